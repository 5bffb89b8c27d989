//! Restore: the tasks a previous gateway left in the state directory. Finished tasks become
//! answerable again; unfinished ones on a managed server that gateway let run on for them (it
//! exited cleanly, see `opencode::linger`), on the configured attached server, or on a worker
//! are adopted and finish normally; unfinished ones on a managed server that died with that
//! gateway are reported `failed` (`Interrupted`). Unfinished tasks of another gateway that is still running are
//! left to it, answered for from their records meanwhile, and taken over the same way once that
//! gateway is gone (one shutting down while this one starts, as on a host's reconnect).

use std::sync::Arc;
use std::time::Duration;

use super::housekeeping;
use super::lifecycle::entry::{Claim, TaskEntry};
use super::lifecycle::phase::Phase;
use super::lifecycle::record::{interrupted, worker_lost, TaskRecord};
use super::model::TaskStatus;
use super::service::TaskService;
use crate::tasks::lifecycle::turn::Idle;
use crate::tasks::tracking::budget;
use crate::tasks::tracking::completion;

/// How often the owners of other gateways' unfinished tasks are asked whether they are still
/// alive (a lock probe: one open and one `flock` each).
const OWNER_POLL: Duration = Duration::from_millis(250);

/// A stored record as the restore keeps it.
enum Loaded {
    /// Held in memory: an unfinished task, one finished too recently to have left memory, or
    /// one whose record expired (the eviction right after the restore deletes it, with its
    /// worktree).
    Whole(Box<TaskRecord>),
    /// Finished longer ago than tasks stay in memory (`limits.finished_in_memory`): it stays on
    /// disk, read back by id when asked for, and only what an eviction keeps of a task is kept.
    /// Without this a restart held every record of the day at once before the first eviction
    /// let most of them go: with 4,800 such records on disk a restarted gateway peaked at
    /// 32.1 MiB and kept 10.1 MiB; now 9.2 and 9.2 (an empty state directory: 8.6).
    OnDisk(Resting),
}

struct Resting {
    id: String,
    idempotency: Option<(String, u64)>,
    /// Its fan-out group, which still counts it among its members.
    group: Option<super::lifecycle::record::GroupMember>,
    /// Its finish (epoch ms), when its record is due to expire from.
    finished_ms: u64,
    /// Its turn, and what it spent toward its finishing day (see [`day_spend`]).
    turn: u32,
    spend: f64,
}

impl Loaded {
    /// Which of the two `record` is, `now` being the epoch ms of the restore. Dated by the
    /// wall clock, as the record is: an `Instant` made from an old date is clamped to the
    /// machine's boot, which would keep yesterday's tasks in memory on a machine booted since.
    fn sort(record: TaskRecord, now: u64, memory_ttl: Duration, disk_ttl: Duration) -> Self {
        let age = match record.finished_ms {
            Some(at) if record.status().is_terminal() => {
                Duration::from_millis(now.saturating_sub(at))
            }
            _ => return Self::Whole(Box::new(record)),
        };
        if age < memory_ttl || age >= disk_ttl {
            return Self::Whole(Box::new(record));
        }
        Self::OnDisk(Resting {
            finished_ms: record.finished_ms.unwrap_or_default(),
            turn: record.turn,
            spend: day_spend(&record, now),
            idempotency: record.idempotency,
            group: record.group,
            id: record.id,
        })
    }
}

/// What a finished record spent toward today (UTC, `now` being epoch ms): its last turn's cost,
/// and its earlier turns' if it was started today; nothing if it finished another day. The day's
/// ledger holds every turn that ran since it existed; this covers records written before.
fn day_spend(record: &TaskRecord, now: u64) -> f64 {
    const DAY_MS: u64 = 86_400_000;
    let today = now / DAY_MS;
    if !record.status().is_terminal() || record.finished_ms.unwrap_or_default() / DAY_MS != today {
        return 0.0;
    }
    let turn = record.outcome_cost();
    let earlier = if record.started_ms() / DAY_MS == today {
        record.spend.earlier().cost
    } else {
        0.0
    };
    turn + earlier
}

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
    /// that reads tasks waits for it ([`TaskContext::restored`](crate::tasks::context::TaskContext::restored)). Adopting, which needs the network,
    /// runs after that in the background, and so does the housekeeping of finished tasks
    /// ([`housekeeping::housekeep`]) from here on.
    pub fn restore(
        self: &Arc<Self>,
        after: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        tokio::spawn(housekeeping::housekeep(self.tracker.clone()));
        tokio::spawn(crate::tasks::placement::queue::drain_queue(Arc::downgrade(
            &self.placement,
        )));
        let Some(store) = self.registry.store().cloned() else {
            return;
        };
        self.restored.send_replace(false);
        // Every other gateway's unfinished task read from now on is watched too: one started
        // after this restore by a gateway that then exits is taken over the same way.
        let (report, seen) = tokio::sync::mpsc::unbounded_channel();
        self.registry.report_foreign(report);
        let this = self.clone();
        tokio::spawn(async move {
            after.await;
            let (memory_ttl, disk_ttl) = (this.tracker.memory_ttl, this.tracker.finished_ttl);
            let loaded = tokio::task::spawn_blocking(move || {
                let now = super::model::epoch_ms(std::time::SystemTime::now());
                store.load_each(|record| Loaded::sort(record, now, memory_ttl, disk_ttl))
            })
            .await;
            let (adopt, foreign) = match loaded {
                Ok((records, bad)) => this.take_over(records, bad),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the state directory failed");
                    (Vec::new(), Vec::new())
                }
            };
            this.restored.send_replace(true);
            // Records that expired while no gateway ran go now, with their worktrees, rather
            // than at the first reconcile tick of a server this gateway may never start.
            housekeeping::evict(&this.tracker);
            if !adopt.is_empty() {
                this.adopt(adopt).await;
            }
            // What gateways now gone left running on workers that no task needs.
            this.placement.sweep_worker_serves().await;
            tokio::spawn(watch_owners(Arc::downgrade(&this), seen, foreign));
        });
    }

    /// Registers loaded records; returns the tasks to adopt, and the unfinished tasks of
    /// gateways still alive (task id, owner pid).
    fn take_over(
        &self,
        records: Vec<Loaded>,
        bad: Vec<(std::path::PathBuf, String)>,
    ) -> (Vec<Adopt>, Vec<(String, u32)>) {
        for (path, why) in bad {
            tracing::warn!(path = %path.display(), %why, "skipping an unreadable task record");
        }
        let attach_url = self.attach_url();
        let store = self.registry.store().cloned();
        let owner_alive = |pid: u32| store.as_ref().is_some_and(|s| s.owner_alive(pid));
        let mut adopt = Vec::new();
        let mut foreign = Vec::new();
        let mut loaded = 0usize;
        for record in records {
            let record = match record {
                Loaded::Whole(record) => *record,
                Loaded::OnDisk(rest) => {
                    if let Some((key, fingerprint)) = rest.idempotency {
                        self.placement.bind_key(key, fingerprint, rest.id.clone());
                    }
                    self.registry.note_spend(&rest.id, rest.turn, rest.spend);
                    self.registry.restore_on_disk(
                        &rest.id,
                        rest.finished_ms,
                        rest.group.as_ref(),
                        self.tracker.finished_ttl,
                    );
                    loaded += 1;
                    continue;
                }
            };
            if let Some((key, fingerprint)) = record.idempotency.clone() {
                self.placement.bind_key(key, fingerprint, record.id.clone());
            }
            if record.status().is_terminal() {
                let now = super::model::epoch_ms(std::time::SystemTime::now());
                self.registry
                    .note_spend(&record.id, record.turn, day_spend(&record, now));
                self.registry.restore(TaskEntry::from_record(record));
                loaded += 1;
                continue;
            }
            if record.owner_pid != std::process::id() && owner_alive(record.owner_pid) {
                // Another gateway's live work, or a gateway still shutting down while this one
                // starts (a host's reconnect): answered for from its record meanwhile, and
                // taken over once that gateway is gone. Its fan-out group is whole here too.
                if let Some(g) = &record.group {
                    self.registry.join_group(&record.id, g);
                }
                foreign.push((record.id, record.owner_pid));
                continue;
            }
            adopt.extend(self.take_unfinished(record, attach_url.as_deref()));
            loaded += 1;
        }
        if loaded > 0 || !foreign.is_empty() {
            tracing::info!(
                tasks = loaded,
                adopting = adopt.len(),
                other_gateways = foreign.len(),
                "restored tasks from the state directory"
            );
        }
        (adopt, foreign)
    }

    /// Takes over an unfinished task whose gateway is gone: on the attached server, or on a
    /// remote worker (whose OpenCode outlived that gateway), it is registered to be adopted;
    /// on a managed server, which died with its gateway, or on a server no longer configured,
    /// it is finished `failed` (`Interrupted`).
    fn take_unfinished(&self, record: TaskRecord, attach_url: Option<&str>) -> Option<Adopt> {
        let attached_here = !record.managed && attach_url == Some(record.server_url.as_str());
        let on_worker = (record.worker() != crate::config::LOCAL_WORKER)
            .then(|| (record.worker().to_string(), record.owner_pid));
        // A managed server here that its gateway let run on for its tasks (it exited cleanly).
        let lingering = self
            .placement
            .state_dir
            .as_deref()
            .filter(|_| record.managed && on_worker.is_none())
            .and_then(|dir| crate::opencode::linger::load(dir, &record.server_id))
            .map(|_| record.server_id.clone());
        let mut entry = TaskEntry::from_record(record);
        entry.adopt();
        // A queued task never started (or its start from the queue died with its gateway): it
        // stays in the queue, this gateway's now.
        if entry.phase() == Phase::Queued {
            self.registry.insert(entry);
            return None;
        }
        if let Some((worker, owner)) = on_worker {
            let id = entry.rec.id.clone();
            self.registry.insert(entry);
            return Some(Adopt::OnWorker { id, worker, owner });
        }
        if attached_here {
            let id = entry.rec.id.clone();
            self.registry.insert(entry);
            return Some(Adopt::Attached(id));
        }
        if let Some(server_id) = lingering {
            let id = entry.rec.id.clone();
            self.registry.insert(entry);
            return Some(Adopt::Lingering { id, server_id });
        }
        let reason = if entry.rec.managed {
            "the gateway running this task exited, and its managed OpenCode server with it; continue the task (its session is kept) or start it again"
        } else {
            "the gateway running this task exited, and the OpenCode server it was attached to is no longer configured (opencode.url)"
        };
        let turn = entry.rec.turn;
        entry.finish(
            Claim::Gone(turn),
            TaskStatus::Failed,
            Some(interrupted(reason)),
        );
        self.registry.insert(entry);
        None
    }

    /// The URL of the configured attached server, as records name it.
    fn attach_url(&self) -> Option<String> {
        self.tracker
            .config()
            .opencode
            .url
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_string())
    }

    /// Hands the unfinished tasks a previous gateway left to the servers they run on: the
    /// configured attached server, and each worker's OpenCode, reached again.
    async fn adopt(&self, adopt: Vec<Adopt>) {
        let mut attached = Vec::new();
        let mut on_workers: std::collections::BTreeMap<(String, u32), Vec<String>> =
            Default::default();
        let mut lingering: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for a in adopt {
            match a {
                Adopt::Attached(id) => attached.push(id),
                Adopt::OnWorker { id, worker, owner } => {
                    on_workers.entry((worker, owner)).or_default().push(id)
                }
                Adopt::Lingering { id, server_id } => {
                    lingering.entry(server_id).or_default().push(id)
                }
            }
        }
        for (server_id, ids) in lingering {
            self.adopt_lingering(&server_id, ids).await;
        }
        for ((worker, owner), ids) in on_workers {
            let reached = match self
                .placement
                .remote_worker(&worker, crate::config::Isolation::Worktree)
            {
                Ok(Some(w)) => self.placement.reattach_worker(&w, owner).await,
                Ok(None) => Err(super::error::TaskError::Conflict(
                    "not a remote worker".into(),
                )),
                Err(e) => Err(e),
            };
            match reached {
                Ok(server) => self.adopt_on(&server, ids).await,
                Err(e) => {
                    tracing::warn!(worker, error = %e, "cannot adopt the tasks a previous gateway ran on a worker");
                    let why = format!(
                        "the gateway running this task exited, and worker `{worker}`'s OpenCode that ran it cannot be reached again ({e}); continue the task (its session is kept there) or start it again"
                    );
                    self.fail_unadopted(&ids, worker_lost(&why));
                }
            }
        }
        if attached.is_empty() {
            return;
        }
        let adopt = attached;
        let server = match self.placement.start_server(None, None).await {
            Ok(info) => self.placement.pool.get(&info.server_id),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the attached OpenCode to adopt unfinished tasks");
                None
            }
        };
        let Some(server) = server else {
            self.fail_unadopted(
                &adopt,
                interrupted(
                    "the gateway restarted and could not reach the attached OpenCode server to pick this task up again",
                ),
            );
            return;
        };
        self.adopt_on(&server, adopt).await;
    }

    /// Takes over the managed server `server_id` a gateway left running for `ids` (see
    /// `opencode::linger`) and hands them to it; if it cannot be reached, they end `failed`
    /// (`Interrupted`) as on a server that died with its gateway.
    async fn adopt_lingering(&self, server_id: &str, ids: Vec<String>) {
        let taken = match self.placement.pool.adopt_lingering(server_id).await {
            Some(Ok(started)) => Ok(self.placement.track(started)),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("no gateway left it running".into()),
        };
        match taken {
            Ok(server) => self.adopt_on(&server, ids).await,
            Err(e) => {
                tracing::warn!(server_id, error = %e, "cannot take over the OpenCode a previous gateway left running");
                let why = format!(
                    "the gateway running this task exited, and the OpenCode it left running for it cannot be reached ({e}); continue the task (its session is kept) or start it again"
                );
                self.fail_unadopted(&ids, interrupted(&why));
            }
        }
    }

    /// Ends `ids`, unfinished tasks of a gateway that is gone whose server cannot be reached
    /// again, `failed` with `error`.
    fn fail_unadopted(&self, ids: &[String], error: crate::opencode::ErrorInfo) {
        for id in ids {
            self.registry.update(id, |e| {
                let turn = e.rec.turn;
                e.finish(Claim::Gone(turn), TaskStatus::Failed, Some(error.clone()))
            });
        }
    }

    /// Hands `ids`, unfinished tasks of a gateway that is gone, to `server`, which runs them.
    async fn adopt_on(&self, server: &Arc<crate::opencode::Server>, ids: Vec<String>) {
        let limit = self.tracker.config().timeouts.task.get();
        for id in ids {
            let Some((turn, elapsed, checking)) = self.registry.update(&id, |e| {
                e.rec.server_id = server.id.clone();
                // A worker's OpenCode is reached through a forward of this gateway's.
                e.rec.server_url = server.api.base_url().to_string();
                let checking = e.rec.is_held();
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
                self.tracker
                    .arm_turn_deadline(server, &id, turn, limit.saturating_sub(elapsed));
            }
            // What the turn spent while no gateway watched counts against its caps now, not
            // only from its next step on.
            budget::reconcile_spend(&self.tracker, server, &id).await;
            completion::spawn_check(&self.tracker, server, id, Idle::No, None);
        }
    }
}

/// A task a previous gateway left unfinished, to hand to the server it runs on.
enum Adopt {
    /// On the configured attached server.
    Attached(String),
    /// On a remote worker's OpenCode, started by gateway `owner`.
    OnWorker {
        id: String,
        worker: String,
        owner: u32,
    },
    /// On a managed server here that its gateway left running (`opencode::linger`).
    Lingering { id: String, server_id: String },
}

/// Watches the gateways whose unfinished tasks this one has seen (`foreign` at the restore, then
/// each one read since, reported by the registry on `seen`): once one is gone, each of its tasks
/// is read again and taken over as at a restore (a turn it finished while going keeps its
/// answer). A gateway shutting down spends seconds stopping while its successor restores in
/// milliseconds, and two hosts may share a state directory and one close mid-task: without this
/// such tasks stayed another's for this gateway's whole life. Ends with the service.
async fn watch_owners(
    service: std::sync::Weak<TaskService>,
    mut seen: tokio::sync::mpsc::UnboundedReceiver<(String, u32)>,
    foreign: Vec<(String, u32)>,
) {
    let mut watched: std::collections::HashMap<String, u32> = foreign.into_iter().collect();
    let mut tick = tokio::time::interval(OWNER_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            reported = seen.recv() => match reported {
                Some((id, pid)) => {
                    watched.insert(id, pid);
                }
                // The registry, and so the service, is gone.
                None => return,
            },
            _ = tick.tick(), if !watched.is_empty() => {
                let Some(this) = service.upgrade() else {
                    return;
                };
                this.take_over_orphans(&mut watched).await;
            }
        }
    }
}

impl TaskService {
    /// Takes over the `watched` tasks whose owner is gone (see [`watch_owners`]); the others
    /// stay watched.
    async fn take_over_orphans(&self, watched: &mut std::collections::HashMap<String, u32>) {
        let Some(store) = self.registry.store().cloned() else {
            watched.clear();
            return;
        };
        let mut gone = Vec::new();
        watched.retain(|id, pid| {
            let alive = store.owner_alive(*pid);
            if !alive {
                gone.push(id.clone());
            }
            alive
        });
        let attach_url = self.attach_url();
        let mut adopt = Vec::new();
        for id in gone {
            // Another call may have read it into memory once it finished.
            if self.registry.any(|e| e.rec.id == id) {
                continue;
            }
            let Some(record) = store.load(&id) else {
                continue;
            };
            if record.status().is_terminal() {
                self.registry.restore(TaskEntry::from_record(record));
                continue;
            }
            tracing::info!(task = %id, owner = record.owner_pid, "taking over a task whose gateway exited");
            adopt.extend(self.take_unfinished(record, attach_url.as_deref()));
        }
        if !adopt.is_empty() {
            self.adopt(adopt).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::lifecycle::turn::TurnState;
    use crate::tasks::model::epoch_ms;

    const DAY_MS: u64 = 24 * 60 * 60 * 1000;

    /// A finished record: `cost` spent, finished `ago` before `now` (epoch ms).
    fn finished(id: &str, now: u64, ago: u64, cost: f64, key: Option<&str>) -> TaskRecord {
        let mut r = TaskRecord::new(
            id.into(),
            "srv_1".into(),
            format!("ses_{id}"),
            "/w".into(),
            "title".into(),
        );
        r.server_url = "http://127.0.0.1:1".into();
        r.managed = true;
        r.begin_turn_for_test("msg_1".into(), None, None);
        r.finish_for_test(TaskStatus::Completed, None);
        r.finished_ms = Some(now - ago);
        r.outcome = Some(TurnState {
            text: format!("answer of {id}"),
            finished: true,
            cost,
            ..TurnState::default()
        });
        r.idempotency = key.map(|k| (k.to_string(), 7));
        r
    }

    /// Held in memory: the unfinished, the recently finished, and the expired (for the
    /// eviction to delete with their worktrees); the rest is left on disk.
    #[test]
    fn only_tasks_still_due_in_memory_are_held_whole() {
        let (memory, disk) = (Duration::from_secs(600), Duration::from_secs(86_400));
        // Noon of today (UTC): a record that finished minutes before `now` finished today too,
        // so its spend counts toward the day whatever the time the test runs at (at 00:05 UTC,
        // 700 s before the real now was yesterday, and the spend read 0).
        let now = epoch_ms(std::time::SystemTime::now()) / DAY_MS * DAY_MS + DAY_MS / 2;
        let on_disk =
            |r: TaskRecord| matches!(Loaded::sort(r, now, memory, disk), Loaded::OnDisk(_));
        assert!(!on_disk(finished("a", now, 599_000, 0.0, None)));
        assert!(on_disk(finished("b", now, 600_000, 0.0, None)));
        assert!(on_disk(finished("c", now, 86_399_000, 0.0, None)));
        assert!(!on_disk(finished("d", now, 86_400_000, 0.0, None)));
        let mut running = finished("e", now, 700_000, 0.0, None);
        running.set_status_for_test(TaskStatus::Running);
        assert!(!on_disk(running));
        let Loaded::OnDisk(rest) = Loaded::sort(
            finished("f", now, 700_000, 0.5, Some("k")),
            now,
            memory,
            disk,
        ) else {
            panic!("left on disk");
        };
        assert_eq!(
            (rest.id.as_str(), rest.finished_ms, rest.spend),
            ("f", now - 700_000, 0.5)
        );
        assert_eq!(rest.idempotency, Some(("k".to_string(), 7)));
    }

    /// A restart keeps in memory only what a running gateway would: records finished longer
    /// ago than `limits.finished_in_memory` stay on disk, yet answer by id, count toward the
    /// day's spend, and keep their idempotency keys.
    #[tokio::test]
    async fn tasks_past_their_time_in_memory_are_restored_on_disk() {
        // Both records must finish on the same UTC day as the restore, for the spend check.
        while epoch_ms(std::time::SystemTime::now()) % DAY_MS < 5_000 {
            std::thread::sleep(Duration::from_millis(500));
        }
        let now = epoch_ms(std::time::SystemTime::now());
        let dir = std::env::temp_dir().join(format!("ocm-restore-{}", crate::ids::task_id()));
        let mut config = crate::gateway::test_config();
        config.state_dir = Some(dir.display().to_string());
        config.limits.finished_in_memory = Duration::from_secs(2).into();
        let written = TaskService::new(Arc::new(config.clone()));
        let store = written.registry.store().cloned().expect("a store");
        store.submit(finished("tsk_old", now, 4_000, 0.25, Some("old-key")));
        store.submit(finished("tsk_new", now, 0, 0.5, None));
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("written");
        drop(written);
        drop(store);

        let service = Arc::new(TaskService::new(Arc::new(config)));
        service.restore(async {});
        service.tracker.restored().await;
        let in_memory: Vec<String> = service
            .registry
            .summaries()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(in_memory, vec!["tsk_new".to_string()]);
        let spent = service.registry.spent_today();
        assert!((spent - 0.75).abs() < 1e-9, "spent today: {spent}");
        let bound = service.placement.key_slot("old-key");
        let bound = bound.try_lock().expect("not in use").clone();
        assert_eq!(bound, Some((7, "tsk_old".to_string())));
        let old = service.registry.get("tsk_old").expect("read back by id");
        assert_eq!(
            old.rec.outcome.map(|o| o.text).as_deref(),
            Some("answer of tsk_old")
        );
        // Read back, it counts once; and a second restart counts nothing twice.
        let spent = service.registry.spent_today();
        assert!((spent - 0.75).abs() < 1e-9, "spent today: {spent}");
        drop(service);
        let again = Arc::new(TaskService::new(Arc::new({
            let mut c = crate::gateway::test_config();
            c.state_dir = Some(dir.display().to_string());
            c
        })));
        again.restore(async {});
        again.tracker.restored().await;
        let spent = again.registry.spent_today();
        assert!((spent - 0.75).abs() < 1e-9, "spent today: {spent}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
