//! The usage report and the task list, computed from stored task records.
//!
//! Pure: records and a clock reading in, numbers out. The same functions serve the tools
//! (`opencode_usage`, `opencode_list_tasks`, over what the gateway holds) and the subcommands
//! (`opencode-mcp usage`, `opencode-mcp tasks`, over the state directory without a gateway), so
//! the two can never disagree about what was spent.
//!
//! **Counting.** Every turn of a task counts: a record holds its current turn's outcome (what
//! `get_task_result` reports) and the sums of its earlier turns (follow-ups and a structured
//! task's automatic corrections), and the report adds both. A task counts once, in the period
//! of its latest turn.
//!
//! **Reported and priced.** `cost` is what OpenCode reported for each turn. For a turn it
//! reported no cost for (0: a provider without prices in OpenCode's catalog at the time, a free
//! or local model), the turn's tokens are priced at the price the server's catalog listed for
//! the model the task was started on, when that is the model that answered (input, output and
//! reasoning, cache reads and cache writes each at their own price); that part is also reported
//! apart as `priced_cost`, so a reader can tell measured from estimated.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;

use crate::config::ReferencePrice;
use crate::opencode::{Price, Tokens};
use crate::tasks::lifecycle::record::{requested_if_other, TaskRecord};
use crate::tasks::model::TaskStatus;
use crate::tasks::spend::spent::{Segment, Spent};

/// Shown for tasks started without a tier (an explicit model, or the server's default).
pub const NO_TIER: &str = "(none)";
/// Shown for tasks whose model is the server's default and whose outcome names none.
pub const DEFAULT_MODEL: &str = "(server default)";

/// What the report and the list read of a task record: a few hundred bytes, where a record
/// holds its answer (up to `limits.max_result_chars`), tool calls and changed files. The state
/// directory keeps a day of records by default, so the report and the list are computed over
/// summaries, each made as its record is read and the record dropped: before, every call held
/// every record at once (1,878 records on disk took a gateway from 8.5 to 23 MiB, and glibc
/// kept most of it).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSummary {
    pub id: String,
    pub status: TaskStatus,
    /// Where it stands when the status alone does not say (see `TaskLine::phase`).
    pub phase: Option<String>,
    pub tier: Option<String>,
    /// The model the task asked for (`None`: the server's default).
    pub model: Option<String>,
    pub title: String,
    /// The gateway that ran it, to tell an unfinished task whose gateway exited.
    pub owner_pid: u32,
    /// See [`TaskRecord::started_ms`].
    pub started_ms: u64,
    pub turn_started_ms: u64,
    pub finished_ms: Option<u64>,
    /// The current turn as reported, once it has an outcome.
    pub latest: Option<Latest>,
    /// The turns before it (see [`TaskSpend::earlier`](crate::tasks::spend::spent::TaskSpend::earlier)).
    pub earlier: Spent,
    /// The catalog price of the model it was started on (see [`TaskRecord::price`]).
    pub price: Option<(String, Price)>,
    /// The remote worker it runs on (`None`: this machine).
    pub worker: Option<String>,
    /// What it spent on tiers and models it moved away from (see [`TaskSpend::segments`](crate::tasks::spend::spent::TaskSpend::segments)).
    pub segments: Vec<Segment>,
    /// Why its commands ran unconfined (`None`: confined, or a record from before the sandbox).
    pub unconfined: Option<String>,
}

/// What the current turn's outcome reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Latest {
    /// The model that answered.
    pub model: Option<String>,
    pub tokens: Tokens,
    pub cost: f64,
}

impl From<&TaskRecord> for TaskSummary {
    /// Copies only what the summary keeps.
    fn from(r: &TaskRecord) -> Self {
        Self {
            id: r.id.clone(),
            status: r.status(),
            phase: r.phase().shown().map(str::to_string),
            tier: r.tier.clone(),
            model: r.model.clone(),
            title: r.title.clone(),
            owner_pid: r.owner_pid,
            worker: r
                .workspace
                .as_ref()
                .and_then(|w| w.remote.as_ref())
                .map(|r| r.worker.clone()),
            started_ms: r.started_ms(),
            turn_started_ms: r.turn_started_ms,
            finished_ms: r.finished_ms,
            latest: r.outcome.as_ref().map(|o| Latest {
                model: o.model.clone(),
                tokens: o.tokens,
                cost: o.cost,
            }),
            earlier: *r.spend.earlier(),
            price: r.price.clone(),
            segments: r.spend.segments().to_vec(),
            unconfined: r
                .confinement
                .as_ref()
                .and_then(|c| c.why_not().map(str::to_string)),
        }
    }
}

impl TaskSummary {
    /// The model that answered the current turn, if it reported one.
    fn answered(&self) -> Option<&str> {
        self.latest.as_ref().and_then(|l| l.model.as_deref())
    }

    /// The model the turn ran on: what OpenCode reported, else what it was asked for (`None`:
    /// the server's default).
    pub fn ran_on(&self) -> Option<&str> {
        self.answered().or(self.model.as_deref())
    }
}

/// What a set of tasks used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
pub struct Usage {
    /// Tasks counted.
    pub tasks: u32,
    /// Tasks by status (`completed`, `failed`, `cancelled`, `timed_out`, or still `running`...).
    pub statuses: BTreeMap<String, u32>,
    /// Tokens, summed over the tasks' latest turns.
    pub tokens: Tokens,
    /// USD: as OpenCode reported it, and for turns it reported none for, priced from the
    /// model's catalog price (see `priced_cost`).
    pub cost: f64,
    /// The part of `cost` the gateway priced from the catalog (turns OpenCode reported no cost
    /// for); 0 when every figure is reported.
    pub priced_cost: f64,
    /// Milliseconds from each turn's start to its end (to now for a task still running).
    pub wall_ms: u64,
    /// USD the same tokens would have cost at `report.reference_price`.
    pub reference_cost: f64,
    /// `reference_cost - cost`: what delegating saved (negative if it cost more).
    pub saving: f64,
}

impl Usage {
    fn add(&mut self, r: &TaskSummary, now_ms: u64, price: &ReferencePrice) {
        self.tasks += 1;
        *self
            .statuses
            .entry(r.status.as_str().to_string())
            .or_default() += 1;
        let answered = r.answered();
        let catalog = r
            .price
            .as_ref()
            .filter(|(model, _)| answered.is_none_or(|a| a == model))
            .map(|(_, p)| *p);
        let mut count = |tokens: &Tokens, reported: f64| {
            let (cost, priced) = turn_cost(reported, tokens, catalog);
            self.tokens.add(tokens);
            self.cost += cost;
            self.priced_cost += priced;
            self.reference_cost += reference_cost(tokens, price);
        };
        if let Some(l) = &r.latest {
            count(&l.tokens, l.cost);
        }
        // Follow-ups and automatic corrections replaced the outcomes of the turns before them:
        // those turns count with what the record kept of them.
        count(&r.earlier.tokens, r.earlier.cost);
        let end = r.finished_ms.unwrap_or(now_ms);
        self.wall_ms += end.saturating_sub(r.turn_started_ms) + r.earlier.wall_ms;
        self.saving = self.reference_cost - self.cost;
    }

    /// Adds what a task spent on a tier or model it moved away from: its tokens, cost and time,
    /// not the task itself (which counts once, under where it ended).
    fn add_segment(&mut self, spent: &Spent, price: &ReferencePrice) {
        let (cost, priced) = turn_cost(spent.cost, &spent.tokens, None);
        self.tokens.add(&spent.tokens);
        self.cost += cost;
        self.priced_cost += priced;
        self.reference_cost += reference_cost(&spent.tokens, price);
        self.wall_ms += spent.wall_ms;
        self.saving = self.reference_cost - self.cost;
    }
}

/// A task's spend less what it spent on the tiers and models it moved away from: the share of
/// the tier and model it ended on.
fn after_segments(r: &TaskSummary) -> std::borrow::Cow<'_, TaskSummary> {
    if r.segments.is_empty() {
        return std::borrow::Cow::Borrowed(r);
    }
    let left = r
        .segments
        .iter()
        .fold(Spent::default(), |acc, s| acc.plus(&s.spent));
    let mut rest = r.clone();
    rest.earlier = r.earlier.minus(&left);
    std::borrow::Cow::Owned(rest)
}

/// One tier's or one model's share.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Group {
    /// The tier or model (`(none)`: no tier; `(server default)`: no model named).
    pub name: String,
    #[serde(flatten)]
    pub usage: Usage,
}

/// The usage report.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct UsageReport {
    /// Epoch ms the period starts at (tasks whose latest turn started then or later); absent:
    /// every stored task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// The price the saving is computed against (dollars per million tokens).
    pub reference_price: ReferencePrice,
    pub total: Usage,
    /// Per tier, by name.
    pub tiers: Vec<Group>,
    /// Per model, by name.
    pub models: Vec<Group>,
}

/// A turn's cost and the part of it priced here: what OpenCode reported, or, when it reported
/// nothing (0, or not a number), `tokens` at the catalog price if there is one.
pub fn turn_cost(reported: f64, tokens: &Tokens, catalog: Option<Price>) -> (f64, f64) {
    if reported.is_finite() && reported > 0.0 {
        return (reported, 0.0);
    }
    match catalog.filter(|p| !p.is_free()) {
        Some(p) => {
            let priced = p.of(tokens);
            (priced, priced)
        }
        None => (0.0, 0.0),
    }
}

/// What `tokens` would cost at `price`: prompt tokens (cache reads and writes included, since a
/// reference price has no cache discount) at the input price, output and reasoning tokens at the
/// output price.
pub fn reference_cost(tokens: &Tokens, price: &ReferencePrice) -> f64 {
    let input = (tokens.input + tokens.cache_read + tokens.cache_write) as f64;
    let output = (tokens.output + tokens.reasoning) as f64;
    (input * price.input_per_mtok + output * price.output_per_mtok) / 1_000_000.0
}

/// The model a task's turn ran on: what OpenCode reported, else what it was asked for.
fn model_of(r: &TaskSummary) -> &str {
    r.ran_on().unwrap_or(DEFAULT_MODEL)
}

/// Aggregates `records` whose latest turn started at or after `since_ms` (all of them when
/// `None`), per tier and per model.
pub fn report(
    records: &[TaskSummary],
    since_ms: Option<u64>,
    now_ms: u64,
    price: ReferencePrice,
) -> UsageReport {
    let mut total = Usage::default();
    let mut tiers: BTreeMap<String, Usage> = BTreeMap::new();
    let mut models: BTreeMap<String, Usage> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| since_ms.is_none_or(|s| r.turn_started_ms >= s))
    {
        total.add(r, now_ms, &price);
        // An escalated task: each tier and model it left gets what it spent there.
        for s in &r.segments {
            let tier = s.tier.clone().unwrap_or_else(|| NO_TIER.to_string());
            tiers.entry(tier).or_default().add_segment(&s.spent, &price);
            let model = s.model.clone().unwrap_or_else(|| DEFAULT_MODEL.to_string());
            models
                .entry(model)
                .or_default()
                .add_segment(&s.spent, &price);
        }
        let rest = after_segments(r);
        let tier = r.tier.clone().unwrap_or_else(|| NO_TIER.to_string());
        tiers.entry(tier).or_default().add(&rest, now_ms, &price);
        models
            .entry(model_of(r).to_string())
            .or_default()
            .add(&rest, now_ms, &price);
    }
    let groups = |m: BTreeMap<String, Usage>| {
        m.into_iter()
            .map(|(name, usage)| Group { name, usage })
            .collect()
    };
    UsageReport {
        since_ms,
        reference_price: price,
        total,
        tiers: groups(tiers),
        models: groups(models),
    }
}

impl UsageReport {
    /// The report as a table for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let p = &self.reference_price;
        out.push_str(&format!(
            "{} task(s){}; reference price ${}/M input, ${}/M output\n",
            self.total.tasks,
            match self.since_ms {
                Some(ms) => format!(" since {}", format_epoch(ms)),
                None => String::new(),
            },
            p.input_per_mtok,
            p.output_per_mtok
        ));
        for (title, groups) in [("tier", &self.tiers), ("model", &self.models)] {
            out.push_str(&format!(
                "\n{:<28} {:>5} {:<22} {:>10} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10}\n",
                title,
                "tasks",
                "statuses",
                "input",
                "output",
                "reasoning",
                "cache r/w",
                "wall",
                "cost",
                "saving"
            ));
            for g in groups.iter() {
                out.push_str(&row(&g.name, &g.usage));
            }
            out.push_str(&row("total", &self.total));
        }
        if self.total.priced_cost > 0.0 {
            out.push_str(&format!(
                "\ncost: ${:.4} as OpenCode reported it, ${:.4} priced from the model catalog for \
                 turns it reported no cost for\n",
                self.total.cost - self.total.priced_cost,
                self.total.priced_cost
            ));
        }
        out
    }
}

fn row(name: &str, u: &Usage) -> String {
    let statuses: Vec<String> = u.statuses.iter().map(|(s, n)| format!("{n} {s}")).collect();
    format!(
        "{:<28} {:>5} {:<22} {:>10} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10}\n",
        name,
        u.tasks,
        statuses.join(", "),
        u.tokens.input,
        u.tokens.output,
        u.tokens.reasoning,
        format!("{}/{}", u.tokens.cache_read, u.tokens.cache_write),
        format_ms(u.wall_ms),
        format!("${:.4}", u.cost),
        format!("${:.4}", u.saving),
    )
}

/// One line of the task list.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TaskLine {
    pub task_id: String,
    pub status: TaskStatus,
    /// Where it stands, when the status alone does not say: `starting`, `held_schema`,
    /// `held_checks`, `held_outage`, `aborting`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The model of the latest turn (as reported, else as asked for); absent: the server's
    /// default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Present only when the model that answered is not the one asked for: the one asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_requested: Option<String>,
    pub title: String,
    /// The remote worker it runs on; absent: this machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Milliseconds since the task was started.
    pub age_ms: u64,
    /// Milliseconds the latest turn took; absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Unfinished, but the gateway that ran it has exited: the status is the last it recorded.
    /// Its OpenCode may run on for `limits.linger` (the gateway exited cleanly); the next
    /// gateway to start takes it over then, or reports it interrupted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gateway_gone: bool,
    /// Why its commands ran unsandboxed; absent: sandboxed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unconfined: Option<String>,
}

/// The tasks among `records` with `status` (all when `None`), newest first. `gateway_alive`
/// says whether the gateway with a pid still runs (for unfinished tasks).
pub fn list(
    records: &[TaskSummary],
    status: Option<TaskStatus>,
    now_ms: u64,
    gateway_alive: &dyn Fn(u32) -> bool,
) -> Vec<TaskLine> {
    let mut chosen: Vec<&TaskSummary> = records
        .iter()
        .filter(|r| status.is_none_or(|s| r.status == s))
        .collect();
    // Ties (same millisecond) fall back to the id, so the order is stable.
    chosen.sort_by(|a, b| {
        b.started_ms
            .cmp(&a.started_ms)
            .then_with(|| b.id.cmp(&a.id))
    });
    chosen
        .into_iter()
        .map(|r| TaskLine {
            task_id: r.id.clone(),
            status: r.status,
            phase: r.phase.clone(),
            tier: r.tier.clone(),
            model: r.ran_on().map(str::to_string),
            model_requested: requested_if_other(r.model.as_deref(), r.answered()),
            title: r.title.clone(),
            worker: r.worker.clone(),
            age_ms: now_ms.saturating_sub(r.started_ms),
            duration_ms: r.finished_ms.map(|f| f.saturating_sub(r.turn_started_ms)),
            gateway_gone: !r.status.is_terminal() && !gateway_alive(r.owner_pid),
            unconfined: r.unconfined.clone(),
        })
        .collect()
}

/// Slots in use per worker (`local` for this machine) among `records`: the unfinished tasks of
/// live gateways (`gateway_alive`), less those still queued, which wait for a slot and hold
/// none. What `opencode-mcp workers` and the dashboard show.
pub fn slots_in_use(
    records: &[TaskSummary],
    gateway_alive: &dyn Fn(u32) -> bool,
) -> BTreeMap<String, u32> {
    let mut in_use = BTreeMap::new();
    for r in records.iter().filter(|r| {
        !r.status.is_terminal() && r.status != TaskStatus::Queued && gateway_alive(r.owner_pid)
    }) {
        let on = r.worker.as_deref().unwrap_or(crate::config::LOCAL_WORKER);
        *in_use.entry(on.to_string()).or_default() += 1;
    }
    in_use
}

/// The task list as a table for people.
pub fn list_text(lines: &[TaskLine]) -> String {
    let mut out = format!(
        "{:<21} {:<18} {:<10} {:<32} {:>8} {:>8}  {}\n",
        "task", "status", "tier", "model", "age", "duration", "title"
    );
    for l in lines {
        let mut status = l.status.as_str().to_string();
        if let Some(phase) = &l.phase {
            status = format!("{status}: {phase}");
        }
        if l.gateway_gone {
            status.push_str(" (no gateway)");
        }
        let model = match &l.model_requested {
            Some(asked) => format!(
                "{} (asked {asked})",
                l.model.as_deref().unwrap_or(DEFAULT_MODEL)
            ),
            None => l.model.as_deref().unwrap_or(DEFAULT_MODEL).to_string(),
        };
        let title = format!(
            "{}{}{}",
            l.title,
            l.worker
                .as_ref()
                .map_or(String::new(), |w| format!(" [on {w}]")),
            if l.unconfined.is_some() {
                " [unconfined]"
            } else {
                ""
            }
        );
        out.push_str(&format!(
            "{:<21} {:<18} {:<10} {:<32} {:>8} {:>8}  {}\n",
            l.task_id,
            status,
            l.tier.as_deref().unwrap_or("-"),
            model,
            format_ms(l.age_ms),
            l.duration_ms.map_or_else(|| "-".to_string(), format_ms),
            title,
        ));
    }
    if lines.iter().any(|l| l.gateway_gone) {
        out.push_str(
            "(no gateway): the gateway running it has exited; its OpenCode may run on for \
             limits.linger, and the next gateway to start takes it over or reports it \
             interrupted\n",
        );
    }
    out
}

/// `1h02m`, `3m07s`, `12.3s`: short enough for a column.
pub fn format_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{:.1}s", ms as f64 / 1000.0),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn format_epoch(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::lifecycle::turn::TurnState;
    use crate::tasks::spend::spent::TaskSpend;

    fn tokens(input: u64, output: u64, reasoning: u64, cr: u64, cw: u64) -> Tokens {
        Tokens {
            input,
            output,
            reasoning,
            cache_read: cr,
            cache_write: cw,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rec(
        id: &str,
        tier: Option<&str>,
        model: &str,
        status: TaskStatus,
        started: u64,
        finished: Option<u64>,
        t: Tokens,
        cost: f64,
    ) -> TaskRecord {
        let mut r = TaskRecord::new(
            id.into(),
            "srv".into(),
            "ses".into(),
            "/w".into(),
            id.into(),
        );
        r.tier = tier.map(str::to_string);
        r.model = Some(model.to_string());
        r.set_status_for_test(status);
        r.created_ms = Some(started);
        r.turn_started_ms = started;
        r.finished_ms = finished;
        r.outcome = Some(TurnState {
            tokens: t,
            cost,
            model: Some(model.to_string()),
            ..TurnState::default()
        });
        r
    }

    fn summaries(records: &[TaskRecord]) -> Vec<TaskSummary> {
        records.iter().map(TaskSummary::from).collect()
    }

    fn sample() -> Vec<TaskRecord> {
        vec![
            rec(
                "a",
                Some("fast"),
                "p/cheap",
                TaskStatus::Completed,
                1_000,
                Some(4_000),
                tokens(100, 20, 5, 1_000, 10),
                0.01,
            ),
            rec(
                "b",
                Some("fast"),
                "p/cheap",
                TaskStatus::Failed,
                2_000,
                Some(2_500),
                tokens(300, 0, 0, 0, 0),
                0.002,
            ),
            rec(
                "c",
                None,
                "p/other",
                TaskStatus::Running,
                5_000,
                None,
                tokens(7, 3, 0, 0, 0),
                0.0,
            ),
        ]
    }

    const PRICE: ReferencePrice = ReferencePrice {
        input_per_mtok: 3.0,
        output_per_mtok: 15.0,
    };

    #[test]
    fn totals_are_the_sums_and_groups_split_them() {
        let r = report(&summaries(&sample()), None, 6_000, PRICE);
        assert_eq!(r.total.tasks, 3);
        assert_eq!(r.total.tokens, tokens(407, 23, 5, 1_000, 10));
        assert!((r.total.cost - 0.012).abs() < 1e-12);
        // 3000 + 500 + (6000 - 5000) for the running one.
        assert_eq!(r.total.wall_ms, 4_500);
        assert_eq!(r.total.statuses["completed"], 1);
        assert_eq!(r.total.statuses["failed"], 1);
        assert_eq!(r.total.statuses["running"], 1);
        let names: Vec<&str> = r.tiers.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, [NO_TIER, "fast"]);
        let fast = &r.tiers[1].usage;
        assert_eq!(fast.tasks, 2);
        assert_eq!(fast.tokens, tokens(400, 20, 5, 1_000, 10));
        let models: Vec<(&str, u32)> = r
            .models
            .iter()
            .map(|g| (g.name.as_str(), g.usage.tasks))
            .collect();
        assert_eq!(models, [("p/cheap", 2), ("p/other", 1)]);
        let sum: u64 = r.models.iter().map(|g| g.usage.tokens.input).sum();
        assert_eq!(sum, r.total.tokens.input);
    }

    #[test]
    fn the_saving_follows_the_configured_prices() {
        let r = report(&summaries(&sample()), None, 6_000, PRICE);
        // Prompt side: 407 + 1000 + 10 = 1417 tokens at $3/M; output side: 23 + 5 = 28 at $15/M.
        let expected = (1_417.0 * 3.0 + 28.0 * 15.0) / 1e6;
        assert!((r.total.reference_cost - expected).abs() < 1e-12);
        assert!((r.total.saving - (expected - 0.012)).abs() < 1e-12);
        let doubled = ReferencePrice {
            input_per_mtok: 6.0,
            output_per_mtok: 30.0,
        };
        let r2 = report(&summaries(&sample()), None, 6_000, doubled);
        assert!((r2.total.reference_cost - 2.0 * expected).abs() < 1e-12);
        let free = ReferencePrice {
            input_per_mtok: 0.0,
            output_per_mtok: 0.0,
        };
        assert!(
            (report(&summaries(&sample()), None, 6_000, free)
                .total
                .saving
                + 0.012)
                .abs()
                < 1e-12
        );
    }

    /// A task that moved from `fast` to `strong`: each tier and model gets what was spent on
    /// it; the task counts once, under where it ended; the total is every turn's.
    #[test]
    fn an_escalated_tasks_spend_is_split_between_its_tiers_and_models() {
        let mut r = rec(
            "e",
            Some("strong"),
            "p/strong",
            TaskStatus::Completed,
            1_000,
            Some(9_000),
            tokens(500, 50, 0, 0, 0),
            0.5,
        );
        // Two earlier turns: the cheap model's (then it moved), and one more on strong.
        let earlier = Spent {
            tokens: tokens(300, 30, 0, 0, 0),
            cost: 0.13,
            wall_ms: 4_000,
        };
        let segments = vec![Segment {
            tier: Some("fast".into()),
            model: Some("p/cheap".into()),
            spent: Spent {
                tokens: tokens(100, 10, 0, 0, 0),
                cost: 0.01,
                wall_ms: 1_000,
            },
        }];
        r.spend = TaskSpend::with(earlier, segments, (0.0, 0));
        let report = report(&summaries(&[r]), None, 10_000, ReferencePrice::default());
        let group = |groups: &[Group], name: &str| {
            groups
                .iter()
                .find(|g| g.name == name)
                .map(|g| g.usage.clone())
                .unwrap_or_else(|| panic!("no group {name}"))
        };
        let fast = group(&report.tiers, "fast");
        let strong = group(&report.tiers, "strong");
        assert_eq!((fast.tasks, strong.tasks), (0, 1));
        assert_eq!(fast.tokens.input, 100);
        assert_eq!(strong.tokens.input, 700);
        assert!((fast.cost - 0.01).abs() < 1e-9 && (strong.cost - 0.62).abs() < 1e-9);
        assert_eq!(group(&report.models, "p/cheap").tokens.input, 100);
        assert_eq!(group(&report.models, "p/strong").tokens.input, 700);
        assert_eq!(report.total.tokens.input, 800);
        assert!((report.total.cost - 0.63).abs() < 1e-9);
        assert_eq!(fast.wall_ms + strong.wall_ms, report.total.wall_ms);
    }

    #[test]
    fn the_period_keeps_turns_started_since() {
        let r = report(&summaries(&sample()), Some(2_000), 6_000, PRICE);
        assert_eq!(r.total.tasks, 2);
        assert_eq!(r.total.tokens.input, 307);
        assert_eq!(report(&[], Some(0), 6_000, PRICE).total, Usage::default());
    }

    /// A reported cost is taken as is; a turn reported at 0 is priced at the catalog price of
    /// the model it was started on (cache reads and writes at their own prices), unless another
    /// model answered or the model is free; the priced part is reported apart.
    #[test]
    fn turns_without_a_reported_cost_are_priced_from_the_catalog() {
        let price = Price {
            input: 2.0,
            output: 10.0,
            cache_read: 0.5,
            cache_write: 4.0,
        };
        let t = tokens(1_000_000, 100_000, 100_000, 2_000_000, 250_000);
        // 2 + 2 (output and reasoning at 10) + 1 (cache reads at 0.5) + 1 (writes at 4).
        let priced = 2.0 + 2.0 + 1.0 + 1.0;
        assert_eq!(turn_cost(0.25, &t, Some(price)), (0.25, 0.0));
        let (cost, part) = turn_cost(0.0, &t, Some(price));
        assert!((cost - priced).abs() < 1e-9 && (part - priced).abs() < 1e-9);
        assert_eq!(turn_cost(0.0, &t, Some(Price::default())), (0.0, 0.0));
        assert_eq!(turn_cost(f64::NAN, &t, None), (0.0, 0.0));

        let mut free = rec(
            "f",
            None,
            "local/model",
            TaskStatus::Completed,
            1_000,
            Some(2_000),
            t,
            0.0,
        );
        free.price = Some(("local/model".into(), price));
        let earlier = Spent {
            tokens: tokens(1_000_000, 0, 0, 0, 0),
            ..Spent::default()
        };
        free.spend = TaskSpend::with(earlier, Vec::new(), (0.0, 0));
        let r = report(
            &[TaskSummary::from(&free)],
            None,
            3_000,
            ReferencePrice::default(),
        );
        assert!(
            (r.total.cost - (priced + 2.0)).abs() < 1e-9,
            "{:?}",
            r.total
        );
        assert!((r.total.priced_cost - r.total.cost).abs() < 1e-9);
        assert!(
            r.text().contains("priced from the model catalog"),
            "{}",
            r.text()
        );
        // Another model answered: its price is not known, nothing is priced.
        if let Some(o) = free.outcome.as_mut() {
            o.model = Some("other/model".into());
        }
        let r = report(
            &[TaskSummary::from(&free)],
            None,
            3_000,
            ReferencePrice::default(),
        );
        assert_eq!((r.total.cost, r.total.priced_cost), (0.0, 0.0));
    }

    /// A task answered by another model than the one it asked for is flagged in the list; one
    /// that asked for none (the server's default) or got the one it asked for is not.
    #[test]
    fn a_task_answered_by_another_model_is_flagged() {
        let mut records = sample();
        if let Some(o) = records[0].outcome.as_mut() {
            o.model = Some("acme/fallback".into());
        }
        let asked = records[0].model.clone();
        records[1].model = None;
        let lines = list(&summaries(&records), None, 6_000, &|_| true);
        let flagged: Vec<(&str, Option<&str>)> = lines
            .iter()
            .map(|l| (l.task_id.as_str(), l.model_requested.as_deref()))
            .filter(|(_, m)| m.is_some())
            .collect();
        assert_eq!(flagged, [(records[0].id.as_str(), asked.as_deref())]);
        let text = list_text(&lines);
        assert!(text.contains("acme/fallback (asked "), "{text}");
    }

    #[test]
    fn the_list_is_newest_first_and_filters_by_status() {
        let alive = |_| true;
        let lines = list(&summaries(&sample()), None, 6_000, &alive);
        let ids: Vec<&str> = lines.iter().map(|l| l.task_id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "a"]);
        assert_eq!(lines[0].duration_ms, None);
        assert_eq!(lines[0].age_ms, 1_000);
        assert_eq!(lines[2].duration_ms, Some(3_000));
        assert_eq!(lines[2].tier.as_deref(), Some("fast"));
        let failed = list(
            &summaries(&sample()),
            Some(TaskStatus::Failed),
            6_000,
            &alive,
        );
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].task_id, "b");
        let text = list_text(&lines);
        assert!(text.lines().nth(1).is_some_and(|l| l.starts_with("c ")));
        assert!(!text.contains("(no gateway)"), "{text}");
        // The gateway that ran the unfinished task has exited: said, for it alone.
        let gone = list(&summaries(&sample()), None, 6_000, &|_| false);
        let flagged: Vec<&str> = gone
            .iter()
            .filter(|l| l.gateway_gone)
            .map(|l| l.task_id.as_str())
            .collect();
        assert_eq!(flagged, ["c"]);
        let text = list_text(&gone);
        assert!(
            text.lines()
                .nth(1)
                .is_some_and(|l| l.contains("(no gateway)")),
            "{text}"
        );
        assert!(text.contains("exited"), "{text}");
    }

    #[test]
    fn slots_in_use_count_running_tasks_of_live_gateways_not_queued_ones() {
        let mut all = summaries(&sample());
        let running = all
            .iter()
            .find(|s| !s.status.is_terminal())
            .expect("an unfinished task")
            .clone();
        let on = |id: &str, worker: Option<&str>, status: TaskStatus, pid: u32| TaskSummary {
            id: id.into(),
            worker: worker.map(str::to_string),
            status,
            owner_pid: pid,
            ..running.clone()
        };
        all.extend([
            on("w", Some("w1"), TaskStatus::Running, 1),
            on("w2", Some("w1"), TaskStatus::Pending, 1),
            on("q", Some("w1"), TaskStatus::Queued, 1),
            on("gone", Some("w1"), TaskStatus::Running, 7),
        ]);
        let in_use = slots_in_use(&all, &|pid| pid != 7);
        assert_eq!(
            in_use.into_iter().collect::<Vec<_>>(),
            [("local".to_string(), 1), ("w1".to_string(), 2)]
        );
    }

    #[test]
    fn the_text_report_names_every_group() {
        let text = report(&summaries(&sample()), None, 6_000, PRICE).text();
        for needle in ["fast", "p/cheap", "p/other", NO_TIER, "total", "1 failed"] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(format_ms(12_345), "12.3s");
        assert_eq!(format_ms(187_000), "3m07s");
        assert_eq!(format_ms(3_720_000), "1h02m");
    }
}
