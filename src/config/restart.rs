//! The keys a running gateway cannot change: the one list a reload consults.
//!
//! A reload swaps what is looked up per call (tools, prompts, tiers, hosts, most timeouts and
//! limits). Some settings were used once, at start, to build something that lives as long as the
//! process, and changing the number later would not change the thing built with it; worse, it
//! would make the config claim a value the gateway does not act on. Those keep their running
//! value on reload, and a warning names the key and the file(s) whose edit changed it:
//!
//! - `state_dir`: the task store is opened there at start; records and worktrees live there.
//! - `opencode.*`: the servers already running were started (or attached) with them, and the
//!   server pool holds them.
//! - `timeouts.server_start`, `timeouts.request`: given to the server pool and each server's
//!   HTTP client when it is made.
//! - `limits.progress_tail_chars`, `limits.max_result_chars`, `limits.finished_task_ttl`,
//!   `limits.finished_in_memory`: the task tracker is built with them at start; a task's kept
//!   text and expiry must not change under it.
//! - `instructions`: sent to the host once, at `initialize`; a connected host keeps them.
//! - `reload`: whether the files are watched at all is decided at start.
//! - `workers`: the machines, their connections and their OpenCode servers are set up at start.
//! - `dashboard.*`: the page is bound (or not) once, at start.
//!
//! Everything else applies to new calls and new tasks at once.

use std::fmt;
use std::path::PathBuf;

use super::types::Config;

/// One key that keeps its running value until the gateway restarts.
pub struct RestartKey {
    /// The dotted key path, as the file writes it.
    pub key: &'static str,
    /// Whether `new` has another value than `running` at this key.
    differs: fn(new: &Config, running: &Config) -> bool,
    /// Copies the running value into `new`.
    keep: fn(new: &mut Config, running: &Config),
}

macro_rules! restart_keys {
    ($($key:literal => $($field:ident).+;)*) => {
        &[$(RestartKey {
            key: $key,
            differs: |new: &Config, running: &Config| new.$($field).+ != running.$($field).+,
            keep: |new: &mut Config, running: &Config| {
                new.$($field).+ = running.$($field).+.clone()
            },
        },)*]
    };
}

/// Every key a reload does not apply (see the module documentation for why each).
pub const RESTART_KEYS: &[RestartKey] = restart_keys![
    "state_dir" => state_dir;
    "opencode.command" => opencode.command;
    "opencode.hostname" => opencode.hostname;
    "opencode.port" => opencode.port;
    "opencode.url" => opencode.url;
    "opencode.password_env" => opencode.password_env;
    "opencode.permission" => opencode.permission;
    "timeouts.server_start" => timeouts.server_start;
    "timeouts.request" => timeouts.request;
    "limits.progress_tail_chars" => limits.progress_tail_chars;
    "limits.max_result_chars" => limits.max_result_chars;
    "limits.finished_task_ttl" => limits.finished_task_ttl;
    "limits.finished_in_memory" => limits.finished_in_memory;
    "instructions" => instructions;
    "reload" => reload;
    "dashboard.serve" => dashboard.serve;
    "dashboard.port" => dashboard.port;
];

/// A restart-only key an edit changed; its running value was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotApplied {
    /// The dotted key.
    pub key: &'static str,
    /// The files whose edit brought the change.
    pub files: Vec<PathBuf>,
    /// `instructions` only: the text as written is the same, and what changed is the tool
    /// names filled into it (a tool renamed, enabled or disabled).
    pub only_tool_names: bool,
}

impl fmt::Display for NotApplied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        let files = match files.as_slice() {
            [] => "the configuration".to_string(),
            _ => files.join(", "),
        };
        if self.key == "instructions" && self.only_tool_names {
            write!(
                f,
                "the tools changed in {files}, and the instructions name tools: the host \
                 received them at initialize and keeps the old names until the gateway restarts"
            )
        } else if self.key == "instructions" {
            write!(
                f,
                "`instructions` changed in {files}; the host received them at initialize, so \
                 they take effect when the gateway restarts"
            )
        } else {
            write!(
                f,
                "`{}` changed in {files}; it takes effect when the gateway restarts (the running \
                 value is kept until then)",
                self.key
            )
        }
    }
}

/// Puts the running value back into `new` at every restart-only key where the two differ, and
/// returns those keys (blamed on `files`, the files whose edit is being applied).
pub fn keep_running(new: &mut Config, running: &Config, files: &[PathBuf]) -> Vec<NotApplied> {
    let mut kept = Vec::new();
    for k in RESTART_KEYS {
        if (k.differs)(new, running) {
            (k.keep)(new, running);
            kept.push(NotApplied {
                key: k.key,
                files: files.to_vec(),
                only_tool_names: k.key == "instructions"
                    && new.instructions_source.0 == running.instructions_source.0,
            });
            if k.key == "instructions" {
                // The text in force is the running one, as written too.
                new.instructions_source
                    .clone_from(&running.instructions_source);
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HumanDuration, PermissionPolicy, Tier};

    fn built_in() -> Config {
        let sources = crate::config::Sources {
            explicit: None,
            cwd: PathBuf::from("/nonexistent/opencode-mcp-unit-tests"),
            user_dir: None,
            frozen_repository: None,
        };
        crate::config::load_with_env(&sources, Vec::new()).expect("the built-in config loads")
    }

    #[test]
    fn instructions_that_only_name_other_tools_say_so() {
        let running = built_in();
        let mut new = running.clone();
        // The same text as written, rendered with a renamed tool.
        new.instructions = running
            .instructions
            .replace("opencode_start_task", "delegate");
        let kept = keep_running(&mut new, &running, &[PathBuf::from("/p/delegation.yaml")]);
        assert_eq!(kept.len(), 1);
        assert!(kept[0].only_tool_names);
        let said = kept[0].to_string();
        assert!(
            said.starts_with("the tools changed in /p/delegation.yaml")
                && !said.contains("`instructions` changed"),
            "{said}"
        );
        // A text edit is said as one.
        let mut edited = running.clone();
        edited.instructions = "other".into();
        edited.instructions_source = crate::config::Provenance("other".into());
        let kept = keep_running(
            &mut edited,
            &running,
            &[PathBuf::from("/p/delegation.yaml")],
        );
        assert!(!kept[0].only_tool_names);
        assert!(kept[0].to_string().starts_with("`instructions` changed"));
        assert_eq!(edited.instructions_source.0, running.instructions_source.0);
    }

    #[test]
    fn restart_only_keys_keep_their_running_value_and_the_rest_applies() {
        let running = built_in();
        let mut new = running.clone();
        new.state_dir = Some("/tmp/elsewhere".into());
        new.opencode.permission = PermissionPolicy::Deny;
        new.limits.max_result_chars = 7;
        new.instructions = "other".into();
        new.timeouts.task = HumanDuration::from(std::time::Duration::from_secs(5));
        new.tiers.push(Tier {
            name: "new".into(),
            handles: "anything".into(),
            models: vec![],
            ..Tier::default()
        });
        let file = PathBuf::from("/p/delegation.yaml");
        let kept = keep_running(&mut new, &running, std::slice::from_ref(&file));
        let keys: Vec<&str> = kept.iter().map(|k| k.key).collect();
        assert_eq!(
            keys,
            [
                "state_dir",
                "opencode.permission",
                "limits.max_result_chars",
                "instructions"
            ]
        );
        assert_eq!(new.state_dir, None);
        assert_eq!(new.opencode, running.opencode);
        assert_eq!(new.limits, running.limits);
        assert_eq!(new.instructions, running.instructions);
        assert_eq!(new.timeouts.task.get(), std::time::Duration::from_secs(5));
        assert_eq!(new.tiers.len(), running.tiers.len() + 1);
        assert_eq!(
            kept[0].to_string(),
            "`state_dir` changed in /p/delegation.yaml; it takes effect when the gateway \
             restarts (the running value is kept until then)"
        );
        assert!(kept[3].to_string().contains("at initialize"));
    }

    #[test]
    fn nothing_is_reported_when_no_restart_only_key_changed() {
        let running = built_in();
        let mut new = running.clone();
        new.timeouts.stall = HumanDuration::from(std::time::Duration::from_secs(1));
        assert!(keep_running(&mut new, &running, &[]).is_empty());
        assert_ne!(new, running);
    }

    #[test]
    fn every_restart_key_names_a_key_of_the_schema() {
        let schema = crate::config::json_schema();
        for k in RESTART_KEYS {
            let mut node = &schema;
            for part in k.key.split('.') {
                let props = node
                    .get("properties")
                    .or_else(|| {
                        let name = node.get("$ref")?.as_str()?.rsplit('/').next()?;
                        schema["$defs"][name].get("properties")
                    })
                    .unwrap_or_else(|| panic!("{}: no properties at {part}", k.key));
                node = props
                    .get(part)
                    .unwrap_or_else(|| panic!("{} is not a key of delegation.yaml", k.key));
            }
        }
    }
}
