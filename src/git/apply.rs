//! Bringing a task's change into the tree it was branched from, by a three-way merge.
//!
//! `git apply --3way` would be the short way, but it writes the user's index (it implies
//! `--index`) and leaves conflict markers in their files. Instead: snapshot the user's tree as it
//! is now (uncommitted changes included, through a temporary index), merge in memory with
//! `git merge-tree --write-tree --merge-base=<base>` (git 2.40 or newer), and only if that is
//! clean write the difference between the user's tree and the merged one with a plain
//! `git apply`, which checks every hunk before writing any file. A conflict therefore changes
//! nothing, and the merge is a real three-way one: edits the user made since the task started
//! are kept, next to the task's.

use std::path::Path;

use super::diff::{summary, DiffFile, DiffStatus};
use super::run::{commit_tree, GitError, Repo};
use super::worktree::{as_snapshot_error, snapshot_tree};

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The files it changed in the working tree (empty: it was already there).
    pub files: Vec<DiffFile>,
}

/// Applies the change from commit `from` to commit `to` (both of the task's branch) to the
/// working tree of `origin`, merging against what is there now. `label` names the change in
/// messages. On a conflict, nothing is written and the error lists the files and git's
/// conflict messages.
pub async fn apply(
    origin: &Path,
    from: &str,
    to: &str,
    scratch: &Path,
    label: &str,
) -> Result<Applied, GitError> {
    let repo = Repo::at(origin);
    let ours_tree = snapshot_tree(&repo, scratch)
        .await
        .map_err(|e| as_snapshot_error(origin, e))?;
    let head = repo
        .git(&["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .line();
    let ours = commit_tree(
        &repo,
        &ours_tree,
        &head,
        &format!("opencode-mcp: the working tree before applying {label}"),
    )
    .await?;
    let merge_base = format!("--merge-base={from}");
    // Attributes (merge drivers among them) from the user's tree as it is, not from the task's.
    let out = repo
        .cmd(&[
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--messages",
            &merge_base,
            &ours,
            to,
        ])
        .env("GIT_ATTR_SOURCE", std::ffi::OsStr::new(&ours))
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let merged = match out.code {
        Some(0) => text.lines().next().unwrap_or("").trim().to_string(),
        Some(1) => {
            let hunks = conflict_hunks(&repo, &text, label).await;
            return Err(conflict(origin, label, &text, &hunks));
        }
        _ => {
            return Err(GitError::Failed {
                dir: origin.to_path_buf(),
                command: format!("merge-tree --write-tree {merge_base} (git 2.40 or newer is needed to apply a task)"),
                stderr: out.stderr,
            })
        }
    };
    if merged == ours_tree {
        return Ok(Applied { files: Vec::new() });
    }
    let files = summary(&repo, &ours_tree, &merged).await?;
    // `git apply` checks every hunk before it writes, but a path it must create under a name
    // that is a file in the working tree (an ignored `foo` where the task adds `foo/bar`) is
    // met only while writing, after other files were written. Checked here first, so a failed
    // apply has changed nothing.
    let blocked = blocked_paths(origin, &files);
    if !blocked.is_empty() {
        return Err(GitError::Conflict {
            message: format!(
                "{label} writes where the working tree of {} has something else, and nothing \
                 was applied: {}. Move or remove those (they may be ignored files) and apply \
                 again",
                origin.display(),
                blocked.join("; ")
            ),
            files: files.into_iter().map(|f| f.file).collect(),
        });
    }
    // Plumbing with its prefixes spelt out: the user's `diff.noprefix`, `diff.srcPrefix` or
    // `diff.mnemonicPrefix` must not shape the patch (with `noprefix`, a new `src/new.rs` was
    // written to `new.rs`), and `apply -p1` reads it back as written.
    let patch = repo
        .git(&[
            "diff-tree",
            "-r",
            "-p",
            "--binary",
            "--full-index",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            &ours_tree,
            &merged,
        ])
        .await?;
    if patch.truncated {
        return Err(GitError::Failed {
            dir: origin.to_path_buf(),
            command: "diff-tree -p".into(),
            stderr: format!(
                "{label}'s change is larger than the gateway applies ({} MiB of patch): nothing \
                 was applied; merge its branch with git yourself",
                super::run::OUTPUT_LIMIT >> 20
            ),
        });
    }
    let patch = patch.stdout;
    let names = files.iter().map(|f| f.file.clone()).collect();
    write_patch(origin, patch, label, names).await?;
    Ok(Applied { files })
}

/// Writes `patch` into the working tree of `origin` with one `git apply`, which checks every
/// hunk before it writes any file: a hunk that no longer matches (the tree changed after the
/// merge was computed) fails it with nothing written. `files` are the ones the patch touches,
/// for the error.
pub(super) async fn write_patch(
    origin: &Path,
    patch: Vec<u8>,
    label: &str,
    files: Vec<String>,
) -> Result<(), GitError> {
    let applied = Repo::at(origin)
        .cmd(&["apply", "-p1", "--whitespace=nowarn", "-"])
        .stdin(patch)
        .output()
        .await?;
    if applied.code == Some(0) {
        return Ok(());
    }
    Err(GitError::Conflict {
        message: format!(
            "the working tree of {} changed while {label} was being applied, and nothing was \
             applied ({}); apply it again",
            origin.display(),
            applied.stderr
        ),
        files,
    })
}

/// The paths the change would write but cannot: a file it adds whose parent directory is a file
/// (or symlink) in the working tree, or which already exists there untracked (git keeps no
/// record of it, so the apply would overwrite it). In words, one entry each.
fn blocked_paths(origin: &Path, files: &[DiffFile]) -> Vec<String> {
    let mut blocked = Vec::new();
    for f in files {
        let writes_new = matches!(
            f.status,
            DiffStatus::Added | DiffStatus::Renamed | DiffStatus::Copied
        );
        if !writes_new {
            continue;
        }
        let rel = Path::new(&f.file);
        let mut parent = rel.parent();
        let mut in_the_way = None;
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            let meta = std::fs::symlink_metadata(origin.join(dir));
            if meta.is_ok_and(|m| !m.is_dir()) {
                in_the_way = Some(dir);
            }
            parent = dir.parent();
        }
        if let Some(dir) = in_the_way {
            blocked.push(format!(
                "`{}` needs `{}` to be a directory",
                f.file,
                dir.display()
            ));
        } else if std::fs::symlink_metadata(origin.join(rel)).is_ok() {
            blocked.push(format!("`{}` already exists, untracked", f.file));
        }
    }
    blocked
}

/// Most conflicting files whose regions are quoted, most lines quoted in all, most characters
/// of one quoted line, and most bytes of a conflicting file read to find its regions.
const HUNK_FILES: usize = 3;
const HUNK_LINES: usize = 60;
const HUNK_LINE_CHARS: usize = 200;
const HUNK_FILE_BYTES: usize = 1 << 20;

/// The conflicting regions as git wrote them into the merged tree (`<<<<<<<` to `>>>>>>>`, both
/// sides), for the first [`HUNK_FILES`] files and at most [`HUNK_LINES`] lines in all: what the
/// host needs to word a follow-up that resolves them. A file git cannot show (binary, deleted on
/// one side) is simply left out; the file list and git's messages still name it.
async fn conflict_hunks(repo: &Repo, output: &str, label: &str) -> String {
    let mut lines = output.lines();
    let tree = lines.next().unwrap_or("").trim().to_string();
    let files: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
    let mut quoted = String::new();
    let mut budget = HUNK_LINES;
    for file in files.into_iter().take(HUNK_FILES) {
        if budget == 0 || tree.is_empty() {
            break;
        }
        // A file git cannot show reads as one without markers: left out. Only its first
        // [`HUNK_FILE_BYTES`] are read, however large the task made it.
        let text = repo
            .cmd(&["show", &format!("{tree}:{file}")])
            .limit(HUNK_FILE_BYTES)
            .ok()
            .await
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let regions = conflict_regions(&text, budget, label);
        if regions.is_empty() {
            continue;
        }
        budget = budget.saturating_sub(regions.len());
        quoted.push_str(&format!("\n--- {file}\n{}", regions.join("\n")));
    }
    quoted
}

/// The lines of `text` inside conflict markers (markers included), at most `max` of them, with
/// `…` where the quote is cut. The markers name the sides in words (`working tree`, and
/// `label` for the task's), not by the temporary commits git merged.
fn conflict_regions(text: &str, max: usize, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("<<<<<<< ") {
            inside = true;
        }
        if inside {
            if out.len() == max {
                out.push("…".to_string());
                return out;
            }
            let line = if line.starts_with("<<<<<<< ") {
                "<<<<<<< working tree".to_string()
            } else if line.starts_with(">>>>>>> ") {
                format!(">>>>>>> {label}")
            } else {
                match line.char_indices().nth(HUNK_LINE_CHARS) {
                    Some((at, _)) => format!("{}…", &line[..at]),
                    None => line.to_string(),
                }
            };
            out.push(line);
        }
        if line.starts_with(">>>>>>> ") {
            inside = false;
        }
    }
    out
}

/// The conflict error from `merge-tree`'s output: the merged tree's id, the conflicting files
/// (one a line), an empty line, then git's messages (`CONFLICT (content): Merge conflict in ...`);
/// `hunks` quotes the conflicting regions (see [`conflict_hunks`]).
fn conflict(origin: &Path, label: &str, output: &str, hunks: &str) -> GitError {
    let mut sections = output.splitn(2, "\n\n");
    let files: Vec<String> = sections
        .next()
        .unwrap_or("")
        .lines()
        .skip(1)
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect();
    let messages: Vec<&str> = sections
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with("CONFLICT"))
        .collect();
    GitError::Conflict {
        message: format!(
            "{label} conflicts with the working tree of {} in {}; nothing was changed. {}\
             Resolve it by continuing the task with what changed meanwhile (or discard it), or \
             merge its branch yourself.{}",
            origin.display(),
            files.join(", "),
            if messages.is_empty() {
                String::new()
            } else {
                format!("Git says: {}. ", messages.join("; "))
            },
            if hunks.is_empty() {
                String::new()
            } else {
                format!(" The conflicting lines (working tree first, then the task's):{hunks}")
            }
        ),
        files,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_name_the_files_and_gits_messages() {
        let out = "4b825dc\nsrc/a.rs\nb.txt\n\nAuto-merging b.txt\nCONFLICT (content): Merge conflict in b.txt\n";
        let GitError::Conflict { message, files } = conflict(Path::new("/r"), "task t", out, "")
        else {
            panic!("not a conflict");
        };
        assert_eq!(files, vec!["src/a.rs".to_string(), "b.txt".to_string()]);
        assert!(message.contains("CONFLICT (content): Merge conflict in b.txt"));
        assert!(message.contains("/r") && message.contains("src/a.rs, b.txt"));
        assert!(!message.contains("conflicting lines"));
    }

    #[test]
    fn conflict_regions_are_quoted_markers_included_and_cut() {
        let text = "a\n<<<<<<< 4b825dc\nmine\n=======\ntheirs\n>>>>>>> 9f3e1aa\nb\n<<<<<<< 4b825dc\nx\n=======\ny\n>>>>>>> 9f3e1aa\n";
        assert_eq!(
            conflict_regions(text, 60, "task tsk_1"),
            [
                "<<<<<<< working tree",
                "mine",
                "=======",
                "theirs",
                ">>>>>>> task tsk_1",
                "<<<<<<< working tree",
                "x",
                "=======",
                "y",
                ">>>>>>> task tsk_1"
            ]
        );
        assert_eq!(
            conflict_regions(text, 3, "task tsk_1"),
            ["<<<<<<< working tree", "mine", "=======", "…"]
        );
        assert!(conflict_regions("no markers\n", 60, "task tsk_1").is_empty());
        let long = format!("<<<<<<< a\n{}\n=======\n>>>>>>> b\n", "x".repeat(1000));
        let quoted = conflict_regions(&long, 60, "task tsk_1");
        assert_eq!(quoted[1], format!("{}…", "x".repeat(HUNK_LINE_CHARS)));
    }
}
