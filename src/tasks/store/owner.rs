//! Which gateway is alive, asked through a lock rather than `/proc`.
//!
//! Several gateways may share one state directory (one per host window, say). At start-up a
//! gateway must tell another gateway's live tasks, which it leaves alone, from a dead gateway's,
//! which it takes over. Asking the process table does not work everywhere (`/proc` is Linux's),
//! and a pid alone can be reused. So every gateway holds an exclusive lock on
//! `<state_dir>/owners/<pid>.lock` for as long as it runs: the operating system drops the lock
//! when the process ends, however it ends (SIGKILL and a crash included). Whether gateway `pid`
//! is alive is then whether that lock is held, which works the same on Linux and macOS.
//!
//! A record written by a gateway from before these locks has no lock file; there, on Linux, the
//! process table still answers (a live process named `opencode-mcp` with that pid).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// The directory of owner locks inside the state directory.
const OWNERS_DIR: &str = "owners";

/// This gateway's lock: held from [`OwnerLock::acquire`] until dropped (or the process ends).
#[derive(Debug)]
pub struct OwnerLock {
    path: PathBuf,
    _file: File,
}

impl OwnerLock {
    /// Takes `<state_dir>/owners/<own pid>.lock`. A lock file left by a dead process with the
    /// same pid is simply taken over: its lock went with that process.
    pub fn acquire(state_dir: &Path) -> std::io::Result<Self> {
        let dir = state_dir.join(OWNERS_DIR);
        crate::private_files::create_dir(&dir)?;
        let path = lock_path(state_dir, std::process::id());
        let file = open(&path)?;
        match file.try_lock() {
            Ok(()) => Ok(Self { path, _file: file }),
            Err(TryLockError::WouldBlock) => Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is held by another process", path.display()),
            )),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        // The lock itself goes with the file handle; the file is only tidied away.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the gateway with `pid` is running, as its owner lock (or, for a gateway from before
/// the locks, the process table on Linux) says.
pub fn alive(state_dir: &Path, pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let path = lock_path(state_dir, pid);
    match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(file) => match file.try_lock() {
            Err(TryLockError::WouldBlock) => true,
            Ok(()) => {
                // Nobody holds it: that gateway is gone. Tidy its file while we hold the lock.
                let _ = std::fs::remove_file(&path);
                false
            }
            // A lock that cannot be asked about is taken as held: leaving a live gateway's
            // tasks alone is the safe mistake.
            Err(TryLockError::Error(_)) => true,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => legacy_alive(pid),
        Err(_) => true,
    }
}

fn lock_path(state_dir: &Path, pid: u32) -> PathBuf {
    state_dir.join(OWNERS_DIR).join(format!("{pid}.lock"))
}

fn open(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// A gateway from before the owner locks: a live process named `opencode-mcp` with that pid.
#[cfg(target_os = "linux")]
fn legacy_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let running = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .is_some_and(|s| s != 'Z' && s != 'X');
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    running && comm.trim().starts_with("opencode-mcp")
}

/// Elsewhere there were never gateways without locks.
#[cfg(not(target_os = "linux"))]
fn legacy_alive(_pid: u32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_means_alive_and_a_released_one_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Another gateway, played by a lock file this test holds under a pid that is not ours.
        let other = u32::MAX - 7;
        std::fs::create_dir_all(dir.path().join(OWNERS_DIR)).expect("dir");
        let held = open(&lock_path(dir.path(), other)).expect("open");
        held.lock().expect("lock");
        assert!(alive(dir.path(), other));
        drop(held);
        // A child another test thread forks at this moment shares the lock's open file until it
        // execs (the descriptor is close-on-exec): the release may be seen a moment later.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(dir.path(), other) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(!alive(dir.path(), other));
        assert!(
            !lock_path(dir.path(), other).exists(),
            "a dead owner's file is tidied"
        );
        // No lock file and no such process: gone.
        assert!(!alive(dir.path(), u32::MAX - 8));
    }

    #[test]
    fn our_own_lock_is_held_until_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = OwnerLock::acquire(dir.path()).expect("acquire");
        let path = lock_path(dir.path(), std::process::id());
        assert!(path.exists());
        // Another open file description cannot take it while we hold it.
        let probe = open(&path).expect("open");
        assert!(matches!(probe.try_lock(), Err(TryLockError::WouldBlock)));
        drop(probe);
        drop(lock);
        assert!(!path.exists());
    }
}
