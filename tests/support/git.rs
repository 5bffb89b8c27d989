//! Real `git` for the tests that need a repository, run as a user without any git config would
//! (no global or system config, a fixed identity), so a developer's settings cannot change what
//! a test sees.

use std::path::Path;
use std::process::Command;

/// Runs git in `dir` and returns its stdout; a failure fails the test with git's stderr.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        // Reads in a test must not refresh the index the test is checking.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_AUTHOR_NAME", "user")
        .env("GIT_AUTHOR_EMAIL", "user@example.invalid")
        .env("GIT_COMMITTER_NAME", "user")
        .env("GIT_COMMITTER_EMAIL", "user@example.invalid")
        .output()
        .expect("git runs (the tests need git on PATH: apt-get install git)");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes `dir` a git repository on `main` whose one commit holds `files` (path, content; missing
/// directories are created).
pub fn init_repo(dir: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        std::fs::write(&file, content).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
    }
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &["commit", "-q", "-m", "initial"],
    ] {
        git(dir, args);
    }
}
