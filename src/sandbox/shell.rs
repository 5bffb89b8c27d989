//! The confining shell: what OpenCode runs for each command of a delegated agent.
//!
//! OpenCode execs its `shell` setting as `<shell> -c <command>` in the command's working
//! directory (the session's directory, or the `workdir` the model passed), with the whole
//! server environment. The gateway's script for the server ([`super::server`]) runs this binary
//! as `opencode-mcp __sandbox-shell <policy file> -c <command>`. This subcommand:
//!
//! 1. reads the server's policy (written by the gateway, in its private state directory, which
//!    no confined command can see);
//! 2. finds the task root the working directory lies in, and refuses the command (exit 126,
//!    with a message the agent reads) when it lies in none;
//! 3. runs the command with `bash -c` (or `sh -c`) under `bwrap`, confined to that root, with
//!    the allowed environment only, and exits as it did;
//! 4. when the command failed, adds one line saying it ran confined and which setting would
//!    allow more, so an agent reads "Read-only file system" for what it is.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use super::policy::Policy;

/// The hidden subcommand.
pub const SUBCOMMAND: &str = "__sandbox-shell";
/// Exit status of a refused command (as a shell's for a command it cannot execute).
pub const REFUSED: u8 = 126;
/// The most bytes of a policy file read.
const MAX_POLICY_BYTES: u64 = 1 << 20;
/// Starts every line this subcommand prints, so the agent knows who speaks.
pub const PREFIX: &str = "opencode-mcp sandbox:";

/// Runs the confining shell when the process was started as one; `main` calls this first.
pub fn main_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SUBCOMMAND)) {
        return None;
    }
    Some(run(args.collect()))
}

fn run(args: Vec<OsString>) -> ExitCode {
    let [policy_path, flag, command] = args.as_slice() else {
        return refuse("expected `<policy file> -c <command>`");
    };
    if flag != "-c" {
        return refuse("expected `-c <command>`");
    }
    let policy = match read_policy(Path::new(policy_path)) {
        Ok(p) => p,
        Err(e) => return refuse(&format!("its policy could not be read ({e})")),
    };
    let cwd = match std::env::current_dir().and_then(|d| d.canonicalize()) {
        Ok(d) => d,
        Err(e) => return refuse(&format!("the working directory cannot be read ({e})")),
    };
    let Some(root) = policy.root_for(&cwd) else {
        return refuse(&format!(
            "{} is outside this task's directory. A delegated agent's commands run only inside \
             its own task's directory: run it there (leave `workdir` out, or pass a directory \
             inside the task's). {}.",
            cwd.display(),
            super::SETTING_HINT
        ));
    };
    let shell = if Path::new("/bin/bash").is_file() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    if policy.open_roots.contains(&root) {
        // The user's file lets this task's tier run unconfined: the command runs as OpenCode
        // would run it without the gateway.
        use std::os::unix::process::CommandExt;
        let err = std::process::Command::new(shell)
            .arg("-c")
            .arg(command)
            .exec();
        return refuse(&format!("`{shell}` could not be started ({err})"));
    }
    let mut cmd = policy.command(
        &root,
        &cwd,
        shell.as_ref(),
        &["-c".as_ref(), command.as_os_str()],
    );
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            return refuse(&format!(
                "the sandbox (`{}`) could not be started ({e})",
                policy.bwrap.display()
            ))
        }
    };
    if status.success() {
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "\n{PREFIX} this command ran confined: it may write only in {} and a private /tmp, \
         {}, and secrets (~/.ssh, cloud credentials, provider keys) are not there. If that is \
         why it failed (\"Read-only file system\", \"Network is unreachable\"), say so in your \
         answer: {}.",
        root.display(),
        if policy.network {
            "the network is on"
        } else {
            "the network is off"
        },
        super::SETTING_HINT
    );
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn refuse(why: &str) -> ExitCode {
    eprintln!("{PREFIX} refused: {why}");
    ExitCode::from(REFUSED)
}

/// The policy at `path`, read bounded (the confining shell reads it before each command; a
/// gateway taking over a lingering server reads it back, see `server::ServerSandbox::reopen`).
pub(super) fn read_policy(path: &Path) -> Result<Policy, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_POLICY_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    /// Every way the confining shell cannot go on ends in a refusal (126), never in running
    /// the command unconfined.
    #[test]
    fn what_it_cannot_read_or_place_is_refused() {
        let refused = ExitCode::from(REFUSED);
        assert_eq!(run(args(&["only-one"])), refused);
        assert_eq!(run(args(&["/p.json", "-x", "true"])), refused);
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.json");
        assert_eq!(
            run(args(&[&missing.to_string_lossy(), "-c", "true"])),
            refused
        );
        let garbage = dir.path().join("garbage.json");
        std::fs::write(&garbage, "{not json").expect("write");
        assert!(read_policy(&garbage).is_err_and(|e| e.contains("garbage.json")));
        assert_eq!(
            run(args(&[&garbage.to_string_lossy(), "-c", "true"])),
            refused
        );
        // A policy with no root for this process's directory refuses the command.
        let empty = dir.path().join("empty.json");
        let policy = Policy::from_settings(
            &crate::config::SandboxConfig::default(),
            "/nonexistent/bwrap".into(),
            None,
            &[],
        );
        std::fs::write(&empty, serde_json::to_vec(&policy).expect("json")).expect("write");
        assert_eq!(
            run(args(&[&empty.to_string_lossy(), "-c", "true"])),
            refused
        );
        // A root that holds this directory, but a sandbox that cannot be started: refused, not
        // run unconfined.
        let mut placed = policy;
        placed.roots = vec![std::env::current_dir().expect("cwd")];
        let no_bwrap = dir.path().join("no-bwrap.json");
        std::fs::write(&no_bwrap, serde_json::to_vec(&placed).expect("json")).expect("write");
        assert_eq!(
            run(args(&[&no_bwrap.to_string_lossy(), "-c", "true"])),
            refused
        );
    }
}
