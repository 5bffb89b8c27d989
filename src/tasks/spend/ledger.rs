//! The day's spend, in one place every gateway on a state directory shares.
//!
//! `limits.max_cost_usd_per_day` is a cap on what the user's delegated work costs in a UTC day,
//! whichever gateway ran it: two host windows sharing a state directory must not each spend the
//! whole cap. So the spend is kept on disk, in `<state_dir>/spend/<YYYY-MM-DD>.log`, one line per
//! observation `<task_id> <turn> <usd>`: the turn's spend so far (every step, subagents and
//! compaction included), appended whenever it grows. A turn counts with its largest observation,
//! the day's spend is the sum over turns, and each gateway reads the lines the others appended
//! since it last looked (the file only grows). Lines are appended with one `write` on a file
//! opened `O_APPEND`, so lines from several gateways never interleave.
//!
//! What a turn counts for: what it spent as OpenCode reported it while it streamed (the task's
//! session and its subagents' child sessions), or, if more, the cost read over HTTP once it
//! ended; also what it spent after an abort that OpenCode did not confirm at once. A turn
//! counts toward the day of each observation: one that runs over midnight counts what it spent
//! so far on the new day too (an over-count of at most one turn, never an under-count). A turn
//! that ends with the gateway (killed, interrupted) keeps the spend of its last observation.
//!
//! Without a state directory the ledger is kept in memory, for this gateway alone.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Mutex;

/// A UTC day in milliseconds.
const DAY_MS: u64 = 86_400_000;

/// The day's spend, shared through `<state_dir>/spend/` when there is one.
pub struct Ledger {
    /// `<state_dir>/spend`, or `None` to keep the day in memory.
    dir: Option<PathBuf>,
    day: Mutex<Day>,
}

/// What this gateway knows of one UTC day.
#[derive(Default)]
struct Day {
    /// Days since the epoch.
    number: u64,
    /// How far the day's file has been read.
    read_to: u64,
    /// The largest observation of each turn, by task id and turn.
    turns: HashMap<(String, u32), f64>,
}

impl Day {
    /// Notes an observation; whether it raised what the turn counts for.
    fn note(&mut self, task_id: &str, turn: u32, usd: f64) -> bool {
        let known = self.turns.entry((task_id.to_string(), turn)).or_insert(0.0);
        if usd > *known {
            *known = usd;
            true
        } else {
            false
        }
    }

    fn total(&self) -> f64 {
        self.turns.values().sum()
    }
}

impl Ledger {
    /// A ledger kept in `dir` (created `0700` on the first write), or in memory with `None`.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            day: Mutex::new(Day::default()),
        }
    }

    /// Turn `turn` of `task_id` has spent `usd` so far. Written (and counted) only when it is
    /// more than the turn's spend known already, so a turn writes a line per step at most. The
    /// file is not read first (this runs on every change of a task's spend): what other
    /// gateways appended is read before the cap is checked ([`Self::spent_today`]), and a line
    /// written although another gateway already noted more for the turn counts for nothing.
    pub fn observe(&self, task_id: &str, turn: u32, usd: f64) {
        if !usd.is_finite() || usd <= 0.0 {
            return;
        }
        let mut day = self.today();
        if !day.note(task_id, turn, usd) {
            return;
        }
        if let Some(path) = self.file(day.number) {
            let line = format!("{task_id} {turn} {usd}\n");
            if let Err(e) = append(&path, line.as_bytes()) {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the day's spend; other gateways on this state directory will not count this turn");
            }
        }
    }

    /// What today's (UTC) turns spent, as every gateway on the state directory observed it.
    pub fn spent_today(&self) -> f64 {
        let mut day = self.today();
        self.catch_up(&mut day);
        day.total()
    }

    /// The day's state, started over when the UTC day changed.
    fn today(&self) -> std::sync::MutexGuard<'_, Day> {
        let mut day = self.day.lock().unwrap_or_else(|p| p.into_inner());
        let number = crate::tasks::model::epoch_ms(std::time::SystemTime::now()) / DAY_MS;
        if day.number != number {
            *day = Day {
                number,
                ..Day::default()
            };
        }
        day
    }

    /// Reads the lines appended to the day's file since the last read (by any gateway). A last
    /// line without its newline is a write under way: read next time. A line that does not
    /// parse is skipped.
    fn catch_up(&self, day: &mut Day) {
        let Some(path) = self.file(day.number) else {
            return;
        };
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the day's spend");
                return;
            }
        };
        let mut fresh = Vec::new();
        let read = file
            .seek(SeekFrom::Start(day.read_to))
            .and_then(|_| file.read_to_end(&mut fresh));
        if let Err(e) = read {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the day's spend");
            return;
        }
        let Some(end) = fresh.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        for line in fresh[..end].split(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(line);
            let mut parts = line.split_whitespace();
            let (Some(task), Some(turn), Some(usd), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(turn), Ok(usd)) = (turn.parse::<u32>(), usd.parse::<f64>()) else {
                continue;
            };
            if usd.is_finite() && usd > 0.0 {
                day.note(task, turn, usd);
            }
        }
        day.read_to += end as u64 + 1;
    }

    /// The file of day `number` (days since the epoch), named by its date.
    fn file(&self, number: u64) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let secs = i64::try_from(number.saturating_mul(DAY_MS / 1000)).ok()?;
        let date = chrono::DateTime::from_timestamp(secs, 0)?.date_naive();
        Some(dir.join(format!("{date}.log")))
    }
}

/// Appends `bytes` to `path` in one write, the file created owner-only.
fn append(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        crate::private_files::create_dir(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        std::env::temp_dir().join(format!("ocm-ledger-{}", crate::ids::task_id()))
    }

    /// A turn counts once, with its largest observation; turns add up.
    #[test]
    fn a_turn_counts_with_its_largest_observation() {
        let l = Ledger::new(None);
        l.observe("tsk_a", 1, 0.25);
        l.observe("tsk_a", 1, 0.5);
        l.observe("tsk_a", 1, 0.4);
        l.observe("tsk_a", 2, 0.125);
        l.observe("tsk_b", 1, f64::NAN);
        l.observe("tsk_b", 1, -1.0);
        assert_eq!(l.spent_today(), 0.625);
    }

    /// Two gateways on one state directory see each other's spend; a torn last line waits for
    /// its end, and garbage is skipped.
    #[test]
    fn gateways_sharing_a_state_directory_share_the_day() {
        let dir = dir();
        let (one, two) = (
            Ledger::new(Some(dir.clone())),
            Ledger::new(Some(dir.clone())),
        );
        one.observe("tsk_a", 1, 0.5);
        two.observe("tsk_b", 1, 0.25);
        assert_eq!(one.spent_today(), 0.75);
        assert_eq!(two.spent_today(), 0.75);
        // The same observation from the other gateway adds nothing.
        two.observe("tsk_a", 1, 0.5);
        assert_eq!(one.spent_today(), 0.75);
        let file = one
            .file(crate::tasks::model::epoch_ms(std::time::SystemTime::now()) / DAY_MS)
            .expect("a file");
        append(&file, b"not a line\ntsk_c 1 0.125\ntsk_d 1 0.0").expect("append");
        assert_eq!(two.spent_today(), 0.875, "the torn line is not read yet");
        append(&file, b"625\n").expect("append");
        assert_eq!(two.spent_today(), 0.9375);
        // A fresh gateway reads the whole day.
        assert_eq!(Ledger::new(Some(dir.clone())).spent_today(), 0.9375);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A ledger whose directory cannot be written still counts this gateway's turns (and says
    /// the others will not see them).
    #[test]
    fn a_ledger_that_cannot_be_written_still_counts_here() {
        let blocker = dir();
        std::fs::write(&blocker, b"a file where the directory should be").expect("write");
        let l = Ledger::new(Some(blocker.join("spend")));
        l.observe("tsk_a", 1, 0.5);
        assert_eq!(l.spent_today(), 0.5);
        let _ = std::fs::remove_file(&blocker);
    }
}
