//! Noticing edits to the configuration files while the gateway serves.
//!
//! The files are *polled*: every [`POLL`] each layer file is read and its contents compared with
//! the last ones seen. Reasons, over file-system events (the `notify` crate):
//!
//! - the files are a few kilobytes and there are at most three, so a read a second costs nothing
//!   measurable, and it needs no dependency, no platform back-end and no thread;
//! - editors save by writing a temporary file and renaming it over the old one, and a repository
//!   file may appear after start (or a directory may not exist yet): an inotify watch on the file
//!   would be lost with the rename, and one on the directory needs the directory to exist.
//!   Reading by path sees all of these alike;
//! - comparing contents, not modification times, catches two writes within one timestamp tick
//!   and ignores a `touch` that changes nothing.
//!
//! A change is reported once the files have held still for [`SETTLE`], so a burst of writes (an
//! editor truncating then writing, a `git checkout` touching several layers) is one reload.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::load::FILE_NAME;
use super::Sources;

/// How often the layer files are read.
pub const POLL: Duration = Duration::from_secs(1);

/// How long the files must stay unchanged before a change is reported.
pub const SETTLE: Duration = Duration::from_millis(250);

/// At most this many settle rounds per change, so a file rewritten without pause (a runaway
/// generator) still gets reloaded rather than holding the watch forever.
const MAX_SETTLE_ROUNDS: u32 = 20;

/// What a layer file held when it was last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// No such file (the layer is simply absent).
    Absent,
    /// It exists but could not be read; the loader will say why.
    Unreadable,
    /// Its length and a hash of its bytes.
    Contents(u64, u64),
}

/// The layer files of one [`Sources`], and what each held when last looked at.
#[derive(Debug)]
pub struct Watch {
    sources: Sources,
    files: Vec<(PathBuf, Seen)>,
    poll: Duration,
    settle: Duration,
}

impl Watch {
    /// Reads every layer file once. Call it *before* loading the configuration that will be
    /// served, so that an edit made between the two is still seen as a change.
    pub fn new(sources: &Sources) -> Self {
        let files = layer_files(sources)
            .into_iter()
            .map(|p| {
                let seen = read(&p);
                (p, seen)
            })
            .collect();
        Self {
            sources: sources.clone(),
            files,
            poll: POLL,
            settle: SETTLE,
        }
    }

    /// The same watch polling faster, for tests.
    #[cfg(test)]
    fn quick(mut self) -> Self {
        self.poll = Duration::from_millis(20);
        self.settle = Duration::from_millis(10);
        self
    }

    /// The sources to load the configuration from again.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The files watched: every layer that exists or could appear.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// Waits until some layer file changed and then held still, and returns the files that
    /// changed (since the last call).
    pub async fn changed(&mut self) -> Vec<PathBuf> {
        loop {
            tokio::time::sleep(self.poll).await;
            let mut now = self.read_all().await;
            if now == self.seen() {
                continue;
            }
            for _ in 0..MAX_SETTLE_ROUNDS {
                tokio::time::sleep(self.settle).await;
                let again = self.read_all().await;
                if again == now {
                    break;
                }
                now = again;
            }
            let changed = self
                .files
                .iter_mut()
                .zip(now)
                .filter_map(|((path, seen), now)| {
                    let differs = *seen != now;
                    *seen = now;
                    differs.then(|| path.clone())
                })
                .collect::<Vec<_>>();
            if !changed.is_empty() {
                return changed;
            }
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.files.iter().map(|(_, s)| *s).collect()
    }

    async fn read_all(&self) -> Vec<Seen> {
        let paths: Vec<PathBuf> = self.files.iter().map(|(p, _)| p.clone()).collect();
        // Small files, but still file I/O: off the async workers.
        tokio::task::spawn_blocking(move || paths.iter().map(|p| read(p)).collect())
            .await
            .unwrap_or_else(|_| self.seen())
    }
}

/// The files the loader reads, in its order: the user's, the repository's, `--config`'s. Each is
/// watched whether or not it exists now (the repository's may be created later). The same file
/// reached by two names is watched once.
pub fn layer_files(sources: &Sources) -> Vec<PathBuf> {
    let candidates = [
        sources.user_dir.as_ref().map(|d| d.join(FILE_NAME)),
        Some(sources.cwd.join(FILE_NAME)),
        sources.explicit.as_ref().map(|p| sources.cwd.join(p)),
    ];
    let mut files: Vec<PathBuf> = Vec::new();
    for path in candidates.into_iter().flatten() {
        if !files.iter().any(|f| super::load::same_file(f, &path)) {
            files.push(path);
        }
    }
    files
}

/// Reads a layer file as the loader does (a regular file, bounded: never a device read whole
/// once a second), so a change is noticed exactly when the loader would see one.
fn read(path: &Path) -> Seen {
    if std::fs::symlink_metadata(path).is_err() {
        return Seen::Absent;
    }
    match super::load::read_layer(path, None) {
        Ok(text) => {
            let mut hasher = DefaultHasher::new();
            text.hash(&mut hasher);
            Seen::Contents(text.len() as u64, hasher.finish())
        }
        Err(_) => Seen::Unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &Path) -> Sources {
        Sources {
            explicit: Some(PathBuf::from("extra.yaml")),
            cwd: dir.join("repo"),
            user_dir: Some(dir.join("user")),
            frozen_repository: None,
        }
    }

    /// A layer that is a device is never read (a repository's `delegation.yaml` linked to
    /// `/dev/zero` was read whole once a second).
    #[test]
    fn a_device_is_unreadable_not_read() {
        let dir = std::env::temp_dir().join(format!("ocm-watch-{}", crate::ids::task_id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let link = dir.join("delegation.yaml");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        assert_eq!(read(&link), Seen::Unreadable);
        assert_eq!(read(&dir.join("absent.yaml")), Seen::Absent);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A FIFO is not waited on: opening one for reading blocks until a writer comes, so the
    /// watcher (and the gateway's start) would hang on a `delegation.yaml` made with mkfifo.
    #[test]
    fn a_fifo_is_unreadable_and_not_waited_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("delegation.yaml");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo(3) on a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read(&path));
        });
        // Bounded: without the fix the read never returns (no writer ever opens the FIFO).
        let seen = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO returned");
        assert_eq!(seen, Seen::Unreadable);
        assert!(super::super::load::read_layer(&fifo, None)
            .is_err_and(|e| e.contains("not a regular file")));
    }

    #[test]
    fn every_layer_is_watched_even_before_it_exists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = layer_files(&sources(dir.path()));
        assert_eq!(
            files,
            [
                dir.path().join("user").join(FILE_NAME),
                dir.path().join("repo").join(FILE_NAME),
                dir.path().join("repo").join("extra.yaml"),
            ]
        );
        let mut same = sources(dir.path());
        same.explicit = Some(PathBuf::from(FILE_NAME));
        assert_eq!(layer_files(&same).len(), 2, "one file, two names");
    }

    #[tokio::test]
    async fn a_created_file_a_rename_and_a_deletion_are_changes_and_a_touch_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = sources(dir.path());
        std::fs::create_dir_all(&src.cwd).expect("mkdir");
        let repo = src.cwd.join(FILE_NAME);
        let mut watch = Watch::new(&src).quick();

        std::fs::write(&repo, "tiers: []\n").expect("write");
        assert_eq!(
            watch.changed().await,
            std::slice::from_ref(&repo),
            "created"
        );

        // Saved as an editor does: a new file renamed over the old one.
        let tmp = src.cwd.join(".delegation.yaml.swp");
        std::fs::write(&tmp, "reload: true\n").expect("write");
        std::fs::rename(&tmp, &repo).expect("rename");
        assert_eq!(
            watch.changed().await,
            std::slice::from_ref(&repo),
            "renamed over"
        );

        // The same bytes again, then a real change: only the latter is reported, so a call
        // that returns proves the rewrite with equal contents was not a change.
        std::fs::write(&repo, "reload: true\n").expect("write");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), watch.changed())
                .await
                .is_err(),
            "unchanged contents are no change"
        );
        std::fs::remove_file(&repo).expect("remove");
        assert_eq!(watch.changed().await, [repo], "deleted");
    }
}
