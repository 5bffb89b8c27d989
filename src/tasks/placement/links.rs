//! The workers' OpenCode servers in use by this gateway, one per worker, and the workers found
//! out of reach: what the service holds of its workers (`remote.rs` starts, `supervise.rs` watches and
//! stops them; placement by free slots asks which workers to avoid).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::workers::serve::RemoteServe;
use crate::workers::Remote;

/// How long new tasks the call places nowhere avoid a worker that was found down.
const AVOID_DOWN: Duration = Duration::from_secs(30);

/// The workers' OpenCode servers this gateway started, one per worker.
#[derive(Default)]
pub(in crate::tasks) struct WorkerServes {
    /// Worker name -> its OpenCode, if started. A worker's slot is locked while it is being
    /// started, so two tasks placed at once start one OpenCode.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Link>>>>>,
    /// Workers out of reach: why, and until when placement avoids them.
    pub(in crate::tasks) down: Arc<Reach>,
}

/// Which workers this gateway found out of reach, and (with a state directory) a note of each
/// change for the dashboard ([`crate::workers::seen`]).
#[derive(Default)]
pub(in crate::tasks) struct Reach {
    down: Mutex<HashMap<String, Down>>,
    /// The state directory the notes go under; unset: none are written.
    notes: std::sync::OnceLock<std::path::PathBuf>,
    /// Per worker, what was last noted and when: a note is written when reachability changes,
    /// or at most every [`NOTE_AGAIN`] while it stays the same (every task start marks a
    /// worker up; the disk need not hear of each).
    noted: Mutex<HashMap<String, (bool, std::time::Instant)>>,
}

/// How often an unchanged reachability is noted again, so the page's "last seen" stays fresh.
const NOTE_AGAIN: Duration = Duration::from_secs(60);

impl Reach {
    /// Notes go under `state_dir` from now on.
    pub(in crate::tasks) fn note_under(&self, state_dir: std::path::PathBuf) {
        let _ = self.notes.set(state_dir);
    }

    fn note(&self, worker: &str, reachable: bool, why: Option<&str>) {
        let Some(dir) = self.notes.get() else {
            return;
        };
        let now = std::time::Instant::now();
        {
            let mut noted = self.noted.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = noted
                .get(worker)
                .is_some_and(|(was, at)| *was == reachable && now.duration_since(*at) < NOTE_AGAIN);
            if fresh {
                return;
            }
            noted.insert(worker.to_string(), (reachable, now));
        }
        let by = format!("gateway {}", std::process::id());
        crate::workers::seen::note(
            dir,
            worker,
            &crate::workers::seen::Sighting::now(reachable, why, by),
        );
    }
}

/// A worker found out of reach.
#[derive(Debug, Clone)]
pub(in crate::tasks) struct Down {
    pub(in crate::tasks) why: String,
    pub(in crate::tasks) since: std::time::Instant,
    avoid_until: std::time::Instant,
}

impl WorkerServes {
    /// Whether placement should avoid `worker` now.
    pub(in crate::tasks) fn avoided(&self, worker: &str) -> bool {
        let down = self.down.down.lock().unwrap_or_else(|p| p.into_inner());
        down.get(worker)
            .is_some_and(|d| d.avoid_until > std::time::Instant::now())
    }

    pub(in crate::tasks) fn mark_down(down: &Reach, worker: &str, why: String) {
        let now = std::time::Instant::now();
        {
            let mut map = down.down.lock().unwrap_or_else(|p| p.into_inner());
            let since = map.get(worker).map_or(now, |d| d.since);
            map.insert(
                worker.to_string(),
                Down {
                    why: why.clone(),
                    since,
                    avoid_until: now + AVOID_DOWN,
                },
            );
        }
        down.note(worker, false, Some(&why));
    }

    pub(in crate::tasks) fn mark_up(down: &Reach, worker: &str) {
        down.down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(worker);
        down.note(worker, true, None);
    }

    pub(in crate::tasks) fn down_since(&self, worker: &str) -> Option<Down> {
        let down = self.down.down.lock().unwrap_or_else(|p| p.into_inner());
        down.get(worker).cloned()
    }
}

/// A worker's OpenCode in use: the pool's server for it and the ssh session it runs in.
pub(in crate::tasks) struct Link {
    pub(in crate::tasks) server_id: String,
    pub(in crate::tasks) serve: RemoteServe,
    pub(in crate::tasks) remote: Remote,
}

impl WorkerServes {
    pub(in crate::tasks) fn slot(&self, worker: &str) -> Arc<tokio::sync::Mutex<Option<Link>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(worker.to_string()).or_default().clone()
    }

    pub(in crate::tasks) fn all(&self) -> Vec<(String, Arc<tokio::sync::Mutex<Option<Link>>>)> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}
