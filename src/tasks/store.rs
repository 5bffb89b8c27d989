//! The task store: every task's state on disk, so a restarted gateway still answers for it.
//!
//! **Format: one small JSON file per task** in `<state_dir>/tasks/<task_id>.json`, replaced
//! atomically (written to a temporary file in the same directory, then renamed over the old
//! one; not fsynced, see [`Store::save`]). Why not an embedded database: the registry is small (capped by `limits.max_tasks`),
//! is read whole once at start-up, and each task has exactly one writer: the gateway process that
//! owns it. With a file per task, two gateway processes sharing the directory never write the same
//! file, a crash mid-write leaves the previous version intact (rename is atomic), and a corrupt
//! file costs one task rather than the store. A database would add a dependency, a lock shared by
//! every process, and its own recovery story, for none of that.
//!
//! Ownership: each record names the pid of the gateway that wrote it. At start-up a gateway skips
//! unfinished tasks whose owner is still alive (another gateway's live work) and takes over the
//! rest.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::record::{TaskRecord, VERSION};

/// The directory of task files.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// Makes every temporary file name unique within the process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Opens (creating) `<state_dir>/tasks`.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        let dir = state_dir.join("tasks");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn path(&self, task_id: &str) -> Option<PathBuf> {
        // Ids are ours (`tsk_` + base62), but a file name is built from them: refuse anything
        // that could leave the directory.
        let safe = !task_id.is_empty()
            && task_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        safe.then(|| self.dir.join(format!("{task_id}.json")))
    }

    /// Writes the task atomically (temporary file, flush, rename).
    pub fn save(&self, task: &TaskRecord) -> std::io::Result<()> {
        let Some(path) = self.path(&task.id) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("unsafe task id `{}`", task.id),
            ));
        };
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            task.id,
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        // No fsync: the rename keeps a crash of this process (or of the host model's session)
        // from ever leaving a torn record, which is the failure this store is for; an fsync per
        // state change would put a disk flush on every start_task (measured: most of the
        // gateway's overhead over raw HTTP) to guard only against the machine losing power.
        let mut record = task.clone();
        record.owner_pid = std::process::id();
        let bytes = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        std::fs::File::create(&tmp)?.write_all(&bytes)?;
        std::fs::rename(&tmp, &path)
    }

    /// Writes a record, in the order of calls (the registry calls this under its lock).
    pub fn submit(&self, task: TaskRecord) {
        if let Err(e) = self.save(&task) {
            tracing::warn!(task_id = %task.id, error = %e, "cannot save the task to the state directory");
        }
    }

    /// Removes a record, in the order of calls.
    pub fn submit_remove(&self, task_id: &str) {
        self.remove(task_id);
    }

    /// One record by id.
    pub fn load(&self, task_id: &str) -> Option<TaskRecord> {
        let bytes = std::fs::read(self.path(task_id)?).ok()?;
        serde_json::from_slice::<TaskRecord>(&bytes)
            .ok()
            .filter(|t| t.version == VERSION)
    }

    pub fn remove(&self, task_id: &str) {
        if let Some(path) = self.path(task_id) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Every readable record; unreadable files are reported (path, reason) and left in place.
    pub fn load_all(&self) -> (Vec<TaskRecord>, Vec<(PathBuf, String)>) {
        let mut tasks = Vec::new();
        let mut bad = Vec::new();
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return (tasks, bad);
        };
        for entry in dir.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<TaskRecord>(&b).map_err(|e| e.to_string()))
            {
                Ok(t) if t.version == VERSION => tasks.push(t),
                Ok(t) => bad.push((path, format!("unknown record version {}", t.version))),
                Err(e) => bad.push((path, e)),
            }
        }
        (tasks, bad)
    }
}

/// `$XDG_STATE_HOME/opencode-mcp`, else `$HOME/.local/state/opencode-mcp`.
pub fn default_state_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state"))
        })?;
    Some(base.join("opencode-mcp"))
}

/// Whether the gateway process `pid` is alive (and is a gateway: pids get reused).
pub fn gateway_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tasks::model::TaskStatus;
    use crate::tasks::turn::TurnState;

    fn record() -> TaskRecord {
        let mut r = TaskRecord::new(
            "tsk_abc".into(),
            "srv_1".into(),
            "ses_1".into(),
            "/w".into(),
            "title".into(),
        );
        r.server_url = "http://127.0.0.1:1".into();
        r.managed = true;
        r.begin_turn("msg_1".into(), Some("build".into()), None);
        r.finish(TaskStatus::Completed, None);
        r.outcome = Some(TurnState {
            text: "done".into(),
            finished: true,
            ..TurnState::default()
        });
        r
    }

    #[test]
    fn records_round_trip_through_disk() {
        let dir = std::env::temp_dir().join(format!("ocm-store-{}", crate::ids::task_id()));
        let store = Store::open(&dir).expect("open");
        let stored = record();
        store.save(&stored).expect("save");
        store.save(&stored).expect("overwrite");
        let (all, bad) = store.load_all();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(all, vec![stored.clone()]);
        let back = store.load("tsk_abc").expect("by id");
        assert_eq!(back.status, TaskStatus::Completed);
        assert_eq!(back.outcome.map(|o| o.text).as_deref(), Some("done"));
        assert!(back.finished_ms.is_some());
        store.remove("tsk_abc");
        assert!(store.load_all().0.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn corrupt_files_are_reported_not_fatal() {
        let dir = std::env::temp_dir().join(format!("ocm-store-{}", crate::ids::task_id()));
        let store = Store::open(&dir).expect("open");
        std::fs::write(store.dir.join("tsk_bad.json"), b"{not json").expect("write");
        store.save(&record()).expect("save");
        let (all, bad) = store.load_all();
        assert_eq!(all.len(), 1);
        assert_eq!(bad.len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn unsafe_ids_never_become_paths() {
        let store = Store {
            dir: PathBuf::from("/nonexistent"),
        };
        assert!(store.path("../etc/passwd").is_none());
        assert!(store.path("").is_none());
        assert!(store.path("tsk_ok").is_some());
    }

    #[test]
    fn only_live_gateways_count_as_owners() {
        assert!(gateway_alive(std::process::id()));
        assert!(!gateway_alive(u32::MAX - 1));
    }
}
