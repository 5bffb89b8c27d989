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
    pub(in crate::tasks) down: Arc<Mutex<HashMap<String, Down>>>,
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
        let down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        down.get(worker)
            .is_some_and(|d| d.avoid_until > std::time::Instant::now())
    }

    pub(in crate::tasks) fn mark_down(
        down: &Mutex<HashMap<String, Down>>,
        worker: &str,
        why: String,
    ) {
        let now = std::time::Instant::now();
        let mut down = down.lock().unwrap_or_else(|p| p.into_inner());
        let since = down.get(worker).map_or(now, |d| d.since);
        down.insert(
            worker.to_string(),
            Down {
                why,
                since,
                avoid_until: now + AVOID_DOWN,
            },
        );
    }

    pub(in crate::tasks) fn mark_up(down: &Mutex<HashMap<String, Down>>, worker: &str) {
        down.lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(worker);
    }

    pub(in crate::tasks) fn down_since(&self, worker: &str) -> Option<Down> {
        let down = self.down.lock().unwrap_or_else(|p| p.into_inner());
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
