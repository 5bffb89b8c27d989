//! Reading OpenCode's JSON leniently without building a tree of it.
//!
//! The event stream is the gateway's busiest input: on a fan-out every task streams dozens of
//! frames, and a text part's frame carries the whole text written so far, so a long answer is
//! sent again on every update. Parsing each frame into a `serde_json::Value` and picking fields
//! out of it allocated a map for every object and a string for every value, most of them
//! dropped at once (a tool's output, a file's content in a tool's input). Typed structs of only
//! the fields the tracker reads let serde skip the rest without allocating, and borrow strings
//! that need no unescaping straight from the frame.
//!
//! Typed must not mean strict: OpenCode's events change between releases, and a frame whose
//! field changed shape must still yield what it can, as picking from a `Value` did. So a leaf
//! is a [`Scalar`] (whatever JSON value it is; `as_str` of a number is `None`, as with
//! `Value::as_str`), and a nested object is an [`Obj`] (anything but an object reads as absent).
//! Unknown fields are skipped, as serde does by default.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON leaf read as whatever it is. Strings without escapes are borrowed from the input.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Scalar<'a> {
    /// The field was not there (the `#[serde(default)]`).
    #[default]
    Absent,
    Null,
    Bool(bool),
    /// A non-negative integer (serde_json reads those as `u64`).
    U64(u64),
    I64(i64),
    F64(f64),
    Str(Cow<'a, str>),
    /// An array or an object: skipped, not kept.
    Composite,
}

impl<'a> Scalar<'a> {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The string, owned (moved out when the parser already had to unescape it).
    pub fn into_string(self) -> Option<String> {
        match self {
            Scalar::Str(s) => Some(s.into_owned()),
            _ => None,
        }
    }

    pub fn is_true(&self) -> bool {
        matches!(self, Scalar::Bool(true))
    }

    /// Present and not `null`.
    pub fn is_set(&self) -> bool {
        !matches!(self, Scalar::Absent | Scalar::Null)
    }

    /// As `Value::as_u64`: a non-negative integer, not a float.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Scalar::U64(n) => Some(n),
            _ => None,
        }
    }

    /// As `Value::as_f64`: any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Scalar::U64(n) => Some(n as f64),
            Scalar::I64(n) => Some(n as f64),
            Scalar::F64(n) => Some(n),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor(PhantomData))
    }
}

struct ScalarVisitor<'a>(PhantomData<Scalar<'a>>);

impl<'de: 'a, 'a> Visitor<'de> for ScalarVisitor<'a> {
    type Value = Scalar<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Scalar::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Scalar::I64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Scalar::F64(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq).map(|()| Scalar::Composite)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map).map(|()| Scalar::Composite)
    }
}

/// A nested object read as `T`; anything else there (or nothing) is `None`, so a field that
/// changed shape costs that field, not the whole frame.
#[derive(Debug)]
pub struct Obj<T>(pub Option<T>);

impl<T> Default for Obj<T> {
    fn default() -> Self {
        Obj(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjVisitor(PhantomData))
    }
}

struct ObjVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjVisitor<T> {
    type Value = Obj<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(|t| Obj(Some(t)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq).map(|()| Obj(None))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Obj(None))
    }
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Inner<'a> {
        #[serde(borrow, default)]
        name: Scalar<'a>,
    }

    #[derive(serde::Deserialize, Debug)]
    struct Outer<'a> {
        #[serde(borrow, default)]
        a: Scalar<'a>,
        #[serde(borrow, default)]
        inner: Obj<Inner<'a>>,
    }

    fn read(json: &str) -> Outer<'_> {
        match serde_json::from_str(json) {
            Ok(o) => o,
            Err(e) => panic!("{json} did not read: {e}"),
        }
    }

    /// Every JSON shape of a leaf reads as itself; strings without escapes are borrowed.
    #[test]
    fn a_scalar_is_whatever_value_is_there() {
        assert_eq!(read("{}").a, Scalar::Absent);
        assert_eq!(read(r#"{"a":null}"#).a, Scalar::Null);
        assert_eq!(read(r#"{"a":true}"#).a, Scalar::Bool(true));
        assert_eq!(read(r#"{"a":7}"#).a.as_u64(), Some(7));
        assert_eq!(read(r#"{"a":-7}"#).a.as_u64(), None);
        assert_eq!(read(r#"{"a":-7}"#).a.as_f64(), Some(-7.0));
        assert_eq!(read(r#"{"a":1.5}"#).a.as_u64(), None);
        assert_eq!(read(r#"{"a":1.5}"#).a.as_f64(), Some(1.5));
        assert!(matches!(
            read(r#"{"a":"plain"}"#).a,
            Scalar::Str(Cow::Borrowed("plain"))
        ));
        assert_eq!(
            read(r#"{"a":"two\nlines"}"#).a.into_string().as_deref(),
            Some("two\nlines")
        );
        assert_eq!(read(r#"{"a":[1,{"b":2}]}"#).a, Scalar::Composite);
        assert_eq!(read(r#"{"a":{"b":[3]}}"#).a.as_str(), None);
        assert!(!read(r#"{"a":null}"#).a.is_set());
        assert!(read(r#"{"a":0}"#).a.is_set());
    }

    /// A nested object that is not an object costs that field only; unknown fields anywhere
    /// are skipped.
    #[test]
    fn an_object_of_another_shape_is_absent_not_an_error() {
        for other in ["null", "3", "\"x\"", "[{\"name\":\"n\"}]", "false"] {
            let json = format!(r#"{{"a":"kept","inner":{other}}}"#);
            let o = read(&json);
            assert!(o.inner.0.is_none(), "{other}");
            assert_eq!(o.a.as_str(), Some("kept"), "{other}");
        }
        let o = read(r#"{"new":{"deep":[1,2]},"inner":{"name":"n","extra":[{}]},"a":1}"#);
        assert_eq!(
            o.inner.0.and_then(|i| i.name.into_string()).as_deref(),
            Some("n")
        );
        assert_eq!(o.a.as_u64(), Some(1));
    }

    /// Whatever stands where an object was expected, an object of the wrong shape included,
    /// reads as absent rather than failing the whole event.
    #[test]
    fn anything_but_an_object_reads_as_no_object() {
        #[derive(serde::Deserialize, Debug)]
        struct Named {
            #[allow(dead_code)]
            name: String,
        }
        for text in [
            "true",
            "7",
            "-7",
            "1.5",
            "\"x\"",
            "\"a\\nb\"",
            "null",
            "[1, {}]",
        ] {
            let read: Obj<Named> = serde_json::from_str(text).expect(text);
            assert!(read.0.is_none(), "{text}");
        }
        let read: Obj<Named> = serde_json::from_str(r#"{"name": "n"}"#).expect("an object");
        assert!(read.0.is_some());
    }

    /// A scalar read from an escaped string is owned, from `null` is null, and from anything
    /// else is kept by kind.
    #[test]
    fn scalars_keep_their_kind() {
        let escaped: Scalar = serde_json::from_str("\"a\\nb\"").expect("a string");
        assert!(matches!(escaped, Scalar::Str(Cow::Owned(ref s)) if s == "a\nb"));
        let null: Scalar = serde_json::from_str("null").expect("null");
        assert!(!null.is_set());
        let negative: Scalar = serde_json::from_str("-3").expect("a number");
        assert_eq!(negative.as_f64(), Some(-3.0));
        assert_eq!(negative.as_u64(), None);
        let text = serde_json::Value::String("owned".into());
        let owned = Scalar::deserialize(text).expect("an owned string");
        assert!(matches!(owned, Scalar::Str(Cow::Owned(ref s)) if s == "owned"));
    }
}
