//! Confinement on a worker: the agent's commands and the checks there run under the worker's
//! own bubblewrap, held to the same rules as on this machine (see [`crate::sandbox`]).
//!
//! This machine's confining shell is the gateway's own binary, which a worker does not have.
//! There it is a POSIX `sh` script the gateway writes under the worker's root
//! (`<root>/sandbox/shell`, mode 0700) and gives the worker's OpenCode as its `shell`. It is
//! written again before every turn: OpenCode silently falls back to plain `bash` when its
//! `shell` file is missing, so a script some other process removed must not stay removed.
//!
//! The script finds the task's root from the command's working directory, structurally: a
//! worker's worktrees all live in `<root>/worktrees/<task>`, so the root is the first directory
//! below `<root>/worktrees` that the (canonical) working directory lies in, and any other
//! directory is refused. Inside the sandbox:
//! - the file system is read-only, except that task's worktree and a private `/tmp`; its `.git`
//!   pointer and the bare repositories (`<root>/repos`) stay read-only, and the other tasks'
//!   worktrees are not there at all;
//! - the worker's secrets are hidden (the same list as here, under the ssh user's `$HOME`, and
//!   `sandbox.hide`), caches are a private layer over read-only entries, the environment is
//!   the allow-list (no `OPENCODE_SERVER_PASSWORD`), pid/ipc/uts namespaces are its own, and
//!   the network is off unless `sandbox.network`.
//!
//! Which workers are confined is the user's own file's choice: `workers.<name>.sandbox`, else
//! `sandbox.mode`. A worker where bubblewrap cannot run is refused with the fix, unless that
//! file lets it run unconfined (`workers.<name>.sandbox: off`).

use std::time::Duration;

use super::ssh::SshError;
use super::Remote;
use crate::config::{Config, SandboxConfig, SandboxMode};
use crate::sandbox::policy::{CACHES_IN_HOME, ENV_ALLOWED, HIDDEN_ELSEWHERE, HIDDEN_IN_HOME};

/// Where the script lives, relative to the worker's root.
pub const SHELL_IN_ROOT: &str = "sandbox/shell";

/// How long writing the script there before a turn may take (the first time, with the probe,
/// is held to the server's start timeout).
const INSTALL_LIMIT: Duration = Duration::from_secs(30);

/// Whether bubblewrap runs there, as one `bwrap=` line: `ok <path>`, `missing`, or `broken
/// <what it said>` (no user namespaces, say).
macro_rules! bwrap_probe {
    () => {
        r#"b=$(command -v bwrap) || { echo "bwrap=missing"; exit 0; }
if o=$("$b" --die-with-parent --unshare-pid --clearenv --ro-bind / / --dev /dev --proc /proc -- /bin/sh -c : 2>&1)
then echo "bwrap=ok $b"
else echo "bwrap=broken $(printf '%s' "$o" | head -c 300 | tr -c '[:print:]' ' ')"
fi"#
    };
}

/// The fixed script that installs the confining shell: the script's text on stdin; `$1` the
/// worker's root (made when missing), `$2` `probe` to also try bubblewrap there, `$3` a task
/// whose turn opens (its worktree's name) and `$4` `open` when that task runs unconfined (its
/// tier's `sandbox: off`: a marker `sandbox/open/<task>` the script reads; no task can write
/// there). It prints the script's absolute path, OpenCode's data directory there, and what the
/// probe found. Starts on one worker run side by side (a fan-out's, a series answered at
/// once), so each writes the script under a name of its own (its pid) before the rename.
const INSTALL: &str = concat!(
    r#"umask 077
mkdir -p -- "$1/sandbox" && cd -- "$1" || exit 98
d=$(pwd -P) || exit 98
case $d in *[\"\\]*|*[![:print:]]*) echo "unsafe-root"; exit 93;; esac
n="sandbox/shell.new.$$"
cat > "$n" && chmod 700 "$n" && mv -f "$n" sandbox/shell || { rm -f "$n"; exit 94; }
echo "shell=$d/sandbox/shell"
echo "data=${XDG_DATA_HOME:-$HOME/.local/share}/opencode"
if [ -n "$3" ]; then
  case $3 in *[!A-Za-z0-9_-]*|-*) exit 92;; esac
  mkdir -p sandbox/open || exit 94
  if [ "$4" = open ]; then : > "sandbox/open/$3" || exit 94; else rm -f -- "sandbox/open/$3"; fi
fi
[ "$2" = probe ] || exit 0
"#,
    bwrap_probe!()
);

/// The bubblewrap probe alone, for `opencode-mcp workers` and `doctor`.
pub const PROBE: &str = bwrap_probe!();

/// How a worker's tasks run, as its user's file and the worker decide.
#[derive(Debug)]
pub enum Prepared {
    /// Confined by the script at this path there.
    Confined(WorkerShell),
    /// Unconfined, for this reason (the user's file turned it off).
    Unconfined(String),
}

/// What installing the shell can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Reaching the worker to install it failed (the worker, the step and ssh's account).
    #[error("worker {worker}, writing its confining shell: {source}")]
    Ssh {
        worker: String,
        #[source]
        source: SshError,
    },
    /// Confinement is on for the worker, but cannot work there.
    #[error(
        "worker {worker} cannot confine its agents: {why}. Fix: install bubblewrap there \
         (`apt-get install bubblewrap`; unprivileged user namespaces must be allowed), or let \
         its agents run unconfined as its ssh user with `workers.{worker}.sandbox: off` in your \
         own delegation.yaml"
    )]
    Unavailable { worker: String, why: String },
    #[error("cannot write the confining shell on worker {worker}: {detail}")]
    Install { worker: String, detail: String },
}

/// The confining shell of one worker, as installed there.
#[derive(Debug, Clone)]
pub struct WorkerShell {
    pub worker: String,
    remote: Remote,
    /// The script's absolute path there (OpenCode's `shell`).
    pub path: String,
    /// OpenCode's data directory there, as the ssh login sees it (its `tool-output`).
    pub opencode_data: Option<String>,
    script: String,
}

impl WorkerShell {
    /// Writes the script there again before a turn of the task whose worktree there is
    /// `worktree` (a removed or changed script is back), and marks that task's commands
    /// unconfined or not (`open`).
    pub async fn ensure(&self, worktree: &str, open: bool) -> Result<(), SandboxError> {
        let task = worktree.rsplit('/').next().unwrap_or_default();
        let turn = Turn::Of(task, open);
        install(
            &self.worker,
            &self.remote,
            &self.script,
            turn,
            INSTALL_LIMIT,
        )
        .await
        .map(|_| ())
    }
}

/// Whether worker `name`'s tasks are confined: its own `sandbox`, else `sandbox.mode`.
pub fn mode(config: &Config, name: &str) -> SandboxMode {
    config
        .workers
        .get(name)
        .and_then(|w| w.sandbox)
        .unwrap_or(config.sandbox.mode)
}

/// Makes the worker ready for confined tasks, or says why its tasks run unconfined: installs
/// the script and checks that bubblewrap runs there, within `within`.
pub async fn prepare(
    worker: &str,
    remote: &Remote,
    config: &Config,
    within: Duration,
) -> Result<Prepared, SandboxError> {
    if mode(config, worker) == SandboxMode::Off {
        return Ok(Prepared::Unconfined(format!(
            "confinement is off for worker {worker} in your delegation.yaml \
             (workers.{worker}.sandbox or sandbox.mode)"
        )));
    }
    let script = script(worker, &config.sandbox);
    let found = install(worker, remote, &script, Turn::Probe, within).await?;
    match found.bwrap.as_deref() {
        Some(b) if b.starts_with("ok") => {}
        Some("missing") | None => {
            return Err(SandboxError::Unavailable {
                worker: worker.to_string(),
                why: "bubblewrap (`bwrap`) is not on its PATH".into(),
            })
        }
        Some(other) => {
            return Err(SandboxError::Unavailable {
                worker: worker.to_string(),
                why: format!(
                    "bubblewrap does not run there ({})",
                    other.trim_start_matches("broken").trim()
                ),
            })
        }
    }
    Ok(Prepared::Confined(WorkerShell {
        worker: worker.to_string(),
        remote: remote.clone(),
        path: found.shell,
        opencode_data: found.data,
        script,
    }))
}

/// What an install is for: the first one, which probes bubblewrap, or a task's turn.
enum Turn<'a> {
    Probe,
    Of(&'a str, bool),
}

/// What [`INSTALL`] reported.
struct Installed {
    shell: String,
    data: Option<String>,
    bwrap: Option<String>,
}

async fn install(
    worker: &str,
    remote: &Remote,
    script: &str,
    turn: Turn<'_>,
    within: Duration,
) -> Result<Installed, SandboxError> {
    let failed = |detail: String| SandboxError::Install {
        worker: worker.to_string(),
        detail,
    };
    let (probe, task, open) = match turn {
        Turn::Probe => ("probe", "", ""),
        Turn::Of(task, open) => ("", task, if open { "open" } else { "" }),
    };
    let argv = ["sh", "-c", INSTALL, "sh", &remote.root, probe, task, open];
    let out = remote
        .ssh
        .run(&argv, Some(script.as_bytes()), within)
        .await
        .map_err(|source| SandboxError::Ssh {
            worker: worker.to_string(),
            source,
        })?;
    let mut shell = None;
    let mut data = None;
    let mut bwrap = None;
    // What the worker prints is read as hostile: only the first few lines, each bounded.
    for line in out.stdout.lines().take(8) {
        let line: String = line.chars().take(4096).collect();
        if let Some(p) = line.strip_prefix("shell=") {
            shell = Some(p.to_string());
        } else if let Some(p) = line.strip_prefix("data=") {
            data = Some(p.to_string());
        } else if let Some(p) = line.strip_prefix("bwrap=") {
            bwrap = Some(p.to_string());
        }
    }
    match (out.status, shell) {
        (0, Some(shell)) if is_plain_absolute(&shell) => Ok(Installed {
            shell,
            data: data.filter(|d| is_plain_absolute(d)),
            bwrap,
        }),
        (93, _) | (0, Some(_)) => Err(failed(format!(
            "its root {} is not a plain absolute path (no quotes, backslashes or control \
             characters): set workers.{worker}.root to another",
            remote.root
        ))),
        (status, _) => Err(failed(format!(
            "status {status}: {}",
            crate::config::printable(out.stderr.trim())
        ))),
    }
}

/// An absolute path that can go into a JSON string and a command line as it is.
pub fn is_plain_absolute(path: &str) -> bool {
    path.starts_with('/')
        && !path
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
}

/// `value` as one word for `sh`.
fn word(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// A path of the user's settings (`~/...` or absolute) as a word the script expands on the
/// worker; `None` for anything else.
fn path_word(path: &str) -> Option<String> {
    match path.strip_prefix("~/") {
        Some(rest) => Some(format!("\"$HOME\"/{}", word(rest))),
        None => path.starts_with('/').then(|| word(path)),
    }
}

/// A shell variable's name (what `sandbox.env` accepts, `config::validate`).
pub fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The confining shell for worker `worker` under the user's `settings`.
pub fn script(worker: &str, settings: &SandboxConfig) -> String {
    let home = |rel: &&str| format!("\"$HOME\"/{}", word(rel));
    let mut caches: Vec<String> = CACHES_IN_HOME.iter().map(home).collect();
    caches.extend(settings.caches.iter().filter_map(|p| path_word(p)));
    let in_home: Vec<String> = HIDDEN_IN_HOME.iter().map(|p| word(p)).collect();
    let mut hides: Vec<String> = HIDDEN_ELSEWHERE.iter().map(|p| word(p)).collect();
    // OpenCode's own data and config, wherever the worker's XDG variables put them.
    hides.push("\"${XDG_DATA_HOME:-$HOME/.local/share}/opencode\"".into());
    hides.push("\"${XDG_CONFIG_HOME:-$HOME/.config}/opencode\"".into());
    hides.extend(settings.hide.iter().filter_map(|p| path_word(p)));
    let mut env: Vec<&str> = ENV_ALLOWED.to_vec();
    env.extend(
        settings
            .env
            .iter()
            .map(String::as_str)
            .filter(|n| is_name(n)),
    );
    env.sort_unstable();
    env.dedup();
    let hint = word(&format!(
        "the user's own delegation.yaml sets this: `sandbox:` (network, hide, caches, env), or \
         `workers.{worker}.sandbox: off` to run this worker's agents unconfined"
    ));
    let net = if settings.network {
        ""
    } else {
        " --unshare-net"
    };
    let keep_resolver = if settings.network {
        "set -- \"$@\" --ro-bind-try /run/systemd/resolve /run/systemd/resolve\n"
    } else {
        ""
    };
    let network = if settings.network { "on" } else { "off" };
    format!(
        r#"#!/bin/sh
# opencode-mcp: the confining shell of worker {worker}'s delegated agents. The gateway writes it
# before every turn (edits do not last). OpenCode runs each command as `<this file> -c <command>`;
# it runs under bubblewrap, writable only in its own task's worktree and a private /tmp.
hint={hint}
refuse() {{ printf 'opencode-mcp sandbox: refused: %s (%s)\n' "$1" "$hint" >&2; exit 126; }}
[ "$#" -eq 2 ] && [ "$1" = -c ] || refuse "expected to be run as: -c <command>"
cmd=$2
top=$(CDPATH= cd -- "${{0%/*}}/.." 2>/dev/null && pwd -P) || refuse "cannot find the worker's root from $0"
here=$(pwd -P 2>/dev/null) || refuse "the working directory cannot be read"
case $here/ in
"$top"/worktrees/?*/*) ;;
*) refuse "$here is outside this task's worktree. A delegated agent's commands run only inside its own task's worktree: run it there (leave workdir out, or pass a directory inside it)" ;;
esac
rest=${{here#"$top"/worktrees/}}
task=$top/worktrees/${{rest%%/*}}
sh=/bin/sh
[ -x /bin/bash ] && sh=/bin/bash
# A task of a tier the user's file lets run unconfined (the gateway's marker, out of any
# task's reach): the command runs as OpenCode would run it without the gateway.
[ -f "$top/sandbox/open/${{rest%%/*}}" ] && exec "$sh" -c "$cmd"
bw=$(command -v bwrap) || refuse "bubblewrap (bwrap) is not installed on this worker"
set -- --die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup-try{net} --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
for c in {caches}; do
  [ -d "$c" ] || continue
  c=$(readlink -f -- "$c" 2>/dev/null) || continue
  set -- "$@" --tmpfs "$c"
  n=0
  for e in "$c"/* "$c"/.[!.]* "$c"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=$((n + 1))
    [ "$n" -le 256 ] || break
    set -- "$@" --ro-bind-try "$e" "$e"
  done
done
# The secrets under $HOME (OpenCode's, or the ssh login's for a check) and under the home
# the user database names, when another one; then the others. `hide` sets how to cover one
# (an empty directory or an empty file); a path that is not there costs no fork.
hide() {{
  [ -e "$1" ] || return 1
  h=$(readlink -f -- "$1" 2>/dev/null) || return 1
  if [ -d "$h" ]; then how=--tmpfs; else how='--ro-bind /dev/null'; fi
}}
pw=$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f6)
for d in "$HOME" ${{pw:+"$pw"}}; do
  for r in {in_home}; do
    hide "$d/$r" && set -- "$@" $how "$h"
  done
done
for p in {hides}; do
  hide "$p" && set -- "$@" $how "$h"
done
{keep_resolver}set -- "$@" --tmpfs "$top/worktrees" --bind "$task" "$task"
if [ -e "$task/.git" ] || [ -L "$task/.git" ]; then set -- "$@" --ro-bind "$task/.git" "$task/.git"; fi
set -- "$@" --clearenv
for n in {env}; do
  eval "[ -n \"\${{$n+x}}\" ]" || continue
  eval "v=\$$n"
  set -- "$@" --setenv "$n" "$v"
done
set -- "$@" --setenv TMPDIR /tmp --chdir "$here" -- "$sh" -c "$cmd"
"$bw" "$@"
s=$?
[ "$s" -eq 0 ] || printf '\n%s\n' "opencode-mcp sandbox: this command ran confined: it may write only in $task and a private /tmp, the network is {network}, and secrets (~/.ssh, cloud credentials, provider keys) are not there. If that is why it failed (\"Read-only file system\", \"Network is unreachable\"), say so in your answer: $hint." >&2
exit "$s"
"#,
        caches = caches.join(" "),
        in_home = in_home.join(" "),
        hides = hides.join(" "),
        env = env.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Installs run side by side on one worker (a fan-out's starts) all succeed, and leave the
    /// one script and no half-written copy: each writes under a name of its own first (they
    /// once shared `shell.new`, and one's rename took the other's file from under its chmod).
    #[test]
    fn installs_side_by_side_all_succeed() {
        use std::io::Write;
        let root = tempfile::tempdir().expect("tempdir");
        let runs: Vec<_> = (0..12)
            .map(|i| {
                let mut child = std::process::Command::new("/bin/sh")
                    .args(["-c", INSTALL, "sh"])
                    .arg(root.path())
                    .args(["", "", ""])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("sh runs");
                let script = format!("#!/bin/sh\n# install {i}\n{}", "x".repeat(64 * 1024));
                let mut stdin = child.stdin.take().expect("stdin");
                std::thread::spawn(move || {
                    let _ = stdin.write_all(script.as_bytes());
                });
                child
            })
            .collect();
        for mut child in runs {
            let status = child.wait().expect("it ends");
            assert!(status.success(), "an install failed: {status}");
        }
        let left: Vec<_> = std::fs::read_dir(root.path().join("sandbox"))
            .expect("sandbox")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["shell".to_string()], "{left:?}");
    }

    #[test]
    fn paths_of_the_settings_become_words_the_worker_expands() {
        assert_eq!(
            path_word("~/.secret").as_deref(),
            Some("\"$HOME\"/'.secret'")
        );
        assert_eq!(path_word("/srv/it's").as_deref(), Some("'/srv/it'\\''s'"));
        assert_eq!(path_word("relative"), None);
        assert!(is_name("CARGO_HOME") && is_name("_x1"));
        assert!(!is_name("1X") && !is_name("A-B") && !is_name("$(id)") && !is_name(""));
        assert!(is_plain_absolute("/home/u/.opencode-mcp/sandbox/shell"));
        assert!(!is_plain_absolute("rel/shell"));
        assert!(!is_plain_absolute("/a\"b") && !is_plain_absolute("/a\\b"));
        assert!(!is_plain_absolute("/a\nb"));
    }

    #[test]
    fn a_worker_is_confined_unless_the_users_file_says_otherwise() {
        let mut config = crate::gateway::test_config();
        assert_eq!(mode(&config, "box"), SandboxMode::On);
        config.sandbox.mode = SandboxMode::Off;
        assert_eq!(mode(&config, "box"), SandboxMode::Off);
        config.workers.insert(
            "box".into(),
            crate::config::WorkerConfig {
                sandbox: Some(SandboxMode::On),
                ..Default::default()
            },
        );
        assert_eq!(mode(&config, "box"), SandboxMode::On);
        assert_eq!(mode(&config, "other"), SandboxMode::Off);
    }

    /// The script itself, run as OpenCode runs it (with real bubblewrap, on this machine as
    /// a worker would): a command in a task's worktree writes there and nowhere else, sees no
    /// secret of the home, no other task and no password; a directory outside every worktree
    /// and a call without `-c` are refused with a readable reason.
    #[test]
    fn the_script_confines_a_command_to_its_worktree() {
        if which_bwrap().is_none() {
            panic!("bubblewrap is missing: install it (`apt-get install bubblewrap`)");
        }
        // Not in /tmp: the sandbox's /tmp is private, so nothing there would prove anything.
        std::fs::create_dir_all("/var/tmp/opencode-mcp-tests").expect("/var/tmp tree");
        let tmp = tempfile::tempdir_in("/var/tmp/opencode-mcp-tests").expect("tempdir");
        let top = tmp.path().join("root");
        let home = tmp.path().join("home");
        let t1 = top.join("worktrees/t1");
        for dir in [
            t1.join("sub"),
            // A name no temporary directory's can hold (they are `.tmp` and six letters or
            // digits): the check below looks for it in all the command printed.
            top.join("worktrees/other-task"),
            top.join("repos/x.git/hooks"),
            top.join("sandbox"),
            home.join(".ssh"),
        ] {
            std::fs::create_dir_all(&dir).expect("dirs");
        }
        std::fs::write(home.join(".ssh/id_ed25519"), "PLANTED-KEY").expect("plant");
        std::fs::write(t1.join(".git"), "gitdir: /elsewhere\n").expect("pointer");
        let shell = top.join("sandbox/shell");
        std::fs::write(&shell, script("box", &SandboxConfig::default())).expect("script");
        std::fs::set_permissions(&shell, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("chmod");
        let run = |cwd: &std::path::Path, args: &[&str]| {
            let out = std::process::Command::new(&shell)
                .args(args)
                .current_dir(cwd)
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", &home)
                .env("OPENCODE_SERVER_PASSWORD", "PLANTED-PASSWORD")
                .output()
                .expect("the script runs");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.code(), text)
        };
        let attack = format!(
            "echo mine > ../mine.txt; cat ~/.ssh/id_ed25519; env; ls {top}/worktrees; \
             echo x > .git; echo x > {top}/repos/x.git/hooks/pre-commit; echo x > {home}/owned",
            top = top.display(),
            home = home.display()
        );
        let (status, out) = run(&t1.join("sub"), &["-c", &attack]);
        assert_ne!(status, Some(0), "{out}");
        assert_eq!(
            std::fs::read_to_string(t1.join("mine.txt")).expect("its own write"),
            "mine\n"
        );
        for leaked in ["PLANTED-KEY", "PLANTED-PASSWORD", "other-task"] {
            assert!(
                !out.contains(leaked),
                "{leaked} reached the command:\n{out}"
            );
        }
        assert!(out.contains("Read-only file system"), "{out}");
        assert!(
            out.contains("opencode-mcp sandbox: this command ran confined"),
            "{out}"
        );
        assert_eq!(
            std::fs::read_to_string(t1.join(".git")).expect("pointer"),
            "gitdir: /elsewhere\n"
        );
        assert!(!top.join("repos/x.git/hooks/pre-commit").exists());
        assert!(!home.join("owned").exists());

        let (status, out) = run(&top, &["-c", "touch escaped"]);
        assert_eq!(status, Some(126), "{out}");
        assert!(out.contains("refused") && out.contains("outside"), "{out}");
        assert!(!top.join("escaped").exists());
        let (status, out) = run(&t1, &["touch", "x"]);
        assert_eq!(status, Some(126), "{out}");
        assert!(out.contains("-c <command>"), "{out}");

        // The gateway's marker for a task of a tier the user lets run unconfined.
        std::fs::create_dir_all(top.join("sandbox/open")).expect("marker dir");
        std::fs::write(top.join("sandbox/open/t1"), "").expect("marker");
        let opened = format!("echo x > {}/opened", home.display());
        let (status, out) = run(&t1, &["-c", &opened]);
        assert_eq!(status, Some(0), "{out}");
        assert!(home.join("opened").exists());
    }

    fn which_bwrap() -> Option<std::path::PathBuf> {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("bwrap"))
                .find(|p| p.is_file())
        })
    }

    /// The script is valid `sh`, and what a user's settings add reaches it only as quoted
    /// words or checked names.
    #[test]
    fn the_script_is_sh_and_settings_stay_words() {
        let settings = SandboxConfig {
            network: true,
            hide: vec!["~/$(touch /tmp/owned)".into(), "relative".into()],
            caches: vec!["/opt/cache'; touch /tmp/owned; '".into()],
            env: vec!["GOOD_NAME".into(), "BAD;touch".into()],
            ..SandboxConfig::default()
        };
        let text = script("box", &settings);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("shell");
        std::fs::write(&file, &text).expect("write");
        let out = std::process::Command::new("/bin/sh")
            .arg("-n")
            .arg(&file)
            .output()
            .expect("sh -n");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("\"$HOME\"/'$(touch /tmp/owned)'"), "{text}");
        assert!(
            text.contains("'/opt/cache'\\''; touch /tmp/owned; '\\'''"),
            "{text}"
        );
        assert!(text.contains("GOOD_NAME") && !text.contains("BAD;touch"));
        assert!(!text.contains("relative"));
        assert!(!text.contains("--unshare-net") && text.contains("/run/systemd/resolve"));
        let closed = script("box", &SandboxConfig::default());
        assert!(closed.contains("--unshare-net") && !closed.contains("systemd/resolve"));
    }
}
