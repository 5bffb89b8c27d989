//! Restore: the tasks a previous gateway left in the state directory. Finished tasks become
//! answerable again; unfinished ones on a managed server died with that gateway's server and
//! are reported `failed` (`Interrupted`); unfinished ones on the configured attached server are
//! adopted and finish normally; unfinished tasks of another gateway that is still running are
//! left to it.

use std::sync::Arc;

use super::model::TaskStatus;
use super::record::{interrupted, TaskRecord};
use super::registry::TaskEntry;
use super::service::TaskService;
use super::tracker;
use super::turn::Idle;

impl TaskService {
    /// Loads the tasks a previous gateway left in the state directory. Finished tasks become
    /// answerable again; unfinished ones on a managed server died with that gateway's server and
    /// are reported `failed` (`Interrupted`); unfinished ones on the attached server are adopted
    /// and finish normally. Unfinished tasks of another gateway that is still running are left to
    /// it.
    ///
    /// The store is read on a blocking thread once `after` resolves (the gateway passes the end
    /// of the host's handshake), so a full state directory (about 10 ms of reading per 1,000
    /// records) never delays the `initialize` reply, on two cores least of all; every action
    /// that reads tasks waits for it ([`Self::restored`]). Adopting, which needs the network,
    /// runs after that in the background.
    pub fn restore(
        self: &Arc<Self>,
        after: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let Some(store) = self.registry.store().cloned() else {
            return;
        };
        self.restored.send_replace(false);
        let this = self.clone();
        tokio::spawn(async move {
            after.await;
            let loaded = tokio::task::spawn_blocking(move || store.load_all()).await;
            let adopt = match loaded {
                Ok((records, bad)) => this.take_over(records, bad),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the state directory failed");
                    Vec::new()
                }
            };
            this.restored.send_replace(true);
            // Records that expired while no gateway ran go now, with their worktrees, rather
            // than at the first reconcile tick of a server this gateway may never start.
            tracker::evict(&this.tracker);
            if !adopt.is_empty() {
                this.adopt(adopt).await;
            }
        });
    }

    /// Resolves once the stored tasks are loaded (at once when there is nothing to load).
    pub(super) async fn restored(&self) {
        let mut rx = self.restored.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// Registers loaded records; returns the ids to adopt on the attached server.
    fn take_over(
        &self,
        records: Vec<TaskRecord>,
        bad: Vec<(std::path::PathBuf, String)>,
    ) -> Vec<String> {
        for (path, why) in bad {
            tracing::warn!(path = %path.display(), %why, "skipping an unreadable task record");
        }
        let attach_url = self
            .config()
            .opencode
            .url
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_string());
        let store = self.registry.store().cloned();
        let owner_alive = |pid: u32| store.as_ref().is_some_and(|s| s.owner_alive(pid));
        let mut adopt = Vec::new();
        let mut loaded = 0usize;
        for record in records {
            if let Some((key, fingerprint)) = record.idempotency.clone() {
                self.bind_key(key, fingerprint, record.id.clone());
            }
            if record.status.is_terminal() {
                self.registry.restore(TaskEntry::from_record(record));
                loaded += 1;
                continue;
            }
            if record.owner_pid != std::process::id() && owner_alive(record.owner_pid) {
                continue;
            }
            let attached_here =
                !record.managed && attach_url.as_deref() == Some(record.server_url.as_str());
            let mut entry = TaskEntry::from_record(record);
            if attached_here {
                adopt.push(entry.rec.id.clone());
                self.registry.insert(entry);
            } else {
                let reason = if entry.rec.managed {
                    "the gateway running this task exited, and its managed OpenCode server with it; continue the task (its session is kept) or start it again"
                } else {
                    "the gateway running this task exited, and the OpenCode server it was attached to is no longer configured (opencode.url)"
                };
                entry.finish(TaskStatus::Failed, Some(interrupted(reason)));
                self.registry.insert(entry);
            }
            loaded += 1;
        }
        if loaded > 0 {
            tracing::info!(
                tasks = loaded,
                adopting = adopt.len(),
                "restored tasks from the state directory"
            );
        }
        adopt
    }

    /// Attaches to the configured server and hands it the unfinished tasks a previous gateway
    /// left there.
    async fn adopt(&self, adopt: Vec<String>) {
        let server = match self.start_server(None, None).await {
            Ok(info) => self.pool.get(&info.server_id),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the attached OpenCode to adopt unfinished tasks");
                None
            }
        };
        let Some(server) = server else {
            for id in &adopt {
                self.registry.update(id, |e| {
                    e.finish(
                        TaskStatus::Failed,
                        Some(interrupted(
                            "the gateway restarted and could not reach the attached OpenCode server to pick this task up again",
                        )),
                    )
                });
            }
            return;
        };
        let limit = self.config().timeouts.task.get();
        for id in adopt {
            let Some((turn, elapsed, checking)) = self.registry.update(&id, |e| {
                e.rec.server_id = server.id.clone();
                let checking =
                    e.rec.structured.as_ref().and_then(|s| s.checking) == Some(e.rec.turn);
                (e.rec.turn, e.live.turn_started.elapsed(), checking)
            }) else {
                continue;
            };
            // A turn whose answer was being checked had finished within its deadline; after a
            // long downtime an armed deadline would fire before the check and throw the answer
            // away. A correction it opens gets a deadline of its own. A turn whose deadline
            // passed while the gateway was down gets a deadline that fires now: it reads the
            // turn before it claims it, so a turn that finished in the meantime keeps its answer.
            if !checking {
                self.arm_deadline(&server, &id, turn, limit.saturating_sub(elapsed));
            }
            tracker::spawn_check(&self.tracker, &server, id, Idle::No, None);
        }
    }
}
