//! The configuration reference, `docs/configuration-reference.md`: every key of
//! `delegation.yaml`, its default, what it does and whether a repository's file may set it.
//!
//! It is made from the same three sources the gateway runs on (the JSON Schema of [`Config`],
//! the built-in layer and the trust [`POLICY`]), so it cannot say something the code does not
//! do: a test regenerates it and fails when the committed page differs
//! (`UPDATE_DOCS=1 cargo test --test docs` rewrites it).
//!
//! [`Config`]: super::Config
//! [`POLICY`]: super::trust::POLICY

use serde_json::Value;

use super::trust::{policy_for, Rule};

/// The reference page, as Markdown.
pub fn markdown() -> String {
    let schema = super::json_schema();
    let defaults: Value = serde_json::from_str(super::DEFAULT_JSON).unwrap_or(Value::Null);
    let mut rows = Vec::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (key, prop) in props {
            if key == "$schema" {
                continue;
            }
            walk(&schema, key, prop, defaults.get(key), &mut rows, 0);
        }
    }
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of `delegation.yaml`. Generated from the configuration's schema, the \
         built-in file and the trust rules; do not edit by hand.\n\n\
         - **Default** is the built-in value; `–` means unset.\n\
         - **Repository** says what a repository's own `delegation.yaml` may do with the key. \
         Your own file, `--config` and `OPENCODE_MCP_*` variables may set every key.\n\
         - `*` stands for a name you choose: a tier, a tool, a host or a worker.\n\n\
         How the files are layered, and examples, are in [configuration.md](configuration.md).\n\n\
         | key | default | what it does | repository |\n|---|---|---|---|\n",
    );
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// Follows a `$ref` into the schema's `$defs`, once.
fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/$defs/")
            .and_then(|name| schema.get("$defs")?.get(name))
            .unwrap_or(node),
        None => node,
    }
}

/// Adds the row of `key` (whose schema is `node`), or of each key inside it when it is an
/// object of known keys, a map of named entries, or a list of such objects.
fn walk(
    schema: &Value,
    key: &str,
    node: &Value,
    default: Option<&Value>,
    rows: &mut Vec<String>,
    depth: usize,
) {
    let target = resolve(schema, node);
    let description = node
        .get("description")
        .or_else(|| target.get("description"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if depth < 4 {
        if let Some(props) = target.get("properties").and_then(Value::as_object) {
            for (sub, prop) in props {
                let d = default.and_then(|d| d.get(sub));
                walk(schema, &format!("{key}.{sub}"), prop, d, rows, depth + 1);
            }
            return;
        }
        // A map of named entries (tools, hosts, workers) or a list of objects (tiers).
        let entries = target
            .get("additionalProperties")
            .filter(|v| v.is_object())
            .or_else(|| target.get("items"));
        if let Some(entry) = entries {
            if resolve(schema, entry).get("properties").is_some() {
                rows.push(row(key, description, default, schema, node));
                walk(schema, &format!("{key}.*"), entry, None, rows, depth + 1);
                return;
            }
        }
    }
    rows.push(row(key, description, default, schema, node));
}

fn row(
    key: &str,
    description: &str,
    default: Option<&Value>,
    schema: &Value,
    node: &Value,
) -> String {
    // The built-in file's value first: a key's serde default may be emptier than what the
    // built-in file sets (`hosts`).
    let default = default
        .or_else(|| node.get("default"))
        .or_else(|| resolve(schema, node).get("default"));
    format!(
        "| `{key}` | {} | {} | {} |",
        shown(default),
        cell(description),
        repository(key)
    )
}

/// A default as a table cell: short values in code, long ones (texts, lists of entries) named.
fn shown(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "–".into(),
        Some(Value::String(s)) if s.contains('\n') || s.chars().count() > 40 => "(a text)".into(),
        Some(Value::Array(a)) if a.is_empty() => "`[]`".into(),
        Some(Value::Array(a)) if a.iter().any(Value::is_object) => format!("({} entries)", a.len()),
        Some(Value::Object(o)) if !o.is_empty() => format!("({} entries)", o.len()),
        Some(v) => {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("`{}`", text.replace('|', "\\|"))
        }
    }
}

/// A description as one table cell: its first paragraph, on one line.
fn cell(description: &str) -> String {
    let first = description.split("\n\n").next().unwrap_or_default();
    first
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// What a repository's file may do with `key`, in words: as the loader judges it, the row of
/// the shortest leading part of the key that has one decides for everything under it.
fn repository(key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let decided = (1..=parts.len()).find_map(|n| policy_for(&parts[..n].join(".")));
    let Some(policy) = decided else {
        return "yes".into();
    };
    match policy.rule {
        Rule::Free => "yes".into(),
        Rule::Withheld => "no".into(),
        Rule::OnlyLower => "only lower".into(),
        Rule::OnlyTighter(ranks) => format!("only stricter ({})", ranks.join(" < ")),
        Rule::OnlyFixedTo(values) => format!("only as {}", values.join(" or ")),
        Rule::AllowedBy(switch) => format!("if your file sets `{switch}: true`"),
        Rule::WithOwnDescription => "with its own description".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_top_level_key_and_its_trust_are_in_the_reference() {
        let page = markdown();
        for key in [
            "limits.max_tasks",
            "sandbox.mode",
            "tiers.*.models",
            "workers.*.ssh",
        ] {
            assert!(page.contains(&format!("| `{key}` |")), "{key} missing");
        }
        let line = |key: &str| {
            page.lines()
                .find(|l| l.starts_with(&format!("| `{key}` |")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            line("sandbox.mode").ends_with("| no |"),
            "{}",
            line("sandbox.mode")
        );
        assert!(
            line("timeouts.task").contains("`30m`"),
            "{}",
            line("timeouts.task")
        );
        assert!(
            line("timeouts.task").ends_with("| only lower |"),
            "{}",
            line("timeouts.task")
        );
    }
}
