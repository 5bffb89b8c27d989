//! The files that confine one managed OpenCode server: its policy and its shell script.
//!
//! OpenCode's `shell` setting is one path for the whole server, and OpenCode silently falls
//! back to plain `bash` when that file is missing (measured on 1.18.33: one INFO log line). So
//! the script is written before the server starts and written again, when it is missing or not
//! what the gateway wrote, before every turn ([`ServerSandbox::admit`]). Both files live in the
//! gateway's private state directory (`sandbox/`, mode 0700), which confined commands cannot
//! see and delegated sessions may not edit.
//!
//! The policy's `roots` grow as tasks start on the server: each task's root is registered before
//! its session exists, so its first command already finds it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::policy::Policy;

/// The most task roots a server's policy keeps (see [`ServerSandbox::admit`]).
pub const MAX_ROOTS: usize = 512;

/// The confinement of one server.
#[derive(Debug)]
pub struct ServerSandbox {
    policy: Mutex<Policy>,
    policy_file: PathBuf,
    script: PathBuf,
    script_text: String,
    /// Set when the server outlives this gateway (it lingers, see `opencode::linger`): its
    /// files must then stay for the next gateway, or OpenCode would run commands unconfined.
    kept: std::sync::atomic::AtomicBool,
}

impl ServerSandbox {
    /// Writes the policy and the script for server `key` under `dir`, the script running
    /// `exe` (this binary).
    pub fn create(dir: &Path, key: &str, policy: Policy, exe: &Path) -> std::io::Result<Self> {
        crate::private_files::create_dir(dir)?;
        let sandbox = Self::at(dir, key, policy, exe);
        sandbox.write_policy(&sandbox.lock())?;
        sandbox.write_script()?;
        Ok(sandbox)
    }

    /// The confinement of server `key` as the gateway that started it left it (the server
    /// lingered, and this gateway takes it over): its policy is read back, and both files are
    /// written again, the script for `exe`. The policy is read as the confining shell reads it
    /// (bounded).
    pub fn reopen(dir: &Path, key: &str, exe: &Path) -> std::io::Result<Self> {
        let policy = super::shell::read_policy(&dir.join(format!("{key}.json")))
            .map_err(std::io::Error::other)?;
        Self::create(dir, key, policy, exe)
    }

    fn at(dir: &Path, key: &str, policy: Policy, exe: &Path) -> Self {
        let policy_file = dir.join(format!("{key}.json"));
        let script = dir.join(format!("{key}.sh"));
        let script_text = format!(
            "#!/bin/sh\n# opencode-mcp: runs each command of a delegated agent confined (see \
             `opencode-mcp doctor`).\nexec {} {} {} \"$@\"\n",
            sh_quote(&exe.to_string_lossy()),
            super::shell::SUBCOMMAND,
            sh_quote(&policy_file.to_string_lossy()),
        );
        Self {
            policy: Mutex::new(policy),
            policy_file,
            script,
            script_text,
            kept: Default::default(),
        }
    }

    /// Leaves the files in place when this handle drops: the server outlives this gateway.
    pub fn keep(&self) {
        self.kept.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The script OpenCode is given as its `shell`.
    pub fn shell(&self) -> &Path {
        &self.script
    }

    /// Registers `root` (a task's worktree or directory) and makes sure the script is in
    /// place: called before each turn of a task on this server. The roots are kept most recent
    /// last and at most [`MAX_ROOTS`] of them (a root that is gone is dropped), so a server
    /// that runs for weeks keeps a small file: a task's root is registered again before each of
    /// its turns, so only roots of turns long over leave.
    ///
    /// `open`: the task's commands run unconfined (its tier's `sandbox: off`), as its own turn
    /// says each time.
    pub fn admit(&self, root: &Path, open: bool) -> std::io::Result<()> {
        let root = root.canonicalize()?;
        let mut policy = self.lock();
        let was_open = policy.open_roots.contains(&root);
        if policy.roots.last() != Some(&root) || was_open != open {
            policy.roots.retain(|r| *r != root && r.is_dir());
            policy.roots.push(root.clone());
            let over = policy.roots.len().saturating_sub(MAX_ROOTS);
            policy.roots.drain(..over);
            let Policy {
                roots, open_roots, ..
            } = &mut *policy;
            open_roots.retain(|r| *r != root && roots.contains(r));
            if open {
                open_roots.push(root);
            }
            self.write_policy(&policy)?;
        }
        drop(policy);
        let intact = std::fs::read_to_string(&self.script).is_ok_and(|t| t == self.script_text);
        if !intact {
            tracing::warn!(script = %self.script.display(), "the sandbox shell script was missing or changed; writing it again");
            self.write_script()?;
        }
        Ok(())
    }

    /// The policy as it stands (for the checks of this server's tasks).
    pub fn policy(&self) -> Policy {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write_policy(&self, policy: &Policy) -> std::io::Result<()> {
        let dir = self.policy_file.parent().unwrap_or(Path::new("."));
        let bytes = serde_json::to_vec(policy).map_err(std::io::Error::other)?;
        crate::private_files::write_atomic(dir, &self.policy_file, "policy", &bytes, None)
    }

    fn write_script(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.script.parent().unwrap_or(Path::new("."));
        crate::private_files::write_atomic(
            dir,
            &self.script,
            "shell",
            self.script_text.as_bytes(),
            None,
        )?;
        std::fs::set_permissions(&self.script, std::fs::Permissions::from_mode(0o700))
    }
}

impl Drop for ServerSandbox {
    fn drop(&mut self) {
        if self.kept.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let _ = std::fs::remove_file(&self.script);
        let _ = std::fs::remove_file(&self.policy_file);
    }
}

/// `'text'` for `sh`, with any `'` inside written as `'\''`.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_script_is_written_again_and_roots_are_kept_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("task");
        std::fs::create_dir_all(&root).expect("root");
        let policy = Policy::from_settings(
            &crate::config::SandboxConfig::default(),
            PathBuf::from("/usr/bin/bwrap"),
            Some(dir.path()),
            &[],
        );
        let sandbox = ServerSandbox::create(
            &dir.path().join("sandbox"),
            "srv_1",
            policy,
            Path::new("/opt/it's/opencode-mcp"),
        )
        .expect("create");
        let script = std::fs::read_to_string(sandbox.shell()).expect("script");
        assert!(
            script.contains(r"'/opt/it'\''s/opencode-mcp' __sandbox-shell"),
            "{script}"
        );
        std::fs::remove_file(sandbox.shell()).expect("remove");
        sandbox.admit(&root, false).expect("admit");
        sandbox.admit(&root, false).expect("admit again");
        assert_eq!(
            std::fs::read_to_string(sandbox.shell()).expect("script"),
            script
        );
        let saved: Policy = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("sandbox/srv_1.json")).expect("policy"),
        )
        .expect("json");
        assert_eq!(saved.roots, vec![root.canonicalize().expect("canon")]);
        // Most recent last, bounded, gone ones dropped.
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).expect("other");
        sandbox.admit(&other, false).expect("admit other");
        sandbox.admit(&root, false).expect("admit root again");
        let canon = |p: &Path| p.canonicalize().expect("canon");
        assert_eq!(sandbox.policy().roots, vec![canon(&other), canon(&root)]);
        // A turn of a tier the user lets run unconfined opens its root; its next confined
        // turn closes it again.
        sandbox.admit(&other, true).expect("admit open");
        assert_eq!(sandbox.policy().open_roots, vec![canon(&other)]);
        assert_eq!(sandbox.policy().roots, vec![canon(&root), canon(&other)]);
        sandbox.admit(&other, false).expect("admit closed");
        assert!(sandbox.policy().open_roots.is_empty());
        std::fs::remove_dir(&other).expect("remove");
        for i in 0..MAX_ROOTS + 3 {
            let d = dir.path().join(format!("r{i}"));
            std::fs::create_dir_all(&d).expect("dir");
            sandbox.admit(&d, false).expect("admit");
        }
        let roots = sandbox.policy().roots;
        assert_eq!(roots.len(), MAX_ROOTS);
        assert_eq!(
            roots.last(),
            Some(&canon(&dir.path().join(format!("r{}", MAX_ROOTS + 2))))
        );
        let files = dir.path().join("sandbox");
        drop(sandbox);
        assert_eq!(std::fs::read_dir(files).expect("dir").count(), 0);
    }

    /// A server that outlives its gateway keeps its files; the next gateway reopens them with
    /// the policy as it was (its task roots included), and a missing policy is an error.
    #[test]
    fn a_kept_sandbox_is_reopened_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("task");
        std::fs::create_dir_all(&root).expect("root");
        let files = dir.path().join("sandbox");
        let exe = Path::new("/opt/opencode-mcp");
        let policy = Policy::from_settings(
            &crate::config::SandboxConfig::default(),
            PathBuf::from("/usr/bin/bwrap"),
            Some(dir.path()),
            &[],
        );
        let sandbox = ServerSandbox::create(&files, "srv_1", policy, exe).expect("create");
        sandbox.admit(&root, false).expect("admit");
        let (policy, shell) = (sandbox.policy(), sandbox.shell().to_path_buf());
        sandbox.keep();
        drop(sandbox);
        assert!(shell.exists(), "a kept sandbox's script was removed");
        let reopened = ServerSandbox::reopen(&files, "srv_1", exe).expect("reopen");
        assert_eq!(reopened.policy(), policy);
        assert_eq!(reopened.shell(), shell);
        assert!(ServerSandbox::reopen(&files, "srv_2", exe).is_err());
        drop(reopened);
        assert!(
            !shell.exists(),
            "a reopened sandbox's files are its own again"
        );
    }
}
