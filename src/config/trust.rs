//! The trust boundary of the configuration layers: what a repository's `delegation.yaml` may set.
//!
//! The `delegation.yaml` in the directory the host starts the gateway in is the *repository's*
//! file: whoever wrote the repository wrote it, and cloning a repository must not let it choose
//! what the gateway executes, where it sends prompts and code, which secret goes with them, where
//! task output is kept, or how much delegation may spend. [`POLICY`] is the whole rule, one row
//! per key pattern, each saying what a repository's value gets: taken as written ([`Rule::Free`]),
//! withheld, taken only when it lowers (a cap, a limit, a timeout) or tightens (the permission
//! policy, isolation) what the layers below set, or, for a tool's fixed argument, taken only when
//! it is the safe value. The tools, prompts, instructions, new tiers and most limits stay the
//! surface a repository is meant to tune. A withheld value is reported ([`Withheld`]) with what
//! is in force instead.
//!
//! The user's own layers (their global file, `--config`, the environment) may set every key. A
//! repository file named explicitly with `--config` is the user vouching for it, and is loaded as
//! that trusted layer only.

use std::fmt;
use std::path::PathBuf;

use figment::value::{Dict, Value};

/// What a repository's value for a key gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Taken as written: the surface a repository tunes.
    Free,
    /// Never taken.
    Withheld,
    /// Taken when it is at most the value below (numbers, or durations such as `10m`); where
    /// nothing is set below, any value lowers. Unsetting (`~`) a value set below is raising it.
    OnlyLower,
    /// Taken when it is one of these words (loosest first) and at least as strict as the word
    /// below (unset below: the loosest).
    OnlyTighter(&'static [&'static str]),
    /// A tool's fixed argument, taken only as one of these values: fixing any other value would
    /// choose, out of the host's sight, what the host itself may only choose knowingly.
    OnlyFixedTo(&'static [&'static str]),
    /// Taken only when the user's own layers set this boolean key to `true` (a repository's file
    /// cannot set it: its row is [`Rule::Withheld`]).
    AllowedBy(&'static str),
    /// A tool's `action`, taken when it stays the same or the entry brings its own description
    /// (else the host would read the old tool's description over the new action).
    WithOwnDescription,
}

/// One row of the policy: keys matching `pattern` (dotted; `*` is one segment, a tier's or a
/// tool's or a host's name) get `rule`, for the reason `why` (shown with a withheld value).
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub pattern: &'static str,
    pub rule: Rule,
    pub why: &'static str,
}

const RUNS: &str = "a repository's delegation.yaml may not choose what the gateway runs, where it \
                    connects, which secret it sends or where it keeps data";
const CAP: &str =
    "a repository's delegation.yaml may lower a spending cap, never raise or remove it";
const LIMIT: &str = "a repository's delegation.yaml may lower this limit, never raise it";
const TIER: &str = "a repository's delegation.yaml may not change which model or variant your \
                    tiers run, nor raise or remove their caps";
const WHERE: &str = "a repository's delegation.yaml may not fix, out of the host's sight, where \
                     a tool's tasks run, on which server, with which agent, or what they answer";
const FREE: &str = "the surface a repository tunes";
const CHECKS: &str = "a check is a command the gateway runs: a repository's delegation.yaml may \
                      declare checks only where your own file sets `checks.from_repository: true`";
/// A tier's opt-out of the sandbox: withheld from a repository's file even on a tier of its
/// own (the rest of which is the repository's to fill in).
const TIER_SANDBOX: &str = "tiers.*.sandbox";
/// The key that lets a repository's file declare checks.
pub const CHECKS_FROM_REPOSITORY: &str = "checks.from_repository";
const RANKS_PERMISSION: &[&str] = &["allow", "ask", "deny"];
const RANKS_ISOLATION: &[&str] = &["none", "worktree"];
const RANKS_BASE: &[&str] = &["working_tree", "head"];
const RANKS_COUNT: &[&str] = &["utf16", "bytes"];

/// What a repository's `delegation.yaml` may set, key by key. The first row whose pattern
/// matches a key decides it; a key no row matches is taken (a test checks that every key of the
/// configuration has a row). Tier rows apply to a tier your own layers define; a tier of a new
/// name, or a built-in one (which names no model and no cap), is the repository's to fill in.
pub const POLICY: &[Policy] = &[
    // What runs, where it connects, which secret is sent, where data lands.
    Policy {
        pattern: "opencode.command",
        rule: Rule::Withheld,
        why: RUNS,
    },
    Policy {
        pattern: "opencode.url",
        rule: Rule::Withheld,
        why: RUNS,
    },
    Policy {
        pattern: "opencode.hostname",
        rule: Rule::Withheld,
        why: RUNS,
    },
    Policy {
        pattern: "opencode.port",
        rule: Rule::Withheld,
        why: RUNS,
    },
    Policy {
        pattern: "opencode.password_env",
        rule: Rule::Withheld,
        why: RUNS,
    },
    Policy {
        pattern: "state_dir",
        rule: Rule::Withheld,
        why: RUNS,
    },
    Policy {
        pattern: "workers",
        rule: Rule::Withheld,
        why: "a repository's delegation.yaml may not add, choose or change workers: they decide \
              which machines your code is sent to and what runs there",
    },
    Policy {
        pattern: "sandbox",
        rule: Rule::Withheld,
        why: "a repository's delegation.yaml may not loosen or change the sandbox its own \
              agents run in",
    },
    Policy {
        pattern: "dashboard",
        rule: Rule::Withheld,
        why: "a repository's delegation.yaml may not open a page that shows your tasks and can \
              cancel them",
    },
    Policy {
        pattern: CHECKS_FROM_REPOSITORY,
        rule: Rule::Withheld,
        why: CHECKS,
    },
    Policy {
        pattern: TIER_SANDBOX,
        rule: Rule::Withheld,
        why: "a repository's delegation.yaml may not loosen or change the sandbox its own \
              agents run in",
    },
    Policy {
        pattern: "tiers.*.checks",
        rule: Rule::AllowedBy(CHECKS_FROM_REPOSITORY),
        why: CHECKS,
    },
    Policy {
        pattern: "tools.*.checks",
        rule: Rule::AllowedBy(CHECKS_FROM_REPOSITORY),
        why: CHECKS,
    },
    Policy {
        pattern: "checks.max_rounds",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "checks.from_calls",
        rule: Rule::Withheld,
        why: CHECKS,
    },
    Policy {
        pattern: "checks.named",
        rule: Rule::AllowedBy(CHECKS_FROM_REPOSITORY),
        why: CHECKS,
    },
    Policy {
        pattern: "checks.output_chars",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "checks.*",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "opencode.permission",
        rule: Rule::OnlyTighter(RANKS_PERMISSION),
        why: "a repository's delegation.yaml may tighten the permission policy, never loosen it",
    },
    Policy {
        pattern: "isolation.mode",
        rule: Rule::OnlyTighter(RANKS_ISOLATION),
        why: "a repository's delegation.yaml may tighten isolation (`none` < `worktree`), never \
              loosen it",
    },
    Policy {
        pattern: "isolation.base",
        rule: Rule::OnlyTighter(RANKS_BASE),
        why: "a repository's delegation.yaml may not bring your uncommitted and untracked files \
              into agents' worktrees (`head` is taken, `working_tree` only where it is in force)",
    },
    // What delegation spends, and how long it may hold the host and the machine.
    Policy {
        pattern: "limits.max_cost_usd",
        rule: Rule::OnlyLower,
        why: CAP,
    },
    Policy {
        pattern: "limits.max_tokens",
        rule: Rule::OnlyLower,
        why: CAP,
    },
    Policy {
        pattern: "limits.max_cost_usd_per_day",
        rule: Rule::OnlyLower,
        why: CAP,
    },
    Policy {
        pattern: "limits.max_tasks",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "limits.queue",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "limits.linger",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "limits.structured_retries",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "limits.max_result_chars",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "limits.result_page_chars",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "limits.*",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "timeouts.task",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "timeouts.request",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "timeouts.wait_default",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "timeouts.wait_max",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "timeouts.check",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "timeouts.*",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "hosts.*.result_chars",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "hosts.*.wait_max",
        rule: Rule::OnlyLower,
        why: LIMIT,
    },
    Policy {
        pattern: "hosts.*.count",
        rule: Rule::OnlyTighter(RANKS_COUNT),
        why: "a repository's delegation.yaml may count a host's result in bytes (never larger \
              than utf16), not the other way round",
    },
    // Your tiers: which model they mean decides where the code goes and what it costs.
    Policy {
        pattern: "tiers.*.models",
        rule: Rule::Withheld,
        why: TIER,
    },
    Policy {
        pattern: "tiers.*.variant",
        rule: Rule::Withheld,
        why: TIER,
    },
    Policy {
        pattern: "tiers.*.escalate_to",
        rule: Rule::Withheld,
        why: TIER,
    },
    Policy {
        pattern: "tiers.*.fallback_models",
        rule: Rule::Withheld,
        why: TIER,
    },
    Policy {
        pattern: "tiers.*.max_cost_usd",
        rule: Rule::OnlyLower,
        why: TIER,
    },
    Policy {
        pattern: "tiers.*.max_tokens",
        rule: Rule::OnlyLower,
        why: TIER,
    },
    Policy {
        pattern: "tiers.*.*",
        rule: Rule::Free,
        why: FREE,
    },
    // A tool's fixed arguments (a preset): where its tasks work and what they may do.
    Policy {
        pattern: "tools.*.action",
        rule: Rule::WithOwnDescription,
        why: "a repository's delegation.yaml may change a tool's action only with a description \
              of its own (the host would read the old tool's description)",
    },
    Policy {
        pattern: "tools.*.directory",
        rule: Rule::Withheld,
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.server_id",
        rule: Rule::Withheld,
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.port",
        rule: Rule::Withheld,
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.agent",
        rule: Rule::Withheld,
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.isolation",
        rule: Rule::OnlyFixedTo(&["worktree"]),
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.base",
        rule: Rule::OnlyFixedTo(&["head"]),
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.reply",
        rule: Rule::OnlyFixedTo(&["reject"]),
        why: WHERE,
    },
    Policy {
        pattern: "tools.*.*",
        rule: Rule::Free,
        why: FREE,
    },
    // The words the host reads, and the rest.
    Policy {
        pattern: "instructions",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "prompts",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "tiers",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "report",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "reload",
        rule: Rule::Free,
        why: FREE,
    },
    Policy {
        pattern: "$schema",
        rule: Rule::Free,
        why: FREE,
    },
];

/// The row deciding `key`: the first whose pattern matches it, segment by segment.
pub fn policy_for(key: &str) -> Option<&'static Policy> {
    POLICY.iter().find(|p| matches(p.pattern, key))
}

fn matches(pattern: &str, key: &str) -> bool {
    let (mut p, mut k) = (pattern.split('.'), key.split('.'));
    loop {
        match (p.next(), k.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == "*" || a == b => {}
            _ => return false,
        }
    }
}

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
        let why = policy_for(&self.key).map_or(RUNS, |p| p.why);
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

/// What the layers below the repository's file hold.
pub struct Below<'a> {
    /// The value of a dotted key in force below (`None`: unset).
    pub value: &'a dyn Fn(&str) -> Option<Value>,
    /// The tiers the user's own layers define (not the built-in list: its tiers name no model
    /// and no cap, and a repository may fill those in).
    pub tiers: &'a [super::Tier],
}

/// Applies [`POLICY`] to a repository layer's data: a value not taken is removed (for a tier,
/// replaced by the user's own), and returned with its dotted key. A value that repeats what is
/// in force is dropped quietly, whatever its rule: a repository that commits a copy of the
/// resolved configuration (`print-config`) changes nothing, so there is nothing to report at
/// every start, and `check-config` has no reason to fail on it.
pub fn filter(dict: &mut Dict, below: &Below) -> Vec<(String, String)> {
    let mut withheld = Vec::new();
    walk(dict, "", below, &mut withheld);
    if let Some(Value::Array(_, tiers)) = dict.get_mut("tiers") {
        filter_tiers(tiers, below, &mut withheld);
    }
    withheld
}

/// Judges each key of `dict` (at `prefix`) by its row; a key without a row of its own is
/// looked into, if it is a map.
fn walk(dict: &mut Dict, prefix: &str, below: &Below, out: &mut Vec<(String, String)>) {
    let keys: Vec<String> = dict.keys().cloned().collect();
    for key in keys {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match policy_for(&path).map(|p| p.rule) {
            Some(Rule::Free) => {}
            Some(rule) => {
                let in_force = in_force_below(&path, below);
                let Some(value) = dict.get(&key) else {
                    continue;
                };
                if same(value, in_force.as_ref()) {
                    dict.remove(&key);
                } else if !taken(rule, value, in_force.as_ref(), dict) || !allowed(rule, below) {
                    if let Some(value) = dict.remove(&key) {
                        out.push((path, show(&value)));
                    }
                }
            }
            None => {
                if let Some(Value::Dict(_, inner)) = dict.get_mut(&key) {
                    walk(inner, &path, below, out);
                }
            }
        }
    }
}

/// The value in force below for `path`; a host the layers below do not name is held to what
/// they set for `hosts.default` (the entry such a host would get).
fn in_force_below(path: &str, below: &Below) -> Option<Value> {
    let set = |key: &str| (below.value)(key).filter(|v| !matches!(v, Value::Empty(..)));
    set(path).or_else(|| match path.split('.').collect::<Vec<_>>().as_slice() {
        ["hosts", _, field] => set(&format!("hosts.default.{field}")),
        _ => None,
    })
}

/// Whether a repository's `value` is taken under `rule`, over `below` (the value in force
/// before this file; `None`: unset). `entry` is the map the value sits in (a tool's entry, for
/// its description). Judged on the raw value, whatever its shape: a value that is no number or
/// duration where one is compared is left for the typed extraction to report (naming the
/// file), except a number written as a string, which is compared as the number it would be.
fn taken(rule: Rule, value: &Value, below: Option<&Value>, entry: &Dict) -> bool {
    match rule {
        Rule::Free => true,
        Rule::Withheld => false,
        Rule::OnlyLower => match below {
            None => true,
            Some(below) => match (magnitude(value), magnitude(below)) {
                (Some(v), Some(b)) => v <= b,
                // Unsetting a limit set below removes it: raising it as far as it goes.
                _ if matches!(value, Value::Empty(..)) => false,
                _ => true,
            },
        },
        Rule::OnlyTighter(ranks) => {
            let rank = |v: &Value| v.as_str().and_then(|s| ranks.iter().position(|r| *r == s));
            let floor = below.and_then(rank).unwrap_or(0);
            rank(value).is_some_and(|r| r >= floor)
        }
        Rule::OnlyFixedTo(allowed) => value.as_str().is_some_and(|v| allowed.contains(&v)),
        // Judged against the user's layers by `allowed`.
        Rule::AllowedBy(_) => true,
        Rule::WithOwnDescription => {
            // Only a real action is judged; a misspelt one is left for the typed extraction.
            let is_action = |a: &str| {
                serde_json::from_value::<super::types::Action>(serde_json::json!(a)).is_ok()
            };
            let changed = match (value.as_str(), below.and_then(Value::as_str)) {
                (Some(new), Some(old)) => new != old && is_action(new),
                _ => false,
            };
            !changed || entry.contains_key("description")
        }
    }
}

/// Whether the user's layers allow what `rule` makes conditional ([`Rule::AllowedBy`]).
fn allowed(rule: Rule, below: &Below) -> bool {
    match rule {
        Rule::AllowedBy(key) => matches!((below.value)(key), Some(Value::Bool(_, true))),
        _ => true,
    }
}

/// A number, or a duration in seconds, as a comparable magnitude.
fn magnitude(value: &Value) -> Option<f64> {
    match value {
        Value::Num(_, n) => number(n),
        Value::String(_, s) => s.trim().parse::<f64>().ok().or_else(|| {
            s.parse::<super::HumanDuration>()
                .ok()
                .map(|d| d.get().as_secs_f64())
        }),
        _ => None,
    }
}

/// Holds a repository's `tiers` to the user's (`below`): in a tier the user defines, each field
/// with a rule of its own is judged against the user's value; one not taken, or left out, is
/// the user's. The list itself is still the repository's (figment replaces lists whole): a tier
/// it leaves out is not offered.
fn filter_tiers(tiers: &mut [Value], below: &Below, out: &mut Vec<(String, String)>) {
    let user_tiers = below.tiers;
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
        let Some(mine) = user_tiers.iter().find(|b| b.name == name) else {
            // A tier of the repository's own: its to fill in, except what runs and how it is
            // confined.
            let conditional = POLICY
                .iter()
                .filter(|p| matches!(p.rule, Rule::AllowedBy(_)) || p.pattern == TIER_SANDBOX);
            for p in conditional {
                let Some(field) = p.pattern.strip_prefix("tiers.*.") else {
                    continue;
                };
                if p.pattern == TIER_SANDBOX || !allowed(p.rule, below) {
                    if let Some(given) = fields.remove(field) {
                        out.push((format!("tiers.{name}.{field}"), show(&given)));
                    }
                }
            }
            continue;
        };
        let Some(Value::Dict(_, user)) = Value::serialize(mine).ok() else {
            continue;
        };
        let governed = POLICY
            .iter()
            .filter(|p| p.rule != Rule::Free)
            .filter_map(|p| p.pattern.strip_prefix("tiers.*."));
        for field in governed {
            let path = format!("tiers.{name}.{field}");
            let user_value = user.get(field).filter(|v| !matches!(v, Value::Empty(..)));
            let Some(rule) = policy_for(&path).map(|p| p.rule) else {
                continue;
            };
            let keep = match fields.get(field) {
                None => false,
                Some(given) => {
                    same(given, user_value)
                        || (taken(rule, given, user_value, fields) && allowed(rule, below))
                }
            };
            if keep {
                continue;
            }
            if let Some(given) = fields.remove(field) {
                out.push((path, show(&given)));
            }
            if let Some(v) = user_value {
                fields.insert(field.to_string(), v.clone());
            }
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

#[cfg(test)]
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

    /// Filters `yaml` over the layers below as `below` gives them (no tiers of the user's);
    /// returns the withheld keys and what is left.
    fn run(yaml: &str, below: &dyn Fn(&str) -> Option<Value>) -> (Vec<String>, Dict) {
        let mut d = dict(yaml);
        let keys = filter(
            &mut d,
            &Below {
                value: below,
                tiers: &[],
            },
        )
        .into_iter()
        .map(|(k, _)| k)
        .collect();
        (keys, d)
    }

    /// The layers below: only a permission policy.
    fn policy(permission: Option<&'static str>) -> impl Fn(&str) -> Option<Value> {
        move |key| (key == "opencode.permission").then(|| permission.map(Value::from))?
    }

    /// Every key the configuration has (the built-in file, with every optional key filled in)
    /// has a row of its own or under a section's: a key added later must be classified here,
    /// not taken by default.
    #[test]
    fn every_key_of_the_configuration_has_a_row() {
        let built_in = dict(super::super::DEFAULT_YAML);
        let mut keys = Vec::new();
        fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Dict(_, d) if !d.is_empty() => {
                    for (k, v) in d {
                        let p = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        leaves(&p, v, out);
                    }
                }
                _ => out.push(prefix.to_string()),
            }
        }
        for (k, v) in &built_in {
            leaves(k, v, &mut keys);
        }
        for extra in [
            "tiers.fast.models",
            "tiers.fast.variant",
            "tiers.fast.max_cost_usd",
            "tiers.fast.max_tokens",
            "tiers.fast.handles",
            "tools.x.agent",
            "tools.x.server_id",
            "tools.x.port",
            "tools.x.base",
            "tools.x.reply",
            "tools.x.tier",
            "hosts.x.count",
            "workers.x.ssh",
            "workers.local.max_tasks",
        ] {
            keys.push(extra.to_string());
        }
        let unclassified: Vec<&String> = keys
            .iter()
            .filter(|k| {
                let parts: Vec<&str> = k.split('.').collect();
                !(1..=parts.len()).any(|n| policy_for(&parts[..n].join(".")).is_some())
            })
            .collect();
        assert!(
            unclassified.is_empty(),
            "keys without a row: {unclassified:?}"
        );
        assert!(keys.iter().any(|k| k == "limits.max_tasks"), "{keys:?}");
    }

    /// A repository's file cannot add a worker, nor change one or the local machine's slots.
    #[test]
    fn workers_are_the_users_alone() {
        let (keys, d) = run(
            "workers:\n  evil:\n    ssh: attacker@example.org\n    max_tasks: 9\n  local:\n    max_tasks: 500\n",
            &|_| None,
        );
        assert_eq!(keys, ["workers"]);
        assert!(!d.contains_key("workers"), "{d:?}");
    }

    /// Isolation is only tightened; a tool entry may not fix where its tasks work, on which
    /// server or with which agent, and fixes `isolation`, `base` and `reply` only to the safe
    /// value; an action change needs its own description.
    #[test]
    fn isolation_tool_presets_and_borrowed_descriptions_are_withheld() {
        let below = |key: &str| match key {
            "isolation.mode" => Some(Value::from("worktree")),
            "tools.opencode_get_task_result.action" => Some(Value::from("get_task_result")),
            _ => None,
        };
        let (mut keys, d) = run(
            "isolation:\n  mode: none\ntools:\n  opencode_get_task_result:\n    action: discard_task\n  fix:\n    action: start_task\n    description: d\n    directory: /\n    isolation: none\n    tier: fast\n    agent: yolo\n    server_id: other\n    base: working_tree\n  server:\n    action: start_server\n    port: 22\n  approve:\n    action: reply_permission\n    reply: always\n",
            &below,
        );
        keys.sort();
        assert_eq!(
            keys,
            [
                "isolation.mode",
                "tools.approve.reply",
                "tools.fix.agent",
                "tools.fix.base",
                "tools.fix.directory",
                "tools.fix.isolation",
                "tools.fix.server_id",
                "tools.opencode_get_task_result.action",
                "tools.server.port",
            ]
        );
        assert!(
            lookup(&d, "tools.fix.tier").is_some(),
            "other fixed values stay"
        );
        // Tightening, the safe fixed values, and an action change that brings its own
        // description, are taken.
        let (keys, _) = run(
            "isolation:\n  mode: worktree\ntools:\n  opencode_get_task_result:\n    action: discard_task\n    description: Discards.\n  fix:\n    isolation: worktree\n    base: head\n  refuse:\n    reply: reject\n",
            &below,
        );
        assert!(keys.is_empty(), "{keys:?}");
        let (keys, _) = run("isolation:\n  mode: worktree\n", &|_: &str| {
            Some(Value::from("none"))
        });
        assert!(keys.is_empty(), "{keys:?}");
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
        let (keys, _) = run(
            "opencode:\n  command: opencode\n  port: 0\n  url: ~\n  hostname: 0.0.0.0\nstate_dir: ~\ntools:\n  review:\n    isolation: none\n  fix:\n    directory: /\n    isolation: none\n",
            &in_force,
        );
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
        let (keys, d) = run(
            "opencode:\n  command: ./evil\n  url: http://example.invalid\n  permission: ask\nstate_dir: /tmp/x\ntimeouts:\n  task: 5m\n",
            &policy(Some("allow")),
        );
        assert_eq!(keys, ["opencode.command", "opencode.url", "state_dir"]);
        assert!(lookup(&d, "opencode.command").is_none());
        assert_eq!(
            lookup(&d, "opencode.permission").and_then(|v| v.as_str()),
            Some("ask"),
            "tightening is applied"
        );
        assert!(lookup(&d, "timeouts.task").is_some());
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
                let yaml = format!("opencode:\n  permission: {shape}\n  other: 1\n");
                let (keys, d) = run(&yaml, &policy(below));
                // A null over an unset policy repeats it, and is dropped quietly.
                let quiet = shape == "~" && below.is_none();
                assert_eq!(
                    keys.iter().filter(|k| *k == "opencode.permission").count(),
                    usize::from(!quiet),
                    "shape `{shape}` over {below:?}: {keys:?}"
                );
                assert!(
                    lookup(&d, "opencode.permission").is_none(),
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
            let (keys, d) = run(
                &format!("opencode:\n  permission: {word}\n"),
                &policy(below),
            );
            assert_eq!(keys.is_empty(), taken, "{word} over {below:?}");
            // Taken, or repeating what is in force (then dropped: the same value applies).
            let left = lookup(&d, "opencode.permission").and_then(|v| v.as_str());
            let expected = match (taken, below == Some(word)) {
                (true, false) => Some(word),
                _ => None,
            };
            assert_eq!(left, expected, "{word} over {below:?}");
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
    /// one; a number written as a string counts as that number; another shape is left for the
    /// typed extraction to report.
    #[test]
    fn a_repository_may_only_lower_spending_caps() {
        let below = |cap: Option<f64>| {
            move |key: &str| {
                (key == "limits.max_cost_usd")
                    .then_some(cap?)
                    .map(Value::from)
            }
        };
        for (yaml, cap, taken) in [
            ("limits: {max_cost_usd: 0.5}", Some(1.0), true),
            ("limits: {max_cost_usd: 1}", Some(1.0), true),
            ("limits: {max_cost_usd: 2}", Some(1.0), false),
            ("limits: {max_cost_usd: ~}", Some(1.0), false),
            ("limits: {max_cost_usd: '0.5'}", Some(1.0), true),
            ("limits: {max_cost_usd: '5'}", Some(1.0), false),
            ("limits: {max_cost_usd: 100}", None, true),
        ] {
            let (keys, d) = run(yaml, &below(cap));
            assert_eq!(keys.is_empty(), taken, "{yaml} over {cap:?}: {keys:?}");
            if !taken {
                assert!(
                    lookup(&d, "limits.max_cost_usd").is_none(),
                    "{yaml} over {cap:?}: not left in the layer"
                );
            }
        }
    }

    /// Limits, timeouts and a host's result size only go down: durations compare as
    /// durations; a host the layers below do not name is held to `hosts.default`.
    #[test]
    fn limits_timeouts_and_host_sizes_only_go_down() {
        let below = |key: &str| match key {
            "limits.max_tasks" => Some(Value::from(10u64)),
            "limits.max_wait_ids" => Some(Value::from(50u64)),
            "timeouts.task" => Some(Value::from("30m")),
            "timeouts.stall" => Some(Value::from("5m")),
            "hosts.default.result_chars" => Some(Value::from(20_000u64)),
            "hosts.codex.result_chars" => Some(Value::from(10_000u64)),
            _ => None,
        };
        let (mut keys, d) = run(
            "limits: {max_tasks: 11, max_wait_ids: 500}\ntimeouts: {task: 30d, stall: 1h}\nhosts:\n  codex: {result_chars: 12000}\n  newcomer: {result_chars: 900000}\n",
            &below,
        );
        keys.sort();
        assert_eq!(
            keys,
            [
                "hosts.codex.result_chars",
                "hosts.newcomer.result_chars",
                "limits.max_tasks",
                "timeouts.task"
            ]
        );
        assert!(lookup(&d, "limits.max_wait_ids").is_some(), "a free limit");
        assert!(lookup(&d, "timeouts.stall").is_some(), "a free timeout");
        let (keys, _) = run(
            "limits: {max_tasks: 3}\ntimeouts: {task: 90s}\nhosts:\n  codex: {result_chars: 9000}\n  newcomer: {result_chars: 15000}\n",
            &below,
        );
        assert!(keys.is_empty(), "{keys:?}");
        // A wrong shape is the typed extraction's to report, naming the file.
        let (keys, d) = run("limits: {max_tasks: many}\n", &below);
        assert!(keys.is_empty() && lookup(&d, "limits.max_tasks").is_some());
    }

    /// A check is a command the gateway runs: a repository's file declares none (on the user's
    /// tiers, its own tiers or a tool) unless the user's own layers set
    /// `checks.from_repository`, which it cannot set itself.
    #[test]
    fn a_repositorys_checks_are_withheld_unless_the_user_allows_them() {
        let mine = super::super::Tier {
            name: "fast".into(),
            handles: "quick fixes".into(),
            models: Vec::new(),
            max_cost_usd: None,
            max_tokens: None,
            variant: None,
            checks: vec!["cargo test".into()],
            escalate_to: None,
            fallback_models: Vec::new(),
            sandbox: None,
        };
        let yaml = "checks: {from_repository: true, max_rounds: 9}\ntiers:\n  - {name: fast, handles: x, checks: [rm -rf /], escalate_to: new}\n  - {name: new, handles: x, checks: [curl evil]}\ntools:\n  t: {action: start_task, checks: [curl evil]}\n";
        let run_with = |allowed: bool| {
            let below = move |k: &str| match k {
                "checks.from_repository" if allowed => Some(Value::from(true)),
                "checks.max_rounds" => Some(Value::from(2u32)),
                _ => None,
            };
            let mut d = dict(yaml);
            let mut keys: Vec<String> = filter(
                &mut d,
                &Below {
                    value: &below,
                    tiers: std::slice::from_ref(&mine),
                },
            )
            .into_iter()
            .map(|(k, _)| k)
            .collect();
            keys.sort();
            (keys, d)
        };
        let (keys, d) = run_with(false);
        assert_eq!(
            keys,
            [
                "checks.from_repository",
                "checks.max_rounds",
                "tiers.fast.checks",
                "tiers.fast.escalate_to",
                "tiers.new.checks",
                "tools.t.checks"
            ]
        );
        let Some(Value::Array(_, tiers)) = d.get("tiers") else {
            panic!("tiers stay a list");
        };
        let fast = tiers[0].as_dict().expect("a map");
        assert_eq!(show(&fast["checks"]), r#"["cargo test"]"#, "the user's own");
        assert!(tiers[1].as_dict().expect("a map").get("checks").is_none());
        let (keys, d) = run_with(true);
        // `from_repository: true` repeats what is in force: dropped quietly.
        assert_eq!(keys, ["checks.max_rounds", "tiers.fast.escalate_to"]);
        assert!(lookup(&d, "tools.t.checks").is_some());
    }

    /// A tier the user defines keeps their models and variant, and its caps only go down (one
    /// left out is the user's); a tier of a new name is the repository's.
    #[test]
    fn a_users_tier_keeps_its_models_and_caps() {
        let mine = super::super::Tier {
            name: "fast".into(),
            handles: "quick fixes".into(),
            models: vec!["p/cheap".into()],
            max_cost_usd: Some(0.5),
            max_tokens: None,
            variant: None,
            checks: Vec::new(),
            escalate_to: None,
            fallback_models: Vec::new(),
            sandbox: None,
        };
        let mut d = dict(
            "tiers:\n  - name: fast\n    handles: anything\n    models: [p/opus]\n    variant: high\n    max_tokens: 5000\n    sandbox: off\n  - name: new\n    handles: x\n    models: [p/opus]\n    max_cost_usd: 50\n    sandbox: off\n",
        );
        let mut keys: Vec<String> = filter(
            &mut d,
            &Below {
                value: &|_: &str| None,
                tiers: std::slice::from_ref(&mine),
            },
        )
        .into_iter()
        .map(|(k, _)| k)
        .collect();
        keys.sort();
        // Neither the user's tier nor the repository's own may run unconfined on its word.
        assert_eq!(
            keys,
            [
                "tiers.fast.models",
                "tiers.fast.sandbox",
                "tiers.fast.variant",
                "tiers.new.sandbox"
            ]
        );
        let Some(Value::Array(_, tiers)) = d.get("tiers") else {
            panic!("tiers stay a list");
        };
        let fast = tiers[0].as_dict().expect("a map");
        assert_eq!(show(&fast["models"]), r#"["p/cheap"]"#);
        assert!(fast.get("variant").is_none());
        let num = |v: &Value| match v {
            Value::Num(_, n) => number(n),
            _ => None,
        };
        assert_eq!(
            num(&fast["max_cost_usd"]),
            Some(0.5),
            "left out: the user's cap"
        );
        assert_eq!(
            num(&fast["max_tokens"]),
            Some(5000.0),
            "a cap where none was"
        );
        assert_eq!(fast["handles"].as_str(), Some("anything"), "free");
        let new = tiers[1].as_dict().expect("a map");
        assert!(fast.get("sandbox").is_none() && new.get("sandbox").is_none());
        assert_eq!(
            num(&new["max_cost_usd"]),
            Some(50.0),
            "a new tier is the repository's"
        );
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
        let (keys, d) = run(
            "isolation:\n  mode: sandbox\ntools:\n  odd: 3\n",
            &policy(None),
        );
        assert_eq!(keys, ["isolation.mode"], "an unknown mode is withheld");
        assert!(lookup(&d, "isolation.mode").is_none());
        assert!(
            matches!(lookup(&d, "tools.odd"), Some(Value::Num(..))),
            "a tool entry that is not a map stays for the typed extraction"
        );
    }
}
