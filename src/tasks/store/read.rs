//! Reading records back: every one under a state directory, or one by id, without opening the
//! store (no owner lock, no writer thread), so the CLI can run beside a live gateway; a record
//! that cannot be read is reported, never trusted.

use crate::tasks::lifecycle::record::{TaskRecord, VERSION};
use crate::tasks::store::usage::TaskSummary;
use std::path::{Path, PathBuf};

/// The summary of every readable record under `<state_dir>/tasks/`, read without opening the
/// store (no owner lock, no writer thread), so `opencode-mcp usage` and `tasks` can run beside a
/// live gateway without disturbing it; unreadable files are reported (path, reason).
pub fn read_summaries(state_dir: &Path) -> (Vec<TaskSummary>, Vec<(PathBuf, String)>) {
    read_dir_records(&state_dir.join("tasks"), |r| TaskSummary::from(&r))
}

/// Every readable record in `dir`, each turned into what `keep` makes of it as soon as it is
/// read; unreadable ones are reported (path, reason).
pub(super) fn read_dir_records<T>(
    dir: &Path,
    mut keep: impl FnMut(TaskRecord) -> T,
) -> (Vec<T>, Vec<(PathBuf, String)>) {
    let mut tasks = Vec::new();
    let mut bad = Vec::new();
    let Ok(dir) = std::fs::read_dir(dir) else {
        return (tasks, bad);
    };
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        match read_record(&path) {
            Ok(t) => tasks.push(keep(t)),
            // Removed between listing and reading: not a fault.
            Err(ReadError::Missing) => {}
            Err(ReadError::Bad(why)) => bad.push((path, why)),
        }
    }
    (tasks, bad)
}

/// What the state directory says about one task, read without opening the store (no owner
/// lock, no writer): for `opencode-mcp gc` and `watch`, which run beside a gateway or without one.
pub enum Stored {
    Record(Box<TaskRecord>),
    Missing,
    Unreadable(String),
}

/// Reads `<state_dir>/tasks/<task_id>.json` as it is on disk.
pub fn read_stored(state_dir: &Path, task_id: &str) -> Stored {
    let Some(path) = record_path(&state_dir.join("tasks"), task_id) else {
        return Stored::Missing;
    };
    match read_record(&path) {
        Ok(r) => Stored::Record(Box::new(r)),
        Err(ReadError::Missing) => Stored::Missing,
        Err(ReadError::Bad(why)) => Stored::Unreadable(format!("{}: {why}", path.display())),
    }
}

pub(super) fn record_path(dir: &Path, task_id: &str) -> Option<PathBuf> {
    // Ids are ours (`tsk_` + base62), but a file name is built from them: refuse anything that
    // could leave the directory.
    let safe = !task_id.is_empty()
        && task_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    safe.then(|| dir.join(format!("{task_id}.json")))
}

pub(super) enum ReadError {
    Missing,
    Bad(String),
}

pub(super) fn read_record(path: &Path) -> Result<TaskRecord, ReadError> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::Missing,
        _ => ReadError::Bad(e.to_string()),
    })?;
    let task: TaskRecord =
        serde_json::from_slice(&bytes).map_err(|e| ReadError::Bad(e.to_string()))?;
    if task.version != VERSION {
        return Err(ReadError::Bad(format!(
            "unknown record version {}",
            task.version
        )));
    }
    Ok(task)
}
