//! What watches one worker's connection: a dropped link is reached again with a backoff, and
//! the OpenCode a lost period left running there is stopped once the worker answers again.

use super::links::{Link, Reach, WorkerServes};
use super::remote::Named;
use crate::opencode::Server;
use crate::tasks::tracking::tracker;
use crate::workers::serve::{RemoteServe, Saved, ServeError};
use std::sync::Arc;
use std::time::Duration;

/// How often a worker's connection is looked at (a dropped one is noticed this fast; ssh
/// itself notices a silent network within `ServerAliveInterval` x `ServerAliveCountMax`).
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);
/// Between attempts to reach a worker again: doubling from the first, up to the last.
const RECONNECT_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// What watches one worker's connection ([`Placement::supervise`](super::Placement::supervise)).
pub(super) struct Supervision {
    pub(super) worker: Named,
    pub(super) slot: Arc<tokio::sync::Mutex<Option<Link>>>,
    pub(super) down: Arc<Reach>,
    pub(super) server: Arc<Server>,
    pub(super) registry: Arc<crate::tasks::store::registry::Registry>,
    pub(super) lost_after: Duration,
    pub(super) within: Duration,
    /// This gateway's saved file for the worker's OpenCode (`None` without a state directory).
    pub(super) saved_file: Option<std::path::PathBuf>,
}

/// After a lost worker's last try: between attempts to reach it again to stop the OpenCode its
/// lost period left there, doubling from the first, up to the last.
const ORPHAN_BACKOFF: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(60));

impl Supervision {
    /// The OpenCode of a lost worker may well run on there, finishing turns nobody waits for
    /// (no deadline, no caps): its saved file is set aside under a name of its own (so the
    /// next OpenCode started there does not overwrite it, and a later gateway's sweep still
    /// finds it), and it is stopped once the worker can be reached again.
    fn orphan(&self, saved: Saved) {
        let kept = self.saved_file.as_ref().and_then(|file| {
            let lost = file.with_extension(format!("{}.lost.json", saved.remote_pid));
            std::fs::rename(file, &lost).ok().map(|()| lost)
        });
        let remote = self.worker.remote.clone();
        let name = self.worker.name.clone();
        tokio::spawn(async move {
            let (mut pause, longest) = ORPHAN_BACKOFF;
            loop {
                if RemoteServe::stop_saved(&remote, &saved).await {
                    tracing::info!(worker = %name, pid = saved.remote_pid, "stopped the OpenCode a lost period left on the worker");
                    if let Some(kept) = &kept {
                        let _ = std::fs::remove_file(kept);
                    }
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(longest);
            }
        });
    }

    pub(super) async fn run(self) {
        let mut tick = tokio::time::interval(SUPERVISE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.server.stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let dropped = {
                let mut link = self.slot.lock().await;
                match link.as_mut() {
                    Some(l) if l.server_id == self.server.id => (!l.serve.alive())
                        .then(|| (l.serve.saved(&self.worker.name), l.serve.local_port())),
                    // Stopped, or replaced by another OpenCode: nothing of this one to watch.
                    _ => return,
                }
            };
            let Some((saved, port)) = dropped else {
                continue;
            };
            let name = &self.worker.name;
            tracing::warn!(worker = %name, "the connection to the worker's OpenCode dropped; reconnecting");
            WorkerServes::mark_down(&self.down, name, "its connection dropped".into());
            match self.reconnect(&saved, port).await {
                Some(Ok(serve)) => {
                    let mut link = self.slot.lock().await;
                    match link.as_mut() {
                        Some(l) if l.server_id == self.server.id => l.serve = serve,
                        _ => return,
                    }
                    WorkerServes::mark_up(&self.down, name);
                    tracing::info!(worker = %name, "reached the worker's OpenCode again");
                }
                Some(Err(why)) => {
                    let message = format!(
                        "worker `{name}` was lost: {why}. The work of the turns fetched back \
                         before stays readable here (view: diff)"
                    );
                    let failed = tracker::fail_server_tasks(
                        &self.registry,
                        &self.server.id,
                        crate::tasks::lifecycle::record::WORKER_LOST,
                        &message,
                    );
                    tracing::warn!(worker = %name, tasks = failed.len(), %why, "worker lost; its unfinished tasks failed");
                    WorkerServes::mark_down(&self.down, name, why);
                    let mut link = self.slot.lock().await;
                    if link.as_ref().is_some_and(|l| l.server_id == self.server.id) {
                        *link = None;
                    }
                    drop(link);
                    self.server.stop.cancel();
                    self.orphan(saved);
                    return;
                }
                // The server was stopped meanwhile.
                None => return,
            }
        }
    }

    /// Reaches the same OpenCode again with backoff: `Some(Ok)` once reached, `Some(Err(why))`
    /// when it is gone or stayed out of reach past `lost_after`, `None` when the server was
    /// stopped meanwhile.
    async fn reconnect(
        &self,
        saved: &Saved,
        port: Option<u16>,
    ) -> Option<Result<RemoteServe, String>> {
        let since = std::time::Instant::now();
        let (mut pause, longest) = RECONNECT_BACKOFF;
        loop {
            let w = &self.worker;
            match RemoteServe::reattach(&w.name, &w.remote, saved, self.within, port).await {
                Ok(serve) => return Some(Ok(serve)),
                Err(ServeError::Gone { pid, .. }) => {
                    return Some(Err(format!("its OpenCode there (pid {pid}) stopped")))
                }
                Err(e) if since.elapsed() >= self.lost_after => {
                    return Some(Err(format!(
                        "out of reach for longer than workers.{}.lost_after ({:?}): {e}",
                        w.name, self.lost_after
                    )))
                }
                Err(e) => {
                    tracing::debug!(worker = %w.name, error = %e, ?pause, "the worker is still out of reach");
                    WorkerServes::mark_down(&self.down, &w.name, e.to_string());
                }
            }
            tokio::select! {
                _ = self.server.stop.cancelled() => return None,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(longest);
        }
    }
}
