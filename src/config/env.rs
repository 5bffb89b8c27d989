//! The `OPENCODE_MCP_*` environment layer.
//!
//! This follows figment's `Env::prefixed("OPENCODE_MCP_").split("__")` (prefix matched without
//! regard to case, key lowercased, `__` separating nested keys), with three differences:
//!
//! - The variables are passed in rather than read from the process, so tests can inject them
//!   without touching the test runner's environment ([`super::load_with_env`]).
//! - Each variable is its own figment provider, so an error names the exact variable
//!   (`environment variable OPENCODE_MCP_TIMEOUTS__TASK`) rather than "environment variable(s)".
//! - Values are typed by the key they set. figment parses every value as a literal (`5000` becomes
//!   a number, `true` a boolean, `[a, b]` an array) and then refuses a number where a string is
//!   expected, so `OPENCODE_MCP_OPENCODE__PASSWORD_ENV=123` would fail. Here, when the JSON Schema
//!   says the key holds a string (durations, names, descriptions, `url`), the raw text is used as
//!   is; otherwise figment's literal parsing applies, which gives numbers (`…__PORT=5000`),
//!   booleans (`…__ENABLED=false`) and inline arrays or maps
//!   (`OPENCODE_MCP_TIERS='[{name=fast, handles="docs", models=[]}]'`).
//!
//! `OPENCODE_MCP_CONFIG` (the `--config` file) and `OPENCODE_MCP_LOG` (the log filter) are CLI
//! and logging settings, not config keys, and are skipped. Every other `OPENCODE_MCP_*` variable
//! is a config key, and an unknown one is an error like an unknown key in a file.
//!
//! Limits of the mapping: keys are lowercased, so a tool whose name has capitals cannot be
//! addressed from the environment, nor one whose name contains `__`.

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::error::{Origin, Problem};

/// The prefix of configuration variables.
pub const PREFIX: &str = "OPENCODE_MCP_";

/// Variables with the prefix that are not configuration keys.
pub const IGNORED: [&str; 2] = ["OPENCODE_MCP_CONFIG", "OPENCODE_MCP_LOG"];

/// The metadata name prefix that marks an environment layer (see [`origin_of_name`]).
const NAME_PREFIX: &str = "environment variable ";

/// One configuration variable as a figment provider.
pub(crate) struct EnvVar {
    name: String,
    key: String,
    value: Value,
}

impl EnvVar {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Provider for EnvVar {
    fn metadata(&self) -> Metadata {
        Metadata::named(format!("{NAME_PREFIX}{}", self.name))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let dict = match figment::util::nest(&self.key, self.value.clone()) {
            Value::Dict(_, dict) => dict,
            // `key` is never empty (checked in `collect`), so `nest` always returns a map.
            _ => Dict::new(),
        };
        Ok(Profile::Default.collect(dict))
    }
}

/// The variable named by an environment layer's metadata name, if it is one.
pub(crate) fn origin_of_name(name: &str) -> Option<Origin> {
    name.strip_prefix(NAME_PREFIX)
        .map(|var| Origin::Env(var.to_string()))
}

/// Picks the configuration variables out of `env`, sorted by name, typing each value by the key it
/// sets (see the module doc). Variables whose name cannot be a key (`OPENCODE_MCP_`,
/// `OPENCODE_MCP_A____B`) are returned as problems.
pub(crate) fn collect(
    env: impl IntoIterator<Item = (String, String)>,
    schema: impl Fn() -> serde_json::Value,
) -> (Vec<EnvVar>, Vec<Problem>) {
    // Generated only when a variable needs it: most starts have none, and generating the
    // config's schema was one of the larger costs of a cold start.
    let built = std::cell::OnceCell::new();
    let schema = || built.get_or_init(&schema);
    let mut vars = Vec::new();
    let mut problems = Vec::new();
    for (name, raw) in env {
        let name = name.trim().to_string();
        let Some(head) = name.get(..PREFIX.len()) else {
            continue;
        };
        if !head.eq_ignore_ascii_case(PREFIX)
            // Only the exact names: clap and the log filter read exactly these, so a lowercase
            // spelling is nobody's and must be reported, not swallowed.
            || IGNORED.contains(&name.as_str())
        {
            continue;
        }
        let key = name[PREFIX.len()..].to_ascii_lowercase().replace("__", ".");
        if key.is_empty() || key.split('.').any(str::is_empty) {
            problems.push(Problem {
                origin: Origin::Env(name),
                key: String::new(),
                message: format!(
                    "cannot be read as a config key: expected {PREFIX}<KEY>, with `__` between \
                     nested keys (e.g. {PREFIX}TIMEOUTS__WAIT_DEFAULT=30s)"
                ),
            });
            continue;
        }
        let segments: Vec<&str> = key.split('.').collect();
        let value = if expects_string(schema(), &segments) {
            Value::from(raw)
        } else {
            // figment's own literal syntax; infallible (falls back to a string).
            raw.parse::<Value>().unwrap_or_else(|never| match never {})
        };
        vars.push(EnvVar { name, key, value });
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    (vars, problems)
}

/// Whether the schema says the value at `path` is a string (possibly optional).
fn expects_string(schema: &serde_json::Value, path: &[&str]) -> bool {
    let mut node = resolve(schema, schema);
    for segment in path {
        let next = node
            .get("properties")
            .and_then(|props| props.get(*segment))
            .or_else(|| node.get("additionalProperties").filter(|v| v.is_object()));
        match next {
            Some(next) => node = resolve(schema, next),
            None => return false,
        }
    }
    match node.get("type") {
        Some(serde_json::Value::String(t)) => t == "string",
        Some(serde_json::Value::Array(types)) => {
            types.iter().any(|t| t == "string")
                && types.iter().all(|t| t == "string" || t == "null")
        }
        _ => false,
    }
}

/// Follows a local `$ref` (`#/$defs/Name`) once; other nodes are returned as they are.
fn resolve<'a>(root: &'a serde_json::Value, node: &'a serde_json::Value) -> &'a serde_json::Value {
    node.get("$ref")
        .and_then(|r| r.as_str())
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| root.get("$defs").and_then(|defs| defs.get(name)))
        .unwrap_or(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> (Vec<EnvVar>, Vec<Problem>) {
        collect(
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            crate::config::json_schema,
        )
    }

    /// Every key path of the generated schema (maps' entries under the name `any`), to the
    /// depth `OPENCODE_MCP_*` names reach.
    fn key_paths(schema: &serde_json::Value) -> Vec<Vec<String>> {
        fn walk(
            root: &serde_json::Value,
            node: &serde_json::Value,
            path: &mut Vec<String>,
            out: &mut Vec<Vec<String>>,
        ) {
            let node = resolve(root, node);
            if path.len() >= 4 {
                return;
            }
            let props = node.get("properties").and_then(|p| p.as_object());
            let entries = props.into_iter().flatten().map(|(k, v)| (k.clone(), v));
            let any = node
                .get("additionalProperties")
                .filter(|v| v.is_object())
                .map(|v| ("any".to_string(), v));
            for (key, child) in entries.chain(any) {
                path.push(key);
                out.push(path.clone());
                walk(root, child, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        walk(schema, schema, &mut Vec::new(), &mut out);
        out
    }

    /// The environment layer types values by the trimmed copy of the committed schema
    /// (`build.rs`): for every key, it must say what the generated schema says. A failure here
    /// after changing a config type means `delegation.schema.json` is out of date: run
    /// `cargo run -- config-schema > delegation.schema.json`.
    #[test]
    fn the_env_layer_types_every_key_as_the_current_schema_does() {
        let current = crate::config::json_schema();
        let used = crate::config::env_schema();
        let paths = key_paths(&current);
        assert!(paths.len() > 50, "{} key paths", paths.len());
        for path in &paths {
            let segments: Vec<&str> = path.iter().map(String::as_str).collect();
            assert_eq!(
                expects_string(&used, &segments),
                expects_string(&current, &segments),
                "{}",
                path.join(".")
            );
        }
        assert!(used.to_string().len() * 3 < current.to_string().len());
    }

    #[test]
    fn schema_types_guide_values() {
        let schema = crate::config::json_schema();
        assert!(expects_string(&schema, &["timeouts", "wait_default"]));
        assert!(expects_string(&schema, &["opencode", "password_env"]));
        assert!(expects_string(&schema, &["opencode", "url"]));
        assert!(expects_string(
            &schema,
            &["tools", "anything", "description"]
        ));
        assert!(!expects_string(&schema, &["opencode", "port"]));
        assert!(!expects_string(&schema, &["tools", "anything", "enabled"]));
        assert!(!expects_string(&schema, &["tiers"]));
        assert!(!expects_string(&schema, &["no_such_key"]));
    }

    #[test]
    fn maps_names_to_keys_and_types_values() {
        let (vars, problems) = vars(&[
            ("OPENCODE_MCP_OPENCODE__PORT", "5000"),
            ("OPENCODE_MCP_OPENCODE__PASSWORD_ENV", "123"),
            ("OPENCODE_MCP_TOOLS__OPENCODE_CANCEL_TASK__ENABLED", "false"),
            ("OPENCODE_MCP_CONFIG", "/x.yaml"),
            ("OPENCODE_MCP_LOG", "debug"),
            ("PATH", "/bin"),
            ("OPENCODE_MCP_", "x"),
            ("OPENCODE_MCP_TIMEOUTS____TASK", "1s"),
        ]);
        let got: Vec<(&str, &str, &Value)> = vars
            .iter()
            .map(|v| (v.name(), v.key.as_str(), &v.value))
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].1, "opencode.password_env");
        assert_eq!(got[0].2.as_str(), Some("123"));
        assert_eq!(got[1].1, "opencode.port");
        assert_eq!(got[1].2.to_u128(), Some(5000));
        assert_eq!(got[2].1, "tools.opencode_cancel_task.enabled");
        assert_eq!(got[2].2.to_bool(), Some(false));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems
            .iter()
            .all(|p| p.message.contains("cannot be read as a config key")));
    }

    #[test]
    fn only_the_exact_names_of_the_cli_variables_are_skipped() {
        // clap and the log filter read `OPENCODE_MCP_CONFIG` / `OPENCODE_MCP_LOG` exactly; a
        // lowercase spelling is read as a config key (and then reported as unknown), not lost.
        let (vars, _) = vars(&[
            ("opencode_mcp_config", "/x.yaml"),
            ("opencode_mcp_log", "debug"),
        ]);
        let keys: Vec<&str> = vars.iter().map(|v| v.key.as_str()).collect();
        assert_eq!(keys, ["config", "log"]);
    }
}
