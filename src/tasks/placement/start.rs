//! Starting a task: a validated request, its idempotency key, the room it takes, and the
//! start itself (its server chosen, its worktree made, its session created and its first turn
//! opened). A queued start (`queue.rs`) comes back here once room frees up.

use std::path::Path;
use std::sync::Arc;

use super::Placement;
use crate::tasks::turn::confine::{admit, forced_rules};

use crate::config::Budget;
use crate::config::Isolation;
use crate::git::Base;
use crate::ids;
use crate::opencode::{resolve_directory, RunOn};
use crate::tasks::checks::structured;
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::entry::{Claim, TaskEntry};
use crate::tasks::lifecycle::phase::Phase;
use crate::tasks::lifecycle::record::StructuredState;
use crate::tasks::lifecycle::record::{GroupMember, TaskRecord};
use crate::tasks::model::{TaskSnapshot, TaskStatus};
use crate::tasks::resolve::{self, Choice};
use crate::tasks::spend::caps;
use crate::tasks::store::capacity::{Place, Slots};

/// A validated `start_task` request (kept as JSON in a queued task's record).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StartTask {
    pub server_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    /// Exact `provider/model`.
    pub model: Option<String>,
    /// A tier name from the config; resolved against the server's models.
    pub tier: Option<String>,
    /// Absolute directory the session runs in (default: the server's).
    pub directory: Option<String>,
    pub title: Option<String>,
    /// Same key and arguments: the task the first call started. Same key, other arguments:
    /// `conflict`.
    pub idempotency_key: Option<String>,
    /// `worktree`: the task works in a git worktree of its own (see `workspace.rs`).
    pub isolation: Isolation,
    /// What that worktree starts from.
    pub base: Base,
    /// The fan-out group this task is one answer of, and its place there.
    pub group: Option<GroupMember>,
    /// A JSON Schema the answer must end with a matching JSON value of (see `structured.rs`).
    pub output_schema: Option<serde_json::Value>,
    /// The call's own spending caps (they may only lower those in force; see `spend/caps.rs`).
    pub budget: Budget,
    /// The model variant to run (reasoning effort), in place of the tier's.
    pub variant: Option<String>,
    /// The worker to run on (`local`, or a remote worker of `workers:`); `None`: this machine.
    pub worker: Option<String>,
    /// Commands that must succeed after each turn, besides the tier's (see `checks`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<String>,
}

impl StartTask {
    /// A stable fingerprint of everything but the key (FNV-1a: the same across processes and
    /// releases, so a retry after a restart matches).
    fn fingerprint(&self) -> u64 {
        // serde_json's maps are ordered, so equal schemas serialize alike.
        let schema = self.output_schema.as_ref().map(|s| s.to_string());
        let fields = [
            Some(self.server_id.as_str()),
            Some(self.prompt.as_str()),
            self.agent.as_deref(),
            self.model.as_deref(),
            self.tier.as_deref(),
            self.directory.as_deref(),
            self.title.as_deref(),
            Some(match self.isolation {
                Isolation::None => "isolation:none",
                Isolation::Worktree => "isolation:worktree",
            }),
            Some(match self.base {
                Base::WorkingTree => "base:working_tree",
                Base::Head => "base:head",
            }),
            schema.as_deref(),
        ];
        // Hashed only when given, so a key's fingerprint is what it was before budgets and
        // variants existed.
        let budget = (!self.budget.is_unlimited()).then(|| format!("{:?}", self.budget));
        let variant = self.variant.as_ref().map(|v| format!("variant:{v}"));
        let worker = self.worker.as_ref().map(|w| format!("worker:{w}"));
        let checks = (!self.checks.is_empty()).then(|| format!("checks:{:?}", self.checks));
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let given: Vec<String> = [budget, variant, worker, checks]
            .into_iter()
            .flatten()
            .collect();
        for field in fields
            .into_iter()
            .chain(given.iter().map(|f| Some(f.as_str())))
        {
            // A marker per field keeps `None` apart from `Some("")` and fields apart.
            let bytes = field.map_or(&[0xff_u8][..], str::as_bytes);
            for b in bytes.iter().chain(&[0x00]) {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }
}

/// What an `idempotency_key` is bound to: the argument fingerprint and the task it started.
pub(in crate::tasks) type KeySlot = Arc<tokio::sync::Mutex<Option<(u64, String)>>>;

/// How many idempotency keys accumulate between prunes of those that stand for nothing.
pub(in crate::tasks) const KEYS_PRUNE_AT: usize = 1024;

/// Starts that run their steps on one OpenCode server at the same time; the others wait in
/// line, still `starting`. A task's first request in a new directory (its worktree) makes
/// OpenCode boot an instance for it (its configuration, plugins and tools). Thirty starts
/// answered at once and run side by side, on a 2-core machine whose three workers also ran the
/// tasks already started, made many of them wait past their deadline, in the `fanout` bench
/// (at four at a time still). Two at a time keeps a fan-out's starts overlapping, one making
/// its worktree while the other talks to OpenCode, without flooding the server.
pub(in crate::tasks) const STARTS_AT_ONCE: usize = 2;

impl Placement {
    /// The line a start waits in to run its steps on server `server_id` ([`STARTS_AT_ONCE`]).
    fn start_gate(&self, server_id: &str) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self
            .start_gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        gates
            .entry(server_id.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(STARTS_AT_ONCE)))
            .clone()
    }

    /// Takes room for `new` more unfinished tasks, one slot each, on `worker` when the call
    /// names one, else on this machine first and then on the remote workers with free slots
    /// (only for tasks that can run remotely: `isolation` worktree); refuses when the workers
    /// have too few free slots between them (see `capacity.rs`). Finished tasks never count:
    /// they leave memory and stay readable from disk. `fan_out` takes room for all its targets
    /// at once and hands one slot to each of its starts ([`Placement::start_with`]).
    ///
    /// A worker that declares `tiers` is given only tasks of those tiers (`tier`; `None`: the
    /// task names none, or the tasks of a fan-out differ).
    pub fn reserve(
        &self,
        worker: Option<&str>,
        isolation: Isolation,
        tier: Option<&str>,
        new: usize,
    ) -> Result<Vec<Slots>, TaskError> {
        let config = self.tracker.config();
        let places = match worker {
            Some(name) => {
                self.remote_worker(name, isolation)?;
                vec![Place::of(&config, name)]
            }
            // Workers found out of reach are left out for a while.
            None if isolation == Isolation::Worktree && self.state_dir.is_some() => {
                crate::workers::from_config(&config)
                    .iter()
                    .filter(|w| w.remote.is_none() || !self.workers.avoided(&w.name))
                    .filter(|w| w.takes(tier))
                    .map(|w| Place::from_worker(&config, w))
                    .collect()
            }
            None => vec![Place::local(&config)],
        };
        self.tracker.capacity.spread(&self.registry, &places, new)
    }

    /// Creates a session, sends the prompt, and returns as soon as OpenCode accepted it. With an
    /// `idempotency_key`, a retry returns the task the first call started (concurrent calls with
    /// one key run one after the other); a first call that failed leaves the key free.
    pub async fn start(self: &Arc<Self>, req: StartTask) -> Result<TaskSnapshot, TaskError> {
        self.start_with(req, None).await
    }

    /// [`Placement::start`] in room already taken (`room`, one slot), or taking its own.
    pub async fn start_with(
        self: &Arc<Self>,
        req: StartTask,
        room: Option<Slots>,
    ) -> Result<TaskSnapshot, TaskError> {
        self.tracker.restored().await;
        let Some(key) = req.idempotency_key.clone() else {
            return self.start_new(req, None, room).await;
        };
        let fingerprint = req.fingerprint();
        let slot = self.key_slot(&key);
        let mut bound = slot.lock().await;
        if let Some((fp, task_id)) = bound.as_ref() {
            if *fp != fingerprint {
                return Err(TaskError::Conflict(format!(
                    "idempotency_key `{key}` already started task {task_id} with other arguments; \
                     use a new key for a new task"
                )));
            }
            if let Ok(snapshot) = self.tracker.snapshot(task_id, false) {
                return Ok(snapshot);
            }
            // The task it started has expired: the key starts anew.
        }
        let snapshot = self.start_new(req, Some((key, fingerprint)), room).await?;
        *bound = Some((fingerprint, snapshot.task_id.clone()));
        Ok(snapshot)
    }

    pub(in crate::tasks) fn key_slot(&self, key: &str) -> KeySlot {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        // Keys outlive their tasks (restore binds every stored one, expired records take none
        // along): every KEYS_PRUNE_AT new keys, drop the ones bound to nothing or to a task
        // that no longer exists. A key in use (its slot locked) is left alone. Existence is a
        // `stat` for tasks out of memory: reading them would bring each back into memory.
        if !keys.contains_key(key) && !keys.is_empty() && keys.len().is_multiple_of(KEYS_PRUNE_AT) {
            keys.retain(|_, slot| match slot.try_lock() {
                Ok(bound) => bound
                    .as_ref()
                    .is_some_and(|(_, task_id)| self.registry.knows(task_id)),
                Err(_) => true,
            });
        }
        keys.entry(key.to_string()).or_default().clone()
    }

    /// Unbinds the task's `idempotency_key` (in memory and in its record, so a restart does not
    /// bind it again): for a task started and then cancelled because the call it belonged to
    /// failed as a whole (`fan_out`'s all or nothing), whose retry must start anew rather than
    /// be handed back the cancelled task.
    pub async fn release_key(&self, task_id: &str) {
        let Some((key, _)) = self.registry.get(task_id).and_then(|e| e.rec.idempotency) else {
            return;
        };
        let slot = self.key_slot(&key);
        let mut bound = slot.lock().await;
        if bound.as_ref().is_some_and(|(_, id)| id == task_id) {
            *bound = None;
        }
        self.registry.update(task_id, |e| e.rec.idempotency = None);
    }

    /// Binds keys of restored tasks again, so a retry after a restart finds its task.
    pub(in crate::tasks) fn bind_key(&self, key: String, fingerprint: u64, task_id: String) {
        let slot = self.key_slot(&key);
        let bound = slot.try_lock();
        if let Ok(mut bound) = bound {
            *bound = Some((fingerprint, task_id));
        }
    }

    /// Starts `req` as a new task. A start that makes a worktree or runs on a worker answers
    /// as soon as the task is recorded (`pending`, phase `starting`), and its steps run in the
    /// background ([`Placement::spawn_start`]); one that works in place (isolation `none`)
    /// answers once its prompt is sent, which is as quick. What can be decided without I/O is
    /// refused at once either way: the arguments, the limits, an unknown worker, a directory
    /// that is not in a git repository, and, for this machine, the agent and model.
    pub(in crate::tasks) async fn start_new(
        self: &Arc<Self>,
        req: StartTask,
        idempotency: Option<(String, u64)>,
        room: Option<Slots>,
    ) -> Result<TaskSnapshot, TaskError> {
        let admitted = match self.admit(req, idempotency, room).await? {
            Admitted::Run(admitted) => *admitted,
            Admitted::Queued(snapshot) => return Ok(*snapshot),
        };
        if admitted.worker.is_none() && admitted.req.isolation == Isolation::None {
            return self.run_steps(admitted, None).await.map_err(|(_, e)| e);
        }
        crate::git::can_branch(Path::new(&admitted.directory)).await?;
        if admitted.worker.is_none() {
            // This machine's listings are at hand (remembered): a model or agent it does not
            // have is refused now rather than in the background.
            let Ready {
                req,
                local,
                directory,
                ..
            } = &admitted;
            resolve::choose(
                &self.tracker.config(),
                local,
                directory,
                req.agent.as_deref(),
                req.model.as_deref(),
                req.tier.as_deref(),
                req.variant.as_deref(),
            )
            .await?;
        }
        let Ready {
            mut req,
            idempotency,
            room,
            directory,
            ..
        } = admitted;
        let task_id = ids::task_id();
        let rec = unstarted_record(&task_id, &mut req, directory, idempotency.clone())?;
        self.registry.insert(TaskEntry::starting(rec));
        tracing::info!(task_id, "the task is recorded; it starts in the background");
        self.spawn_start(req, idempotency, room, task_id.clone(), false);
        self.tracker.snapshot(&task_id, false)
    }

    /// The checks of a start that need no I/O, and its room: taken here unless given (a
    /// queued start's, a fan-out's); none anywhere, and the task is queued when the user
    /// allows it (`queue.rs`).
    async fn admit(
        &self,
        req: StartTask,
        idempotency: Option<(String, u64)>,
        room: Option<Slots>,
    ) -> Result<Admitted, TaskError> {
        if let Some(schema) = &req.output_schema {
            structured::check_schema(schema)
                .map_err(|e| TaskError::InvalidArgument(e.to_string()))?;
        }
        let checks = crate::tasks::checks::commands::commands_for(
            &self.tracker.config(),
            req.tier.as_deref(),
            &req.checks,
        )
        .map_err(TaskError::InvalidArgument)?;
        resolve::known_tier(&self.tracker.config(), req.tier.as_deref())?;
        let local = self.server(&req.server_id)?;
        let budget = caps::caps(&self.tracker.config(), req.tier.as_deref(), req.budget)?;
        caps::within_daily_cap(&self.tracker.config(), self.registry.spent_today())?;
        let directory = match req.directory.clone() {
            Some(d) => resolve_directory(Some(d))?,
            None => local.directory.clone(),
        };
        // Held until the task is registered as started: until then it counts as an unfinished
        // task of the worker it was taken on, which is where the task runs.
        let room = match room {
            Some(room) => room,
            None => {
                match self.reserve(req.worker.as_deref(), req.isolation, req.tier.as_deref(), 1) {
                    Ok(mut room) => room
                        .pop()
                        .ok_or_else(|| TaskError::LimitExceeded("no room for the task".into()))?,
                    Err(TaskError::LimitExceeded(why)) => {
                        return self
                            .enqueue(req, directory, idempotency, why)
                            .await
                            .map(|s| Admitted::Queued(Box::new(s)))
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let worker = self.remote_worker(room.worker(), req.isolation)?;
        Ok(Admitted::Run(Box::new(Ready {
            req,
            idempotency,
            room,
            worker,
            local,
            directory,
            budget,
            checks,
        })))
    }

    /// Starts the task `id`, recorded as starting, in `room` taken for it (a start answered
    /// at once, or a queued one whose turn came): the steps after the checks, then the task's
    /// first turn in place of its entry. Where it fails, the step it failed at.
    pub(in crate::tasks) async fn start_recorded(
        &self,
        req: StartTask,
        idempotency: Option<(String, u64)>,
        room: Slots,
        id: &str,
    ) -> Result<TaskSnapshot, (Step, TaskError)> {
        match self.admit(req, idempotency, Some(room)).await {
            Ok(Admitted::Run(admitted)) => self.run_steps(*admitted, Some(id)).await,
            Ok(Admitted::Queued(_)) => Err((
                Step::Checks,
                TaskError::LimitExceeded("no room for the task".into()),
            )),
            Err(e) => Err((Step::Checks, e)),
        }
    }

    /// Whether the task `id` is still being started (a cancel may have finished it); `None`
    /// (no task recorded) for a start that answers only once done.
    pub(super) fn still_starting(&self, id: Option<&str>) -> bool {
        id.is_none_or(|id| {
            self.registry
                .get(id)
                .is_some_and(|e| e.phase() == Phase::Starting)
        })
    }

    /// The steps of a start that do I/O: its server (OpenCode on its worker), its model, its
    /// worktree, its confinement, its session, then its first turn, registered before its
    /// prompt is sent so that no event of it can be missed. `starting`: the id of the task
    /// recorded as starting, which a cancel may end between two steps; what was made for it
    /// is then undone, and nothing more is done.
    async fn run_steps(
        &self,
        admitted: Ready,
        starting: Option<&str>,
    ) -> Result<TaskSnapshot, (Step, TaskError)> {
        let Ready {
            req,
            idempotency,
            room,
            worker,
            local,
            directory,
            budget,
            checks,
        } = admitted;
        let cancelled = |step| {
            (
                step,
                TaskError::Conflict("the task was cancelled while it was starting".into()),
            )
        };
        // A remote task runs on its worker's OpenCode, whose agents and models are that
        // worker's own.
        let mut took = StepTimes::new();
        let server = match &worker {
            Some(w) => self.worker_server(w).await.map_err(|e| (Step::Server, e))?,
            None => local,
        };
        took.mark("server");
        // Held until the prompt is sent (or the start fails): see [`STARTS_AT_ONCE`]. Only a
        // start that makes a new directory (a worktree, whose OpenCode instance boots on its
        // first request) waits in line. A start in place works in a directory its server knows,
        // and its host waits for its answer: behind the line it took 1.9 s (p50) in the
        // `fanout` bench instead of tens of milliseconds.
        let _gate = match req.isolation {
            Isolation::Worktree => Some(self.start_gate(&server.id).acquire_owned().await),
            Isolation::None => None,
        };
        took.mark("line");
        let Choice {
            model,
            variant,
            price,
        } = resolve::choose(
            &self.tracker.config(),
            &server,
            if worker.is_some() {
                &server.directory
            } else {
                &directory
            },
            req.agent.as_deref(),
            req.model.as_deref(),
            req.tier.as_deref(),
            req.variant.as_deref(),
        )
        .await
        .map_err(|e| (Step::Model, e))?;
        took.mark("model");
        if !self.still_starting(starting) {
            return Err(cancelled(Step::Model));
        }
        let title = req
            .title
            .clone()
            .unwrap_or_else(|| default_title(&req.prompt));
        let task_id = starting.map_or_else(ids::task_id, str::to_string);
        let group = req.group.as_ref().map(|g| g.id.as_str());
        let workspace = match (&worker, req.isolation) {
            (Some(w), _) => Some(
                self.place(w, &server, &directory, &task_id, req.base, group)
                    .await
                    .map_err(|e| (Step::Worktree, e))?,
            ),
            (None, Isolation::None) => None,
            (None, Isolation::Worktree) => Some(
                self.create_workspace(&directory, &task_id, req.base, group)
                    .await
                    .map_err(|e| (Step::Worktree, e))?,
            ),
        };
        took.mark("worktree");
        let made = workspace.as_ref().map(|(w, _)| w);
        let undo = |step: Step, e: TaskError| async move {
            self.drop_workspace(made).await;
            Err((step, e))
        };
        if !self.still_starting(starting) {
            return undo(Step::Worktree, cancelled(Step::Worktree).1).await;
        }
        let directory = workspace
            .as_ref()
            .map_or(directory, |(_, session_dir)| session_dir.clone());
        // The task's root is registered with the server's sandbox before its session exists,
        // so its first command already finds it; a task that cannot be confined as the user
        // asked does not start.
        let root = workspace
            .as_ref()
            .map_or(directory.as_str(), |(w, _)| w.path.as_str());
        let opt_out = crate::sandbox::tier_opt_out(&self.tracker.config(), req.tier.as_deref());
        let boot = self.tracker.config().timeouts.server_start.get();
        let confinement = match admit(&server, root, opt_out, boot).await {
            Ok(confinement) => confinement,
            Err(e) => return undo(Step::Confinement, e).await,
        };
        took.mark("confinement");
        let forced = forced_rules(&self.tracker.config(), &server);
        let session_id = match server.api.create_session(&directory, &title, &forced).await {
            Ok(id) => id,
            Err(e) => return undo(Step::Session, e.into()).await,
        };
        took.mark("session");
        let message_id = ids::message_id();
        let mut rec = TaskRecord::new(
            task_id.clone(),
            server.id.clone(),
            session_id.clone(),
            directory.clone(),
            title,
        );
        rec.server_url = server.api.base_url().to_string();
        rec.managed = server.process.is_some();
        rec.confinement = Some(confinement);
        rec.idempotency = idempotency;
        rec.workspace = made.cloned();
        rec.tier = req.tier.clone();
        rec.budget = (!budget.is_unlimited()).then_some(budget);
        rec.variant = variant.clone();
        rec.price = price.map(|p| (model.clone().unwrap_or_default(), p));
        rec.group = req.group.clone();
        rec.structured = req.output_schema.clone().map(StructuredState::new);
        rec.checks =
            (!checks.is_empty()).then(|| crate::tasks::lifecycle::record::ChecksState::new(checks));
        let prompt = match &req.output_schema {
            Some(schema) => format!("{}{}", req.prompt, structured::instruction(schema)),
            None => req.prompt.clone(),
        };
        // A new record's phase is `starting`, which `begin_turn` moves from.
        let mut entry = TaskEntry::new(rec);
        if let Err(refused) = entry.begin_turn(message_id.clone(), req.agent.clone(), model.clone())
        {
            let e = TaskError::Conflict(format!("task {task_id}: {refused}"));
            return undo(Step::Session, e).await;
        }
        // Registered before the prompt goes out, so no event of this turn can be missed; a
        // task a cancel ended meanwhile is not (its session stays empty and idle).
        let registered = match starting {
            Some(_) => self.registry.insert_started(entry),
            None => {
                self.registry.insert(entry);
                true
            }
        };
        if !registered {
            return undo(Step::Session, cancelled(Step::Session).1).await;
        }
        drop(room);
        if let Err(e) = server
            .api
            .prompt_async(
                &directory,
                &session_id,
                &message_id,
                &prompt,
                RunOn {
                    agent: req.agent.as_deref(),
                    model: model.as_deref(),
                    variant: variant.as_deref(),
                },
            )
            .await
        {
            // A task that was answered keeps its id: it ends failed rather than vanishing.
            if starting.is_some() {
                let error = crate::tasks::lifecycle::record::start_failed(format_args!(
                    "{}: {e}",
                    Step::Prompt.doing()
                ));
                self.registry.update(&task_id, |entry| {
                    let turn = entry.rec.turn;
                    entry.finish(Claim::Gone(turn), TaskStatus::Failed, Some(error));
                });
            } else {
                self.registry.remove(&task_id);
            }
            return undo(Step::Prompt, e.into()).await;
        }
        took.mark("prompt");
        tracing::debug!(task_id, steps = %took, "the task's start steps are done");
        let limit = self.tracker.config().timeouts.task.get();
        self.tracker.arm_turn_deadline(&server, &task_id, 1, limit);
        self.tracker
            .snapshot(&task_id, false)
            .map_err(|e| (Step::Prompt, e))
    }
}

/// How long each of a start's steps took, for the debug log: where a slow start spent its time
/// (its worker's OpenCode, the line, the model, the worktree, confinement, session, prompt).
struct StepTimes {
    last: std::time::Instant,
    steps: Vec<(&'static str, std::time::Duration)>,
}

impl StepTimes {
    fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            steps: Vec::with_capacity(7),
        }
    }

    /// The step `name` ended now.
    fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.steps.push((name, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for StepTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, took)) in self.steps.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{name}={}ms", took.as_millis())?;
        }
        Ok(())
    }
}

/// A start past its checks ([`Placement::admit`]): queued, or ready to run.
enum Admitted {
    Run(Box<Ready>),
    Queued(Box<TaskSnapshot>),
}

/// What a start's checks decided: its room, its worker, its server here, its directory and
/// caps, and its checks' commands.
struct Ready {
    req: StartTask,
    idempotency: Option<(String, u64)>,
    room: Slots,
    worker: Option<crate::tasks::placement::remote::Named>,
    local: Arc<crate::opencode::Server>,
    directory: String,
    budget: Budget,
    checks: Vec<String>,
}

/// The step a start failed at, named in its `StartFailed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::tasks) enum Step {
    /// Its arguments and room, checked again when a queued start's turn comes.
    Checks,
    Server,
    Model,
    Worktree,
    Confinement,
    Session,
    Prompt,
}

impl Step {
    /// What the start was doing, for its `StartFailed`.
    pub(in crate::tasks) fn doing(self) -> &'static str {
        match self {
            Step::Checks => "checking its arguments and room",
            Step::Server => "starting OpenCode on its worker",
            Step::Model => "choosing its agent and model",
            Step::Worktree => "making its worktree",
            Step::Confinement => "confining its agent",
            Step::Session => "creating its session",
            Step::Prompt => "sending its prompt",
        }
    }
}

/// The record of task `task_id` not started yet (queued, or starting in the background), with
/// its start request kept in it so that whoever starts it (the queue, a gateway that takes it
/// over) starts it as asked: in `directory`, the one it would have started in now, whatever
/// the default is by then.
pub(in crate::tasks) fn unstarted_record(
    task_id: &str,
    req: &mut StartTask,
    directory: String,
    idempotency: Option<(String, u64)>,
) -> Result<TaskRecord, TaskError> {
    let title = req
        .title
        .clone()
        .unwrap_or_else(|| default_title(&req.prompt));
    req.directory = Some(directory.clone());
    let request = serde_json::to_value(&*req)
        .map_err(|e| TaskError::InvalidArgument(format!("the start cannot be kept: {e}")))?;
    let mut rec = TaskRecord::new(
        task_id.to_string(),
        String::new(),
        String::new(),
        directory,
        title,
    );
    rec.queued = Some(request);
    rec.idempotency = idempotency;
    rec.group = req.group.clone();
    rec.tier = req.tier.clone();
    Ok(rec)
}

/// A session title from the prompt's first line (OpenCode would otherwise spend an LLM call).
pub fn default_title(prompt: &str) -> String {
    let line = prompt
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("task");
    let mut title: String = line.chars().take(60).collect();
    if line.chars().count() > 60 {
        title.push('…');
    }
    format!("[opencode-mcp] {title}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of tasks that are gone, or bound to nothing, do not pile up.
    #[test]
    fn idempotency_keys_of_gone_tasks_are_pruned() {
        let mut config = crate::gateway::test_config();
        let dir = std::env::temp_dir().join(format!("ocm-keys-{}", crate::ids::task_id()));
        config.state_dir = Some(dir.display().to_string());
        let service = crate::tasks::TaskService::new(Arc::new(config));
        for i in 0..KEYS_PRUNE_AT {
            service
                .placement
                .bind_key(format!("key-{i}"), 1, format!("tsk_gone_{i}"));
        }
        let held = service.placement.key_slot("key-0");
        let guard = held.try_lock().expect("not in use");
        let _new = service.placement.key_slot("another");
        drop(guard);
        let left = service
            .placement
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        assert!(left <= 2, "{left} keys left");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Placement: this machine first, then the worker with the most free slots among those
    /// that take the task's tier; a worker that declares tiers takes no task of another tier
    /// (nor one naming none); a task that can only run here (isolation `none`) stays here.
    #[test]
    fn placement_gives_a_worker_only_the_tiers_it_takes() {
        let mut config = crate::gateway::test_config();
        let dir = std::env::temp_dir().join(format!("ocm-place-{}", crate::ids::task_id()));
        config.state_dir = Some(dir.display().to_string());
        config.workers = yaml_serde::from_str(
            "local:\n  max_tasks: 1\ncheap:\n  ssh: cheap\n  max_tasks: 2\n  tiers: [fast]\nany:\n  ssh: any\n  max_tasks: 1\n",
        )
        .expect("workers");
        let service = crate::tasks::TaskService::new(Arc::new(config));
        let take = |tier: Option<&str>, isolation| {
            service
                .reserve(None, isolation, tier, 1)
                .map(|mut s| s.pop().expect("a slot"))
        };
        let here = take(Some("fast"), Isolation::Worktree).expect("room here");
        assert_eq!(here.worker(), "local");
        let cheap = take(Some("fast"), Isolation::Worktree).expect("room on cheap");
        assert_eq!(cheap.worker(), "cheap", "2 free there, 1 on any");
        let untiered = take(None, Isolation::Worktree).expect("room on any");
        assert_eq!(untiered.worker(), "any", "cheap takes only tier fast");
        let refused = take(Some("strong"), Isolation::Worktree).expect_err("no room");
        assert!(
            refused
                .to_string()
                .contains("every worker's slots are taken"),
            "{refused}"
        );
        assert!(
            !refused.to_string().contains("cheap"),
            "cheap was not asked: {refused}"
        );
        let here_only = take(Some("fast"), Isolation::None).expect_err("this machine is full");
        assert!(
            here_only.to_string().contains("on this machine"),
            "{here_only}"
        );
        drop((here, cheap, untiered));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn titles_come_from_the_first_non_empty_line() {
        assert_eq!(
            default_title("\n  fix the bug\nmore"),
            "[opencode-mcp] fix the bug"
        );
        assert!(default_title(&"x".repeat(100)).ends_with('…'));
    }
}
