//! Checks on the merged configuration that types alone cannot express.
//!
//! Every rule here is an error (the server refuses to start), never a warning: a gateway running
//! on a setting the user did not mean is worse than one that says why it will not start, and
//! `check-config` is there to find out before a host does. In particular, a configuration with no
//! enabled tool bound to `start_task`, or none that reads a task's outcome (`wait_for_task`,
//! `get_task_status`, `get_task_result`), is rejected: such a gateway cannot do its one job.
//! Binding one action to several enabled tools (aliases) is fine. A text the host is shown that
//! names a tool through `{{tool:<action>}}` must name an action that has an enabled tool, for the
//! same reason: the host would otherwise be sent to a tool that is not there.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use super::template::{self, TIERS_PLACEHOLDER};
use super::types::{
    Action, Budget, Config, DEFAULT_HOST, LOCAL_WORKER, MAX_COST_USD, MAX_INSTRUCTIONS_CHARS,
    MAX_QUEUE, MAX_TOKENS, MIN_RESULT_CHARS, WORKER_NAME_PATTERN,
};

/// One violated rule. `key` is the setting to blame; `related` are other settings the rule
/// compares it with. The loader reports whichever of them came from the latest layer, since
/// that is the one the user most likely just changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub key: String,
    pub related: Vec<String>,
    pub message: String,
}

struct Issues(Vec<Issue>);

impl Issues {
    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Issue {
            key: key.into(),
            related: Vec::new(),
            message: message.into(),
        });
    }

    fn push_related(&mut self, key: &str, related: &str, message: String) {
        self.0.push(Issue {
            key: key.into(),
            related: vec![related.into()],
            message,
        });
    }

    fn non_empty(&mut self, key: String, text: &str, what: &str) {
        if text.trim().is_empty() {
            self.push(key, format!("expected {what}, found empty text"));
        }
    }
}

/// Every rule violated by `config`, in the order of the file.
pub(crate) fn validate(config: &Config) -> Vec<Issue> {
    let mut issues = Issues(Vec::new());
    instructions(config, &mut issues);
    opencode(config, &mut issues);
    timeouts(config, &mut issues);
    limits(config, &mut issues);
    tiers(config, &mut issues);
    tools(config, &mut issues);
    prompts(config, &mut issues);
    tool_placeholders(config, &mut issues);
    state_dir(config, &mut issues);
    hosts(config, &mut issues);
    report(config, &mut issues);
    workers(config, &mut issues);
    checks(config, &mut issues);
    sandbox(config, &mut issues);
    issues.0
}

/// Sandbox: paths absolute or `~/...`, variables by their names. They reach the `bwrap` line
/// here and the confining script a worker runs (as quoted words), so nothing else is taken.
fn sandbox(config: &Config, issues: &mut Issues) {
    let s = &config.sandbox;
    for (field, paths) in [("hide", &s.hide), ("caches", &s.caches)] {
        for path in paths {
            let rooted = path.starts_with('/') || path.starts_with("~/");
            if !rooted || path.chars().any(char::is_control) {
                issues.push(
                    format!("sandbox.{field}"),
                    format!(
                        "expected absolute paths or `~/...`, found {}",
                        super::printable(path)
                    ),
                );
            }
        }
    }
    for name in &s.env {
        if !crate::workers::sandbox::is_name(name) {
            issues.push(
                "sandbox.env",
                format!(
                    "expected names of environment variables (letters, digits and `_`), found {}",
                    super::printable(name)
                ),
            );
        }
    }
}

/// Checks: the fix prompt must render (MiniJinja syntax, with the values a fix round gives it);
/// the rounds and the output kept are bounded (each round is a model turn).
fn checks(config: &Config, issues: &mut Issues) {
    let c = &config.checks;
    if c.max_rounds > super::types::MAX_CHECK_ROUNDS {
        issues.push(
            "checks.max_rounds",
            format!(
                "expected at most {}, found {}",
                super::types::MAX_CHECK_ROUNDS,
                c.max_rounds
            ),
        );
    }
    if !(100..=super::types::MAX_CHECK_OUTPUT_CHARS).contains(&c.output_chars) {
        issues.push(
            "checks.output_chars",
            format!(
                "expected 100 to {}, found {}",
                super::types::MAX_CHECK_OUTPUT_CHARS,
                c.output_chars
            ),
        );
    }
    for (name, command) in &c.named {
        let key = format!("checks.named.{name}");
        if !regex_lite_name(name) {
            issues.push(
                &key,
                format!(
                    "expected a name of letters, digits, `_` and `-` (at most 40), found {}",
                    super::printable(name)
                ),
            );
        }
        if command.trim().is_empty() || command.chars().any(|ch| ch.is_control() && ch != '\t') {
            issues.push(
                &key,
                "expected a command on one line, found an empty one or one with control \
                 characters",
            );
        }
    }
    let sample = super::types::FixFailure {
        command: "make test".into(),
        status: "exit status 1".into(),
        seconds: 1.5,
        output: "test failed".into(),
    };
    let rendered = c.render_fix_prompt(1, &[sample], config.limits.max_prompt_bytes as usize);
    match rendered {
        Err(e) => issues.push(
            "checks.fix_prompt",
            format!("expected a MiniJinja template that renders, found an error: {e}"),
        ),
        Ok(text) if text.trim().is_empty() => issues.push(
            "checks.fix_prompt",
            "expected a template that renders to a prompt, found one that renders empty",
        ),
        Ok(_) => {}
    }
}

/// A name `checks.named` accepts ([`super::types::CHECK_NAME_PATTERN`]).
fn regex_lite_name(name: &str) -> bool {
    (1..=40).contains(&name.chars().count())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Workers: a safe name each; `local` is this machine (only `max_tasks`); every other one
/// names an `ssh` destination that cannot be read as an option, and how many tasks it takes.
/// The texts reach a command line (quoted): no control characters.
fn workers(config: &Config, issues: &mut Issues) {
    for (name, w) in &config.workers {
        let key = |field: &str| format!("workers.{name}.{field}");
        for tier in w.tiers.iter().flatten() {
            if !config.tiers.iter().any(|t| &t.name == tier) {
                let known: Vec<&str> = config.tiers.iter().map(|t| t.name.as_str()).collect();
                issues.push(
                    key("tiers"),
                    format!("expected tier names ({}), found `{tier}`", known.join(", ")),
                );
            }
        }
        if !is_worker_name(name) {
            issues.push(
                format!("workers.{name}"),
                format!(
                    "expected a worker name matching {WORKER_NAME_PATTERN} (it names branches \
                     and directories)"
                ),
            );
        }
        let texts = [
            ("ssh", w.ssh.as_deref()),
            ("ssh_config", w.ssh_config.as_deref()),
            ("opencode", w.opencode.as_deref()),
            ("root", w.root.as_deref()),
        ];
        if name == LOCAL_WORKER {
            if w.tiers.is_some() {
                issues.push(
                    key("tiers"),
                    "expected only `max_tasks` for `local` (this machine takes every tier)",
                );
            }
            if w.sandbox.is_some() {
                issues.push(
                    key("sandbox"),
                    "expected only `max_tasks` for `local` (this machine's confinement is \
                     `sandbox.mode`)",
                );
            }
            if w.lost_after.is_some() {
                issues.push(
                    key("lost_after"),
                    "expected only `max_tasks` for `local` (this machine, not reached over ssh)",
                );
            }
            for (field, set) in texts {
                if set.is_some() {
                    issues.push(
                        key(field),
                        "expected only `max_tasks` for `local` (this machine, not reached over ssh)",
                    );
                }
            }
            continue;
        }
        for (field, text) in texts {
            let Some(text) = text else { continue };
            if text.trim().is_empty() || text.chars().any(char::is_control) {
                issues.push(
                    key(field),
                    "expected text without control characters, found empty or control characters",
                );
            }
        }
        match w.ssh.as_deref() {
            None => issues.push(
                key("ssh"),
                "expected the worker's ssh destination (a Host of ~/.ssh/config, or user@host)",
            ),
            // git addresses the worker's repositories as `<destination>:<path>`: a `:` or `/`
            // in the destination would be read as part of the path.
            Some(d)
                if d.starts_with('-')
                    || d.chars().any(|c| c.is_whitespace() || c == ':' || c == '/') =>
            {
                issues.push(
                    key("ssh"),
                    format!(
                        "expected an ssh destination (a Host of ~/.ssh/config, or user@host), \
                         found {d:?}: no leading `-`, no spaces, no `:` or `/` (give a port or \
                         an ssh:// address its own Host entry in ~/.ssh/config)"
                    ),
                )
            }
            Some(_) => {}
        }
        if let Some(file) = w.ssh_config.as_deref() {
            if !std::path::Path::new(file).is_absolute() {
                issues.push(
                    key("ssh_config"),
                    format!("expected an absolute path, found {file:?}"),
                );
            }
        }
        if w.max_tasks.is_none() {
            issues.push(
                key("max_tasks"),
                "expected how many tasks the worker runs at once",
            );
        }
    }
}

/// Whether `name` matches [`WORKER_NAME_PATTERN`].
pub(crate) fn is_worker_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 32
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Every host needs a result budget with room for an answer and a wait it can sit through:
/// `hosts.default` must give both, and no entry may go below the floor or past `wait_max`.
fn hosts(config: &Config, issues: &mut Issues) {
    match config.hosts.get(DEFAULT_HOST) {
        None => issues.push(
            "hosts",
            format!("expected a `{DEFAULT_HOST}` entry, for hosts without one of their own"),
        ),
        Some(d) => {
            for (field, set) in [
                ("result_chars", d.result_chars.is_some()),
                ("wait_max", d.wait_max.is_some()),
            ] {
                if !set {
                    issues.push(
                        format!("hosts.{DEFAULT_HOST}.{field}"),
                        "expected a value: the default entry fills what other hosts leave out",
                    );
                }
            }
        }
    }
    for (name, host) in &config.hosts {
        if let Some(chars) = host.result_chars.filter(|c| *c < MIN_RESULT_CHARS) {
            issues.push(
                format!("hosts.{name}.result_chars"),
                format!(
                    "expected at least {MIN_RESULT_CHARS} characters (a result's fields besides \
                     the answer take up to a few thousand), found {chars}"
                ),
            );
        }
        if let Some(wait) = host.wait_max {
            let key = format!("hosts.{name}.wait_max");
            if wait.get() == Duration::ZERO {
                issues.push(key, "expected a duration greater than zero, found 0s");
            } else if wait.get() > config.timeouts.wait_max.get() {
                issues.push_related(
                    &key,
                    "timeouts.wait_max",
                    format!(
                        "expected at most timeouts.wait_max ({}), found {wait}",
                        config.timeouts.wait_max
                    ),
                );
            }
        }
    }
}

/// A negative or non-finite price would turn the saving into nonsense.
fn report(config: &Config, issues: &mut Issues) {
    let p = config.report.reference_price;
    for (name, value) in [
        ("input_per_mtok", p.input_per_mtok),
        ("output_per_mtok", p.output_per_mtok),
    ] {
        if !value.is_finite() || value < 0.0 {
            issues.push(
                format!("report.reference_price.{name}"),
                format!(
                    "expected a price in dollars per million tokens of 0 or more, found {value}"
                ),
            );
        }
    }
}

fn state_dir(config: &Config, issues: &mut Issues) {
    if let Some(dir) = &config.state_dir {
        if !std::path::Path::new(dir).is_absolute() {
            issues.push(
                "state_dir",
                format!("expected an absolute directory path, found `{dir}`"),
            );
        }
    }
}

/// The limit applies to what the host receives: the text with its `{{tool:...}}` rendered.
fn instructions(config: &Config, issues: &mut Issues) {
    let rendered = template::render_tools(&config.instructions, &template::tool_names(config));
    let chars = rendered.chars().count();
    if chars > MAX_INSTRUCTIONS_CHARS {
        issues.push(
            "instructions",
            format!(
                "expected at most {MAX_INSTRUCTIONS_CHARS} characters (Claude Code cuts longer \
                 instructions), found {chars}; move guidance into the `delegate_task` prompt or \
                 the tool descriptions"
            ),
        );
    }
}

fn opencode(config: &Config, issues: &mut Issues) {
    let oc = &config.opencode;
    issues.non_empty(
        "opencode.command".into(),
        &oc.command,
        "the `opencode` binary (a name on PATH or a path)",
    );
    if !is_loopback(&oc.hostname) {
        issues.push(
            "opencode.hostname",
            format!(
                "expected a loopback address (`127.0.0.1` or another 127.x.y.z, `::1`, or \
                 `localhost`), found `{}`: a managed OpenCode server runs tools with your rights \
                 and must not listen on the network",
                oc.hostname
            ),
        );
    }
    if let Some(url) = &oc.url {
        if let Err(why) = check_url(url) {
            issues.push("opencode.url", why);
        }
    }
    if oc.permission == super::types::PermissionPolicy::Ask {
        require_action(
            config,
            issues,
            &[Action::ReplyPermission],
            "with `opencode.permission: ask` every permission a task asks for would wait, \
             unanswerable, until the task deadline",
        );
    }
    issues.non_empty(
        "opencode.password_env".into(),
        &oc.password_env,
        "the name of an environment variable",
    );
    if oc.password_env.contains('=') || oc.password_env.contains('\0') {
        issues.push(
            "opencode.password_env",
            format!(
                "expected the name of an environment variable, found `{}`",
                oc.password_env
            ),
        );
    }
}

/// The longest duration any setting may have: beyond it, deadlines computed from the clock could
/// overflow (`300000000000y` once panicked a wait).
const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

fn timeouts(config: &Config, issues: &mut Issues) {
    let t = &config.timeouts;
    let all = [
        ("server_start", t.server_start),
        ("request", t.request),
        ("wait_default", t.wait_default),
        ("wait_max", t.wait_max),
        ("task", t.task),
        ("stall", t.stall),
        ("progress_interval", t.progress_interval),
        ("check", t.check),
    ];
    for (name, value) in all {
        if value.get() == Duration::ZERO {
            issues.push(
                format!("timeouts.{name}"),
                "expected a duration greater than zero, found 0s",
            );
        }
    }
    for (name, value) in all {
        if value.get() > MAX_DURATION {
            issues.push(
                format!("timeouts.{name}"),
                format!("expected a duration of at most 30 days, found {value}"),
            );
        }
    }
    if t.progress_interval >= t.wait_default {
        issues.push_related(
            "timeouts.progress_interval",
            "timeouts.wait_default",
            format!(
                "expected `timeouts.progress_interval` ({}) to be shorter than \
                 `timeouts.wait_default` ({}): a wait would end before its first progress report",
                t.progress_interval, t.wait_default
            ),
        );
    }
    if t.stall >= t.task {
        issues.push_related(
            "timeouts.stall",
            "timeouts.task",
            format!(
                "expected `timeouts.stall` ({}) to be shorter than `timeouts.task` ({}): a task \
                 would be aborted before it could be reported stalled",
                t.stall, t.task
            ),
        );
    }
    if t.wait_default > t.wait_max {
        issues.push_related(
            "timeouts.wait_default",
            "timeouts.wait_max",
            format!(
                "expected `timeouts.wait_default` ({}) to be at most `timeouts.wait_max` ({})",
                t.wait_default, t.wait_max
            ),
        );
    }
}

/// Spending caps: a positive, finite number within [`MAX_COST_USD`] / [`MAX_TOKENS`] (0 would
/// stop every task at its first step; unset is how to say "no cap").
fn caps<const C: usize, const T: usize>(
    issues: &mut Issues,
    at: &str,
    costs: [(&str, Option<f64>); C],
    tokens: [(&str, Option<u64>); T],
) {
    for (name, value) in costs {
        if let Some(v) = value.filter(|v| !Budget::cost_cap_ok(*v)) {
            issues.push(
                format!("{at}.{name}"),
                format!(
                    "expected an amount in USD above 0 and at most {MAX_COST_USD} (leave it unset \
                     for no cap), found {v}"
                ),
            );
        }
    }
    for (name, value) in tokens {
        if let Some(v) = value.filter(|v| !Budget::token_cap_ok(*v)) {
            issues.push(
                format!("{at}.{name}"),
                format!(
                    "expected a number of tokens above 0 and at most {MAX_TOKENS} (leave it unset \
                     for no cap), found {v}"
                ),
            );
        }
    }
}

fn limits(config: &Config, issues: &mut Issues) {
    let l = &config.limits;
    caps(
        issues,
        "limits",
        [
            ("max_cost_usd", l.max_cost_usd),
            ("max_cost_usd_per_day", l.max_cost_usd_per_day),
        ],
        [("max_tokens", l.max_tokens)],
    );
    if l.queue > MAX_QUEUE {
        issues.push(
            "limits.queue",
            format!("expected at most {MAX_QUEUE}, found {}", l.queue),
        );
    }
    let counts = [
        ("max_prompt_bytes", l.max_prompt_bytes),
        ("max_wait_ids", l.max_wait_ids),
        ("result_page_chars", l.result_page_chars),
        ("max_tasks", l.max_tasks),
        ("progress_tail_chars", l.progress_tail_chars),
        ("max_result_chars", l.max_result_chars),
    ];
    for (name, value) in counts {
        if value == 0 {
            issues.push(
                format!("limits.{name}"),
                "expected a number greater than zero, found 0",
            );
        }
    }
    if l.structured_retries > super::types::MAX_STRUCTURED_RETRIES {
        issues.push(
            "limits.structured_retries",
            format!(
                "expected at most {}, found {}",
                super::types::MAX_STRUCTURED_RETRIES,
                l.structured_retries
            ),
        );
    }
    if l.finished_in_memory.get() == Duration::ZERO {
        issues.push(
            "limits.finished_in_memory",
            "expected a duration greater than zero, found 0s",
        );
    }
    if l.finished_task_ttl.get() == Duration::ZERO {
        issues.push(
            "limits.finished_task_ttl",
            "expected a duration greater than zero, found 0s",
        );
    }
    // What a managed OpenCode's supervisor grants at most.
    if l.linger.get() > crate::opencode::supervisor::MAX_LINGER {
        issues.push(
            "limits.linger",
            format!(
                "expected a duration of at most 1 day (a supervisor grants no longer), found {}",
                l.linger
            ),
        );
    }
    if l.finished_task_ttl.get() > MAX_DURATION {
        issues.push(
            "limits.finished_task_ttl",
            format!(
                "expected a duration of at most 30 days, found {}",
                l.finished_task_ttl
            ),
        );
    }
}

fn tiers(config: &Config, issues: &mut Issues) {
    let mut seen = BTreeSet::new();
    for (i, tier) in config.tiers.iter().enumerate() {
        let at = format!("tiers.{i}");
        if tier.name.trim().is_empty() {
            issues.push(
                format!("{at}.name"),
                "expected a tier name such as `fast`, found empty text",
            );
        } else if !seen.insert(tier.name.as_str()) {
            issues.push(
                format!("{at}.name"),
                format!(
                    "expected unique tier names, found `{}` more than once",
                    tier.name
                ),
            );
        }
        issues.non_empty(
            format!("{at}.handles"),
            &tier.handles,
            "a description of the work this tier handles",
        );
        caps(
            issues,
            &at,
            [("max_cost_usd", tier.max_cost_usd)],
            [("max_tokens", tier.max_tokens)],
        );
        match tier.variant.as_deref() {
            Some(v) if v.trim().is_empty() => issues.push(
                format!("{at}.variant"),
                "expected a variant name such as `high`, found empty text",
            ),
            Some(v) if tier.models.is_empty() => issues.push(
                format!("{at}.variant"),
                format!(
                    "expected `models` beside variant `{v}`: a variant belongs to a model, and \
                     this tier names none (the server's default could be any)"
                ),
            ),
            _ => {}
        }
        for (j, check) in tier.checks.iter().enumerate() {
            issues.non_empty(
                format!("{at}.checks.{j}"),
                check,
                "a command such as `cargo test -q`",
            );
        }
        if let Some(to) = &tier.escalate_to {
            if to == &tier.name {
                issues.push(
                    format!("{at}.escalate_to"),
                    format!("expected another tier than `{to}` itself"),
                );
            } else if !config.tiers.iter().any(|t| &t.name == to) {
                let known: Vec<&str> = config.tiers.iter().map(|t| t.name.as_str()).collect();
                issues.push(
                    format!("{at}.escalate_to"),
                    format!(
                        "expected one of the tiers ({}), found `{to}`",
                        known.join(", ")
                    ),
                );
            }
        }
        for (field, models) in [
            ("models", &tier.models),
            ("fallback_models", &tier.fallback_models),
        ] {
            for (j, model) in models.iter().enumerate() {
                if !is_model_id(model) {
                    issues.push(
                        format!("{at}.{field}.{j}"),
                        format!(
                            "expected a model id of the form `provider/model` (e.g. \
                             `openrouter/qwen/qwen3-coder`), found `{model}`"
                        ),
                    );
                }
            }
        }
    }
}

fn tools(config: &Config, issues: &mut Issues) {
    for (name, tool) in &config.tools {
        if !is_tool_name(name) {
            issues.push(
                format!("tools.{name}"),
                format!(
                    "expected a tool name of 1 to 64 letters, digits, `_` or `-`, found `{name}`"
                ),
            );
        }
        issues.non_empty(
            format!("tools.{name}.description"),
            &tool.description,
            "a description the host model reads",
        );
    }
    require_action(
        config,
        issues,
        &[Action::StartTask],
        "no task could ever be started",
    );
    require_action(
        config,
        issues,
        &[
            Action::WaitForTask,
            Action::GetTaskStatus,
            Action::GetTaskResult,
        ],
        "the host could start tasks but never learn how they ended",
    );
}

/// At least one enabled tool must be bound to one of `actions`. If a disabled one exists, blame
/// its `enabled` flag (that is what the user changed); otherwise blame `tools`.
fn require_action(config: &Config, issues: &mut Issues, actions: &[Action], why: &str) {
    if config
        .enabled_tools()
        .any(|(_, t)| actions.contains(&t.action))
    {
        return;
    }
    let names: Vec<&str> = actions.iter().map(|a| a.as_str()).collect();
    let key = config
        .tools
        .iter()
        .find(|(_, t)| actions.contains(&t.action))
        .map(|(name, _)| format!("tools.{name}.enabled"))
        .unwrap_or_else(|| "tools".to_string());
    issues.push(
        key,
        format!(
            "expected at least one enabled tool bound to action {}, found none: {why}",
            names.join(" or ")
        ),
    );
}

/// Every `{{tool:<action>}}` must name an action, and one with an enabled tool: otherwise the
/// host would be told to call a tool that is not there. A disabled tool's own texts are never
/// shown, so only their action names are checked.
fn tool_placeholders(config: &Config, issues: &mut Issues) {
    let names = template::tool_names(config);
    for text in template::texts(config) {
        let mut reported = BTreeSet::new();
        for action in template::tool_placeholders(text.text) {
            if !reported.insert(action) {
                continue;
            }
            match template::action_named(action) {
                None => {
                    let known: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
                    issues.push(
                        text.key.clone(),
                        format!(
                            "unknown action `{action}` in `{{{{tool:{action}}}}}`; expected one \
                             of: {}",
                            known.join(", ")
                        ),
                    );
                }
                Some(a) if text.shown && !names.contains_key(&a) => {
                    // Blame the `enabled: false` that emptied the action, if that is newer.
                    let disabled = config
                        .tools
                        .iter()
                        .find(|(_, t)| t.action == a)
                        .map(|(name, _)| format!("tools.{name}.enabled"));
                    let message = format!(
                        "`{}` names `{{{{tool:{action}}}}}`, but no enabled tool is bound to \
                         action {action}: the host would be told to call a tool that is not \
                         there; enable one, or change `{}` not to mention it",
                        text.key, text.key
                    );
                    match disabled {
                        Some(related) => issues.push_related(&text.key, &related, message),
                        None => issues.push(text.key.clone(), message),
                    }
                }
                Some(_) => {}
            }
        }
    }
}

fn prompts(config: &Config, issues: &mut Issues) {
    for (name, prompt) in &config.prompts {
        let at = format!("prompts.{name}");
        if name.trim().is_empty() {
            issues.push(at.clone(), "expected a prompt name, found empty text");
        }
        issues.non_empty(
            format!("{at}.description"),
            &prompt.description,
            "a description of the prompt",
        );
        issues.non_empty(
            format!("{at}.template"),
            &prompt.template,
            "the prompt text",
        );
        let mut declared = Vec::new();
        for (i, arg) in prompt.arguments.iter().enumerate() {
            let arg_at = format!("{at}.arguments.{i}");
            if !is_argument_name(&arg.name) {
                issues.push(
                    format!("{arg_at}.name"),
                    format!(
                        "expected an argument name of letters, digits, `_` or `-`, found `{}`",
                        arg.name
                    ),
                );
            } else if arg.name == TIERS_PLACEHOLDER {
                issues.push(
                    format!("{arg_at}.name"),
                    "expected a name other than `tiers`, which the gateway fills in itself",
                );
            } else if declared.contains(&arg.name.as_str()) {
                issues.push(
                    format!("{arg_at}.name"),
                    format!(
                        "expected unique argument names, found `{}` more than once",
                        arg.name
                    ),
                );
            } else {
                declared.push(arg.name.as_str());
            }
            issues.non_empty(
                format!("{arg_at}.description"),
                &arg.description,
                "a description of the argument",
            );
        }
        let mut reported = BTreeSet::new();
        for placeholder in template::placeholders(&prompt.template) {
            if placeholder != TIERS_PLACEHOLDER
                && !declared.contains(&placeholder)
                && reported.insert(placeholder)
            {
                let mut known = declared.clone();
                known.push(TIERS_PLACEHOLDER);
                issues.push(
                    format!("{at}.template"),
                    format!(
                        "placeholder `{{{{{placeholder}}}}}` names no declared argument; expected \
                         one of: {}",
                        known.join(", ")
                    ),
                );
            }
        }
    }
}

/// `localhost`, an IPv4 address in 127.0.0.0/8, or `::1`.
pub(crate) fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `^[a-zA-Z0-9_-]{1,64}$` ([`super::TOOL_NAME_PATTERN`]).
pub(crate) fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && is_argument_name(name)
}

/// `^[a-zA-Z0-9_-]+$` ([`super::ARGUMENT_NAME_PATTERN`]).
fn is_argument_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `^[^/\s]+/\S+$` ([`super::MODEL_ID_PATTERN`]).
pub(crate) fn is_model_id(id: &str) -> bool {
    match id.split_once('/') {
        Some((provider, model)) => {
            !provider.is_empty() && !model.is_empty() && !id.chars().any(char::is_whitespace)
        }
        None => false,
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        format!("expected an http(s) URL such as `http://127.0.0.1:4096`, found `{url}` ({e})")
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "expected an http(s) URL such as `http://127.0.0.1:4096`, found `{url}`"
        ));
    }
    let host = parsed
        .host_str()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if parsed.scheme() == "http" && !is_loopback(host) {
        return Err(format!(
            "expected an https URL for a server on another host, found `{url}`: the gateway \
             authenticates with a password, and plain http would send it in clear"
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "expected a URL without credentials: put the password in the environment variable \
             named by `opencode.password_env`"
                .to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of what `validate` finds in the test config after `edit`.
    fn issues(edit: &dyn Fn(&mut Config)) -> Vec<String> {
        let mut config = crate::gateway::test_config();
        edit(&mut config);
        validate(&config).into_iter().map(|i| i.key).collect()
    }

    #[test]
    fn loopback() {
        for ok in ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"] {
            assert!(is_loopback(ok), "{ok}");
        }
        for bad in [
            "0.0.0.0",
            "192.168.1.2",
            "::",
            "example.com",
            "[::1]",
            "",
            "128.0.0.1",
        ] {
            assert!(!is_loopback(bad), "{bad}");
        }
    }

    /// Sandbox paths must be rooted and variables named: both reach a `bwrap` line and a
    /// worker's script.
    #[test]
    fn sandbox_settings() {
        let issues = |yaml: &str| {
            let mut config = crate::gateway::test_config();
            config.sandbox = yaml_serde::from_str(yaml).expect("sandbox yaml");
            let mut found = Issues(Vec::new());
            sandbox(&config, &mut found);
            found.0.into_iter().map(|i| i.key).collect::<Vec<_>>()
        };
        assert!(issues("hide: [~/x, /y]\ncaches: [~/.gradle]\nenv: [GOFLAGS, _X1]\n").is_empty());
        assert_eq!(issues("hide: [relative]\n"), ["sandbox.hide"]);
        assert_eq!(issues("caches: [\"~x\"]\n"), ["sandbox.caches"]);
        assert_eq!(
            issues("env: [\"A B\", 9X]\n"),
            ["sandbox.env", "sandbox.env"]
        );
    }

    /// Each way a worker entry can be wrong is named by its key; a good one passes.
    #[test]
    fn worker_entries() {
        let issues = |yaml: &str| {
            let mut config = crate::gateway::test_config();
            config.workers = yaml_serde::from_str(yaml).expect("workers yaml");
            let mut found = Issues(Vec::new());
            workers(&config, &mut found);
            found.0.into_iter().map(|i| i.key).collect::<Vec<_>>()
        };
        assert!(issues("box:\n  ssh: me@box\n  max_tasks: 2\n").is_empty());
        assert!(issues("local:\n  max_tasks: 2\n").is_empty());
        assert_eq!(issues("local:\n  ssh: me@box\n"), ["workers.local.ssh"]);
        assert_eq!(
            issues("local:\n  sandbox: off\n"),
            ["workers.local.sandbox"]
        );
        assert!(issues("box:\n  ssh: box\n  max_tasks: 1\n  sandbox: off\n").is_empty());
        assert_eq!(issues("box:\n  max_tasks: 2\n"), ["workers.box.ssh"]);
        assert_eq!(issues("box:\n  ssh: box\n"), ["workers.box.max_tasks"]);
        assert!(issues("box:\n  ssh: box\n  max_tasks: 1\n  tiers: [fast]\n").is_empty());
        assert_eq!(
            issues("box:\n  ssh: box\n  max_tasks: 1\n  tiers: [fast, turbo]\n"),
            ["workers.box.tiers"]
        );
        assert_eq!(
            issues("local:\n  max_tasks: 1\n  tiers: [fast]\n"),
            ["workers.local.tiers"]
        );
        assert_eq!(
            issues("local:\n  max_tasks: 1\n  lost_after: 5m\n"),
            ["workers.local.lost_after"]
        );
        for destination in ["-oProxyCommand=sh", "'me@box rm'", "box:2222", "ssh://box"] {
            let yaml = format!("box:\n  ssh: {destination}\n  max_tasks: 1\n");
            assert_eq!(issues(&yaml), ["workers.box.ssh"], "{destination}");
        }
        assert_eq!(
            issues("box:\n  ssh: box\n  max_tasks: 1\n  ssh_config: relative/config\n"),
            ["workers.box.ssh_config"]
        );
        assert_eq!(
            issues("box:\n  ssh: box\n  max_tasks: 1\n  root: \"a\\nb\"\n"),
            ["workers.box.root"]
        );
        assert_eq!(
            issues("Box:\n  ssh: box\n  max_tasks: 1\n"),
            ["workers.Box"]
        );
        assert!(is_worker_name("gpu-1_a"));
        assert!(!is_worker_name(&"x".repeat(33)));
        assert!(!is_worker_name("-x"));
    }

    /// Each way timeouts, limits, hosts, the reference price and the state directory can be
    /// wrong is named by its key; the built-in values pass.
    #[test]
    fn timeouts_limits_hosts_and_paths() {
        let secs = |n: u64| -> super::super::HumanDuration { Duration::from_secs(n).into() };
        let blank = || -> super::super::types::HostConfig {
            yaml_serde::from_str("{}").expect("an empty host entry")
        };
        let long = Duration::from_secs(31 * 24 * 3600);
        assert!(issues(&|_| {}).is_empty());
        assert_eq!(
            issues(&|c| c.timeouts.request = secs(0)),
            ["timeouts.request"]
        );
        assert_eq!(
            issues(&|c| c.timeouts.server_start = long.into()),
            ["timeouts.server_start"]
        );
        assert_eq!(
            issues(&|c| c.timeouts.progress_interval = c.timeouts.wait_default),
            ["timeouts.progress_interval"]
        );
        assert_eq!(
            issues(&|c| c.timeouts.stall = c.timeouts.task),
            ["timeouts.stall"]
        );
        assert_eq!(
            issues(&|c| {
                c.timeouts.wait_default = secs(c.timeouts.wait_max.get().as_secs() + 1);
                c.hosts.clear();
                c.hosts.insert(DEFAULT_HOST.into(), blank());
            })[0],
            "timeouts.wait_default"
        );
        assert_eq!(
            issues(&|c| c.limits.max_cost_usd = Some(-1.0)),
            ["limits.max_cost_usd"]
        );
        assert_eq!(
            issues(&|c| c.limits.max_tokens = Some(0)),
            ["limits.max_tokens"]
        );
        assert_eq!(
            issues(&|c| c.limits.queue = MAX_QUEUE + 1),
            ["limits.queue"]
        );
        assert_eq!(
            issues(&|c| c.limits.max_wait_ids = 0),
            ["limits.max_wait_ids"]
        );
        assert_eq!(
            issues(&|c| c.limits.structured_retries = 99),
            ["limits.structured_retries"]
        );
        assert_eq!(
            issues(&|c| c.limits.finished_in_memory = secs(0)),
            ["limits.finished_in_memory"]
        );
        assert_eq!(
            issues(&|c| c.limits.finished_task_ttl = long.into()),
            ["limits.finished_task_ttl"]
        );
        assert_eq!(
            issues(&|c| c.limits.linger = secs(90_000)),
            ["limits.linger"]
        );
        assert!(
            issues(&|c| c.limits.linger = secs(0)).is_empty(),
            "0 turns it off"
        );
        // Hosts: the default entry fills what others leave out; each value within bounds.
        let hosts = issues(&|c| {
            c.hosts.clear();
        });
        assert_eq!(hosts, ["hosts"]);
        let hosts = issues(&|c| {
            c.hosts.clear();
            c.hosts.insert(DEFAULT_HOST.into(), blank());
        });
        assert_eq!(
            hosts,
            [
                format!("hosts.{DEFAULT_HOST}.result_chars"),
                format!("hosts.{DEFAULT_HOST}.wait_max")
            ]
        );
        let hosts = issues(&|c| {
            let mut small = blank();
            small.result_chars = Some(MIN_RESULT_CHARS - 1);
            small.wait_max = Some(secs(0));
            c.hosts.insert("tiny".into(), small.clone());
            small.wait_max = Some(long.into());
            small.result_chars = None;
            c.hosts.insert("slow".into(), small);
        });
        assert_eq!(
            hosts,
            [
                "hosts.slow.wait_max",
                "hosts.tiny.result_chars",
                "hosts.tiny.wait_max"
            ]
        );
        assert_eq!(
            issues(&|c| c.report.reference_price.output_per_mtok = f64::NAN),
            ["report.reference_price.output_per_mtok"]
        );
        assert_eq!(
            issues(&|c| c.state_dir = Some("relative/dir".into())),
            ["state_dir"]
        );
    }

    /// Each way checks, escalation and fallbacks can be wrong is named by its key; the built-in
    /// values pass.
    #[test]
    fn checks_and_escalation() {
        assert!(issues(&|_| {}).is_empty());
        assert_eq!(issues(&|c| c.checks.max_rounds = 11), ["checks.max_rounds"]);
        assert_eq!(
            issues(&|c| c.checks.output_chars = 10),
            ["checks.output_chars"]
        );
        assert_eq!(
            issues(&|c| c.checks.fix_prompt = "{% for f in failures %}".into()),
            ["checks.fix_prompt"]
        );
        assert_eq!(
            issues(&|c| c.checks.fix_prompt = "{% if false %}x{% endif %}".into()),
            ["checks.fix_prompt"]
        );
        // Named checks: a name a call can pass, a command on one line.
        assert_eq!(
            issues(&|c| {
                c.checks
                    .named
                    .insert("bad name!".into(), "cargo test".into());
                c.checks.named.insert("empty".into(), " ".into());
                c.checks.named.insert("split".into(), "a\nb".into());
                c.checks.named.insert("test".into(), "cargo test -q".into());
            }),
            [
                "checks.named.bad name!",
                "checks.named.empty",
                "checks.named.split"
            ]
        );
        // A template that would build a gigabyte stops at the prompt limit, named.
        let huge = "{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}";
        assert_eq!(
            issues(&|c| c.checks.fix_prompt = huge.into()),
            ["checks.fix_prompt"]
        );
        let mut config = crate::gateway::test_config();
        config.checks.fix_prompt = huge.into();
        let message = validate(&config)
            .into_iter()
            .map(|i| i.message)
            .collect::<String>();
        assert!(message.contains("limits.max_prompt_bytes"), "{message}");
        assert_eq!(
            issues(&|c| c.timeouts.check = Duration::ZERO.into()),
            ["timeouts.check"]
        );
        assert_eq!(
            issues(&|c| c.tiers[0].checks = vec!["cargo test".into(), " ".into()]),
            ["tiers.0.checks.1"]
        );
        assert_eq!(
            issues(&|c| c.tiers[0].escalate_to = Some(c.tiers[0].name.clone())),
            ["tiers.0.escalate_to"]
        );
        assert_eq!(
            issues(&|c| c.tiers[0].escalate_to = Some("turbo".into())),
            ["tiers.0.escalate_to"]
        );
        assert_eq!(
            issues(&|c| c.tiers[0].fallback_models = vec!["p/m".into(), "nomodel".into()]),
            ["tiers.0.fallback_models.1"]
        );
        assert!(issues(&|c| c.tiers[0].escalate_to = Some(c.tiers[1].name.clone())).is_empty());
    }

    #[test]
    fn names_and_models() {
        assert!(is_tool_name("opencode_start-task9"));
        assert!(!is_tool_name(""));
        assert!(!is_tool_name("has space"));
        assert!(!is_tool_name("dotted.name"));
        assert!(!is_tool_name(&"x".repeat(65)));
        assert!(is_tool_name(&"x".repeat(64)));
        assert!(is_model_id("anthropic/claude-sonnet-4"));
        assert!(is_model_id("openrouter/qwen/qwen3-coder"));
        for bad in ["gpt-5", "/model", "provider/", "pro vider/m", "p/m x", ""] {
            assert!(!is_model_id(bad), "{bad}");
        }
    }

    #[test]
    fn urls() {
        assert!(check_url("http://127.0.0.1:4096").is_ok());
        assert!(check_url("https://example.com/").is_ok());
        assert!(check_url("ftp://example.com").is_err());
        assert!(check_url("127.0.0.1:4096").is_err());
        assert!(check_url("").is_err());
        assert!(check_url("http://u:p@127.0.0.1:4096").is_err());
    }

    /// A prompt's arguments are named as templates can use them: letters, digits, `_` and `-`,
    /// once each, and never `tiers` (the gateway fills it in).
    #[test]
    fn prompt_arguments_are_named_once_and_never_tiers() {
        let found = issues(&|c| {
            let arg = |name: &str| crate::config::PromptArgument {
                name: name.into(),
                description: "d".into(),
                required: false,
            };
            c.prompts.insert(
                "p".into(),
                crate::config::PromptConfig {
                    description: "a prompt".into(),
                    arguments: vec![arg("ok-1"), arg("bad name"), arg("tiers"), arg("ok-1")],
                    template: "{{ok-1}}".into(),
                },
            );
        });
        assert_eq!(
            found,
            [
                "prompts.p.arguments.1.name",
                "prompts.p.arguments.2.name",
                "prompts.p.arguments.3.name"
            ]
        );
    }

    /// Settings that would make the gateway useless are refused by their key: a password
    /// variable that is no variable name, records that expire at once, an empty variant.
    #[test]
    fn settings_that_cannot_work_are_named() {
        assert_eq!(
            issues(&|c| c.opencode.password_env = "A=B".into()),
            ["opencode.password_env"]
        );
        assert_eq!(
            issues(&|c| c.limits.finished_task_ttl = Duration::ZERO.into()),
            ["limits.finished_task_ttl"]
        );
        let variant = issues(&|c| c.tiers[0].variant = Some(" ".into()));
        assert_eq!(variant.len(), 1, "{variant:?}");
        assert!(variant[0].ends_with(".variant"), "{variant:?}");
    }
}
