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

/// The isolation default, which a repository may only tighten (`none` < `worktree`).
pub const ISOLATION_KEY: &str = "isolation.mode";

/// Arguments a repository's tool entry may not fix: where the tool's tasks work, out of the
/// host's sight (a preset fixing `directory: /` runs every task in the root; one fixing
/// `isolation: none` edits the checkout). `isolation: worktree` is tightening and is taken.
pub const UNFIXABLE_ARGUMENTS: &[&str] = &["directory", "isolation"];

/// Spending caps, which a repository may only lower (a cap where the layers below set none is
/// lowering too).
pub const CAP_KEYS: &[&str] = &[
    "limits.max_cost_usd",
    "limits.max_tokens",
    "limits.max_cost_usd_per_day",
];

/// Limits a repository may only lower, like the caps: how many tasks run at once, how many
/// paid correction turns a structured answer gets, and how long a task may run. Each multiplies
/// what delegation spends.
pub const LIMIT_KEYS: &[&str] = &["limits.max_tasks", "limits.structured_retries"];
pub const DURATION_LIMIT_KEYS: &[&str] = &["timeouts.task"];

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
        let why = if CAP_KEYS.contains(&self.key.as_str()) {
            "a repository's delegation.yaml may lower a spending cap, never raise or remove it"
        } else if LIMIT_KEYS.contains(&self.key.as_str())
            || DURATION_LIMIT_KEYS.contains(&self.key.as_str())
        {
            "a repository's delegation.yaml may lower this limit, never raise it"
        } else if self.key == PERMISSION_KEY {
            "a repository's delegation.yaml may tighten the permission policy, never loosen it"
        } else if self.key == ISOLATION_KEY {
            "a repository's delegation.yaml may tighten isolation (`none` < `worktree`), never \
             loosen it"
        } else if self.key.starts_with("tiers.") {
            "a repository's delegation.yaml may not change which model or variant your tiers \
             run, nor raise or remove their caps"
        } else if self.key.starts_with("tools.") && self.key.ends_with(".action") {
            "a repository's delegation.yaml may change a tool's action only with a description \
             of its own (the host would read the old tool's description)"
        } else if self.key.starts_with("tools.") {
            "a repository's delegation.yaml may not fix where a tool's tasks work, out of the \
             host's sight (it may fix `isolation: worktree`)"
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

/// How strict an isolation mode is; anything else has no rank.
fn isolation_rank(mode: &str) -> Option<u8> {
    match mode {
        "none" => Some(0),
        "worktree" => Some(1),
        _ => None,
    }
}

/// Removes the settings of a repository layer that [`filter`] would withhold but that repeat
/// the value already in force below it (`in_force` reads the layers below; `None`: unset).
///
/// A repository that commits a copy of the resolved configuration (`print-config`) or of the
/// built-in file repeats `opencode.command: opencode`, `state_dir: ~` and the like. Those
/// change nothing, so there is nothing to withhold and nothing to warn about at every start,
/// and `check-config` has no reason to fail on them. A value that differs in any way is left
/// for [`filter`] to withhold and report.
pub fn drop_unchanged(dict: &mut Dict, in_force: &dyn Fn(&str) -> Option<Value>) {
    let mut keys: Vec<String> = TRUST_KEYS.iter().map(|k| k.to_string()).collect();
    if let Some(Value::Dict(_, tools)) = dict.get("tools") {
        for name in tools.keys() {
            keys.extend(
                UNFIXABLE_ARGUMENTS
                    .iter()
                    .map(|arg| format!("tools.{name}.{arg}")),
            );
        }
    }
    for key in keys {
        let unchanged = lookup(dict, &key).is_some_and(|v| same(v, in_force(&key).as_ref()));
        if unchanged {
            take(dict, &key);
        }
    }
}

/// Whether a repository's value is the one in force: equal contents (figment compares values,
/// not where they came from), numbers by value whatever their width, and an explicit null for
/// a key that is unset.
fn same(value: &Value, in_force: Option<&Value>) -> bool {
    match (value, in_force) {
        (Value::Empty(..), None | Some(Value::Empty(..))) => true,
        (Value::Num(_, a), Some(Value::Num(_, b))) => {
            number(a).is_some_and(|a| Some(a) == number(b))
        }
        (value, Some(in_force)) => value == in_force,
        (_, None) => false,
    }
}

/// A number as an `f64`, whichever width the parser gave it.
fn number(n: &figment::value::Num) -> Option<f64> {
    n.to_f64()
        .or_else(|| n.to_u128().map(|v| v as f64))
        .or_else(|| n.to_i128().map(|v| v as f64))
}

/// Removes the repository-controlled keys from a repository layer's data. `below` reads a
/// string setting of the layers below (the policy in force before this file, a tool's action).
/// Returns the withheld keys and their values (the caller adds what is in force).
pub fn filter(dict: &mut Dict, below: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let mut withheld = Vec::new();
    for key in TRUST_KEYS {
        if let Some(value) = take(dict, key) {
            withheld.push((key.to_string(), show(&value)));
        }
    }
    // Judged on the raw value, whatever its shape: only a string naming a setting at least as
    // strict as the one below is taken. A map (`{allow: ~}`), a null, a number, a list or an
    // unknown word is withheld, never left for the typed extraction to read as a setting.
    for (key, rank) in [
        (PERMISSION_KEY, strictness as fn(&str) -> Option<u8>),
        (ISOLATION_KEY, isolation_rank),
    ] {
        let floor = below(key).as_deref().and_then(rank).unwrap_or(0);
        let taken =
            lookup(dict, key).map(|v| v.as_str().and_then(rank).is_some_and(|r| r >= floor));
        if taken == Some(false) {
            if let Some(value) = take(dict, key) {
                withheld.push((key.to_string(), show(&value)));
            }
        }
    }
    if let Some(Value::Dict(_, tools)) = dict.get_mut("tools") {
        for (name, entry) in tools.iter_mut() {
            let Value::Dict(_, entry) = entry else {
                continue;
            };
            for arg in UNFIXABLE_ARGUMENTS {
                // Fixing the stricter isolation is tightening, and taken.
                let tightens = *arg == "isolation"
                    && entry.get(*arg).and_then(|v| v.as_str()) == Some("worktree");
                if tightens {
                    continue;
                }
                if let Some(value) = entry.remove(*arg) {
                    withheld.push((format!("tools.{name}.{arg}"), show(&value)));
                }
            }
            let action = entry
                .get("action")
                .and_then(|v| v.as_str().map(str::to_string));
            let was = below(&format!("tools.{name}.action"));
            // Only a real action is judged here; a misspelt one is left for the typed
            // extraction to report.
            let is_action = |a: &str| {
                serde_json::from_value::<super::types::Action>(serde_json::json!(a)).is_ok()
            };
            let changed =
                matches!((&action, &was), (Some(new), Some(old)) if new != old && is_action(new));
            if changed && !entry.contains_key("description") {
                if let Some(value) = entry.remove("action") {
                    withheld.push((format!("tools.{name}.action"), show(&value)));
                }
            }
        }
    }
    withheld
}

/// Removes the spending caps a repository layer would raise or remove ([`CAP_KEYS`]). `below`
/// reads the cap the layers below set (`None`: no cap). Judged on the raw value: only a number
/// at most the one below is taken; a null (no cap), a string, a map or anything else is
/// withheld when there is a cap below, so the typed extraction never sees it. Returns the
/// withheld keys and their values.
pub fn filter_caps(dict: &mut Dict, below: &dyn Fn(&str) -> Option<f64>) -> Vec<(String, String)> {
    let mut withheld = Vec::new();
    for key in CAP_KEYS.iter().chain(LIMIT_KEYS) {
        let Some(value) = lookup(dict, key) else {
            continue;
        };
        let given = match value {
            Value::Num(_, n) => number(n),
            _ => None,
        };
        let taken = match (given, below(key)) {
            (Some(v), Some(cap)) => v <= cap,
            (Some(_), None) => true,
            // A limit that is no number is left to the typed extraction, which reports it.
            (None, _) if LIMIT_KEYS.contains(key) => true,
            // No number: only harmless when nothing below caps it either (the typed extraction
            // then reports a wrong shape).
            (None, cap) => cap.is_none(),
        };
        if !taken {
            if let Some(value) = take(dict, key) {
                withheld.push((key.to_string(), show(&value)));
            }
        }
    }
    withheld
}

/// Removes the durations in [`DURATION_LIMIT_KEYS`] a repository layer would raise: taken only
/// when it reads as a duration at most the one below. Returns the withheld keys and values.
pub fn filter_durations(
    dict: &mut Dict,
    below: &dyn Fn(&str) -> Option<std::time::Duration>,
) -> Vec<(String, String)> {
    let mut withheld = Vec::new();
    for key in DURATION_LIMIT_KEYS {
        let Some(value) = lookup(dict, key) else {
            continue;
        };
        let given = value
            .as_str()
            .and_then(|t| t.parse::<super::HumanDuration>().ok())
            .map(super::HumanDuration::get);
        let taken = match (given, below(key)) {
            (Some(v), Some(limit)) => v <= limit,
            // No duration: left to the typed extraction, which reports it naming the file.
            (None, _) | (_, None) => true,
        };
        if !taken {
            if let Some(value) = take(dict, key) {
                withheld.push((key.to_string(), show(&value)));
            }
        }
    }
    withheld
}

/// Holds a repository's `tiers` to the user's: a tier the user's layers define keeps their
/// `models` and `variant` (which model a tier means decides where the code goes and what it
/// costs), and its `max_cost_usd` / `max_tokens` may only go down (one left out keeps the
/// user's). A tier of a new name, or any tier when only the built-in list is below (it names no
/// model and no cap), is the repository's own, under `limits`. The list itself is
/// still the repository's (figment replaces lists whole): a tier it leaves out is not offered.
/// Returns the withheld keys (`tiers.<name>.<field>`) and their values.
pub fn filter_tiers(dict: &mut Dict, below: &[super::Tier]) -> Vec<(String, String)> {
    let mut withheld = Vec::new();
    let Some(Value::Array(_, tiers)) = dict.get_mut("tiers") else {
        return withheld;
    };
    for tier in tiers.iter_mut() {
        let Value::Dict(_, fields) = tier else {
            continue;
        };
        let Some(name) = fields
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            continue;
        };
        let Some(mine) = below.iter().find(|b| b.name == name) else {
            continue;
        };
        let mut hold = |field: &str, user: Option<Value>, keep: &dyn Fn(&Value) -> bool| {
            let given = fields.get(field).cloned();
            if given.as_ref().is_some_and(keep) {
                return;
            }
            if let Some(g) = &given {
                withheld.push((format!("tiers.{name}.{field}"), show(g)));
            }
            match user {
                Some(v) => {
                    fields.insert(field.to_string(), v);
                }
                None => {
                    fields.remove(field);
                }
            }
        };
        let models = as_value(&mine.models);
        let same_models = |g: &Value| models.as_ref().is_some_and(|m| show(m) == show(g));
        hold("models", models.clone(), &same_models);
        let variant = mine.variant.as_ref().and_then(as_value);
        let same_variant = |g: &Value| variant.as_ref().is_some_and(|v| show(v) == show(g));
        hold("variant", variant.clone(), &same_variant);
        for (field, cap) in [
            ("max_cost_usd", mine.max_cost_usd),
            ("max_tokens", mine.max_tokens.map(|t| t as f64)),
        ] {
            let Some(cap) = cap else {
                continue;
            };
            let user = match field {
                "max_tokens" => mine.max_tokens.and_then(|t| as_value(&t)),
                _ => as_value(&cap),
            };
            let lower =
                |g: &Value| matches!(g, Value::Num(_, n) if number(n).is_some_and(|v| v <= cap));
            hold(field, user, &lower);
        }
    }
    withheld
}

/// A value as figment data.
fn as_value<T: serde::Serialize>(v: &T) -> Option<Value> {
    Value::serialize(v).ok()
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

    /// The layers below as `filter` reads them: only a permission policy.
    fn policy(permission: Option<&str>) -> impl Fn(&str) -> Option<String> {
        let permission = permission.map(str::to_string);
        move |key| {
            (key == PERMISSION_KEY)
                .then(|| permission.clone())
                .flatten()
        }
    }

    /// Isolation is only tightened; a tool entry may not fix where its tasks work; an action
    /// change needs its own description.
    #[test]
    fn isolation_tool_locations_and_borrowed_descriptions_are_withheld() {
        let below = |key: &str| match key {
            ISOLATION_KEY => Some("worktree".to_string()),
            "tools.opencode_get_task_result.action" => Some("get_task_result".to_string()),
            _ => None,
        };
        let mut d = dict(
            "isolation:\n  mode: none\ntools:\n  opencode_get_task_result:\n    action: discard_task\n  fix:\n    action: start_task\n    description: d\n    directory: /\n    isolation: none\n    tier: fast\n",
        );
        let mut keys: Vec<String> = filter(&mut d, &below).into_iter().map(|(k, _)| k).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "isolation.mode",
                "tools.fix.directory",
                "tools.fix.isolation",
                "tools.opencode_get_task_result.action"
            ]
        );
        assert!(
            lookup(&d, "tools.fix.tier").is_some(),
            "other fixed values stay"
        );
        // Tightening, and an action change that brings its own description, are taken.
        let mut ok = dict(
            "isolation:\n  mode: worktree\ntools:\n  opencode_get_task_result:\n    action: discard_task\n    description: Discards.\n",
        );
        assert!(filter(&mut ok, &below).is_empty());
        let mut stricter =
            dict("tools:\n  fix:\n    action: start_task\n    isolation: worktree\n");
        assert!(filter(&mut stricter, &below).is_empty());
        let mut tighter = dict("isolation:\n  mode: worktree\n");
        assert!(filter(&mut tighter, &|_: &str| Some("none".to_string())).is_empty());
    }

    /// A repository repeating what is in force loses nothing and is told nothing; any other
    /// value is still withheld. Numbers compare by value (YAML gives `0` a narrower width than
    /// the layer below may have).
    #[test]
    fn values_already_in_force_are_dropped_quietly() {
        let in_force = |key: &str| match key {
            "opencode.command" => Some(Value::from("opencode")),
            "opencode.port" => Some(Value::from(0u64)),
            "opencode.hostname" => Some(Value::from("127.0.0.1")),
            "tools.review.isolation" => Some(Value::from("none")),
            _ => None,
        };
        let mut d = dict(
            "opencode:\n  command: opencode\n  port: 0\n  url: ~\n  hostname: 0.0.0.0\nstate_dir: ~\ntools:\n  review:\n    isolation: none\n  fix:\n    directory: /\n    isolation: none\n",
        );
        drop_unchanged(&mut d, &in_force);
        let keys: Vec<String> = filter(&mut d, &policy(None))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            [
                "opencode.hostname",
                "tools.fix.directory",
                "tools.fix.isolation"
            ]
        );
    }

    #[test]
    fn trust_keys_are_withheld_and_the_surface_kept() {
        let mut d = dict(
            "opencode:\n  command: ./evil\n  url: http://example.invalid\n  permission: ask\nstate_dir: /tmp/x\ntimeouts:\n  task: 5m\n",
        );
        let withheld = filter(&mut d, &policy(Some("allow")));
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
        let withheld = filter(&mut d, &policy(Some("ask")));
        assert_eq!(
            withheld,
            vec![(PERMISSION_KEY.to_string(), "`allow`".to_string())]
        );
        let mut same = dict("opencode:\n  permission: ask\n");
        assert!(filter(&mut same, &policy(Some("ask"))).is_empty());
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
                let withheld = filter(&mut d, &policy(below));
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
            let withheld = filter(&mut d, &policy(below));
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
    /// A repository may lower a spending cap or set one where none is, never raise or remove
    /// one, whatever shape its value has.
    #[test]
    fn a_repository_may_only_lower_spending_caps() {
        let below = |cap: Option<f64>| {
            move |key: &str| (key == "limits.max_cost_usd").then_some(cap).flatten()
        };
        for (yaml, cap, taken) in [
            ("limits: {max_cost_usd: 0.5}", Some(1.0), true),
            ("limits: {max_cost_usd: 1}", Some(1.0), true),
            ("limits: {max_cost_usd: 2}", Some(1.0), false),
            ("limits: {max_cost_usd: ~}", Some(1.0), false),
            ("limits: {max_cost_usd: '0.5'}", Some(1.0), false),
            ("limits: {max_cost_usd: {a: 1}}", Some(1.0), false),
            ("limits: {max_cost_usd: 100}", None, true),
            ("limits: {max_cost_usd: ~}", None, true),
        ] {
            let mut d = dict(yaml);
            let withheld = filter_caps(&mut d, &below(cap));
            assert_eq!(
                withheld.is_empty(),
                taken,
                "{yaml} over {cap:?}: {withheld:?}"
            );
            assert_eq!(
                lookup(&d, "limits.max_cost_usd").is_some(),
                taken,
                "{yaml} over {cap:?}: left in the layer only when taken"
            );
        }
    }

    /// The rest of the rules, each on the shape that reaches it: a withheld cap says why in
    /// its own words, an isolation word nobody ranks is withheld under any floor, and a tool
    /// entry that is not a map is left for the typed extraction to report.
    #[test]
    fn unranked_isolation_words_non_map_tools_and_the_reason_for_a_cap() {
        let withheld = Withheld {
            file: PathBuf::from("/r/delegation.yaml"),
            key: "limits.max_cost_usd".to_string(),
            value: "5".to_string(),
            in_force: "1 (built-in delegation.yaml)".to_string(),
        }
        .to_string();
        assert!(
            withheld.contains("may lower a spending cap, never raise or remove it"),
            "{withheld}"
        );

        let mut d = dict("isolation:\n  mode: sandbox\ntools:\n  odd: 3\n");
        let keys: Vec<String> = filter(&mut d, &policy(None))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["isolation.mode"], "an unknown mode is withheld");
        assert!(lookup(&d, "isolation.mode").is_none());
        assert!(
            matches!(lookup(&d, "tools.odd"), Some(Value::Num(..))),
            "a tool entry that is not a map stays for the typed extraction"
        );
    }
}
