//! What lets the next gateway take over a managed OpenCode that outlived the gateway that
//! started it: one private file per lingering server, `<state_dir>/linger/<server_id>.json`,
//! beside the Unix socket its supervisor listens on, `<server_id>.sock`.
//!
//! A host's reconnect (Claude Code's `/mcp`, an update, a closed terminal) ends the gateway
//! cleanly while its tasks run. Rather than stop their OpenCode, the gateway asks its
//! supervisor for a grace period (`limits.linger`, see [`super::supervisor`]) and writes this
//! file before it exits. The next gateway on the same state directory reads it when it takes
//! the tasks over, connects to the socket (the connection is the supervisor's lifeline from then
//! on), and uses the server as its own managed one, under the same id: the records, the sandbox's
//! files and this file all name it by that id.
//!
//! The file holds the server's password, so it is `0600` in a `0700` directory, as the
//! credentials files of `watch` are; it is removed once a gateway has taken the server over.
//! Its contents are read as untrusted all the same: the id must be one of ours, the URL a
//! loopback one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The directory of linger files and sockets inside the state directory.
const LINGER_DIR: &str = "linger";
/// The longest socket path the kernel takes (`sun_path` is 108 bytes on Linux, 104 on macOS,
/// with its terminating NUL).
const MAX_SOCKET_PATH: usize = 103;

/// One lingering managed server, as its gateway left it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lingering {
    pub server_id: String,
    /// Its base URL (loopback).
    pub url: String,
    /// Its basic-auth password.
    pub password: String,
    /// The directory it serves from.
    pub directory: String,
    /// Whether its agents' commands run through the sandbox's shell (`sandbox/<server_id>.sh`).
    pub confined: bool,
    /// The gateway that left it.
    pub gateway_pid: u32,
}

impl std::fmt::Debug for Lingering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Debug output ends up in logs; the password never does.
        f.debug_struct("Lingering")
            .field("server_id", &self.server_id)
            .field("url", &self.url)
            .field("directory", &self.directory)
            .field("confined", &self.confined)
            .field("gateway_pid", &self.gateway_pid)
            .finish_non_exhaustive()
    }
}

/// The socket server `server_id`'s supervisor listens on while it lingers; `None` for an id
/// that is not ours or a path the kernel would refuse.
pub fn socket_path(state_dir: &Path, server_id: &str) -> Option<PathBuf> {
    let path = file_path(state_dir, server_id, "sock")?;
    (path.as_os_str().len() <= MAX_SOCKET_PATH && !path.to_string_lossy().contains('\n'))
        .then_some(path)
}

/// Writes `lingering` (atomically, `0600`), making the directory first.
pub fn save(state_dir: &Path, lingering: &Lingering) -> std::io::Result<()> {
    let dir = state_dir.join(LINGER_DIR);
    crate::private_files::create_dir(&dir)?;
    let path = file_path(state_dir, &lingering.server_id, "json").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("unsafe server id `{}`", lingering.server_id),
        )
    })?;
    let bytes = serde_json::to_vec(lingering).map_err(std::io::Error::other)?;
    crate::private_files::write_atomic(&dir, &path, "linger", &bytes, None)
}

/// The lingering server `server_id`, if a gateway left one: `None` when there is no file, or
/// one that does not hold what a gateway of ours writes.
pub fn load(state_dir: &Path, server_id: &str) -> Option<Lingering> {
    const MAX_FILE: u64 = 64 * 1024;
    let path = file_path(state_dir, server_id, "json")?;
    let file = std::fs::File::open(&path).ok()?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_FILE), &mut bytes).ok()?;
    let lingering: Lingering = match serde_json::from_slice(&bytes) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable linger file");
            return None;
        }
    };
    (lingering.server_id == server_id && super::is_loopback_url(&lingering.url))
        .then_some(lingering)
}

/// Removes server `server_id`'s file and socket (taken over, or gone).
pub fn remove(state_dir: &Path, server_id: &str) {
    for ext in ["json", "sock"] {
        if let Some(path) = file_path(state_dir, server_id, ext) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes the files of servers that cannot be lingering any more: a file older than the
/// longest grace period a supervisor grants ([`super::supervisor::MAX_LINGER`]) names one that
/// stopped long ago (a server taken over loses its file; one that lingers again gets a new one).
/// Returns how many servers' files were removed.
pub fn sweep(state_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(state_dir.join(LINGER_DIR)) else {
        return 0;
    };
    let old = |path: &Path| {
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age > super::supervisor::MAX_LINGER)
    };
    let mut removed = 0;
    for path in entries.filter_map(|e| Some(e.ok()?.path())) {
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if old(&path) {
            remove(state_dir, id);
            removed += 1;
        }
    }
    removed
}

fn file_path(state_dir: &Path, server_id: &str, ext: &str) -> Option<PathBuf> {
    // A file name is built from the id, which a task record carries (the length bound keeps
    // the socket's path short).
    let safe = server_id.len() <= 64 && super::credentials::is_file_safe(server_id);
    safe.then(|| {
        state_dir
            .join(LINGER_DIR)
            .join(format!("{server_id}.{ext}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lingering(id: &str, url: &str) -> Lingering {
        Lingering {
            server_id: id.into(),
            url: url.into(),
            password: "hunter2-not-for-logs".into(),
            directory: "/repo".into(),
            confined: true,
            gateway_pid: 7,
        }
    }

    /// What one gateway saves the next reads back; its debug output has no password.
    #[test]
    fn a_saved_server_reads_back_without_its_password_in_logs() {
        let dir = tempfile::tempdir().expect("a directory");
        let saved = lingering("srv_abc", "http://127.0.0.1:4100");
        save(dir.path(), &saved).expect("saved");
        assert_eq!(load(dir.path(), "srv_abc"), Some(saved.clone()));
        assert!(!format!("{saved:?}").contains("hunter2"));
        remove(dir.path(), "srv_abc");
        assert_eq!(load(dir.path(), "srv_abc"), None);
    }

    /// A file that names another server, a URL off this machine, or an id that would leave
    /// the directory is not taken.
    #[test]
    fn a_file_a_gateway_did_not_write_is_not_taken() {
        let dir = tempfile::tempdir().expect("a directory");
        save(dir.path(), &lingering("srv_far", "http://192.0.2.1:4100")).expect("saved");
        assert_eq!(load(dir.path(), "srv_far"), None);
        let path = file_path(dir.path(), "srv_other", "json").expect("a path");
        let bytes = serde_json::to_vec(&lingering("srv_abc", "http://127.0.0.1:1")).expect("json");
        std::fs::write(&path, bytes).expect("written");
        assert_eq!(load(dir.path(), "srv_other"), None);
        assert!(save(dir.path(), &lingering("../x", "http://127.0.0.1:1")).is_err());
        assert_eq!(socket_path(dir.path(), "../x"), None);
        std::fs::write(&path, b"{not json").expect("written");
        assert_eq!(load(dir.path(), "srv_other"), None);
    }

    /// Files older than the longest grace period go; recent ones stay.
    #[test]
    fn only_files_older_than_any_grace_period_are_swept() {
        let dir = tempfile::tempdir().expect("a directory");
        save(dir.path(), &lingering("srv_old", "http://127.0.0.1:1")).expect("saved");
        save(dir.path(), &lingering("srv_new", "http://127.0.0.1:2")).expect("saved");
        let old = file_path(dir.path(), "srv_old", "json").expect("a path");
        let long_ago = std::time::SystemTime::now()
            - super::super::supervisor::MAX_LINGER
            - std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .and_then(|f| f.set_modified(long_ago))
            .expect("dated");
        assert_eq!(sweep(dir.path()), 1);
        assert_eq!(load(dir.path(), "srv_old"), None);
        assert!(load(dir.path(), "srv_new").is_some());
    }

    /// A state directory too deep for a socket's path gets no socket (and so no linger).
    #[test]
    fn a_socket_path_the_kernel_would_refuse_is_none() {
        let deep = Path::new("/").join("d".repeat(120));
        assert_eq!(socket_path(&deep, "srv_abc"), None);
        assert!(socket_path(Path::new("/tmp/s"), "srv_abc").is_some());
    }
}
