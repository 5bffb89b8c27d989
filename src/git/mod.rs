//! Git, run as the `git` program, for task workspaces: a git worktree per task, its diff against
//! the base it started from, and bringing that change back (apply) or dropping it (discard).
//!
//! # Why plain `git` and not OpenCode's `POST /experimental/worktree`
//!
//! OpenCode 1.18.33 can create worktrees itself, but that endpoint does not fit a task:
//! - it returns before the worktree exists (it is created asynchronously), so a session started
//!   right after it would race the checkout;
//! - it puts the worktree under OpenCode's own data directory on a branch `opencode/<name>`, which
//!   the gateway can neither name after its task nor keep with its task records;
//! - it branches from `HEAD` only, so the orchestrator's uncommitted changes (what it sees and
//!   means when it delegates) would be missing in the task's tree;
//! - it is experimental, and an attached server of another version may lack it.
//!
//! With `git` the worktree exists when the call returns, its base is exactly what the
//! orchestrator sees, and the same code works for managed and attached servers.
//!
//! # The user's tree is never touched, except by apply
//!
//! Snapshots of a tree with its uncommitted changes go through a temporary index
//! (`GIT_INDEX_FILE`, seeded from a copy of the real one so unchanged files are not hashed again;
//! the copy keeps the real one's mtime, which git's check of racily clean entries depends on)
//! and `git write-tree`/`git commit-tree`: they add objects to the repository and nothing else.
//! Reads run with `GIT_OPTIONAL_LOCKS=0`, so not even an index refresh is written. Apply computes
//! the merged tree first (`git merge-tree`) and changes the working tree only when the merge is
//! clean, with one `git apply` that checks every hunk before it writes any.
//!
//! - `run`: spawning `git` with a clean environment and forced settings, bounded, and its
//!   errors; [`Repo`]: where a call runs and what it is pinned to.
//! - `worktree`: snapshots, creating and removing a task's worktree; [`Worktree`]: a task's
//!   worktree reached through the gateway's record, never through what the agent wrote.
//! - `diff`: the summary (`--raw --numstat`) and the unified diff of a change.
//! - `apply`: the three-way merge of a task's change into its origin.

mod apply;
mod diff;
mod run;
mod worktree;

pub use apply::{apply, Applied};
pub use diff::{parse_raw_numstat, summary, unified, DiffFile, DiffStatus};
pub use run::{GitError, Repo, IDENTITY, OVERRIDES};
pub use worktree::{
    base_commit, can_branch, commit_state, create, create_at, locate, pending, remove,
    snapshot_tree, Base, Created, Located, Pending, Reading, Worktree,
};

/// The prefix of every task branch: `opencode-mcp/<task_id>`.
pub const BRANCH_PREFIX: &str = "opencode-mcp/";

/// Real git on a repository whose own settings would shape or stop the gateway's calls.
#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;

    /// Runs git in `dir`; fails the test if git does; returns its stdout, trimmed.
    fn sh(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn stamp(path: &Path, at: std::time::SystemTime) {
        std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(at))
            .expect("set mtime");
    }

    /// A file rewritten with the same size in the same clock tick as the index was written has
    /// the stat data the index cached for it: only git's "racily clean" rule (an entry as new as
    /// the index is compared by content) catches the change. The snapshot's temporary index
    /// must keep that rule working. The tick is made deterministic here: both times are set to
    /// one instant ten seconds ago, and `core.checkStat=minimal` leaves ctime and inode out.
    #[tokio::test]
    async fn a_same_size_rewrite_in_the_index_tick_is_in_the_snapshot() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = init_repo(tmp.path(), &[("core.checkStat", "minimal")], &[]);
        let file = repo.join("a.txt");
        let tick = std::time::SystemTime::now() - std::time::Duration::from_secs(10);
        stamp(&file, tick);
        sh(&repo, &["add", "a.txt"]);
        stamp(&repo.join(".git/index"), tick);
        std::fs::write(&file, "two\n").expect("rewrite");
        stamp(&file, tick);

        let tree = worktree::snapshot_tree(&Repo::at(&repo), &tmp.path().join("scratch"))
            .await
            .expect("snapshot");
        let blob = sh(&repo, &["rev-parse", &format!("{tree}:a.txt")]);
        assert_eq!(sh(&repo, &["cat-file", "-p", &blob]), "two");
        assert_ne!(tree, sh(&repo, &["rev-parse", "HEAD^{tree}"]));
    }

    /// A repository at `<tmp>/repo` with a committer and one commit of `a.txt` ("one") plus
    /// `files`, and `settings` in its config.
    fn init_repo(tmp: &Path, settings: &[(&str, &str)], files: &[(&str, &str)]) -> PathBuf {
        let repo = tmp.join("repo");
        std::fs::create_dir_all(&repo).expect("repo dir");
        sh(&repo, &["init", "--quiet", "-b", "main"]);
        for (k, v) in [("user.name", "t"), ("user.email", "t@localhost")]
            .iter()
            .chain(settings)
        {
            sh(&repo, &["config", k, v]);
        }
        for (name, text) in std::iter::once(&("a.txt", "one\n")).chain(files) {
            std::fs::write(repo.join(name), text).expect("write");
            sh(&repo, &["add", name]);
        }
        sh(&repo, &["commit", "--quiet", "-m", "init"]);
        repo
    }

    async fn pinned(created: &Created) -> Worktree {
        Worktree::pin(&created.origin, &created.path, &created.base)
            .await
            .expect("the worktree is registered in its origin")
    }

    fn hook(repo: &Path, name: &str) {
        let path = repo.join(".git/hooks").join(name);
        std::fs::write(&path, "#!/bin/sh\necho \"hook $0 ran\" >&2\nexit 1\n").expect("hook");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    /// Failing `post-checkout` and `reference-transaction` hooks (a husky setup gone wrong) do
    /// not run; `diff.noprefix` and friends do not bend the patch an apply writes (a new
    /// `src/new.rs` once landed as `new.rs`); the worktrees are owner-only.
    #[tokio::test]
    async fn hooks_and_diff_settings_of_the_user_do_not_reach_the_gateways_git() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let settings = [
            ("diff.noprefix", "true"),
            ("diff.mnemonicPrefix", "true"),
            ("diff.srcPrefix", "x/"),
            ("diff.dstPrefix", "y/"),
        ];
        let repo = init_repo(tmp.path(), &settings, &[]);
        hook(&repo, "post-checkout");
        hook(&repo, "reference-transaction");

        let root = tmp.path().join("worktrees");
        let scratch = tmp.path().join("scratch");
        let created = create(&repo, &root, "tsk_1", Base::Head)
            .await
            .unwrap_or_else(|e| panic!("the user's hooks stopped the worktree: {e}"));
        let mode = std::fs::metadata(&root).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the worktrees directory is owner-only");

        std::fs::create_dir_all(created.path.join("src")).expect("src");
        std::fs::write(created.path.join("src/new.rs"), "fn main() {}\n").expect("write");
        std::fs::write(created.path.join("a.txt"), "one\ntwo\n").expect("write");
        let tip = commit_state(&pinned(&created).await, &scratch, "tsk_1")
            .await
            .unwrap_or_else(|e| panic!("commit the task's state: {e}"));
        let applied = apply(&repo, &created.base, &tip, &scratch, "task tsk_1")
            .await
            .unwrap_or_else(|e| panic!("apply: {e}"));
        let mut files: Vec<String> = applied.files.into_iter().map(|f| f.file).collect();
        files.sort();
        assert_eq!(files, ["a.txt", "src/new.rs"]);
        assert!(
            repo.join("src/new.rs").is_file(),
            "written where the task wrote it"
        );
        assert!(!repo.join("new.rs").exists(), "not one directory up");
        assert_eq!(
            std::fs::read_to_string(repo.join("a.txt")).expect("read"),
            "one\ntwo\n"
        );
    }

    /// A start made again (its gateway stopped while the task was starting) finds the
    /// worktree and branch of the first attempt: they are replaced, from the new base; a name
    /// in the way that is no worktree is left alone, and the start fails.
    #[tokio::test]
    async fn a_worktree_made_again_replaces_the_first_attempts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = init_repo(tmp.path(), &[], &[]);
        let root = tmp.path().join("worktrees");
        let first = create(&repo, &root, "tsk_again", Base::Head)
            .await
            .unwrap_or_else(|e| panic!("first: {e}"));
        std::fs::write(first.path.join("left.txt"), "by the first attempt\n").expect("write");
        std::fs::write(repo.join("a.txt"), "two\n").expect("write");
        sh(&repo, &["commit", "--quiet", "-am", "second"]);
        let again = create(&repo, &root, "tsk_again", Base::Head)
            .await
            .unwrap_or_else(|e| panic!("again: {e}"));
        assert_eq!(again.path, first.path);
        assert_ne!(again.base, first.base, "from the new base");
        assert!(!again.path.join("left.txt").exists());
        assert_eq!(
            std::fs::read_to_string(again.path.join("a.txt")).expect("read"),
            "two\n"
        );
        // A directory in the way that is no worktree is neither added over nor deleted.
        let stray = root.join("tsk_stray");
        std::fs::create_dir_all(&stray).expect("mkdir");
        std::fs::write(stray.join("x"), "x").expect("write");
        let refused = create(&repo, &root, "tsk_stray", Base::Head).await;
        assert!(refused.is_err(), "{refused:?}");
        assert!(stray.join("x").exists(), "the stray directory was deleted");
    }

    /// An apply is all or nothing: a task that adds `foo/bar` where the working tree has an
    /// ignored file `foo` fails before writing anything (a.txt was rewritten first, then the
    /// apply failed with "Not a directory" and reported nothing applied).
    #[tokio::test]
    async fn an_apply_that_cannot_write_every_path_writes_none() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = init_repo(tmp.path(), &[], &[(".gitignore", "foo\n")]);
        let root = tmp.path().join("worktrees");
        let scratch = tmp.path().join("scratch");
        let created = create(&repo, &root, "tsk_2", Base::Head)
            .await
            .expect("worktree");
        std::fs::create_dir_all(created.path.join("foo")).expect("foo dir");
        std::fs::write(created.path.join("foo/bar"), "bar\n").expect("write");
        std::fs::write(created.path.join("a.txt"), "one\ntwo\n").expect("write");
        // The task's worktree ignores foo too: commit its state with the file forced in.
        sh(&created.path, &["add", "-f", "foo/bar"]);
        let tip = commit_state(&pinned(&created).await, &scratch, "tsk_2")
            .await
            .expect("commit state");
        // Meanwhile the user's tree has an ignored *file* named foo.
        std::fs::write(repo.join("foo"), "mine\n").expect("write");
        let err = apply(&repo, &created.base, &tip, &scratch, "task tsk_2")
            .await
            .expect_err("foo is in the way");
        let text = err.to_string();
        assert!(
            text.contains("foo/bar") && text.contains("nothing"),
            "{text}"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("a.txt")).expect("read"),
            "one\n",
            "nothing was written"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("foo")).expect("read"),
            "mine\n"
        );
    }

    /// A task started on a fresh worktree of `repo` (its base is HEAD) whose `edits` are
    /// committed as its state: (base, tip).
    async fn task_state(
        repo: &Path,
        tmp: &Path,
        id: &str,
        edits: &[(&str, Option<&str>)],
    ) -> (String, String) {
        let created = create(repo, &tmp.join("worktrees"), id, Base::Head)
            .await
            .expect("worktree");
        for (name, text) in edits {
            let path = created.path.join(name);
            match text {
                Some(text) => std::fs::write(&path, text).expect("write"),
                None => std::fs::remove_file(&path).expect("remove"),
            }
        }
        let tip = commit_state(&pinned(&created).await, &tmp.join("scratch"), id)
            .await
            .expect("commit state");
        (created.base, tip)
    }

    /// A conflict changes nothing and quotes the conflicting regions, sides named in words, up
    /// to sixty lines; a file with no markers (deleted by the task, edited by the user) is named
    /// but not quoted.
    #[tokio::test]
    async fn a_conflict_writes_nothing_and_quotes_the_regions_within_bounds() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let big: String = (0..80).map(|i| format!("line {i}\n")).collect();
        let files: Vec<(String, String)> = ["b.txt", "c.txt", "d.txt", "e.txt"]
            .iter()
            .map(|n| (n.to_string(), big.clone()))
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .chain([("a0.txt", "keep me\n")])
            .collect();
        let repo = init_repo(tmp.path(), &[], &refs);
        // The task rewrites every line of b..e and deletes gone.txt; the user does likewise
        // with other words, and edits gone.txt.
        let theirs: Vec<String> = (0..4).map(|_| "task\n".repeat(80)).collect();
        let mut edits: Vec<(&str, Option<&str>)> = ["b.txt", "c.txt", "d.txt", "e.txt"]
            .iter()
            .zip(&theirs)
            .map(|(n, t)| (*n, Some(t.as_str())))
            .collect();
        edits.push(("a0.txt", None));
        let (base, tip) = task_state(&repo, tmp.path(), "tsk_c", &edits).await;
        for name in ["b.txt", "c.txt", "d.txt", "e.txt"] {
            std::fs::write(repo.join(name), "user\n".repeat(80)).expect("write");
        }
        std::fs::write(repo.join("a0.txt"), "edited\n").expect("write");

        let err = apply(
            &repo,
            &base,
            &tip,
            &tmp.path().join("scratch"),
            "task tsk_c",
        )
        .await
        .expect_err("both sides rewrote the same lines");
        let GitError::Conflict { message, files } = err else {
            panic!("not a conflict: {err}");
        };
        assert!(files.contains(&"a0.txt".to_string()), "{files:?}");
        assert!(
            !message.contains("--- a0.txt"),
            "no markers, not quoted: {message}"
        );
        assert!(message.contains("<<<<<<< working tree"), "{message}");
        assert!(
            message.contains('…'),
            "the quote is cut at 60 lines: {message}"
        );
        assert_eq!(
            message.matches("\n--- ").count(),
            1,
            "b.txt's region alone fills the sixty lines: {message}"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("b.txt")).expect("read"),
            "user\n".repeat(80),
            "nothing was written"
        );
    }

    /// Applying what is already there changes nothing and says so (no files); a file the task
    /// adds that exists in the working tree as an ignored file (the snapshot leaves those out)
    /// is not overwritten.
    #[tokio::test]
    async fn an_apply_of_what_is_there_is_empty_and_ignored_files_are_not_overwritten() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = init_repo(tmp.path(), &[], &[(".gitignore", "*.env\n")]);
        let scratch = tmp.path().join("scratch");
        let created = create(&repo, &tmp.path().join("worktrees"), "tsk_d", Base::Head)
            .await
            .expect("worktree");
        std::fs::write(created.path.join("a.txt"), "one\ntwo\n").expect("write");
        std::fs::write(created.path.join("new.env"), "task\n").expect("write");
        sh(&created.path, &["add", "-f", "new.env"]);
        let tip = commit_state(&pinned(&created).await, &scratch, "tsk_d")
            .await
            .expect("commit state");
        std::fs::write(repo.join("new.env"), "mine\n").expect("write");
        let err = apply(&repo, &created.base, &tip, &scratch, "task tsk_d")
            .await
            .expect_err("new.env is in the way");
        assert!(
            err.to_string()
                .contains("`new.env` already exists, untracked"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("new.env")).expect("read"),
            "mine\n"
        );

        let (base, tip) = task_state(&repo, tmp.path(), "tsk_f", &[("a.txt", Some("uno\n"))]).await;
        let first = apply(&repo, &base, &tip, &scratch, "task tsk_f")
            .await
            .expect("apply");
        assert_eq!(first.files.len(), 1, "{first:?}");
        let again = apply(&repo, &base, &tip, &scratch, "task tsk_f")
            .await
            .expect("apply again");
        assert!(again.files.is_empty(), "already applied: {again:?}");
    }

    /// Git's own failures name the step: a directory that is no repository fails the snapshot,
    /// a commit that does not exist fails the merge (with the git version it needs), and a patch
    /// the working tree no longer takes changes nothing.
    #[tokio::test]
    async fn failures_of_each_step_say_which_and_change_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let plain = tmp.path().join("plain");
        std::fs::create_dir_all(&plain).expect("dir");
        let scratch = tmp.path().join("scratch");
        let err = apply(&plain, "HEAD", "HEAD", &scratch, "task tsk_e")
            .await
            .expect_err("not a repository");
        assert!(matches!(err, GitError::Snapshot { .. }), "{err:?}");

        let repo = init_repo(tmp.path(), &[], &[]);
        let missing = "0123456789012345678901234567890123456789";
        let err = apply(&repo, missing, missing, &scratch, "task tsk_e")
            .await
            .expect_err("no such commit");
        assert!(err.to_string().contains("git 2.40 or newer"), "{err}");

        let patch = b"--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-not what is there\n+new\n".to_vec();
        let err = super::apply::write_patch(&repo, patch, "task tsk_e", vec!["a.txt".to_string()])
            .await
            .expect_err("the hunk does not match");
        assert!(err.to_string().contains("nothing was applied"), "{err}");
        assert_eq!(
            std::fs::read_to_string(repo.join("a.txt")).expect("read"),
            "one\n"
        );
    }

    /// What an agent that may only edit files can write into its worktree to make `git add` run
    /// a command: `.git` pointing at a repository of its own whose config defines a filter,
    /// borrowing the origin's objects, and `.gitattributes` choosing the filter. Returns the
    /// file the command would create.
    fn plant(worktree: &Path, origin: &Path, tmp: &Path) -> PathBuf {
        let marker = tmp.join("filter-ran");
        let evil = worktree.join(".evil");
        std::fs::create_dir_all(evil.join("objects/info")).expect("mkdir");
        std::fs::create_dir_all(evil.join("refs/heads")).expect("mkdir");
        std::fs::write(evil.join("HEAD"), "ref: refs/heads/main\n").expect("write");
        std::fs::write(
            evil.join("objects/info/alternates"),
            format!("{}\n", origin.join(".git/objects").display()),
        )
        .expect("write");
        std::fs::write(
            evil.join("config"),
            format!(
                "[core]\n\trepositoryformatversion = 0\n[filter \"x\"]\n\tclean = touch {}; cat\n",
                marker.display()
            ),
        )
        .expect("write");
        std::fs::write(worktree.join(".gitattributes"), "* filter=x\n").expect("write");
        std::fs::write(worktree.join(".git"), "gitdir: .evil\n").expect("write");
        // Plain git, finding the repository through `.git` as it would, runs the command.
        let out = Command::new("git")
            .args(["add", "-A"])
            .current_dir(worktree)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_INDEX_FILE", tmp.join("probe-index"))
            .output()
            .expect("git runs");
        assert!(out.status.success(), "{out:?}");
        assert!(marker.exists(), "the planted layout works on plain git");
        std::fs::remove_file(&marker).expect("reset the marker");
        marker
    }

    /// With the planted layout in place, every operation of the gateway on the worktree works
    /// on the true repository and runs nothing: reads, committing its state, pending, apply,
    /// removal; `locate` (for a worktree without a record) refuses to believe the pointer.
    #[tokio::test]
    async fn a_planted_git_dir_is_never_used_and_runs_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = init_repo(tmp.path(), &[], &[]);
        let scratch = tmp.path().join("scratch");
        let created = create(&repo, &tmp.path().join("worktrees"), "tsk_p", Base::Head)
            .await
            .expect("worktree");
        std::fs::write(created.path.join("a.txt"), "one\ntwo\n").expect("write");
        let marker = plant(&created.path, &repo, tmp.path());

        let wt = pinned(&created).await;
        let reading = wt.read(&scratch).await.expect("read");
        let files = summary(reading.repo(), &created.base, &reading.tree)
            .await
            .expect("summary");
        let names: Vec<&str> = files.iter().map(|f| f.file.as_str()).collect();
        assert!(names.contains(&"a.txt"), "{names:?}");
        assert!(!names.contains(&".git"), "{names:?}");
        let (diff, cut) = unified(reading.repo(), &created.base, &reading.tree, 100_000)
            .await
            .expect("diff");
        assert!(diff.contains("+two") && !cut, "{diff}");
        drop(reading);
        let p = pending(&repo, &created.path, &created.base, None, &scratch)
            .await
            .expect("pending");
        assert!(p.unapplied);
        let tip = commit_state(&wt, &scratch, "tsk_p")
            .await
            .expect("commit state");
        assert_eq!(
            sh(&repo, &["show", &format!("{tip}:a.txt")]),
            "one\ntwo",
            "the state went to the task's branch in the true repository"
        );
        apply(&repo, &created.base, &tip, &scratch, "task tsk_p")
            .await
            .expect("apply");
        assert_eq!(
            std::fs::read_to_string(repo.join("a.txt")).expect("read"),
            "one\ntwo\n"
        );
        let err = locate(&created.path).await.expect_err("not believed");
        assert!(
            matches!(err, GitError::Tampered { .. }) && err.to_string().contains(".git"),
            "{err}"
        );
        remove(&repo, &created.path, &created.branch)
            .await
            .expect("removed although git refuses a tampered worktree");
        assert!(!created.path.exists());
        assert_eq!(sh(&repo, &["branch", "--list", "opencode-mcp/*"]), "");
        assert!(!marker.exists(), "the agent's filter ran");
    }

    /// Reading a worktree with new and changed files (for a result's changed files or its diff)
    /// writes no object into the user's repository, however often it is read; the diff is cut
    /// at the characters asked for, and says so.
    #[tokio::test]
    async fn reads_write_nothing_into_the_repository_and_diffs_are_bounded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = init_repo(tmp.path(), &[], &[]);
        let scratch = tmp.path().join("scratch");
        let created = create(&repo, &tmp.path().join("worktrees"), "tsk_r", Base::Head)
            .await
            .expect("worktree");
        let big: String = (0..2000).map(|i| format!("new line {i}\n")).collect();
        std::fs::write(created.path.join("new.txt"), &big).expect("write");
        std::fs::write(created.path.join("a.txt"), "changed\n").expect("write");
        let objects = || sh(&repo, &["count-objects", "-v"]);
        let before = objects();
        let wt = pinned(&created).await;
        for _ in 0..3 {
            let reading = wt.read(&scratch).await.expect("read");
            let files = summary(reading.repo(), &created.base, &reading.tree)
                .await
                .expect("summary");
            assert_eq!(files.len(), 2, "{files:?}");
            let (diff, cut) = unified(reading.repo(), &created.base, &reading.tree, 500)
                .await
                .expect("diff");
            assert!(cut, "a diff of 2,000 lines is cut at 500 characters");
            assert_eq!(diff.chars().count(), 500);
        }
        assert_eq!(objects(), before, "reads added objects to the repository");
        let left: Vec<_> = std::fs::read_dir(&scratch)
            .expect("scratch")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "scratch stores are removed: {left:?}");
    }
}
