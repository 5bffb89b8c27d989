//! What a task changed: a per-file summary, and the unified diff.
//!
//! Both compare two trees (the task's base and a snapshot of its worktree, untracked files
//! included), so the agent's own commits, staged or unstaged edits and new files all count the
//! same. The summary comes from one `git diff --raw --numstat -z -M`: `--raw` says what happened
//! to each file (added, deleted, renamed), `--numstat` how many lines, and `-z` keeps any file
//! name intact.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::run::Repo;
use super::GitError;

/// What happened to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiffStatus {
    Added,
    Modified,
    Deleted,
    /// Moved (with or without edits); `from` is the old path.
    Renamed,
    /// Copied from `from`.
    Copied,
    /// Changed kind (file, symlink, submodule).
    TypeChanged,
}

impl DiffStatus {
    fn from_letter(letter: char) -> Self {
        match letter {
            'A' => DiffStatus::Added,
            'D' => DiffStatus::Deleted,
            'R' => DiffStatus::Renamed,
            'C' => DiffStatus::Copied,
            'T' => DiffStatus::TypeChanged,
            _ => DiffStatus::Modified,
        }
    }
}

/// One changed file of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DiffFile {
    /// Path relative to the repository's top (the new path of a rename).
    pub file: String,
    pub status: DiffStatus,
    /// The old path of a renamed or copied file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Lines added (0 for a binary file).
    pub additions: u64,
    /// Lines removed (0 for a binary file).
    pub deletions: u64,
    /// Binary content: no line counts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binary: bool,
}

/// Parses the output of `git diff --raw --numstat -z -M`: first one raw record per file
/// (`:<modes> <ids> <status>\0<path>\0`, or two paths for a rename or copy), then one numstat
/// record per file in the same order (`<added>\t<removed>\t<path>\0`, or for a rename
/// `<added>\t<removed>\t\0<old>\0<new>\0`; `-` counts for binary files).
pub fn parse_raw_numstat(out: &[u8]) -> Vec<DiffFile> {
    let text = String::from_utf8_lossy(out);
    let mut tokens = text.split('\0').filter(|t| !t.is_empty()).peekable();
    let mut files: Vec<DiffFile> = Vec::new();
    while let Some(raw) = tokens.next_if(|t| t.starts_with(':')) {
        let letter = raw
            .split_whitespace()
            .last()
            .and_then(|s| s.chars().next())
            .unwrap_or('M');
        let status = DiffStatus::from_letter(letter);
        let two_paths = matches!(status, DiffStatus::Renamed | DiffStatus::Copied);
        let first = tokens.next().unwrap_or_default().to_string();
        let (from, file) = if two_paths {
            (Some(first), tokens.next().unwrap_or_default().to_string())
        } else {
            (None, first)
        };
        files.push(DiffFile {
            file,
            status,
            from,
            additions: 0,
            deletions: 0,
            binary: false,
        });
    }
    let mut index = 0;
    while let Some(stat) = tokens.next() {
        let mut fields = stat.splitn(3, '\t');
        let added = fields.next().unwrap_or("-");
        let removed = fields.next().unwrap_or("-");
        let path = fields.next().unwrap_or("");
        let file = if path.is_empty() {
            // A rename: the old and the new path follow.
            let _old = tokens.next();
            tokens.next().unwrap_or_default()
        } else {
            path
        };
        // Same order as the raw records; look the path up should git ever differ.
        let slot = match files.get(index) {
            Some(f) if f.file == file => Some(index),
            _ => files.iter().position(|f| f.file == file),
        };
        index += 1;
        if let Some(f) = slot.and_then(|i| files.get_mut(i)) {
            match (added.parse::<u64>(), removed.parse::<u64>()) {
                (Ok(a), Ok(r)) => {
                    f.additions = a;
                    f.deletions = r;
                }
                _ => f.binary = true,
            }
        }
    }
    files
}

/// The files changed between `from` and `to` (commits or trees), in `repo`.
pub async fn summary(repo: &Repo, from: &str, to: &str) -> Result<Vec<DiffFile>, GitError> {
    let out = repo
        .git(&[
            "diff",
            "--raw",
            "--numstat",
            "-z",
            "-M",
            "--no-ext-diff",
            "--no-textconv",
            from,
            to,
        ])
        .await?;
    Ok(parse_raw_numstat(&out.stdout))
}

/// The unified diff between `from` and `to` (commits or trees), in `repo`, cut after
/// `max_chars` characters: `(diff, cut)`. Git is stopped once it has printed that much (a
/// character is at most four bytes), so a huge change costs no more than the cut.
pub async fn unified(
    repo: &Repo,
    from: &str,
    to: &str,
    max_chars: usize,
) -> Result<(String, bool), GitError> {
    let out = repo
        .cmd(&[
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "-M",
            from,
            to,
        ])
        .limit(max_chars.saturating_mul(4))
        .ok()
        .await?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut cut = out.truncated;
    if let Some((at, _)) = text.char_indices().nth(max_chars) {
        text.truncate(at);
        cut = true;
    }
    Ok((text, cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_numstat_records_join_per_file() {
        // What git 2.47 prints for: a deleted binary, an edit, a pure rename, a new file.
        let out = b":100644 000000 87ae6b6 0000000 D\0b.bin\0\
:100644 100644 422c2b7 6372083 M\0f\0\
:100644 100644 587be6b 587be6b R100\0g\0h\0\
:000000 100644 0000000 8ba3a16 A\0new\0\
-\t-\tb.bin\0\
2\t1\tf\0\
0\t0\t\0g\0h\0\
1\t0\tnew\0";
        let files = parse_raw_numstat(out);
        let expected = vec![
            DiffFile {
                file: "b.bin".into(),
                status: DiffStatus::Deleted,
                from: None,
                additions: 0,
                deletions: 0,
                binary: true,
            },
            DiffFile {
                file: "f".into(),
                status: DiffStatus::Modified,
                from: None,
                additions: 2,
                deletions: 1,
                binary: false,
            },
            DiffFile {
                file: "h".into(),
                status: DiffStatus::Renamed,
                from: Some("g".into()),
                additions: 0,
                deletions: 0,
                binary: false,
            },
            DiffFile {
                file: "new".into(),
                status: DiffStatus::Added,
                from: None,
                additions: 1,
                deletions: 0,
                binary: false,
            },
        ];
        assert_eq!(files, expected);
    }

    #[test]
    fn names_with_tabs_spaces_and_newlines_survive() {
        let out = b":100644 100644 1 2 M\0a b\tc\nd.txt\0\
:100644 100644 3 4 R087\0old name\0new\tname\0\
3\t4\ta b\tc\nd.txt\0\
1\t1\t\0old name\0new\tname\0";
        let files = parse_raw_numstat(out);
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].file, "a b\tc\nd.txt");
        assert_eq!((files[0].additions, files[0].deletions), (3, 4));
        assert_eq!(files[1].file, "new\tname");
        assert_eq!(files[1].from.as_deref(), Some("old name"));
        assert_eq!(files[1].status, DiffStatus::Renamed);
        assert_eq!((files[1].additions, files[1].deletions), (1, 1));
    }

    #[test]
    fn empty_output_is_no_change() {
        assert!(parse_raw_numstat(b"").is_empty());
    }
}
