//! The sandbox's rules for one command, and the `bwrap` command line that enforces them.
//!
//! The rules are resolved once from the user's `sandbox:` settings into absolute paths
//! ([`Policy::from_settings`]); what exists on disk is looked at when each command starts (a
//! `~/.aws` made after the gateway started is hidden too). The same [`Policy`] confines an
//! agent's command (through the [`shell`](super::shell) subcommand, which reads it from the
//! file the gateway wrote for the server) and a check (built in the gateway).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::SandboxConfig;

/// Secrets hidden from every confined command, relative to the home directory: keys, tokens and
/// cloud credentials, and OpenCode's own data (its `auth.json` holds provider keys, its
/// database every session of every task) and config (provider options may hold keys).
pub const HIDDEN_IN_HOME: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".vault-token",
    ".password-store",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/opencode",
    ".local/share/opencode",
    ".cargo/credentials",
    ".cargo/credentials.toml",
];

/// Hidden outside the home directory: `/run` holds sockets (an ssh or gpg agent, docker's)
/// that a read-only mount does not stop a `connect` to.
pub const HIDDEN_ELSEWHERE: &[&str] = &["/run", "/var/run"];

/// Toolchain caches, relative to the home directory: readable, their top level a private
/// writable layer (see the module doc of [`super`]).
pub const CACHES_IN_HOME: &[&str] = &[".cargo", ".rustup", ".npm", ".cache"];

/// Variables a confined command keeps (when set); every other one is dropped.
pub const ENV_ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "TZ",
    "NO_COLOR",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "GOPATH",
    "GOROOT",
    "JAVA_HOME",
];

/// The most entries of one cache directory bound back read-only: each is a mount.
const MAX_CACHE_ENTRIES: usize = 256;

/// Everything a confined command is held to, with paths already absolute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The `bwrap` binary (an absolute path, found when the policy was made).
    pub bwrap: PathBuf,
    /// Whether commands share the machine's network.
    pub network: bool,
    /// Paths replaced by an empty directory (or an empty file) when they exist.
    pub hide: Vec<PathBuf>,
    /// Caches: readable, their top level a private writable layer.
    pub caches: Vec<PathBuf>,
    /// Names of the variables kept.
    pub env: Vec<String>,
    /// The task roots a command may run in (the server's file; checks pass their root).
    #[serde(default)]
    pub roots: Vec<PathBuf>,
    /// Of `roots`, those whose commands run unconfined: tasks of a tier the user's file lets
    /// run so (`tiers[].sandbox: off`).
    #[serde(default)]
    pub open_roots: Vec<PathBuf>,
}

impl Policy {
    /// The policy for the user's `settings`, with `home` the user's home directory and
    /// `private` the directories no command may see (the gateway's state directory, OpenCode's
    /// data directory when it is not the default one).
    pub fn from_settings(
        settings: &SandboxConfig,
        bwrap: PathBuf,
        home: Option<&Path>,
        private: &[PathBuf],
    ) -> Self {
        let expand = |p: &str| -> Option<PathBuf> {
            match (p.strip_prefix("~/"), home) {
                (Some(rest), Some(home)) => Some(home.join(rest)),
                (Some(_), None) => None,
                (None, _) => Path::new(p).is_absolute().then(|| PathBuf::from(p)),
            }
        };
        let in_home = |rel: &&str| home.map(|h| h.join(rel));
        let mut hide: Vec<PathBuf> = HIDDEN_IN_HOME.iter().filter_map(in_home).collect();
        hide.extend(HIDDEN_ELSEWHERE.iter().map(PathBuf::from));
        hide.extend(private.iter().cloned());
        hide.extend(settings.hide.iter().filter_map(|p| expand(p)));
        let mut caches: Vec<PathBuf> = CACHES_IN_HOME.iter().filter_map(in_home).collect();
        caches.extend(settings.caches.iter().filter_map(|p| expand(p)));
        let mut env: Vec<String> = ENV_ALLOWED.iter().map(|s| s.to_string()).collect();
        env.extend(settings.env.iter().cloned());
        env.sort_unstable();
        env.dedup();
        Self {
            bwrap,
            network: settings.network,
            hide,
            caches,
            env,
            roots: Vec::new(),
            open_roots: Vec::new(),
        }
    }

    /// The registered root `cwd` lies in (the deepest one, when roots nest), if any. Both are
    /// compared as canonical paths, so a `..` or a link cannot lead out of a root.
    pub fn root_for(&self, cwd: &Path) -> Option<PathBuf> {
        let cwd = cwd.canonicalize().ok()?;
        self.roots
            .iter()
            .filter_map(|r| r.canonicalize().ok())
            .filter(|r| cwd.starts_with(r))
            .max_by_key(|r| r.components().count())
    }

    /// The `bwrap` command that runs `program args…` confined to `root` (writable), in `cwd`
    /// (which must lie in `root`), with the allowed part of this process's environment.
    pub fn command(
        &self,
        root: &Path,
        cwd: &Path,
        program: &OsStr,
        args: &[&OsStr],
    ) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.bwrap);
        cmd.args(self.bwrap_args(root, cwd));
        cmd.arg("--").arg(program).args(args);
        cmd.env_clear();
        for name in &self.env {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        cmd.env("TMPDIR", "/tmp");
        cmd
    }

    /// The options of the `bwrap` line, in the order the mounts must be made: the read-only
    /// root, a private `/tmp`, the caches, the hidden paths, the task's root (which may lie in
    /// a hidden directory: a worktree under the state directory), the hidden paths inside the
    /// task's root again, and the root's `.git` read-only.
    pub fn bwrap_args(&self, root: &Path, cwd: &Path) -> Vec<OsString> {
        let mut a = Args::default();
        a.flags(&[
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]);
        if !self.network {
            a.flags(&["--unshare-net"]);
        }
        a.pair("--ro-bind", "/", "/");
        a.one("--dev", "/dev");
        a.one("--proc", "/proc");
        a.one("--tmpfs", "/tmp");
        let hidden: Vec<PathBuf> = self
            .hide
            .iter()
            .filter_map(|p| p.canonicalize().ok())
            .collect();
        for cache in &self.caches {
            let Ok(cache) = cache.canonicalize() else {
                continue;
            };
            if !cache.is_dir() || hidden.iter().any(|h| cache.starts_with(h)) {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&cache) else {
                continue;
            };
            a.one("--tmpfs", &cache);
            for entry in entries.flatten().take(MAX_CACHE_ENTRIES) {
                let path = entry.path();
                if hidden.iter().any(|h| h == &path || path.starts_with(h)) {
                    continue;
                }
                // A link is bound as what it points to would be: as the link itself is simpler,
                // and bwrap follows it to the same place.
                a.pair("--ro-bind-try", &path, &path);
            }
        }
        // Network on: name resolution may go through /run (systemd-resolved's stub).
        let keep_in_run: &[&str] = if self.network {
            &["/run/systemd/resolve"]
        } else {
            &[]
        };
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        for h in &hidden {
            hide(&mut a, h);
        }
        for keep in keep_in_run {
            a.pair("--ro-bind-try", keep, keep);
        }
        a.pair("--bind", &root, &root);
        for h in hidden
            .iter()
            .filter(|h| h.starts_with(&root) && *h != &root)
        {
            hide(&mut a, h);
        }
        let git = root.join(".git");
        if git.symlink_metadata().is_ok() {
            a.pair("--ro-bind", &git, &git);
        }
        a.one("--chdir", cwd);
        a.0
    }
}

/// An empty directory in place of a directory, `/dev/null` in place of anything else.
fn hide(a: &mut Args, path: &Path) {
    if path.is_dir() {
        a.one("--tmpfs", path);
    } else {
        a.pair("--ro-bind", "/dev/null", path);
    }
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flags(&mut self, flags: &[&str]) {
        self.0.extend(flags.iter().map(OsString::from));
    }
    fn one(&mut self, flag: &str, value: impl AsRef<OsStr>) {
        self.0.push(flag.into());
        self.0.push(value.as_ref().to_os_string());
    }
    fn pair(&mut self, flag: &str, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) {
        self.one(flag, from);
        self.0.push(to.as_ref().to_os_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(home: &Path, state: &Path) -> Policy {
        Policy::from_settings(
            &SandboxConfig::default(),
            PathBuf::from("/usr/bin/bwrap"),
            Some(home),
            &[state.to_path_buf()],
        )
    }

    fn position(args: &[OsString], a: &str, b: &Path) -> Option<usize> {
        args.windows(2)
            .position(|w| w[0] == a && Path::new(&w[1]) == b)
    }

    #[test]
    fn a_worktree_under_the_hidden_state_directory_is_bound_after_it_is_hidden() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let state = dir.path().join("state");
        let root = state.join("worktrees/tsk_1");
        std::fs::create_dir_all(home.join(".ssh")).expect("ssh");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::write(root.join(".git"), "gitdir: /elsewhere\n").expect("git");
        let p = policy(&home, &state);
        let args = p.bwrap_args(&root, &root);
        let state = state.canonicalize().expect("state");
        let root = root.canonicalize().expect("root");
        let hidden = position(&args, "--tmpfs", &state).expect("state hidden");
        let bound = position(&args, "--bind", &root).expect("root bound");
        assert!(hidden < bound, "{args:?}");
        let ssh = home.join(".ssh").canonicalize().expect("ssh");
        assert!(position(&args, "--tmpfs", &ssh).is_some(), "{args:?}");
        let git = args
            .windows(3)
            .position(|w| w[0] == "--ro-bind" && Path::new(&w[2]) == root.join(".git"))
            .expect("the .git pointer is read-only");
        assert!(git > bound);
        assert!(args.iter().any(|a| a == "--unshare-net"));
        assert!(args.iter().any(|a| a == "--unshare-pid"));
    }

    #[test]
    fn cache_entries_are_bound_back_read_only_except_credentials() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".cargo/registry")).expect("registry");
        std::fs::write(home.join(".cargo/credentials.toml"), "token").expect("creds");
        let p = policy(&home, &dir.path().join("state"));
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        let args = p.bwrap_args(&root, &root);
        let cargo = home.join(".cargo").canonicalize().expect("cargo");
        assert!(position(&args, "--tmpfs", &cargo).is_some(), "{args:?}");
        assert!(position(&args, "--ro-bind-try", &cargo.join("registry")).is_some());
        assert!(position(&args, "--ro-bind-try", &cargo.join("credentials.toml")).is_none());
        let creds = args.windows(3).any(|w| {
            w[0] == "--ro-bind" && w[1] == "/dev/null" && w[2] == cargo.join("credentials.toml")
        });
        assert!(
            creds,
            "the credentials file is replaced by an empty one: {args:?}"
        );
    }

    /// The user's paths: `~/` under the home, absolute as given, anything else (or `~/` with
    /// no home) left out; the user's variables join the allowed ones once.
    #[test]
    fn the_users_paths_and_names_are_taken_as_written() {
        let settings = SandboxConfig {
            hide: vec!["~/secrets".into(), "/srv/keys".into(), "relative/x".into()],
            caches: vec!["~/.gradle".into()],
            env: vec!["GOFLAGS".into(), "PATH".into()],
            network: true,
            ..SandboxConfig::default()
        };
        let home = Path::new("/home/u");
        let p = Policy::from_settings(&settings, PathBuf::from("/usr/bin/bwrap"), Some(home), &[]);
        assert!(p.hide.contains(&home.join("secrets")));
        assert!(p.hide.contains(&PathBuf::from("/srv/keys")));
        assert!(!p.hide.iter().any(|h| h.ends_with("relative/x")));
        assert!(p.caches.contains(&home.join(".gradle")));
        assert_eq!(p.env.iter().filter(|n| *n == "PATH").count(), 1);
        assert!(p.env.contains(&"GOFLAGS".to_string()));
        assert!(p.network);
        let homeless = Policy::from_settings(&settings, PathBuf::from("/usr/bin/bwrap"), None, &[]);
        assert!(!homeless.hide.iter().any(|h| h.ends_with("secrets")));
        assert!(homeless.caches.is_empty());
        // With the network on, no network namespace, and name resolution's stub stays.
        let dir = tempfile::tempdir().expect("tempdir");
        let args = homeless.bwrap_args(dir.path(), dir.path());
        assert!(!args.iter().any(|a| a == "--unshare-net"));
        assert!(args.iter().any(|a| a == "/run/systemd/resolve"));
    }

    #[test]
    fn a_hidden_file_is_an_empty_one_and_a_cache_inside_a_hidden_path_is_not_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".cargo/registry")).expect("cargo");
        std::fs::write(home.join(".netrc"), "machine x password y").expect("netrc");
        let settings = SandboxConfig {
            hide: vec!["~/.cargo".into()],
            ..SandboxConfig::default()
        };
        let p = Policy::from_settings(&settings, PathBuf::from("/usr/bin/bwrap"), Some(&home), &[]);
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        let args = p.bwrap_args(&root, &root);
        let netrc = home.join(".netrc").canonicalize().expect("netrc");
        assert!(args
            .windows(3)
            .any(|w| w[0] == "--ro-bind" && w[1] == "/dev/null" && Path::new(&w[2]) == netrc));
        let cargo = home.join(".cargo").canonicalize().expect("cargo");
        assert!(
            !args.iter().any(|a| Path::new(a) == cargo.join("registry")),
            "{args:?}"
        );
    }

    #[test]
    fn the_deepest_registered_root_holding_the_directory_is_chosen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outer = dir.path().join("repo");
        let inner = outer.join("sub/task");
        std::fs::create_dir_all(inner.join("deep")).expect("dirs");
        let mut p = policy(dir.path(), &dir.path().join("state"));
        p.roots = vec![outer.clone(), inner.clone()];
        let canon = |p: &Path| p.canonicalize().expect("canon");
        assert_eq!(p.root_for(&inner.join("deep")), Some(canon(&inner)));
        assert_eq!(p.root_for(&outer.join("sub")), Some(canon(&outer)));
        assert_eq!(p.root_for(dir.path()), None);
        assert_eq!(p.root_for(&outer.join("sub/../..")), None);
        assert_eq!(p.root_for(Path::new("/")), None);
    }
}
