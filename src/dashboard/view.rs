//! What the page shows, computed from the state directory alone: the stored task records, the
//! day's spend ledger and the user's configuration. No gateway is asked anything, so the page
//! works with none running, and a running gateway's changes appear as its records land.
//!
//! Records are re-read only when their file changed ([`Records`] keeps each file's length and
//! modification time with what was read of it), so a poll of a directory of a thousand
//! finished tasks is a directory listing and a `stat` per file.
//!
//! Everything read here was written by a gateway from what agents said: it is data for the
//! page, sent as JSON and shown as text there, never markup.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;

use crate::config::Config;
use crate::tasks::store::rollup;
use crate::tasks::store::usage::{self, TaskSummary};
use crate::tasks::{epoch_ms, Stored, TaskRecord, TaskStatus};

/// Files read at most per poll: a state directory is bounded by `limits.max_tasks` and a day of
/// finished tasks, but a directory filled by something else must not make a poll unbounded.
const MAX_RECORDS: usize = 20_000;
/// Characters of a task's diff shown on its page.
const MAX_DIFF_CHARS: usize = 200_000;
/// Days of savings shown.
const SAVINGS_DAYS: u64 = 30;

/// One row of the task table: the CLI's list line (`opencode-mcp tasks --json`), and what the
/// page shows beside it.
#[derive(Debug, Clone, Serialize)]
pub struct TaskRow {
    #[serde(flatten)]
    pub line: usage::TaskLine,
    pub spend_usd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<ChecksCell>,
    pub escalations: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::tasks::GroupMember>,
    /// The page can cancel it: it is unfinished and the gateway serving the page runs it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancellable: bool,
}

/// The checks' verdict in a row: `passed` is `None` while they have not decided.
#[derive(Debug, Clone, Serialize)]
pub struct ChecksCell {
    pub passed: Option<bool>,
    pub rounds: u32,
    pub commands: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueueRow {
    pub task_id: String,
    pub position: usize,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    pub name: String,
    pub slots: u32,
    pub in_use: u32,
    pub free: u32,
    pub confined: bool,
    pub remote: bool,
    /// What was last seen of it (a remote worker): reached or not, when, by whom.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seen: Option<crate::workers::seen::Sighting>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Spend {
    pub today_usd: f64,
    pub daily_cap_usd: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Saving {
    pub name: String,
    pub tasks: u32,
    pub cost_usd: f64,
    pub saved_usd: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Savings {
    /// What the saving is measured against, in words.
    pub reference: String,
    pub tiers: Vec<Saving>,
    pub models: Vec<Saving>,
    /// The last days, newest first: the stored records, and what expired ones spent
    /// (`tasks::store::rollup`).
    pub days: Vec<crate::tasks::store::rollup::DayTotals>,
}

/// The whole page's data.
#[derive(Debug, Clone, Serialize)]
pub struct State {
    pub state_dir: String,
    pub exists: bool,
    pub now_ms: u64,
    pub tasks: Vec<TaskRow>,
    pub queue: Vec<QueueRow>,
    pub workers: Vec<WorkerRow>,
    pub spend: Spend,
    pub savings: Savings,
    /// Records that could not be read (reported, never shown as tasks).
    pub unreadable: usize,
    /// The pid of the gateway serving the page, whose tasks it can cancel; absent: the page
    /// is read-only (`opencode-mcp dashboard`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_pid: Option<u32>,
}

/// What was read of one record file, kept while the file is unchanged.
struct Cached {
    stamp: (u64, Option<SystemTime>),
    read: Option<(TaskSummary, Extra)>,
}

/// What a row needs beyond the summary the CLI's list reads.
#[derive(Clone)]
struct Extra {
    checks: Option<ChecksCell>,
    escalations: usize,
    group: Option<crate::tasks::GroupMember>,
}

/// The records of one state directory, re-read as their files change.
pub struct Records {
    state_dir: PathBuf,
    files: HashMap<PathBuf, Cached>,
    /// The workers' health notes as last listed (file name, modification time).
    seen: Vec<(std::ffi::OsString, Option<SystemTime>)>,
    /// The savings day files read.
    days: Vec<DayFile>,
}

/// One savings day file as read: its date, its (length, modification time), and what each
/// expired task it keeps spent.
type DayFile = (
    String,
    (u64, Option<SystemTime>),
    HashMap<String, rollup::Kept>,
);

impl Records {
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            state_dir,
            files: HashMap::new(),
            seen: Vec::new(),
            days: Vec::new(),
        }
    }

    /// Re-reads what changed; returns whether anything did (a file added, changed or gone).
    pub fn refresh(&mut self) -> bool {
        let dir = self.state_dir.join("tasks");
        let mut seen: Vec<PathBuf> = Vec::new();
        let mut changed = false;
        if let Ok(listing) = std::fs::read_dir(&dir) {
            for entry in listing.flatten().take(MAX_RECORDS) {
                let path = entry.path();
                if path.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                let Ok(meta) = entry.metadata() else { continue };
                let stamp = (meta.len(), meta.modified().ok());
                seen.push(path.clone());
                if self.files.get(&path).is_some_and(|c| c.stamp == stamp) {
                    continue;
                }
                changed = true;
                let read = read_one(&self.state_dir, &path);
                self.files.insert(path, Cached { stamp, read });
            }
        }
        let before = self.files.len();
        let seen: std::collections::HashSet<PathBuf> = seen.into_iter().collect();
        self.files.retain(|p, _| seen.contains(p));
        // A worker's health note is a few files at most: listed and compared whole.
        let mut notes: Vec<(std::ffi::OsString, Option<SystemTime>)> =
            std::fs::read_dir(self.state_dir.join(crate::workers::seen::DIR))
                .into_iter()
                .flatten()
                .flatten()
                .take(1000)
                .map(|e| {
                    (
                        e.file_name(),
                        e.metadata().ok().and_then(|m| m.modified().ok()),
                    )
                })
                .collect();
        notes.sort();
        let notes_changed = notes != self.seen;
        self.seen = notes;
        // Every poll reads the day files too: behind `||` they were skipped whenever a record
        // changed, so on a busy directory the days stayed stale (at first, empty).
        let days_changed = self.refresh_days();
        changed || notes_changed || days_changed || self.files.len() != before
    }

    /// Re-reads the savings day files that changed; whether any did.
    fn refresh_days(&mut self) -> bool {
        let mut changed = false;
        let mut fresh = Vec::new();
        for (day, path) in rollup::day_files(&self.state_dir, SAVINGS_DAYS) {
            let stamp = std::fs::metadata(&path)
                .map(|m| (m.len(), m.modified().ok()))
                .unwrap_or((0, None));
            let known = self
                .days
                .iter()
                .position(|(d, s, _)| *d == day && *s == stamp);
            match known {
                Some(i) => fresh.push(self.days.swap_remove(i)),
                None => {
                    changed = true;
                    let kept = rollup::read_day(&path);
                    fresh.push((day, stamp, kept));
                }
            }
        }
        changed |= !self.days.is_empty();
        self.days = fresh;
        changed
    }

    /// The page's data as of now; `controller` is the pid of the gateway serving the page.
    pub fn state(&self, config: &Config, controller: Option<u32>) -> State {
        let now = epoch_ms(SystemTime::now());
        // Whether a gateway lives is asked of its owner lock once per pid, not once per task
        // for each of the list, the queue and the workers.
        let known = std::cell::RefCell::new(HashMap::<u32, bool>::new());
        let alive = |pid: u32| {
            *known
                .borrow_mut()
                .entry(pid)
                .or_insert_with(|| crate::tasks::gateway_alive(&self.state_dir, pid))
        };
        let mut by_id: HashMap<&str, (&TaskSummary, &Extra)> = HashMap::new();
        let mut unreadable = 0;
        for c in self.files.values() {
            match &c.read {
                Some((s, e)) => {
                    by_id.insert(s.id.as_str(), (s, e));
                }
                None => unreadable += 1,
            }
        }
        let summaries: Vec<TaskSummary> = by_id.values().map(|(s, _)| (*s).clone()).collect();
        let price = config.report.reference_price;
        let rows: Vec<TaskRow> = usage::list(&summaries, None, now, &alive)
            .into_iter()
            .map(|line| {
                let read = by_id.get(line.task_id.as_str());
                let spend_usd = read.map_or(0.0, |(s, _)| cost_of(s, now, price));
                let extra = read.map(|(_, e)| *e);
                let cancellable = read.is_some_and(|(s, _)| {
                    controller == Some(s.owner_pid) && !s.status.is_terminal()
                });
                TaskRow {
                    cancellable,
                    spend_usd,
                    checks: extra.and_then(|e| e.checks.clone()),
                    escalations: extra.map_or(0, |e| e.escalations),
                    group: extra.and_then(|e| e.group.clone()),
                    line,
                }
            })
            .collect();
        let queue = queue_of(&summaries, &alive);
        let workers = workers_of(config, &self.state_dir, &summaries, &alive);
        let report = usage::report(&summaries, None, now, price);
        let savings = |groups: &[usage::Group]| {
            groups
                .iter()
                .map(|g| Saving {
                    name: g.name.clone(),
                    tasks: g.usage.tasks,
                    cost_usd: g.usage.cost,
                    saved_usd: g.usage.saving,
                })
                .collect()
        };
        let ledger = crate::tasks::spend::ledger::Ledger::new(Some(self.state_dir.join("spend")));
        State {
            state_dir: self.state_dir.display().to_string(),
            exists: self.state_dir.is_dir(),
            now_ms: now,
            tasks: rows,
            queue,
            workers,
            spend: Spend {
                today_usd: ledger.spent_today(),
                daily_cap_usd: config.limits.max_cost_usd_per_day,
            },
            savings: Savings {
                reference: format!(
                    "against every token at ${}/M input and ${}/M output (report.reference_price)",
                    price.input_per_mtok, price.output_per_mtok
                ),
                tiers: savings(&report.tiers),
                models: savings(&report.models),
                days: self.days_of(&summaries, price),
            },
            unreadable,
            gateway_pid: controller,
        }
    }
}

impl Records {
    /// The savings of the last days: each stored record on the day it finished, and each
    /// expired task (kept, and no longer stored) on the day its last line says.
    fn days_of(
        &self,
        summaries: &[TaskSummary],
        price: crate::config::ReferencePrice,
    ) -> Vec<rollup::DayTotals> {
        let stored: std::collections::HashSet<&str> =
            summaries.iter().map(|s| s.id.as_str()).collect();
        let live: Vec<(String, rollup::Kept)> = summaries
            .iter()
            .filter_map(|s| Some((rollup::day_of_summary(s)?, rollup::Kept::of_summary(s))))
            .collect();
        // Newest file first: a task kept on two days counts on the later one.
        let mut counted: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut kept: Vec<(&str, &rollup::Kept)> = Vec::new();
        for (day, _, tasks) in &self.days {
            for (id, k) in tasks {
                if !stored.contains(id.as_str()) && counted.insert(id.as_str()) {
                    kept.push((day.as_str(), k));
                }
            }
        }
        let first = rollup::first_day(SAVINGS_DAYS);
        kept.extend(
            live.iter()
                .filter(|(day, _)| first.as_deref().is_none_or(|f| day.as_str() >= f))
                .map(|(day, k)| (day.as_str(), k)),
        );
        rollup::totals(kept, price)
    }
}

/// What a task spent, all its turns, as the usage report counts it.
fn cost_of(summary: &TaskSummary, now: u64, price: crate::config::ReferencePrice) -> f64 {
    usage::report(std::slice::from_ref(summary), None, now, price)
        .total
        .cost
}

fn read_one(state_dir: &Path, path: &Path) -> Option<(TaskSummary, Extra)> {
    let id = path.file_stem()?.to_str()?;
    let Stored::Record(r) = crate::tasks::read_stored(state_dir, id) else {
        return None;
    };
    let extra = Extra {
        checks: r.checks.as_ref().map(|c| ChecksCell {
            passed: c.passed,
            rounds: c.rounds,
            commands: c.commands.len(),
        }),
        escalations: r.escalations.len(),
        group: r.group.clone(),
    };
    Some((TaskSummary::from(r.as_ref()), extra))
}

/// Queued tasks of live gateways, oldest first: the order a gateway's queue starts them in.
fn queue_of(summaries: &[TaskSummary], alive: &dyn Fn(u32) -> bool) -> Vec<QueueRow> {
    let mut queued: Vec<&TaskSummary> = summaries
        .iter()
        .filter(|s| s.status == TaskStatus::Queued && alive(s.owner_pid))
        .collect();
    queued.sort_by(|a, b| a.started_ms.cmp(&b.started_ms).then(a.id.cmp(&b.id)));
    queued
        .into_iter()
        .enumerate()
        .map(|(i, s)| QueueRow {
            task_id: s.id.clone(),
            position: i + 1,
            title: s.title.clone(),
            tier: s.tier.clone(),
            worker: s.worker.clone(),
        })
        .collect()
}

/// The configured workers with their slots in use: unfinished, unqueued tasks of live gateways.
fn workers_of(
    config: &Config,
    state_dir: &Path,
    summaries: &[TaskSummary],
    alive: &dyn Fn(u32) -> bool,
) -> Vec<WorkerRow> {
    let in_use = usage::slots_in_use(summaries, alive);
    crate::workers::from_config(config)
        .into_iter()
        .map(|w| {
            let used = in_use.get(&w.name).copied().unwrap_or(0);
            WorkerRow {
                slots: w.max_tasks,
                in_use: used,
                free: w.max_tasks.saturating_sub(used),
                confined: w.sandbox == crate::config::SandboxMode::On,
                remote: w.remote.is_some(),
                seen: w
                    .remote
                    .as_ref()
                    .and_then(|_| crate::workers::seen::read(state_dir, &w.name)),
                name: w.name,
            }
        })
        .collect()
}

/// A task's page.
#[derive(Debug, Clone, Serialize)]
pub struct TaskPage {
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    pub directory: String,
    pub turn: u32,
    pub started_ms: u64,
    /// When the current turn started, and what OpenCode reported it cost so far.
    pub turn_started_ms: u64,
    pub turn_cost_usd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    pub spend_usd: f64,
    pub answer: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub files_changed: Option<Vec<crate::opencode::FileChange>>,
    pub diff: Option<String>,
    pub checks: Option<ChecksDetail>,
    pub escalations: Vec<crate::tasks::Escalation>,
    pub watch: String,
    /// The turns before the current one, oldest first, in short.
    pub past_turns: Vec<crate::tasks::lifecycle::record::PastTurn>,
    /// The page can cancel it (see [`TaskRow::cancellable`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancellable: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChecksDetail {
    pub passed: Option<bool>,
    pub rounds: u32,
    pub results: Vec<crate::tasks::CheckResult>,
}

/// The page of task `id`, or `None` when no such record is stored. Ids are checked by the
/// store's reader (a name that is not a task id is never a path).
pub async fn task_page(
    config: &Config,
    state_dir: &Path,
    id: &str,
    controller: Option<u32>,
) -> Option<TaskPage> {
    let Stored::Record(r) = crate::tasks::read_stored(state_dir, id) else {
        return None;
    };
    let r: TaskRecord = *r;
    let now = epoch_ms(SystemTime::now());
    let summary = TaskSummary::from(&r);
    let spend_usd = cost_of(&summary, now, config.report.reference_price);
    let diff = diff_of(state_dir, &r).await;
    Some(TaskPage {
        task_id: r.id.clone(),
        status: r.status(),
        phase: r.phase().shown().map(str::to_string),
        title: r.title.clone(),
        tier: r.tier.clone(),
        model: summary.ran_on().map(str::to_string),
        worker: summary.worker.clone(),
        directory: r.directory.clone(),
        turn: r.turn,
        started_ms: r.started_ms(),
        turn_started_ms: r.turn_started_ms,
        turn_cost_usd: r.outcome.as_ref().map_or(0.0, |o| o.cost),
        finished_ms: r.finished_ms,
        spend_usd,
        answer: r
            .outcome
            .as_ref()
            .map(|o| o.text.clone())
            .unwrap_or_default(),
        error: r.error.as_ref().map(|e| e.message.clone()),
        files_changed: r.files_changed.clone(),
        diff,
        checks: r.checks.as_ref().map(|c| ChecksDetail {
            passed: c.passed,
            rounds: c.rounds,
            results: c.last.clone(),
        }),
        escalations: r.escalations.clone(),
        watch: format!("opencode-mcp watch {}", r.id),
        past_turns: r.past_turns.clone(),
        cancellable: controller == Some(r.owner_pid) && !r.status().is_terminal(),
    })
}

/// A worktree task's change against its base, read the way the gateway reads it: the worktree
/// pinned to the record's origin and base, its files snapshotted through a scratch index under
/// the state directory, so a `.git` the agent rewrote neither chooses what runs nor what is
/// read. A remote task's is what was fetched back. `None` for a task without a worktree, or
/// when it cannot be read now.
async fn diff_of(state_dir: &Path, r: &TaskRecord) -> Option<String> {
    let w = r.workspace.as_ref().filter(|w| !w.discarded)?;
    let origin = Path::new(&w.origin);
    let read = async {
        if let Some(remote) = &w.remote {
            let tip = remote.fetched.as_deref()?;
            let repo = crate::git::Repo::at(origin);
            return crate::git::unified(&repo, &w.base, tip, MAX_DIFF_CHARS)
                .await
                .ok();
        }
        let tree = crate::git::Worktree::pin(origin, Path::new(&w.path), &w.base)
            .await
            .ok()?;
        let reading = tree.read(&state_dir.join("worktrees")).await.ok()?;
        crate::git::unified(reading.repo(), &w.base, &reading.tree, MAX_DIFF_CHARS)
            .await
            .ok()
    };
    let (text, cut) = tokio::time::timeout(std::time::Duration::from_secs(20), read)
        .await
        .ok()??;
    Some(if cut {
        format!("{text}\n… (cut after {MAX_DIFF_CHARS} characters)")
    } else {
        text
    })
}
