//! A terminal for the tests that drive a terminal UI (OpenCode's, Claude Code's interactive
//! CLI): a tmux server on a private socket, one detached session, keys typed into it and its
//! screen read back.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The name of the one session.
const SESSION: &str = "test";

/// A tmux server on a private socket, killed (with everything in it) when dropped, also when the
/// test fails.
pub struct Tmux {
    dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts a detached 200x50 session `watch` running `cmd`'s program, arguments and
    /// environment (the server starts with exactly that environment, plus TERM).
    pub fn start(cmd: &Command) -> Self {
        if Command::new("tmux").arg("-V").output().is_err() {
            panic!(
                "tmux is not installed; this test runs a terminal UI inside it: install it with \
                 `apt-get install tmux` (or `brew install tmux`)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("test-tmux-")
            .tempdir()
            .expect("temp dir for the tmux socket");
        let conf = dir.path().join("tmux.conf");
        // The pane keeps what the program printed after it exits, so a failure shows its
        // error; a terminal the TUI knows.
        std::fs::write(
            &conf,
            "set -g remain-on-exit on\nset -g default-terminal xterm-256color\nset -g history-limit 5000\n",
        )
        .expect("write tmux.conf");
        let tmux = Tmux { dir };
        let mut start = Command::new("tmux");
        start
            .arg("-S")
            .arg(tmux.socket())
            .arg("-f")
            .arg(&conf)
            .args(["new-session", "-d", "-x", "200", "-y", "50", "-s", SESSION])
            .arg("--")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .env_clear()
            .env("TERM", "xterm-256color");
        if let Some(dir) = cmd.get_current_dir() {
            start.current_dir(dir);
        }
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                start.env(k, v);
            }
        }
        let out = start.output().expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tmux
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(self.socket())
            .args(args)
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the pane shows now.
    pub fn pane(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", SESSION])
    }

    /// Types `text` into the pane, literally (no key names).
    pub fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", SESSION, "-l", text]);
    }

    /// Presses tmux key `key` (e.g. `Enter`, `Escape`, `Down`).
    pub fn press(&self, key: &str) {
        self.run(&["send-keys", "-t", SESSION, key]);
    }

    /// Polls the pane (bounded) until `seen` holds for it; returns it, or `Err` with the last one.
    pub fn wait_for(
        &self,
        within: Duration,
        seen: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let start = Instant::now();
        loop {
            let pane = self.pane();
            if seen(&pane) {
                return Ok(pane);
            }
            if start.elapsed() > within {
                return Err(pane);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of the program the pane runs.
    pub fn pane_pid(&self) -> Option<u32> {
        self.run(&["display-message", "-p", "-t", SESSION, "#{pane_pid}"])
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Tmux {
    /// Kills the server and waits (at most 10 s, then SIGKILL) until the pane's program has
    /// exited: a program still shutting down (Claude Code saves its state on SIGHUP) would
    /// write into its temp home after the test removed it, and leave it behind.
    fn drop(&mut self) {
        let program = self.pane_pid();
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(self.socket())
            .arg("kill-server")
            .output();
        let Some(pid) = program else {
            return;
        };
        let gone = || !super::procs::stat(pid).is_some_and(|p| p.is_live());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !gone() {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill(2) on a pid this test's tmux started; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}
