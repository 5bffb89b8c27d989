//! A figment [`Format`] for YAML backed by `yaml_serde`.
//!
//! figment's own `yaml` feature pulls `serde_yaml`, which is archived; `yaml_serde` is its
//! maintained continuation with the same API, and a `Format` for it is this small.

use figment::providers::Format;
use serde::de::DeserializeOwned;

/// YAML via `yaml_serde`. Merge keys (`<<: *anchor`) are applied, and an empty document (or one
/// holding only comments) is an empty mapping rather than an error, so a placeholder
/// `delegation.yaml` with everything commented out is valid.
pub struct Yaml;

impl Format for Yaml {
    type Error = yaml_serde::Error;

    const NAME: &'static str = "YAML";

    fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Self::Error> {
        let mut value: yaml_serde::Value = yaml_serde::from_str(text)?;
        if value.is_null() {
            value = yaml_serde::Value::Mapping(yaml_serde::Mapping::new());
        }
        value.apply_merge()?;
        T::deserialize(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::value::Dict;

    #[test]
    fn empty_and_comment_only_documents_are_empty_maps() {
        for text in ["", "# nothing here\n", "---\n"] {
            let dict: Dict = Yaml::from_str(text).expect(text);
            assert!(dict.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn merge_keys_apply() {
        let text = "base: &b {a: 1}\nderived:\n  <<: *b\n  c: 2\n";
        let dict: Dict = Yaml::from_str(text).expect("parses");
        let derived = dict.get("derived").and_then(|v| v.as_dict()).expect("map");
        assert!(derived.contains_key("a") && derived.contains_key("c"));
    }

    #[test]
    fn syntax_errors_carry_a_location() {
        let err = Yaml::from_str::<Dict>("a: [1, 2\nb: 3\n").expect_err("unclosed");
        assert!(err.to_string().contains("line"), "{err}");
    }
}
