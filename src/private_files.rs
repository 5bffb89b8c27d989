//! Files only their owner can read: the task store's records and the managed servers'
//! credentials both live under the state directory and both hold what other local users must not
//! see (prompts and answers; a server's password).
//!
//! A file is created `0600` from the moment it exists (never created readable and tightened
//! after), written whole to a temporary name and renamed into place, so a reader never sees a
//! torn file and a crash leaves at worst a stray temporary. Directories are `0700`; an existing
//! one that others can enter is tightened.
//!
//! No fsync: the rename keeps a crash of this process from ever leaving a torn file, which is the
//! failure guarded against; an fsync per write would put a disk flush on every `start_task`
//! (measured: most of the gateway's overhead over raw HTTP) to guard only against the machine
//! losing power.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many temporary names are tried when one is taken (a stale temporary of a crashed process
/// with a reused pid).
const TEMP_ATTEMPTS: u32 = 8;

/// Names temporary files: unique within the process, and the pid makes them unique across the
/// processes that share a state directory.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` (in `dir`) atomically through a fresh `0600` temporary named after
/// `stem`, dated `modified` when given (the file's modification time then says something the
/// reader of the directory can use without opening the file: see `tasks::store`).
pub fn write_atomic(
    dir: &Path,
    path: &Path,
    stem: &str,
    bytes: &[u8],
    modified: Option<std::time::SystemTime>,
) -> std::io::Result<()> {
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{stem}.{}.{n}.tmp", std::process::id()));
        match create_file(&tmp) {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < TEMP_ATTEMPTS => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let written = file.write_all(bytes).and_then(|()| {
        if let Some(at) = modified {
            file.set_modified(at)?;
        }
        drop(file);
        std::fs::rename(&tmp, path)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file, readable by its owner only from the moment it exists; fails if the name is taken.
fn create_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Creates `dir` (and missing parents) as `0700`, or tightens an existing `dir` others can enter.
/// Returns the mode it had when it was tightened (for the caller to say so), else `None`.
pub fn create_dir(dir: &Path) -> std::io::Result<Option<u32>> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        builder.mode(0o700);
        builder.create(dir)?;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            return Ok(Some(mode & 0o777));
        }
        Ok(None)
    }
    #[cfg(not(unix))]
    builder.create(dir).map(|()| None)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_are_owner_only_and_replaced_whole() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/b");
        assert_eq!(create_dir(&dir).expect("created"), None);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let path = dir.join("x.json");
        write_atomic(&dir, &path, "x", b"one", None).expect("written");
        write_atomic(&dir, &path, "x", b"two", None).expect("replaced");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert_eq!(mode(&path), 0o600);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["x.json"], "no temporary left behind");

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(create_dir(&dir).expect("tightened"), Some(0o755));
        assert_eq!(mode(&dir), 0o700);
    }
}
