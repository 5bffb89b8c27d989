//! What delegated work cost, kept past its task records: the dashboard's savings over days.
//!
//! A finished task's record is deleted after `limits.finished_task_ttl` (a day by default), and
//! the spend ledger keeps only task, turn and dollars. So as the store's writer expires a record,
//! it first appends what the record spent, per tier and per model (tokens and dollars, the way
//! the usage report counts them), as one line to `<state_dir>/savings/<YYYY-MM-DD>.log`, the
//! UTC day the task finished. The saving is not stored: it is computed when read, against the
//! `report.reference_price` in force then, as the usage report does for the records still kept.
//!
//! Lines are appended with one `write` on a file opened `O_APPEND`, so gateways sharing the
//! state directory never interleave them. A task counts once: its last line, and only while its
//! record is gone (a record still on disk is counted from the record). Files older than
//! [`KEEP_DAYS`] are removed when a day's file is first made.
//!
//! The files are the gateway's own, but they sit in a directory any of the user's processes
//! can write: reading is bounded per file and per line, and a line that does not parse is
//! skipped.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::usage::{self, TaskSummary};
use crate::config::ReferencePrice;
use crate::opencode::Tokens;
use crate::tasks::lifecycle::record::TaskRecord;

/// The folder of the daily files, under the state directory.
pub const DIR: &str = "savings";
/// Days of files kept.
pub const KEEP_DAYS: u64 = 90;
/// Bytes read of one day's file at most (a line is a few hundred bytes: thousands of tasks).
const MAX_DAY_BYTES: u64 = 8 * 1024 * 1024;
/// A line longer than this is not one the gateway wrote.
const MAX_LINE_BYTES: usize = 16 * 1024;
/// A UTC day in milliseconds.
const DAY_MS: u64 = 86_400_000;

/// One task's spend, as kept past its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    pub task_id: String,
    pub tiers: Vec<Share>,
    pub models: Vec<Share>,
}

/// What a task spent on one tier or model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub name: String,
    /// 1 where the task ended, 0 where it only spent before moving on (an escalation).
    pub tasks: u32,
    pub tokens: Tokens,
    pub cost: f64,
}

impl Kept {
    /// What `rec` spent, per tier and per model, as the usage report counts it.
    pub fn of(rec: &TaskRecord) -> Self {
        Self::of_summary(&TaskSummary::from(rec))
    }

    /// What the task `summary` sums up spent (see [`Self::of`]).
    pub fn of_summary(summary: &TaskSummary) -> Self {
        let end = summary.finished_ms.unwrap_or(summary.turn_started_ms);
        // Tokens and dollars only: the saving is priced when read.
        let zero = ReferencePrice {
            input_per_mtok: 0.0,
            output_per_mtok: 0.0,
        };
        let report = usage::report(std::slice::from_ref(summary), None, end, zero);
        let shares = |groups: Vec<usage::Group>| {
            groups
                .into_iter()
                .map(|g| Share {
                    name: g.name,
                    tasks: g.usage.tasks,
                    tokens: g.usage.tokens,
                    cost: g.usage.cost,
                })
                .collect()
        };
        Self {
            task_id: summary.id.clone(),
            tiers: shares(report.tiers),
            models: shares(report.models),
        }
    }
}

/// The UTC date of `ms`, as `YYYY-MM-DD`.
pub fn date_of(ms: u64) -> Option<String> {
    let secs = i64::try_from(ms / 1000).ok()?;
    Some(
        chrono::DateTime::from_timestamp(secs, 0)?
            .date_naive()
            .to_string(),
    )
}

/// The day a record counts on: the day it finished (its turn started, if it never did).
pub fn day_of(rec: &TaskRecord) -> Option<String> {
    date_of(rec.finished_ms.unwrap_or(rec.turn_started_ms))
}

/// [`day_of`] for a summary of a record.
pub fn day_of_summary(summary: &TaskSummary) -> Option<String> {
    date_of(summary.finished_ms.unwrap_or(summary.turn_started_ms))
}

/// Keeps what `rec` spent before its record is deleted. Failing to keep it is logged: the
/// record's expiry goes on (a full disk must not keep records for ever).
pub fn keep(state_dir: &Path, rec: &TaskRecord) {
    let Some(day) = day_of(rec) else {
        return;
    };
    let dir = state_dir.join(DIR);
    let path = dir.join(format!("{day}.log"));
    let kept = Kept::of(rec);
    let written = serde_json::to_vec(&kept)
        .map_err(std::io::Error::other)
        .and_then(|mut line| {
            line.push(b'\n');
            let fresh = crate::private_files::create_dir(&dir)
                .map(|_| !path.exists())
                .unwrap_or(false);
            let mut options = std::fs::OpenOptions::new();
            options.create(true).append(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            options.open(&path)?.write_all(&line)?;
            if fresh {
                remove_old(&dir);
            }
            Ok(())
        });
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), task_id = %rec.id, error = %e, "cannot keep the expiring task's spend for the dashboard's savings");
    }
}

/// Removes the day files older than [`KEEP_DAYS`].
fn remove_old(dir: &Path) {
    let now = crate::tasks::epoch_ms(std::time::SystemTime::now());
    let Some(oldest) = date_of(now.saturating_sub(KEEP_DAYS * DAY_MS)) else {
        return;
    };
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(day) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        // `YYYY-MM-DD` sorts as it counts.
        if is_date(day) && day < oldest.as_str() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn is_date(name: &str) -> bool {
    name.len() == 10
        && name.chars().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }
        })
}

/// The first date of the last `days` days, today included.
pub fn first_day(days: u64) -> Option<String> {
    let now = crate::tasks::epoch_ms(std::time::SystemTime::now());
    date_of(now.saturating_sub(days.saturating_sub(1) * DAY_MS))
}

/// The day files of the last `days` days, newest first: (date, path).
pub fn day_files(state_dir: &Path, days: u64) -> Vec<(String, PathBuf)> {
    let oldest = first_day(days).unwrap_or_default();
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(state_dir.join(DIR))
        .into_iter()
        .flatten()
        .flatten()
        .take(1000)
        .filter_map(|entry| {
            let name = entry.file_name();
            let day = name.to_str()?.strip_suffix(".log")?.to_string();
            (is_date(&day) && day >= oldest).then(|| (day, entry.path()))
        })
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0));
    out
}

/// The tasks one day's file keeps, by id (a task's last line wins), read bounded.
pub fn read_day(path: &Path) -> HashMap<String, Kept> {
    let mut bytes = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|f| f.take(MAX_DAY_BYTES).read_to_end(&mut bytes));
    if let Err(e) = read {
        tracing::debug!(path = %path.display(), error = %e, "cannot read a day of kept spend");
        return HashMap::new();
    }
    let mut out = HashMap::new();
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() || line.len() > MAX_LINE_BYTES {
            continue;
        }
        if let Ok(kept) = serde_json::from_slice::<Kept>(line) {
            out.insert(kept.task_id.clone(), kept);
        }
    }
    out
}

/// One day's savings per tier and per model, the saving priced at `price`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DayTotals {
    pub day: String,
    pub tasks: u32,
    pub cost_usd: f64,
    pub saved_usd: f64,
    pub tiers: Vec<Total>,
    pub models: Vec<Total>,
}

/// One tier's or model's share of a day.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Total {
    pub name: String,
    pub tasks: u32,
    pub cost_usd: f64,
    pub saved_usd: f64,
}

/// Adds up `kept` by day: `kept` holds each day's tasks (its date, then what each task spent).
pub fn totals<'a>(
    kept: impl IntoIterator<Item = (&'a str, &'a Kept)>,
    price: ReferencePrice,
) -> Vec<DayTotals> {
    // Per day: its tiers, its models.
    type Groups<'n> = BTreeMap<&'n str, Total>;
    let mut days: BTreeMap<&str, (Groups, Groups)> = BTreeMap::new();
    for (day, k) in kept {
        let (tiers, models) = days.entry(day).or_default();
        for (groups, shares) in [(&mut *tiers, &k.tiers), (&mut *models, &k.models)] {
            for s in shares {
                let t = groups.entry(s.name.as_str()).or_insert_with(|| Total {
                    name: s.name.clone(),
                    ..Total::default()
                });
                t.tasks += s.tasks;
                t.cost_usd += s.cost;
                t.saved_usd += usage::reference_cost(&s.tokens, &price) - s.cost;
            }
        }
    }
    days.into_iter()
        .rev()
        .map(|(day, (tiers, models))| {
            let tiers: Vec<Total> = tiers.into_values().collect();
            DayTotals {
                day: day.to_string(),
                tasks: tiers.iter().map(|t| t.tasks).sum(),
                cost_usd: tiers.iter().map(|t| t.cost_usd).sum(),
                saved_usd: tiers.iter().map(|t| t.saved_usd).sum(),
                tiers,
                models: models.into_values().collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(name: &str, tasks: u32, input: u64, cost: f64) -> Share {
        Share {
            name: name.into(),
            tasks,
            tokens: Tokens {
                input,
                ..Tokens::default()
            },
            cost,
        }
    }

    #[test]
    fn days_add_up_per_tier_and_model_and_are_priced_when_read() {
        let a = Kept {
            task_id: "tsk_a".into(),
            tiers: vec![share("fast", 1, 1_000_000, 0.5)],
            models: vec![share("m/cheap", 1, 1_000_000, 0.5)],
        };
        // Escalated: spent on fast first, ended on strong.
        let b = Kept {
            task_id: "tsk_b".into(),
            tiers: vec![
                share("fast", 0, 1_000_000, 0.25),
                share("strong", 1, 2_000_000, 3.0),
            ],
            models: vec![
                share("m/cheap", 0, 1_000_000, 0.25),
                share("m/big", 1, 2_000_000, 3.0),
            ],
        };
        let price = ReferencePrice {
            input_per_mtok: 2.0,
            output_per_mtok: 10.0,
        };
        let days = totals(
            [("2026-12-06", &a), ("2026-12-07", &a), ("2026-12-07", &b)],
            price,
        );
        assert_eq!(days.len(), 2);
        assert_eq!(days[0].day, "2026-12-07", "newest first");
        assert_eq!(days[0].tasks, 2);
        assert!((days[0].cost_usd - 3.75).abs() < 1e-9, "{:?}", days[0]);
        // Reference: 4 M input tokens at $2/M = $8, less $3.75 spent.
        assert!((days[0].saved_usd - 4.25).abs() < 1e-9, "{:?}", days[0]);
        let fast = &days[0].tiers[0];
        assert_eq!((fast.name.as_str(), fast.tasks), ("fast", 1));
        assert!((fast.saved_usd - (4.0 - 0.75)).abs() < 1e-9, "{fast:?}");
        assert_eq!(days[1].tasks, 1);
    }

    #[test]
    fn a_day_file_keeps_each_tasks_last_line_and_skips_what_does_not_parse() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("2026-12-07.log");
        let first = Kept {
            task_id: "tsk_a".into(),
            tiers: vec![share("fast", 1, 10, 0.1)],
            models: vec![],
        };
        let mut later = first.clone();
        later.tiers[0].cost = 0.2;
        let mut text = serde_json::to_string(&first).expect("json");
        text.push_str("\nnot json\n");
        text.push_str(&"x".repeat(MAX_LINE_BYTES + 1));
        text.push('\n');
        text.push_str(&serde_json::to_string(&later).expect("json"));
        text.push('\n');
        std::fs::write(&path, text).expect("a day file");
        let read = read_day(&path);
        assert_eq!(read.len(), 1);
        assert_eq!(read["tsk_a"], later);
        assert!(read_day(&dir.path().join("missing.log")).is_empty());
    }

    #[test]
    fn only_dated_files_of_the_window_are_listed_and_old_ones_removed() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let savings = dir.path().join(DIR);
        std::fs::create_dir_all(&savings).expect("dir");
        let now = crate::tasks::epoch_ms(std::time::SystemTime::now());
        let today = date_of(now).expect("today");
        let old = date_of(now - (KEEP_DAYS + 2) * DAY_MS).expect("old");
        for name in [
            format!("{today}.log"),
            format!("{old}.log"),
            "notes.log".into(),
            "2026-1-07.log".into(),
        ] {
            std::fs::write(savings.join(name), "").expect("a file");
        }
        let listed: Vec<String> = day_files(dir.path(), 30)
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        assert_eq!(listed, vec![today.clone()]);
        remove_old(&savings);
        assert!(!savings.join(format!("{old}.log")).exists());
        assert!(savings.join(format!("{today}.log")).exists());
        assert!(savings.join("notes.log").exists(), "not ours to remove");
    }
}
