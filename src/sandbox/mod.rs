//! Confinement: every command a delegated agent runs, and every check, runs inside an OS
//! sandbox (bubblewrap on Linux), the way Claude Code and Codex confine their own commands.
//!
//! Why it is needed: an MCP server runs outside the host's sandbox, and OpenCode's default
//! permission is `allow`. Unconfined, an agent's `bash` runs as the user: it can write a hook
//! into the user's repository's `.git`, read `~/.ssh` and every provider key in its
//! environment, signal the gateway and reach any local port. Checks are worse: the gateway runs
//! code the agent wrote (a `build.rs`, a test script) with its own environment.
//!
//! What a confined command sees ([`policy::Policy::command`] builds the `bwrap` line):
//! - the whole file system read-only, except its task's *root* (the worktree, or the directory
//!   of an `isolation: none` task), writable, and a private `/tmp` thrown away after the
//!   command; the root's `.git` (a worktree's pointer file, or a repository's git dir) is
//!   read-only, so only the gateway does a task's git work;
//! - the user's secrets not there at all (`~/.ssh`, `~/.gnupg`, `~/.aws`, `~/.netrc`, cloud
//!   CLIs' config, OpenCode's `auth.json`, the gateway's state directory, and what
//!   `sandbox.hide` adds): an empty directory or an empty file in their place;
//! - toolchain caches (`~/.cargo`, `~/.npm`, `~/.cache`, `~/.rustup` and `sandbox.caches`)
//!   readable, their top level a private, writable layer thrown away after the command (where
//!   cargo takes its lock), what is below it read-only: the user's cache, which their next build
//!   trusts, never changes. Debian 12's bubblewrap (0.8.0) has no overlay of its own;
//! - an environment from an allow-list (`PATH`, `HOME`, the locale, `TERM`, toolchain homes,
//!   and `sandbox.env`): no provider key, no `SSH_AUTH_SOCK`, no OpenCode password;
//! - its own pid namespace: it cannot see or signal the gateway, OpenCode or another task, and
//!   whatever it leaves running dies with it (`--die-with-parent`);
//! - no network unless the user's `sandbox.network` is `true` (OpenCode itself, outside, still
//!   reaches the model).
//!
//! How the agent's commands get there: OpenCode runs every command of its `bash` tool as
//! `<shell> -c <command>`, where `<shell>` is its server-wide `shell` setting (measured on
//! 1.18.33). The gateway points it at a small script of its own ([`server`]), which runs this
//! binary's hidden [`shell`] subcommand. Since one OpenCode serves many tasks, the subcommand
//! finds the task's root from the command's working directory among the roots the gateway
//! registered for that server, and refuses a directory that is under none (the model can pass a
//! `workdir`: `~`, `/` or a directory of no task is refused; OpenCode's own `external_directory`
//! rule, forced to `deny` on delegated sessions, refuses one outside the session's directory
//! before it gets here).
//!
//! Only the user's own `delegation.yaml` can turn this off (`sandbox.mode: off`): a repository's
//! file and a call never can. Where it cannot work (no `bwrap`, user namespaces forbidden), a
//! start is refused with the fix; on macOS tasks run unconfined with a warning.

pub mod policy;
pub mod probe;
pub mod server;
pub mod shell;

use std::path::{Path, PathBuf};

use crate::config::{SandboxConfig, SandboxMode};

pub use policy::Policy;
pub use probe::{Availability, Confinement};
pub use server::ServerSandbox;

/// What the user's settings come to on this machine.
#[derive(Debug)]
pub enum Decision {
    /// Confine, under this policy (no roots yet).
    Confine(Policy),
    /// Run unconfined, for this reason (the user turned it off; no sandbox on this platform).
    Unconfined(String),
    /// Confinement is on but cannot work here: refuse, with the fix.
    Refuse(String),
}

/// How commands run under `settings`, with `state_dir` the gateway's state directory (hidden
/// from them, with OpenCode's data and config directories).
pub fn decide(settings: &SandboxConfig, state_dir: &Path) -> Decision {
    if settings.mode == SandboxMode::Off {
        return Decision::Unconfined("sandbox.mode is off in your delegation.yaml".into());
    }
    let bwrap = match probe::availability() {
        Availability::Ready(bwrap) => bwrap.clone(),
        Availability::Unsupported(os) => {
            tracing::warn!(
                "delegated agents and checks run unconfined on {os}: the gateway confines them \
                 on Linux only (see docs/security.md)"
            );
            return Decision::Unconfined(format!("no sandbox on {os} yet"));
        }
        Availability::Missing { why, fix } => {
            return Decision::Refuse(format!(
                "delegated agents and checks run confined by default, but {why}. Fix: {}",
                fix.join("; ")
            ))
        }
    };
    let mut private = vec![state_dir.to_path_buf()];
    private.extend(opencode_dir("XDG_DATA_HOME", ".local/share"));
    private.extend(opencode_dir("XDG_CONFIG_HOME", ".config"));
    let home = std::env::var_os("HOME").map(PathBuf::from);
    Decision::Confine(Policy::from_settings(
        settings,
        bwrap,
        home.as_deref(),
        &private,
    ))
}

/// The permission rules every delegated session gets while the sandbox is on (neither the
/// user's OpenCode config nor a repository's can drop them; only `sandbox.mode: off`):
/// OpenCode's own tools run inside the server, outside the sandbox, so its `external_directory`
/// rule keeps them (and a `workdir`) in the project, less OpenCode's own `tool-output`
/// directory, where a long tool output is saved for the model to read; and no edit may touch a
/// `.git` (a hook or a config there would run as the user). Measured on 1.18.33: the last
/// matching rule wins and the session's come last; `*` matches across `/`; an edit's path is
/// relative to the git root, so both `.git/...` and `<dir>/.git/...` are named.
///
/// `opencode_data`: OpenCode's data directory where the server runs ([`opencode_dir`] here, the
/// worker's own there).
pub fn session_rules(opencode_data: Option<&Path>) -> Vec<crate::opencode::ForcedRule> {
    use crate::opencode::ForcedRule;
    let deny = |permission, pattern: &str| ForcedRule {
        permission,
        pattern: pattern.to_string(),
        allow: false,
    };
    let mut rules = vec![deny("external_directory", "*")];
    if let Some(data) = opencode_data {
        rules.push(ForcedRule {
            permission: "external_directory",
            pattern: format!("{}/*", data.join("tool-output").display()),
            allow: true,
        });
    }
    for pattern in [".git", ".git/*", "*/.git", "*/.git/*"] {
        rules.push(deny("edit", pattern));
    }
    rules
}

/// Why a task of `tier` runs unconfined on a server that confines, when the user's file says
/// so for that tier (`tiers[].sandbox: off`); `None` when it runs confined.
pub fn tier_opt_out(config: &crate::config::Config, tier: Option<&str>) -> Option<String> {
    let tier = tier?;
    config
        .tiers
        .iter()
        .find(|t| t.name == tier && t.sandbox == Some(SandboxMode::Off))
        .map(|t| {
            format!(
                "tier {} runs unconfined (its `sandbox: off` in your delegation.yaml)",
                t.name
            )
        })
}

/// OpenCode's own directory of this machine under an XDG base (`$XDG_DATA_HOME/opencode`, or
/// `~/.local/share/opencode` for `("XDG_DATA_HOME", ".local/share")`), beside the gateway's.
pub fn opencode_dir(var: &str, default_in_home: &str) -> Option<PathBuf> {
    crate::config::xdg_dir(var, default_in_home)
        .as_deref()
        .and_then(Path::parent)
        .map(|base| base.join("opencode"))
}

/// What the agent reads when the sandbox stopped something, and what would allow it.
pub const SETTING_HINT: &str = "the user's own delegation.yaml sets this (`sandbox:`; \
                                `sandbox.mode: off` turns confinement off)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_off_is_unconfined_and_on_confines_or_refuses() {
        let off = SandboxConfig {
            mode: SandboxMode::Off,
            ..SandboxConfig::default()
        };
        match decide(&off, Path::new("/state")) {
            Decision::Unconfined(why) => assert!(why.contains("sandbox.mode"), "{why}"),
            other => panic!("{other:?}"),
        }
        match decide(&SandboxConfig::default(), Path::new("/state")) {
            Decision::Confine(policy) => {
                assert!(policy.hide.contains(&PathBuf::from("/state")));
                assert!(!policy.network);
            }
            Decision::Refuse(why) => assert!(why.contains("Fix:"), "{why}"),
            Decision::Unconfined(why) => assert!(why.contains("no sandbox on"), "{why}"),
        }
    }

    #[test]
    fn session_rules_deny_outside_and_every_git_dir_last() {
        let rules = session_rules(Some(Path::new("/home/u/.local/share/opencode")));
        assert_eq!(rules[0].permission, "external_directory");
        assert!(rules[1].allow);
        assert_eq!(
            rules[1].pattern,
            "/home/u/.local/share/opencode/tool-output/*"
        );
        assert_eq!(session_rules(None).len(), 5);
        assert!(!rules[0].allow);
        let edits: Vec<&str> = rules
            .iter()
            .filter(|r| r.permission == "edit")
            .map(|r| r.pattern.as_str())
            .collect();
        assert_eq!(edits, [".git", ".git/*", "*/.git", "*/.git/*"]);
        assert!(rules.iter().all(|r| r.permission != "edit" || !r.allow));
    }
}
