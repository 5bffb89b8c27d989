//! JSON Schemas for tool inputs and outputs, shaped for what MCP hosts actually accept.
//!
//! The schemas derive from the argument and output types with schemars (JSON Schema 2020-12, the
//! MCP default dialect), then four adjustments make them portable across hosts:
//!
//! - **No `$schema` key.** MCP says a schema without one is 2020-12. Stating it breaks Ajv set up
//!   for draft-07 (`no schema with key or ref "https://json-schema.org/draft/2020-12/schema"`), and
//!   stating anything else is rejected by 2020-12-only validators (recent Claude clients); saying
//!   nothing works with both.
//! - **Subschemas inlined, no `$defs`/`$ref`.** Several hosts hand tool schemas to model APIs or
//!   validators that do not resolve references; our types are small and not recursive, so
//!   inlining costs little.
//! - **No non-standard `format`s.** schemars writes `uint16`, `uint64`, `double`...; strict Ajv
//!   rejects unknown formats, and `minimum`/`maximum` already carry the bounds.
//! - **Inputs only: optional fields are not nullable.** `Option<T>` derives as
//!   `"type": ["string", "null"]`; for an argument, "leave it out" is the contract, and type arrays
//!   confuse some model-side schema converters. (The gateway still treats an explicit `null` as
//!   absent.) Output schemas keep schemars' serialize-side shape untouched, because clients
//!   validate `structuredContent` against them and must never see a false rejection.
//!
//! The root of every schema is `type: object`, which MCP requires of input schemas and which legacy
//! peers need for output schemas (rmcp drops a non-object output schema for them).

use rmcp::model::JsonObject;
use schemars::generate::SchemaSettings;
use schemars::transform::{RecursiveTransform, RestrictFormats, Transform};
use schemars::{JsonSchema, Schema};
use serde_json::Value;

/// The input schema of an argument type.
pub fn input_schema<T: JsonSchema>() -> JsonObject {
    let mut schema = settings()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>();
    RecursiveTransform(drop_null_type).transform(&mut schema);
    RecursiveTransform(compact).transform(&mut schema);
    finish(schema)
}

/// The output schema of a result type (what `Serialize` writes).
pub fn output_schema<T: JsonSchema>() -> JsonObject {
    let schema = settings()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>();
    finish(schema)
}

/// A property's schema inside an object schema, for config-dependent refinements.
pub fn property<'a>(schema: &'a mut JsonObject, name: &str) -> Option<&'a mut JsonObject> {
    schema
        .get_mut("properties")
        .and_then(Value::as_object_mut)
        .and_then(|p| p.get_mut(name))
        .and_then(Value::as_object_mut)
}

/// Lists `name` first among the schema's required properties. For an argument the gateway
/// tolerates leaving out (it has a serde default) but that hosts' existing prompts always pass,
/// such as `server_id`, whose required status the tools keep from the original.
pub fn require_first(schema: &mut JsonObject, name: &str) {
    // Required, so its serde default (an empty string) is no default a host should show.
    if let Some(property) = property(schema, name) {
        property.remove("default");
    }
    let required = schema
        .entry("required")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = required {
        list.retain(|v| v != name);
        list.insert(0, Value::String(name.to_string()));
    }
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| {
        s.meta_schema = None;
        s.inline_subschemas = true;
    })
}

fn finish(mut schema: Schema) -> JsonObject {
    // Allow no format at all: none of the standard ones is used by our types.
    let mut formats = RestrictFormats::default();
    formats.infer_from_meta_schema = false;
    formats.transform(&mut schema);
    RecursiveTransform(unwrap_description).transform(&mut schema);
    let mut object = match schema.to_value() {
        Value::Object(object) => object,
        // Only a bool schema serializes to a non-object; none of our types derives one.
        other => {
            let mut object = JsonObject::new();
            object.insert("type".into(), Value::String("object".into()));
            tracing::error!(schema = %other, "a tool schema did not derive as an object");
            object
        }
    };
    // The type's own title and doc comment are noise: the tool has its own title and description.
    object.remove("title");
    object.remove("description");
    object
}

/// Doc comments keep their source line breaks; a description reads better as one paragraph
/// per blank-line-separated block.
fn unwrap_description(schema: &mut Schema) {
    if let Some(Value::String(text)) = schema.get_mut("description") {
        *text = text
            .split("\n\n")
            .map(|paragraph| {
                paragraph
                    .split('\n')
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n\n");
    }
}

/// What a host's model reads of an input schema costs it on every request, so inputs say each
/// thing once: a `oneOf` of constants (an enum whose variants have doc comments) becomes a plain
/// `enum` (the property's own description says what the values mean), and `minLength: 1` and
/// `additionalProperties: true|false` go (the gateway refuses a blank value, and an unknown
/// argument, with an error naming it; a free-form object is an object without properties).
fn compact(schema: &mut Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let constants = match object.get("oneOf") {
        Some(Value::Array(options)) if !options.is_empty() => options
            .iter()
            .map(|o| o.get("const").cloned().map(|c| (c, o.get("type").cloned())))
            .collect::<Option<Vec<_>>>(),
        _ => None,
    };
    if let Some(constants) = constants {
        object.remove("oneOf");
        if let Some(Some(kind)) = constants.first().map(|(_, t)| t.clone()) {
            object.entry("type").or_insert(kind);
        }
        let values = constants.into_iter().map(|(c, _)| c).collect();
        object.insert("enum".into(), Value::Array(values));
    }
    if object.get("minLength") == Some(&Value::from(1)) {
        object.remove("minLength");
    }
    // Unknown arguments are refused by the gateway itself, naming them (`deny_unknown_fields`);
    // saying so in every object of every schema costs the host's model on each request. (`true`
    // is JSON Schema's default.)
    if matches!(object.get("additionalProperties"), Some(Value::Bool(_))) {
        object.remove("additionalProperties");
    }
}

/// `"type": ["string", "null"]` -> `"type": "string"`; `null` leaves `enum` and `default`;
/// `anyOf: [X, {"type": "null"}]` -> X.
fn drop_null_type(schema: &mut Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = object.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            object.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(values)) = object.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    // `null` is no longer a value the schema allows, so it cannot be the default either: an
    // argument left out is simply not given.
    if object.get("default") == Some(&Value::Null) {
        object.remove("default");
    }
    let nullable_any_of = match object.get("anyOf") {
        Some(Value::Array(options)) if options.len() == 2 => {
            let is_null = |v: &Value| v.get("type").and_then(Value::as_str) == Some("null");
            options
                .iter()
                .position(is_null)
                .map(|i| options[1 - i].clone())
        }
        _ => None,
    };
    if let Some(Value::Object(inner)) = nullable_any_of {
        object.remove("anyOf");
        for (key, value) in inner {
            object.entry(key).or_insert(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    /// Inner doc.
    #[derive(Deserialize, Serialize, JsonSchema)]
    #[allow(dead_code)]
    enum Mode {
        /// The first.
        A,
        /// The second.
        B,
    }

    /// Outer doc.
    #[derive(Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        /// A port,
        /// wrapped.
        port: Option<u16>,
        mode: Option<Mode>,
        name: String,
    }

    #[test]
    fn input_schema_is_portable() {
        let schema = Value::Object(input_schema::<Sample>());
        let text = schema.to_string();
        assert!(!text.contains("$schema"), "{text}");
        assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
        assert!(!text.contains("uint16"), "{text}");
        assert!(!text.contains("null"), "{text}");
        assert_eq!(schema["type"], "object");
        assert!(schema.get("description").is_none());
        assert_eq!(schema["properties"]["port"]["type"], "integer");
        assert_eq!(schema["properties"]["port"]["maximum"], 65535);
        assert_eq!(
            schema["properties"]["port"]["description"],
            "A port, wrapped."
        );
        // Documented variants: a plain enum in the input, said once.
        assert_eq!(schema["properties"]["mode"]["enum"], json!(["A", "B"]));
        assert_eq!(schema["properties"]["mode"]["type"], "string");
        assert!(
            !text.contains("oneOf") && !text.contains("The first"),
            "{text}"
        );
        assert!(schema.get("additionalProperties").is_none(), "{text}");
        assert_eq!(schema["required"], json!(["name"]));
    }

    #[test]
    fn output_schema_keeps_nullability_and_inlines() {
        let schema = Value::Object(output_schema::<Sample>());
        let text = schema.to_string();
        assert!(
            !text.contains("$ref") && !text.contains("$schema"),
            "{text}"
        );
        assert_eq!(schema["type"], "object");
        assert_eq!(
            schema["properties"]["port"]["type"],
            json!(["integer", "null"])
        );
    }
}
