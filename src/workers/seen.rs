//! What was last seen of each worker: whether it could be reached, when, and by whom, kept under
//! the state directory (`worker-health/<worker>.json`) so the dashboard can show a worker's
//! health with no gateway asked and no `ssh` run.
//!
//! A gateway notes what its own use of a worker found (its OpenCode started or reached again,
//! or the worker out of reach), and a probe notes what it found (`opencode-mcp workers`, or the
//! dashboard's probe on request). A note is a claim about the past: the page shows its age.
//!
//! The notes are small, private and replaced whole. What they quote came from `ssh` or the
//! worker, so it is cut short and stripped of control characters before it is written; the
//! page shows it as text.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The folder of the notes, under the state directory. Apart from `workers/`, whose files say
/// how to reach a worker's running OpenCode and are swept as such.
pub const DIR: &str = "worker-health";

/// Characters of the reason kept in a note.
const DETAIL_CHARS: usize = 300;
/// Bytes of a note read at most: a note is a few hundred bytes, and a file grown past this was
/// not written by a gateway.
const MAX_NOTE_BYTES: u64 = 8 * 1024;

/// One sighting of a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sighting {
    /// When (milliseconds since the epoch).
    pub at_ms: u64,
    /// Whether it answered.
    pub reachable: bool,
    /// Why not, or what the probe found, in a line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Who looked: `gateway <pid>`, or `probe`.
    pub by: String,
}

impl Sighting {
    /// A sighting now, with `detail` made safe to keep and show.
    pub fn now(reachable: bool, detail: Option<&str>, by: String) -> Self {
        Self {
            at_ms: crate::tasks::epoch_ms(std::time::SystemTime::now()),
            reachable,
            detail: detail.map(|d| clean(d.trim(), DETAIL_CHARS)),
            by,
        }
    }

    /// What a probe found, as a sighting.
    pub fn of_probe(health: &super::probe::Health) -> Self {
        let detail = if !health.reachable {
            health.error.clone()
        } else if health.ready() {
            Some(format!(
                "ready: opencode {}, {}",
                health.opencode.as_deref().unwrap_or("?"),
                if health.confined {
                    "confined"
                } else {
                    "unconfined"
                }
            ))
        } else {
            Some("reachable, but not ready for tasks (`opencode-mcp workers` says why)".into())
        };
        Self::now(health.reachable, detail.as_deref(), "probe".into())
    }
}

fn path(state_dir: &Path, worker: &str) -> Option<PathBuf> {
    // Worker names are checked by the configuration to be plain names; anything else is not
    // turned into a path.
    let plain = !worker.is_empty()
        && worker
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    plain.then(|| state_dir.join(DIR).join(format!("{worker}.json")))
}

/// Notes `seen` for `worker`. Failing to note is logged and changes nothing else.
pub fn note(state_dir: &Path, worker: &str, seen: &Sighting) {
    let Some(file) = path(state_dir, worker) else {
        return;
    };
    let dir = state_dir.join(DIR);
    let written = crate::private_files::create_dir(&dir).and_then(|_| {
        let bytes = serde_json::to_vec(seen).map_err(std::io::Error::other)?;
        crate::private_files::write_atomic(&dir, &file, worker, &bytes, None)
    });
    if let Err(e) = written {
        tracing::debug!(worker, error = %e, "cannot note what was seen of the worker");
    }
}

/// Notes what the probes of `reports` found (`opencode-mcp workers`, `doctor`), when the state
/// directory exists (a probe creates none).
pub fn note_probes(state_dir: Option<&Path>, reports: &[super::WorkerReport]) {
    let Some(dir) = state_dir.filter(|d| d.is_dir()) else {
        return;
    };
    for report in reports {
        if let Some(health) = &report.health {
            note(dir, &report.name, &Sighting::of_probe(health));
        }
    }
}

/// The last note of `worker`, if one can be read.
pub fn read(state_dir: &Path, worker: &str) -> Option<Sighting> {
    use std::io::Read as _;
    let file = std::fs::File::open(path(state_dir, worker)?).ok()?;
    let mut text = Vec::new();
    file.take(MAX_NOTE_BYTES).read_to_end(&mut text).ok()?;
    let mut seen: Sighting = serde_json::from_slice(&text).ok()?;
    // Written by a gateway, but the directory is a file system anyone of the user's can write:
    // what is shown is bounded and printable however it got there.
    seen.detail = seen.detail.map(|d| clean(&d, DETAIL_CHARS));
    seen.by = clean(&seen.by, 40);
    Some(seen)
}

/// `text` with its control characters escaped, then cut to `chars` (so cleaning it again
/// changes nothing).
fn clean(text: &str, chars: usize) -> String {
    crate::config::printable(text).chars().take(chars).collect()
}

/// The modification time of `worker`'s note: tells a poll whether to read it again.
pub fn stamp(state_dir: &Path, worker: &str) -> Option<std::time::SystemTime> {
    std::fs::metadata(path(state_dir, worker)?)
        .ok()?
        .modified()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_read_back_bounded_and_printable() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert_eq!(read(dir.path(), "w1"), None);
        let seen = Sighting::now(
            false,
            Some("refused\u{1b}[2J by\nthe host"),
            "gateway 7".into(),
        );
        note(dir.path(), "w1", &seen);
        let back = read(dir.path(), "w1").expect("the note");
        assert_eq!(back, seen);
        let detail = back.detail.expect("a reason");
        assert!(!detail.chars().any(char::is_control), "{detail:?}");
        assert!(stamp(dir.path(), "w1").is_some());

        // A name that is not a plain name is never a path; a hostile note is cut and cleaned.
        note(dir.path(), "../escape", &seen);
        assert!(!dir.path().join("escape.json").exists());
        assert_eq!(read(dir.path(), "../escape"), None);
        let long = format!(
            "{{\"at_ms\":1,\"reachable\":true,\"detail\":\"\\u0007{}\",\"by\":\"x\"}}",
            "a".repeat(5000)
        );
        std::fs::write(dir.path().join(DIR).join("w2.json"), long).expect("a note");
        let back = read(dir.path(), "w2")
            .expect("read")
            .detail
            .expect("a reason");
        assert_eq!(back.chars().count(), DETAIL_CHARS);
        assert!(back.starts_with("\\u{7}aaa"), "{back:?}");
        std::fs::write(
            dir.path().join(DIR).join("w3.json"),
            vec![b' '; MAX_NOTE_BYTES as usize + 10],
        )
        .expect("a note");
        assert_eq!(read(dir.path(), "w3"), None, "past the bound");
    }
}
