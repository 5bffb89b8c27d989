//! Whether confinement can work on this machine, found out once by running `bwrap` itself.
//!
//! Looking for the binary is not enough: bubblewrap needs user namespaces when it is not
//! setuid, and distributions forbid them in different ways (Debian's
//! `kernel.unprivileged_userns_clone`, Ubuntu 24.04's AppArmor restriction, a container without
//! `CAP_SYS_ADMIN`). So the probe runs the same kind of sandbox a command gets, around `true`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long the probe's `bwrap` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether tasks can be confined here.
#[derive(Debug, Clone, PartialEq)]
pub enum Availability {
    /// `bwrap` works: the path of the binary.
    Ready(PathBuf),
    /// It cannot work here: why, and the lines that fix it.
    Missing { why: String, fix: Vec<String> },
    /// This platform has no sandbox the gateway drives (macOS: Seatbelt is written down in the
    /// README for later).
    Unsupported(&'static str),
}

/// Whether a task ran confined, as its record keeps it and every view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confinement {
    /// Its commands and checks ran in the sandbox.
    Confined,
    /// They did not, and why (the user turned it off, an attached server, a worker).
    Unconfined(String),
}

impl Confinement {
    pub fn is_confined(&self) -> bool {
        matches!(self, Self::Confined)
    }

    /// Why not, for an unconfined task.
    pub fn why_not(&self) -> Option<&str> {
        match self {
            Self::Confined => None,
            Self::Unconfined(why) => Some(why),
        }
    }
}

/// The probe's answer for this process, found on first use.
pub fn availability() -> &'static Availability {
    static FOUND: OnceLock<Availability> = OnceLock::new();
    FOUND.get_or_init(probe)
}

/// Runs the probe now (the doctor wants a fresh answer).
pub fn probe() -> Availability {
    if !cfg!(target_os = "linux") {
        return Availability::Unsupported(std::env::consts::OS);
    }
    // On `PATH`, else where distributions install it: a host may start the gateway with a
    // `PATH` of its own that leaves `/usr/bin` out.
    let found = crate::opencode::find_program("bwrap", |p| p.is_file()).or_else(|| {
        ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.is_file())
    });
    let Some(bwrap) = found else {
        return Availability::Missing {
            why: "bubblewrap (`bwrap`) is not installed, and every command a delegated agent \
                  runs is confined with it"
                .into(),
            fix: vec![
                "install bubblewrap: `sudo apt-get install bubblewrap` (Debian, Ubuntu), `sudo \
                 dnf install bubblewrap` (Fedora), `sudo pacman -S bubblewrap` (Arch)"
                    .into(),
                format!("or run tasks unconfined: {}", OPT_OUT),
            ],
        };
    };
    match run_probe(&bwrap) {
        Ok(()) => Availability::Ready(bwrap),
        Err(why) => Availability::Missing {
            why: format!("`{}` cannot make a sandbox here: {why}", bwrap.display()),
            fix: vec![
                "allow unprivileged user namespaces: `sudo sysctl -w \
                 kernel.unprivileged_userns_clone=1` (Debian), or `sudo sysctl -w \
                 kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04 and later); in \
                 a container, run it with user namespaces allowed"
                    .into(),
                format!("or run tasks unconfined: {}", OPT_OUT),
            ],
        },
    }
}

/// How the user turns confinement off, for every message that offers it.
pub const OPT_OUT: &str = "`sandbox: {mode: off}` in your own delegation.yaml \
                           (~/.config/opencode-mcp/delegation.yaml; a repository's file cannot \
                           set it)";

fn run_probe(bwrap: &std::path::Path) -> Result<(), String> {
    let mut child = Command::new(bwrap)
        .args([
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--",
            "/bin/sh",
            "-c",
            ":",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("it could not be started ({e})"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    use std::io::Read;
                    let _ = (&mut stderr).take(4096).read_to_string(&mut err);
                }
                let err = err.trim();
                return Err(if err.is_empty() {
                    format!("it {status}")
                } else {
                    err.to_string()
                });
            }
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "it did not finish within {} s",
                    PROBE_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for it failed ({e})")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `bwrap` that cannot be started, or fails, is reported with what it said.
    #[test]
    fn a_bwrap_that_fails_is_reported_with_its_words() {
        let missing = run_probe(std::path::Path::new("/nonexistent/bwrap")).expect_err("missing");
        assert!(missing.contains("could not be started"), "{missing}");
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("bwrap");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'No permissions to create a new namespace' >&2\nexit 1\n",
        )
        .expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let failed = run_probe(&fake).expect_err("fails");
        assert!(failed.contains("No permissions"), "{failed}");
        let silent = dir.path().join("silent");
        std::fs::write(&silent, "#!/bin/sh\nexit 3\n").expect("write");
        std::fs::set_permissions(&silent, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let quiet = run_probe(&silent).expect_err("fails");
        assert!(quiet.contains("exit status: 3"), "{quiet}");
    }

    #[test]
    fn confinement_says_why_not() {
        assert!(Confinement::Confined.is_confined());
        assert_eq!(Confinement::Confined.why_not(), None);
        let off = Confinement::Unconfined("off".into());
        assert!(!off.is_confined());
        assert_eq!(off.why_not(), Some("off"));
    }
}
