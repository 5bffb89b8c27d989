//! Turns OpenCode's OpenAPI 3.1 document into the OpenAPI 3.0 subset progenitor 0.15 generates a
//! client from.
//!
//! `build.rs` includes this file, and so does `tests/openapi_normalize.rs` (which runs the unit
//! tests at the bottom), so every rule is tested on a tiny spec fragment without a build script
//! run. The rules work on `serde_json::Value` because most of what they fix cannot even be parsed
//! by `openapiv3` (a numeric `exclusiveMinimum`, say).
//!
//! Each rule is a small named function. After they ran, [`check_supported`] walks every schema and
//! fails with the JSON path of the first keyword no rule handles: a new OpenCode release with a new
//! construct breaks the build loudly, at the spot, rather than generating a client that silently
//! fails to decode at run time.
//!
//! Two rules exist for tolerance rather than for progenitor: `additionalProperties: false` is
//! dropped (so a newer OpenCode adding a field does not break decoding), and `pattern` is dropped
//! (identifier formats such as `^ses` are the server's to check, and progenitor would otherwise
//! wrap every id in a regex-checked newtype).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

/// Name of the single component every error response is rewritten to.
pub const ERROR_SCHEMA: &str = "OpencodeError";

/// Why the spec could not be normalised.
#[derive(Debug, PartialEq)]
pub struct NormalizeError {
    /// JSON path of the offending node, e.g. `/components/schemas/Part/oneOf/3`.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for NormalizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {}: {}", self.path, self.message)
    }
}

fn err(path: &str, message: impl Into<String>) -> NormalizeError {
    NormalizeError {
        path: path.to_string(),
        message: message.into(),
    }
}

/// Runs every rule, in order, keeping only the operations named in `operations`.
pub fn normalize(mut spec: Value, operations: &[String]) -> Result<Value, NormalizeError> {
    select_operations(&mut spec, operations)?;
    strip_operation_noise(&mut spec);
    unify_error_responses(&mut spec);
    prune_components(&mut spec)?;
    downgrade_version(&mut spec)?;
    for_each_schema(&mut spec, &mut |schema| {
        nullable_unions(schema);
        type_lists(schema);
        exclusive_bounds(schema);
        const_to_enum(schema);
        drop_annotation_keywords(schema);
        prefix_items(schema);
        pattern_properties(schema);
        open_objects(schema);
        any_of_to_one_of(schema);
        open_unions(schema);
        open_string_enums(schema);
    });
    check_supported(&spec)?;
    Ok(spec)
}

// ---------------------------------------------------------------------------------------------
// Document-level rules
// ---------------------------------------------------------------------------------------------

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Keeps only the listed operations (by `operationId`) and drops paths left empty. A listed
/// operation the spec lacks is an error: the refresh script relies on this to report removals.
pub fn select_operations(spec: &mut Value, operations: &[String]) -> Result<(), NormalizeError> {
    let wanted: BTreeSet<&str> = operations.iter().map(String::as_str).collect();
    let mut found = BTreeSet::new();
    let paths = spec
        .get_mut("paths")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| err("/paths", "expected an object of paths"))?;
    paths.retain(|_, item| {
        if let Some(item) = item.as_object_mut() {
            item.retain(|key, op| {
                if !METHODS.contains(&key.as_str()) {
                    return key == "parameters";
                }
                match op.get("operationId").and_then(Value::as_str) {
                    Some(id) if wanted.contains(id) => {
                        found.insert(id.to_string());
                        true
                    }
                    _ => false,
                }
            });
            item.keys().any(|k| METHODS.contains(&k.as_str()))
        } else {
            false
        }
    });
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|id| !found.contains(**id))
        .copied()
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(err(
            "/paths",
            format!("operations listed in openapi/operations.txt are missing: {missing:?}"),
        ))
    }
}

/// Removes vendor extensions (`x-codeSamples`), tags and summaries from operations: they only
/// bloat the generated docs.
pub fn strip_operation_noise(spec: &mut Value) {
    for op in operations_mut(spec) {
        if let Some(op) = op.as_object_mut() {
            op.retain(|k, _| !k.starts_with("x-") && k != "tags");
        }
    }
}

/// progenitor asserts that all error responses of one operation share a type; OpenCode's differ
/// (`BadRequestError`, `NotFoundError`, ...). Every non-2xx response becomes one free-form object
/// component; the gateway reads `name` and `data.message` from it by hand.
pub fn unify_error_responses(spec: &mut Value) {
    for op in operations_mut(spec) {
        let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
            continue;
        };
        for (code, response) in responses.iter_mut() {
            if code.starts_with('2') {
                continue;
            }
            let description = response
                .get("description")
                .cloned()
                .unwrap_or_else(|| json!("error"));
            *response = json!({
                "description": description,
                "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{ERROR_SCHEMA}")}}}
            });
        }
    }
    if let Some(schemas) = spec
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.insert(
            ERROR_SCHEMA.to_string(),
            json!({
                "type": "object",
                "description": "Any error body OpenCode returns; usually `{name, data: {message}}`."
            }),
        );
    }
}

/// Drops every component schema the kept operations do not reach, so the generated code holds
/// only what we call (the `Event` and `Config` unions alone would double the build time).
pub fn prune_components(spec: &mut Value) -> Result<(), NormalizeError> {
    let mut reached = BTreeSet::new();
    collect_refs(spec.get("paths").unwrap_or(&Value::Null), &mut reached);
    let schemas = spec
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut todo: Vec<String> = reached.iter().cloned().collect();
    while let Some(name) = todo.pop() {
        let schema = schemas.get(&name).ok_or_else(|| {
            err(
                &format!("/components/schemas/{name}"),
                "referenced schema does not exist",
            )
        })?;
        let mut found = BTreeSet::new();
        collect_refs(schema, &mut found);
        for next in found {
            if reached.insert(next.clone()) {
                todo.push(next);
            }
        }
    }
    if let Some(components) = spec.get_mut("components").and_then(Value::as_object_mut) {
        components.retain(|k, _| k == "schemas");
        if let Some(map) = components.get_mut("schemas").and_then(Value::as_object_mut) {
            map.retain(|name, _| reached.contains(name));
        }
    }
    Ok(())
}

fn collect_refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref" {
                    if let Some(name) = v
                        .as_str()
                        .and_then(|r| r.strip_prefix("#/components/schemas/"))
                    {
                        out.insert(name.to_string());
                    }
                } else {
                    collect_refs(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// `openapi: 3.1.x` becomes `3.0.3`; the keyword rules below make the content match.
pub fn downgrade_version(spec: &mut Value) -> Result<(), NormalizeError> {
    match spec.get("openapi").and_then(Value::as_str) {
        Some(v) if v.starts_with("3.0.") || v.starts_with("3.1.") => {
            spec["openapi"] = json!("3.0.3");
            Ok(())
        }
        other => Err(err(
            "/openapi",
            format!("expected an OpenAPI 3.0 or 3.1 document, found {other:?}"),
        )),
    }
}

fn operations_mut(spec: &mut Value) -> Vec<&mut Value> {
    let mut out = Vec::new();
    if let Some(paths) = spec.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            if let Some(item) = item.as_object_mut() {
                for (method, op) in item.iter_mut() {
                    if METHODS.contains(&method.as_str()) {
                        out.push(op);
                    }
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Schema-level rules: each one looks at a single schema object; `for_each_schema` walks them all
// (bottom-up, so a rule sees already-normalised children).
// ---------------------------------------------------------------------------------------------

/// Calls `f` on every schema object in the document: component schemas, parameter schemas,
/// request and response body schemas, and every subschema inside them.
pub fn for_each_schema(spec: &mut Value, f: &mut dyn FnMut(&mut Map<String, Value>)) {
    if let Some(schemas) = spec
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        for schema in schemas.values_mut() {
            walk_schema(schema, f);
        }
    }
    for op in operations_mut(spec) {
        if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
            for p in params {
                if let Some(s) = p.get_mut("schema") {
                    walk_schema(s, f);
                }
            }
        }
        if let Some(content) = op
            .pointer_mut("/requestBody/content")
            .and_then(Value::as_object_mut)
        {
            for media in content.values_mut() {
                if let Some(s) = media.get_mut("schema") {
                    walk_schema(s, f);
                }
            }
        }
        if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
            for r in responses.values_mut() {
                if let Some(content) = r.get_mut("content").and_then(Value::as_object_mut) {
                    for media in content.values_mut() {
                        if let Some(s) = media.get_mut("schema") {
                            walk_schema(s, f);
                        }
                    }
                }
            }
        }
    }
}

/// Keywords whose value is one subschema.
const SUBSCHEMA_ONE: [&str; 3] = ["items", "additionalProperties", "not"];
/// Keywords whose value is a list of subschemas.
const SUBSCHEMA_LIST: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];
/// Keywords whose value is a map of subschemas.
const SUBSCHEMA_MAP: [&str; 2] = ["properties", "patternProperties"];

fn walk_schema(schema: &mut Value, f: &mut dyn FnMut(&mut Map<String, Value>)) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    for key in SUBSCHEMA_ONE {
        if let Some(sub) = map.get_mut(key) {
            walk_schema(sub, f);
        }
    }
    for key in SUBSCHEMA_LIST {
        if let Some(list) = map.get_mut(key).and_then(Value::as_array_mut) {
            list.iter_mut().for_each(|s| walk_schema(s, f));
        }
    }
    for key in SUBSCHEMA_MAP {
        if let Some(props) = map.get_mut(key).and_then(Value::as_object_mut) {
            props.values_mut().for_each(|s| walk_schema(s, f));
        }
    }
    f(map);
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
        || v.get("enum") == Some(&json!([null]))
        || v.get("const") == Some(&Value::Null)
}

/// 3.1 writes an optional value as `anyOf: [X, {type: null}]`; 3.0 says `nullable: true`. With a
/// single remaining branch the union disappears (a `$ref` is wrapped in `allOf` so `nullable` is
/// not a sibling of `$ref`, which 3.0 ignores).
pub fn nullable_unions(schema: &mut Map<String, Value>) {
    for key in ["anyOf", "oneOf"] {
        let Some(list) = schema.get(key).and_then(Value::as_array) else {
            continue;
        };
        if !list.iter().any(is_null_schema) {
            continue;
        }
        let rest: Vec<Value> = list
            .iter()
            .filter(|v| !is_null_schema(v))
            .cloned()
            .collect();
        schema.remove(key);
        if rest.len() == 1 {
            let only = rest.into_iter().next().unwrap_or(Value::Null);
            match only {
                Value::Object(inner) if inner.contains_key("$ref") => {
                    schema.insert("allOf".into(), json!([inner]));
                }
                Value::Object(inner) => {
                    for (k, v) in inner {
                        schema.entry(k).or_insert(v);
                    }
                }
                _ => {}
            }
        } else {
            schema.insert(key.into(), Value::Array(rest));
        }
        schema.insert("nullable".into(), json!(true));
    }
}

/// 3.1's `type: [T, "null"]` becomes `type: T, nullable: true`.
pub fn type_lists(schema: &mut Map<String, Value>) {
    let Some(types) = schema.get("type").and_then(Value::as_array).cloned() else {
        return;
    };
    let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
    if non_null.len() < types.len() {
        schema.insert("nullable".into(), json!(true));
    }
    match non_null.len() {
        1 => {
            schema.insert("type".into(), non_null[0].clone());
        }
        _ => {
            schema.remove("type");
            let branches: Vec<Value> = non_null.into_iter().map(|t| json!({"type": t})).collect();
            schema.insert("oneOf".into(), Value::Array(branches));
        }
    }
}

/// 3.1's numeric `exclusiveMinimum: n` becomes 3.0's `minimum: n, exclusiveMinimum: true`.
pub fn exclusive_bounds(schema: &mut Map<String, Value>) {
    for (exclusive, inclusive) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let Some(n) = schema.get(exclusive).filter(|v| v.is_number()).cloned() {
            schema.insert(inclusive.into(), n);
            schema.insert(exclusive.into(), json!(true));
        }
    }
}

/// `const: v` becomes `enum: [v]`.
pub fn const_to_enum(schema: &mut Map<String, Value>) {
    if let Some(v) = schema.remove("const") {
        schema.insert("enum".into(), json!([v]));
    }
}

/// Keywords that only annotate (or that 3.0 lacks and that carry no shape we decode) go.
/// `pattern` goes too: see the module docs.
pub fn drop_annotation_keywords(schema: &mut Map<String, Value>) {
    for key in [
        "$schema",
        "$id",
        "$comment",
        "examples",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "pattern",
        "propertyNames",
    ] {
        schema.remove(key);
    }
}

/// A 3.1 tuple (`prefixItems`) becomes a 3.0 array of any item with the tuple's length bounds.
pub fn prefix_items(schema: &mut Map<String, Value>) {
    if let Some(Value::Array(items)) = schema.remove("prefixItems") {
        let n = items.len();
        schema.insert("items".into(), json!({}));
        schema.entry("minItems").or_insert(json!(n));
        schema.entry("maxItems").or_insert(json!(n));
    }
}

/// 3.0 has no `patternProperties`: the values' schema becomes `additionalProperties` (the key
/// patterns are the server's to check).
pub fn pattern_properties(schema: &mut Map<String, Value>) {
    if let Some(Value::Object(patterns)) = schema.remove("patternProperties") {
        let values: Vec<Value> = patterns.into_iter().map(|(_, v)| v).collect();
        let value_schema = match values.len() {
            0 => json!({}),
            1 => values.into_iter().next().unwrap_or(json!({})),
            _ => json!({"oneOf": values}),
        };
        schema.insert("additionalProperties".into(), value_schema);
    }
}

/// `additionalProperties: false` is dropped so that a field added by a newer OpenCode does not
/// fail decoding (typify would emit `deny_unknown_fields`).
pub fn open_objects(schema: &mut Map<String, Value>) {
    if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
        schema.remove("additionalProperties");
    }
}

/// typify turns an `anyOf` it cannot prove disjoint into a struct of flattened optionals, which
/// can never decode a scalar branch (`bool | {...}`): `GET /config/providers` failed that way.
/// OpenCode's unions are in practice exclusive, so `oneOf` (an untagged or tagged enum) is right.
pub fn any_of_to_one_of(schema: &mut Map<String, Value>) {
    if let Some(list) = schema.remove("anyOf") {
        if schema.contains_key("oneOf") {
            // Both present: keep them as an intersection.
            let mut all = vec![json!({"oneOf": list})];
            if let Some(Value::Array(existing)) = schema.remove("allOf") {
                all.extend(existing);
            }
            schema.insert("allOf".into(), Value::Array(all));
        } else {
            schema.insert("oneOf".into(), list);
        }
    }
}

/// A union of named object schemas (message parts, tool states, errors) gets a final free-form object
/// branch, so that a variant added by a newer OpenCode decodes as "unknown" instead of failing the
/// whole response (one new part type would otherwise make every message list unreadable).
pub fn open_unions(schema: &mut Map<String, Value>) {
    let Some(list) = schema.get_mut("oneOf").and_then(Value::as_array_mut) else {
        return;
    };
    // Only unions of named schemas: an inline union (`SessionStatus`) becomes a tagged enum with
    // readable variants, which a catch-all would turn into `Variant0..n`.
    let all_refs = list.iter().all(|branch| branch.get("$ref").is_some());
    if all_refs && list.len() > 1 {
        list.push(json!({
            "type": "object",
            "description": "A variant this client does not know yet (from a newer OpenCode)."
        }));
    }
}

/// A string enum with several values (`AgentMode`, `SnapshotFileDiffStatus`, ...) becomes a plain
/// string, its known values kept in the description: a value added by a newer OpenCode must not
/// fail decoding of a whole response. Single-value enums stay: they are the discriminators
/// (`type: "text"`) that tell union variants apart.
pub fn open_string_enums(schema: &mut Map<String, Value>) {
    if schema.get("type").and_then(Value::as_str) != Some("string") {
        return;
    }
    let Some(values) = schema.get("enum").and_then(Value::as_array) else {
        return;
    };
    if values.len() < 2 {
        return;
    }
    let known: Vec<String> = values
        .iter()
        .map(|v| {
            v.as_str()
                .map(String::from)
                .unwrap_or_else(|| v.to_string())
        })
        .collect();
    let note = format!("Known values: {}.", known.join(", "));
    let description = match schema.get("description").and_then(Value::as_str) {
        Some(d) => format!("{d} {note}"),
        None => note,
    };
    schema.remove("enum");
    schema.insert("description".into(), Value::String(description));
}

// ---------------------------------------------------------------------------------------------
// The final check
// ---------------------------------------------------------------------------------------------

/// Every keyword a normalised schema may still contain. Anything else means OpenCode's spec grew
/// a construct no rule handles: fail with its JSON path.
const SUPPORTED_KEYWORDS: [&str; 25] = [
    "type",
    "format",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "oneOf",
    "allOf",
    "anyOf",
    "$ref",
    "nullable",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "default",
    "readOnly",
    "deprecated",
];

/// Fails with the JSON path of the first schema keyword no rule handles, or of a parameter style
/// progenitor cannot encode (`deepObject`).
pub fn check_supported(spec: &Value) -> Result<(), NormalizeError> {
    if let Some(schemas) = spec
        .pointer("/components/schemas")
        .and_then(Value::as_object)
    {
        for (name, schema) in schemas {
            check_schema(schema, &format!("/components/schemas/{name}"))?;
        }
    }
    if let Some(paths) = spec.get("paths").and_then(Value::as_object) {
        for (path, item) in paths {
            let item_path = format!("/paths/{}", path.replace('~', "~0").replace('/', "~1"));
            let Some(item) = item.as_object() else {
                continue;
            };
            for (method, op) in item {
                let op_path = format!("{item_path}/{method}");
                if let Some(params) = op.get("parameters").and_then(Value::as_array) {
                    for (i, p) in params.iter().enumerate() {
                        let p_path = format!("{op_path}/parameters/{i}");
                        if p.get("style").and_then(Value::as_str) == Some("deepObject") {
                            return Err(err(&p_path, "deepObject query parameters are not supported by progenitor; leave this operation out"));
                        }
                        if let Some(s) = p.get("schema") {
                            check_schema(s, &format!("{p_path}/schema"))?;
                        }
                    }
                }
                for (section, pointer) in [
                    ("requestBody", "/requestBody/content"),
                    ("responses", "/responses"),
                ] {
                    let _ = section;
                    if let Some(node) = op.pointer(pointer) {
                        check_bodies(node, &format!("{op_path}{pointer}"))?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_bodies(node: &Value, path: &str) -> Result<(), NormalizeError> {
    // Walk down to every `schema` key under a content map or a responses map.
    if let Some(map) = node.as_object() {
        for (k, v) in map {
            let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
            if k == "schema" {
                check_schema(v, &p)?;
            } else if v.is_object() {
                check_bodies(v, &p)?;
            }
        }
    }
    Ok(())
}

fn check_schema(schema: &Value, path: &str) -> Result<(), NormalizeError> {
    let Some(map) = schema.as_object() else {
        return if schema.is_boolean() {
            Ok(())
        } else {
            Err(err(path, "expected a schema object"))
        };
    };
    for (key, value) in map {
        let p = format!("{path}/{key}");
        if !SUPPORTED_KEYWORDS.contains(&key.as_str()) {
            return Err(err(
                &p,
                format!("schema keyword `{key}` is not handled by any normalisation rule"),
            ));
        }
        match key.as_str() {
            "properties" => {
                if let Some(props) = value.as_object() {
                    for (name, sub) in props {
                        check_schema(sub, &format!("{p}/{name}"))?;
                    }
                }
            }
            "items" | "additionalProperties" => check_schema(value, &p)?,
            "oneOf" | "allOf" | "anyOf" => {
                if let Some(list) = value.as_array() {
                    for (i, sub) in list.iter().enumerate() {
                        check_schema(sub, &format!("{p}/{i}"))?;
                    }
                }
            }
            "type" if !value.is_string() => {
                return Err(err(&p, "expected a single type name"));
            }
            "exclusiveMinimum" | "exclusiveMaximum" if !value.is_boolean() => {
                return Err(err(&p, "expected a boolean (OpenAPI 3.0)"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Names of component schemas after progenitor/typify turn them into Rust identifiers
/// (punctuation stripped, PascalCase). Two names mapping to one identifier are reported so the
/// operation list can be adjusted; returned as `identifier -> [original names]`.
pub fn identifier_collisions(spec: &Value) -> BTreeMap<String, Vec<String>> {
    let mut by_ident: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let Some(schemas) = spec
        .pointer("/components/schemas")
        .and_then(Value::as_object)
    {
        for name in schemas.keys() {
            let ident: String = name
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let mut c = s.chars();
                    c.next()
                        .map(|first| first.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                })
                .collect();
            by_ident.entry(ident).or_default().push(name.clone());
        }
    }
    by_ident.retain(|_, names| names.len() > 1);
    by_ident
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn spec_with_ops() -> Value {
        json!({
            "openapi": "3.1.0",
            "paths": {
                "/a": {"get": {"operationId": "a.get", "tags": ["x"], "x-codeSamples": [],
                    "responses": {
                        "200": {"description": "ok", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/A"}}}},
                        "400": {"description": "bad", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Bad"}}}},
                        "404": {"description": "nf", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NotFound"}}}}
                    }}},
                "/b": {"post": {"operationId": "b.post", "responses": {"200": {"description": "ok"}}}}
            },
            "components": {"schemas": {
                "A": {"type": "object", "properties": {"b": {"$ref": "#/components/schemas/B"}}},
                "B": {"type": "string"},
                "Unused": {"type": "string"},
                "Bad": {"type": "object"},
                "NotFound": {"type": "object"}
            }}
        })
    }

    #[test]
    fn select_keeps_only_listed_operations() {
        let mut spec = spec_with_ops();
        select_operations(&mut spec, &["a.get".to_string()]).expect("select");
        assert!(spec.pointer("/paths/~1a/get").is_some());
        assert!(spec.pointer("/paths/~1b").is_none());
    }

    #[test]
    fn select_reports_missing_operations() {
        let mut spec = spec_with_ops();
        let e = select_operations(&mut spec, &["a.get".into(), "gone.op".into()])
            .expect_err("missing op");
        assert!(e.message.contains("gone.op"), "{e}");
    }

    #[test]
    fn strip_noise_drops_extensions_and_tags() {
        let mut spec = spec_with_ops();
        strip_operation_noise(&mut spec);
        let op = spec.pointer("/paths/~1a/get").expect("op");
        assert!(op.get("tags").is_none() && op.get("x-codeSamples").is_none());
        assert!(op.get("operationId").is_some());
    }

    #[test]
    fn error_responses_share_one_schema() {
        let mut spec = spec_with_ops();
        unify_error_responses(&mut spec);
        let r400 = spec
            .pointer("/paths/~1a/get/responses/400/content/application~1json/schema/$ref")
            .expect("400");
        let r404 = spec
            .pointer("/paths/~1a/get/responses/404/content/application~1json/schema/$ref")
            .expect("404");
        assert_eq!(r400, r404);
        assert!(spec
            .pointer(&format!("/components/schemas/{ERROR_SCHEMA}"))
            .is_some());
        // The success response is untouched.
        assert_eq!(
            spec.pointer("/paths/~1a/get/responses/200/content/application~1json/schema/$ref"),
            Some(&json!("#/components/schemas/A"))
        );
    }

    #[test]
    fn prune_keeps_transitively_reachable_schemas() {
        let mut spec = spec_with_ops();
        select_operations(&mut spec, &["a.get".to_string()]).expect("select");
        unify_error_responses(&mut spec);
        prune_components(&mut spec).expect("prune");
        let names: Vec<&String> = spec["components"]["schemas"]
            .as_object()
            .expect("schemas")
            .keys()
            .collect();
        assert_eq!(names, vec!["A", "B", ERROR_SCHEMA]);
    }

    #[test]
    fn prune_reports_dangling_refs() {
        let mut spec = json!({"paths": {"/a": {"get": {"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Nope"}}}}}}}}, "components": {"schemas": {}}});
        let e = prune_components(&mut spec).expect_err("dangling");
        assert_eq!(e.path, "/components/schemas/Nope");
    }

    #[test]
    fn version_is_downgraded_and_unknown_versions_rejected() {
        let mut spec = json!({"openapi": "3.1.0"});
        downgrade_version(&mut spec).expect("3.1");
        assert_eq!(spec["openapi"], "3.0.3");
        let mut swagger = json!({"swagger": "2.0"});
        assert!(downgrade_version(&mut swagger).is_err());
    }

    #[test]
    fn nullable_union_of_ref_becomes_all_of() {
        let mut s =
            schema(json!({"anyOf": [{"$ref": "#/components/schemas/X"}, {"type": "null"}]}));
        nullable_unions(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"allOf": [{"$ref": "#/components/schemas/X"}], "nullable": true})
        );
    }

    #[test]
    fn nullable_union_of_inline_schema_is_flattened() {
        let mut s =
            schema(json!({"anyOf": [{"type": "string"}, {"type": "null"}], "description": "d"}));
        nullable_unions(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "string", "nullable": true, "description": "d"})
        );
    }

    #[test]
    fn nullable_union_with_several_branches_keeps_the_union() {
        let mut s =
            schema(json!({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]}));
        nullable_unions(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"anyOf": [{"type": "string"}, {"type": "number"}], "nullable": true})
        );
    }

    #[test]
    fn type_list_with_null_becomes_nullable() {
        let mut s = schema(json!({"type": ["integer", "null"]}));
        type_lists(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "integer", "nullable": true})
        );
        let mut multi = schema(json!({"type": ["integer", "string"]}));
        type_lists(&mut multi);
        assert_eq!(
            Value::Object(multi),
            json!({"oneOf": [{"type": "integer"}, {"type": "string"}]})
        );
    }

    #[test]
    fn numeric_exclusive_bounds_become_boolean() {
        let mut s = schema(json!({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}));
        exclusive_bounds(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 1, "exclusiveMaximum": true})
        );
    }

    #[test]
    fn const_becomes_single_enum() {
        let mut s = schema(json!({"type": "string", "const": "text"}));
        const_to_enum(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "string", "enum": ["text"]})
        );
    }

    #[test]
    fn annotation_keywords_and_patterns_are_dropped() {
        let mut s = schema(
            json!({"type": "string", "pattern": "^ses", "examples": ["x"], "contentMediaType": "text/plain", "$comment": "c"}),
        );
        drop_annotation_keywords(&mut s);
        assert_eq!(Value::Object(s), json!({"type": "string"}));
    }

    #[test]
    fn prefix_items_become_bounded_array() {
        let mut s = schema(
            json!({"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]}),
        );
        prefix_items(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "array", "items": {}, "minItems": 2, "maxItems": 2})
        );
    }

    #[test]
    fn pattern_properties_become_additional_properties() {
        let mut s =
            schema(json!({"type": "object", "patternProperties": {"^x": {"type": "string"}}}));
        pattern_properties(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "object", "additionalProperties": {"type": "string"}})
        );
    }

    #[test]
    fn closed_objects_are_opened() {
        let mut s = schema(json!({"type": "object", "additionalProperties": false}));
        open_objects(&mut s);
        assert_eq!(Value::Object(s), json!({"type": "object"}));
        // A map type keeps its value schema.
        let mut m = schema(json!({"type": "object", "additionalProperties": {"type": "string"}}));
        open_objects(&mut m);
        assert_eq!(
            Value::Object(m),
            json!({"type": "object", "additionalProperties": {"type": "string"}})
        );
    }

    #[test]
    fn any_of_becomes_one_of() {
        let mut s = schema(json!({"anyOf": [{"type": "boolean"}, {"type": "object"}]}));
        any_of_to_one_of(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"oneOf": [{"type": "boolean"}, {"type": "object"}]})
        );
    }

    #[test]
    fn string_enums_open_up_but_discriminators_stay() {
        let mut s = schema(json!({"type": "string", "enum": ["primary", "subagent", "all"]}));
        open_string_enums(&mut s);
        assert_eq!(
            Value::Object(s),
            json!({"type": "string", "description": "Known values: primary, subagent, all."})
        );
        let mut tag = schema(json!({"type": "string", "enum": ["text"]}));
        open_string_enums(&mut tag);
        assert_eq!(
            Value::Object(tag),
            json!({"type": "string", "enum": ["text"]})
        );
    }

    #[test]
    fn unions_of_objects_get_a_catch_all_branch() {
        let mut s = schema(json!({"oneOf": [
            {"$ref": "#/components/schemas/A"},
            {"$ref": "#/components/schemas/B"}
        ]}));
        open_unions(&mut s);
        assert_eq!(s["oneOf"].as_array().map(Vec::len), Some(3));
        // Inline unions (and any with a scalar branch) are left alone: they become tagged enums.
        let mut inline =
            schema(json!({"oneOf": [{"$ref": "#/components/schemas/A"}, {"type": "object"}]}));
        open_unions(&mut inline);
        assert_eq!(inline["oneOf"].as_array().map(Vec::len), Some(2));
        let mut scalar = schema(json!({"oneOf": [{"type": "boolean"}, {"type": "object"}]}));
        open_unions(&mut scalar);
        assert_eq!(scalar["oneOf"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn walk_reaches_nested_schemas_bottom_up() {
        let mut spec = json!({"openapi": "3.1.0", "paths": {}, "components": {"schemas": {
            "A": {"type": "object", "properties": {"x": {"anyOf": [{"type": "string", "const": "k"}, {"type": "null"}]}}}
        }}});
        for_each_schema(&mut spec, &mut |s| {
            nullable_unions(s);
            const_to_enum(s);
        });
        assert_eq!(
            spec.pointer("/components/schemas/A/properties/x"),
            Some(&json!({"type": "string", "enum": ["k"], "nullable": true}))
        );
    }

    #[test]
    fn unsupported_keyword_fails_with_its_path() {
        let spec = json!({"components": {"schemas": {"A": {"type": "object", "properties": {"x": {"type": "string", "dependentRequired": {}}}}}}});
        let e = check_supported(&spec).expect_err("unsupported");
        assert_eq!(
            e.path,
            "/components/schemas/A/properties/x/dependentRequired"
        );
    }

    #[test]
    fn deep_object_parameters_are_rejected() {
        let spec = json!({"paths": {"/a": {"get": {"parameters": [{"name": "q", "in": "query", "style": "deepObject", "schema": {"type": "object"}}], "responses": {}}}}});
        let e = check_supported(&spec).expect_err("deepObject");
        assert_eq!(e.path, "/paths/~1a/get/parameters/0");
    }

    #[test]
    fn collisions_are_detected_after_identifier_mangling() {
        let spec = json!({"components": {"schemas": {"SessionStatus": {}, "session.status": {}, "Other": {}}}});
        let c = identifier_collisions(&spec);
        assert_eq!(c.len(), 1);
        assert_eq!(c["SessionStatus"].len(), 2);
    }
}
