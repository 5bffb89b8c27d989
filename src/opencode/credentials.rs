//! How `opencode-mcp watch` learns a managed server's password: one private file per server,
//! `<state_dir>/servers/<server_id>.json`, that lives exactly as long as the server.
//!
//! `watch` runs in a process of its own, started by a person from a terminal, while the
//! password exists only in the gateway's memory and in the environment of the `opencode serve`
//! it started. The alternatives, and why this file instead:
//!
//! - **A control socket on the gateway**, answering "the password of server X": the gateway
//!   would grow a second listener beside MCP on stdio, and the socket's only access control
//!   would be file permissions, the same as a file's, with more code to get wrong.
//! - **Reading `/proc/<pid>/environ` of the OpenCode process**: Linux only, and tied to how the
//!   process was started.
//! - **The task record**: records outlive their server by a day (`limits.finished_task_ttl`),
//!   are read by `usage`, `tasks` and `gc`, and the README promises no password in them.
//!
//! The file exposes the password to no one new: it is readable only by the user who runs the
//! gateway (the directory is `0700`, the file `0600` from the moment it exists), and that user
//! can already read the server's environment. It is written atomically (a fresh temporary file,
//! then a rename), so `watch` never reads half a file. It is removed when the server is stopped
//! (`stop_server`, or the gateway's shutdown) and when the [`CredentialsFile`] handle is dropped.
//! A gateway that is SIGKILLed leaves its files behind; its servers went with it (see
//! `supervisor`), so such a password opens nothing, and the next gateway that starts on the same
//! state directory sweeps those files ([`sweep`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The directory of credentials files inside the state directory.
const SERVERS_DIR: &str = "servers";

/// What `watch` needs to attach to one managed server.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub server_id: String,
    /// The server's base URL.
    pub url: String,
    /// The basic-auth password (user [`super::api::AUTH_USER`]).
    pub password: String,
    /// The gateway that started the server: its files are swept once it is gone.
    pub gateway_pid: u32,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Debug output ends up in logs; the password never does.
        f.debug_struct("Credentials")
            .field("server_id", &self.server_id)
            .field("url", &self.url)
            .field("gateway_pid", &self.gateway_pid)
            .finish_non_exhaustive()
    }
}

/// Why a credentials file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// No file: the server was stopped, or its gateway could not write one.
    #[error("no credentials file {}", .0.display())]
    Missing(PathBuf),
    /// A server id that cannot be a file name of ours.
    #[error("`{0}` is not a server id")]
    BadId(String),
    #[error("cannot read {}: {reason}", .path.display())]
    Unreadable { path: PathBuf, reason: String },
}

/// The file of one running managed server; removes it when dropped.
#[derive(Debug)]
pub struct CredentialsFile {
    path: PathBuf,
}

impl CredentialsFile {
    /// Writes `credentials` to `<state_dir>/servers/<server_id>.json`, atomically, `0600`.
    pub fn write(state_dir: &Path, credentials: &Credentials) -> std::io::Result<Self> {
        let dir = state_dir.join(SERVERS_DIR);
        crate::private_files::create_dir(&dir)?;
        let path = file_path(state_dir, &credentials.server_id).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("unsafe server id `{}`", credentials.server_id),
            )
        })?;
        let bytes = serde_json::to_vec(credentials).map_err(std::io::Error::other)?;
        crate::private_files::write_atomic(&dir, &path, &credentials.server_id, &bytes, None)?;
        Ok(Self { path })
    }

    /// Removes the file (again: a no-op).
    pub fn remove(&self) {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a server's credentials file");
            }
            _ => {}
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CredentialsFile {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Reads the credentials of server `server_id` as its gateway wrote them.
pub fn read(state_dir: &Path, server_id: &str) -> Result<Credentials, CredentialsError> {
    let path = file_path(state_dir, server_id)
        .ok_or_else(|| CredentialsError::BadId(server_id.to_string()))?;
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CredentialsError::Missing(path.clone()),
        _ => CredentialsError::Unreadable {
            path: path.clone(),
            reason: e.to_string(),
        },
    })?;
    serde_json::from_slice(&bytes).map_err(|e| CredentialsError::Unreadable {
        path,
        reason: e.to_string(),
    })
}

/// Removes the files of gateways that are gone (`alive` says whether a gateway pid runs), and
/// temporary files they left mid-write. Returns how many were removed.
pub fn sweep(state_dir: &Path, alive: impl Fn(u32) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(state_dir.join(SERVERS_DIR)) else {
        return 0;
    };
    let mut removed = 0;
    for path in entries.filter_map(|e| Some(e.ok()?.path())) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let stale = if let Some(rest) = name.strip_prefix('.') {
            // `.<server_id>.<pid>.<n>.tmp`
            let pid = rest
                .strip_suffix(".tmp")
                .and_then(|r| r.rsplit('.').nth(1))
                .and_then(|p| p.parse().ok());
            pid.is_some_and(|pid| !alive(pid))
        } else if name.ends_with(".json") {
            let owner = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Credentials>(&b).ok())
                .map(|c| c.gateway_pid);
            // A file that does not parse holds nothing `watch` can use.
            owner.is_none_or(|pid| !alive(pid))
        } else {
            false
        };
        if stale && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a file name may be built from `server_id`: ids are ours (`srv_` + base62), but one
/// can come from a task record, so anything that could leave the directory is refused.
pub(crate) fn is_file_safe(server_id: &str) -> bool {
    !server_id.is_empty()
        && server_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn file_path(state_dir: &Path, server_id: &str) -> Option<PathBuf> {
    // Ids are ours (`srv_` + base62), but a file name is built from them (and `watch` reads one
    // from a task record): refuse anything that could leave the directory.
    is_file_safe(server_id).then(|| {
        state_dir
            .join(SERVERS_DIR)
            .join(format!("{server_id}.json"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(id: &str, pid: u32) -> Credentials {
        Credentials {
            server_id: id.into(),
            url: "http://127.0.0.1:4096".into(),
            password: "s3cret".into(),
            gateway_pid: pid,
        }
    }

    #[test]
    fn written_private_read_back_and_removed_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = CredentialsFile::write(dir.path(), &creds("srv_a", 1)).expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode(file.path()), 0o600);
            assert_eq!(mode(&dir.path().join(SERVERS_DIR)), 0o700);
        }
        assert_eq!(read(dir.path(), "srv_a").expect("read"), creds("srv_a", 1));
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists());
        assert!(matches!(
            read(dir.path(), "srv_a"),
            Err(CredentialsError::Missing(_))
        ));
        // Nothing but the (now removed) file was left behind: no temporary files.
        let left = std::fs::read_dir(dir.path().join(SERVERS_DIR))
            .expect("dir")
            .count();
        assert_eq!(left, 0);
    }

    #[test]
    fn debug_output_leaves_the_password_out() {
        assert!(!format!("{:?}", creds("srv_a", 1)).contains("s3cret"));
    }

    #[test]
    fn ids_that_could_leave_the_directory_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            read(dir.path(), "../tasks/x"),
            Err(CredentialsError::BadId(_))
        ));
        assert!(CredentialsFile::write(dir.path(), &creds("../x", 1)).is_err());
        assert!(matches!(
            read(dir.path(), ""),
            Err(CredentialsError::BadId(_))
        ));
    }

    #[test]
    fn sweep_removes_only_the_files_of_gone_gateways() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = CredentialsFile::write(dir.path(), &creds("srv_live", 10)).expect("write");
        let dead = CredentialsFile::write(dir.path(), &creds("srv_dead", 20)).expect("write");
        let dead_path = dead.path().to_path_buf();
        std::mem::forget(dead); // as a SIGKILLed gateway leaves it
        let servers = dir.path().join(SERVERS_DIR);
        std::fs::write(servers.join(".srv_x.20.0.tmp"), b"{").expect("tmp");
        std::fs::write(servers.join("garbage.json"), b"not json").expect("garbage");
        assert_eq!(sweep(dir.path(), |pid| pid == 10), 3);
        assert!(live.path().exists());
        assert!(!dead_path.exists());
        assert_eq!(std::fs::read_dir(&servers).expect("dir").count(), 1);
    }
}
