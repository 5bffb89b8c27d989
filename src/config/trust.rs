//! The trust boundary of the configuration layers.
//!
//! The `delegation.yaml` in the directory the host starts the gateway in is the *repository's*
//! file: whoever wrote the repository wrote it, and cloning a repository must not let it choose
//! what the gateway executes, where it sends prompts and code, which secret goes with them, or
//! where task output is kept. So from that layer the keys in [`TRUST_KEYS`] are withheld (not
//! merged), and `opencode.permission` is taken only when it is at least as strict as what the
//! layers below say (`allow` < `ask` < `deny`). Everything else (tools, prompts, tiers, timeouts,
//! limits, instructions) is the surface a repository is meant to tune.
//!
//! The user's own layers (their global file, `--config`, the environment) may set every key. A
//! repository file named explicitly with `--config` is the user vouching for it, and is loaded as
//! that trusted layer only.

use std::fmt;
use std::path::PathBuf;

use figment::value::{Dict, Value};

/// Keys a repository's `delegation.yaml` may not set: what runs (`opencode.command`), where it
/// connects (`url`, `hostname`, `port`), which secret is sent (`password_env`) and where data
/// lands (`state_dir`).
pub const TRUST_KEYS: &[&str] = &[
    "opencode.command",
    "opencode.url",
    "opencode.hostname",
    "opencode.port",
    "opencode.password_env",
    "state_dir",
];

/// The permission key, which a repository may only tighten.
pub const PERMISSION_KEY: &str = "opencode.permission";

/// A setting of the repository's file that was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// The repository's `delegation.yaml`.
    pub file: PathBuf,
    /// Dotted key path, e.g. `opencode.command`.
    pub key: String,
    /// The value the file gave, as YAML-ish text.
    pub value: String,
    /// The value in force instead, and the layer it comes from.
    pub in_force: String,
}

impl fmt::Display for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = if self.key == PERMISSION_KEY {
            "a repository's delegation.yaml may tighten the permission policy, never loosen it"
        } else {
            "a repository's delegation.yaml may not choose what the gateway runs, where it \
             connects, which secret it sends or where it keeps data"
        };
        let text = format!(
            "file {}: `{}` ({}) is not applied: {why}; in force: {}. Set it in your own \
             $XDG_CONFIG_HOME/opencode-mcp/delegation.yaml, in a file passed with --config, or \
             as {}",
            self.file.display(),
            self.key,
            self.value,
            self.in_force,
            env_name(&self.key)
        );
        f.write_str(&super::error::printable(&text))
    }
}

/// The environment variable that sets `key`.
pub fn env_name(key: &str) -> String {
    format!(
        "{}{}",
        super::env::PREFIX,
        key.replace('.', "__").to_uppercase()
    )
}

/// How strict a permission policy is (`allow` < `ask` < `deny`); anything else has no rank.
fn strictness(policy: &str) -> Option<u8> {
    match policy {
        "allow" => Some(0),
        "ask" => Some(1),
        "deny" => Some(2),
        _ => None,
    }
}

/// Removes the repository-controlled keys from a repository layer's data. `permission_below` is
/// the policy the lower layers set. Returns the withheld keys and their values (the caller adds
/// what is in force).
pub fn filter(dict: &mut Dict, permission_below: Option<&str>) -> Vec<(String, String)> {
    let mut withheld = Vec::new();
    for key in TRUST_KEYS {
        if let Some(value) = take(dict, key) {
            withheld.push((key.to_string(), show(&value)));
        }
    }
    // Judged on the raw value, whatever its shape: only a string naming a policy at least as
    // strict as the one below is taken. A map (`{allow: ~}`), a null, a number, a list or an
    // unknown word is withheld, never left for the typed extraction to read as a policy.
    let floor = permission_below.and_then(strictness).unwrap_or(0);
    let taken = lookup(dict, PERMISSION_KEY).map(|v| {
        v.as_str()
            .and_then(strictness)
            .is_some_and(|rank| rank >= floor)
    });
    if taken == Some(false) {
        if let Some(value) = take(dict, PERMISSION_KEY) {
            withheld.push((PERMISSION_KEY.to_string(), show(&value)));
        }
    }
    withheld
}

fn lookup<'a>(dict: &'a Dict, key: &str) -> Option<&'a Value> {
    let mut parts = key.split('.');
    let mut value = dict.get(parts.next()?)?;
    for part in parts {
        value = value.as_dict()?.get(part)?;
    }
    Some(value)
}

/// Removes the value at dotted `key`, returning it.
pub(super) fn take(dict: &mut Dict, key: &str) -> Option<Value> {
    match key.split_once('.') {
        None => dict.remove(key),
        Some((head, rest)) => match dict.get_mut(head)? {
            Value::Dict(_, inner) => take(inner, rest),
            _ => None,
        },
    }
}

/// A value as messages show it: strings in backticks, numbers as written, `~` for unset.
pub(super) fn show(value: &Value) -> String {
    match value {
        Value::String(_, s) => format!("`{s}`"),
        Value::Num(_, n) => n
            .to_u128()
            .map_or_else(|| format!("{n:?}"), |n| n.to_string()),
        Value::Empty(..) => "~".into(),
        other => serde_json::to_string(other).unwrap_or_else(|_| "(a value)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::Format;

    fn dict(yaml: &str) -> Dict {
        let data = super::super::yaml::Yaml::string(yaml);
        figment::Provider::data(&data)
            .expect("parses")
            .remove(&figment::Profile::Default)
            .expect("default profile")
    }

    #[test]
    fn trust_keys_are_withheld_and_the_surface_kept() {
        let mut d = dict(
            "opencode:\n  command: ./evil\n  url: http://example.invalid\n  permission: ask\nstate_dir: /tmp/x\ntimeouts:\n  task: 5m\n",
        );
        let withheld = filter(&mut d, Some("allow"));
        let keys: Vec<&str> = withheld.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["opencode.command", "opencode.url", "state_dir"]);
        assert!(lookup(&d, "opencode.command").is_none());
        assert_eq!(
            lookup(&d, "opencode.permission").and_then(|v| v.as_str()),
            Some("ask"),
            "tightening is applied"
        );
        assert!(lookup(&d, "timeouts.task").is_some());
    }

    #[test]
    fn loosening_the_permission_policy_is_withheld() {
        let mut d = dict("opencode:\n  permission: allow\n");
        let withheld = filter(&mut d, Some("ask"));
        assert_eq!(
            withheld,
            vec![(PERMISSION_KEY.to_string(), "`allow`".to_string())]
        );
        let mut same = dict("opencode:\n  permission: ask\n");
        assert!(filter(&mut same, Some("ask")).is_empty());
    }

    /// Every YAML shape a repository could write under `permission`: only a policy word at least
    /// as strict as the one below is taken; a map, a null, a number, a list or an unknown word is
    /// withheld (serde would read `{allow: ~}` as `allow`).
    #[test]
    fn only_a_word_at_least_as_strict_is_taken_whatever_the_shape() {
        let shapes = [
            "{allow: ~}",
            "\n    allow: null",
            "{deny: ~}",
            "~",
            "0",
            "2",
            "[deny]",
            "true",
            "DENY",
        ];
        for below in [None, Some("allow"), Some("ask"), Some("deny")] {
            for shape in shapes {
                let mut d = dict(&format!("opencode:\n  permission: {shape}\n  other: 1\n"));
                let withheld = filter(&mut d, below);
                assert_eq!(
                    withheld.iter().filter(|(k, _)| k == PERMISSION_KEY).count(),
                    1,
                    "shape `{shape}` over {below:?}: {withheld:?}"
                );
                assert!(
                    lookup(&d, PERMISSION_KEY).is_none(),
                    "shape `{shape}` over {below:?} is not left in the layer"
                );
            }
        }
        for (word, below, taken) in [
            ("allow", None, true),
            ("allow", Some("allow"), true),
            ("allow", Some("ask"), false),
            ("ask", Some("deny"), false),
            ("ask", Some("ask"), true),
            ("deny", Some("deny"), true),
            ("deny", None, true),
        ] {
            let mut d = dict(&format!("opencode:\n  permission: {word}\n"));
            let withheld = filter(&mut d, below);
            assert_eq!(withheld.is_empty(), taken, "{word} over {below:?}");
            assert_eq!(
                lookup(&d, PERMISSION_KEY).and_then(|v| v.as_str()),
                taken.then_some(word),
                "{word} over {below:?}"
            );
        }
    }

    #[test]
    fn the_env_name_of_a_key() {
        assert_eq!(
            env_name("opencode.command"),
            "OPENCODE_MCP_OPENCODE__COMMAND"
        );
        assert_eq!(env_name("state_dir"), "OPENCODE_MCP_STATE_DIR");
    }
}
