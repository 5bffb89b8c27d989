//! Tasks: what a delegated task is and how its state is decided, kept, read and waited on.
//!
//! The rooms, each importing only the rooms listed before it, with one exception: the
//! facade's larger jobs (`restore.rs`, `follow_up.rs`, `result.rs`, `wait.rs`) add methods to `service.rs`'s
//! `TaskService`, listed last. They call down, into `placement/` and `context.rs`, never
//! into `service.rs` or each other. `placement/` is a struct of its own ([`placement::Placement`]):
//! the service calls it, and it reaches only what it holds, so it cannot call back.
//!
//! | room | what it holds |
//! |---|---|
//! | `model/` | the shapes status, wait and result report (also the tools' output schemas) |
//! | `error.rs`, `resolve.rs` | the task actions' error vocabulary; agents, models and tiers resolved against the live server |
//! | `spend/` | money, and the only room that writes it: what a record keeps of a task's spend (`spent`: earlier turns, segments per tier and model, the host turn's earlier rounds), the open turn's spending and the ledger's hook (`spending`), a task's caps and the day's (`caps`), the day's spend on disk (`ledger`) |
//! | `lifecycle/` | the one state word (`phase`), a turn's state machine (`turn`, pure) and its stream (`stream`), the durable record (`record`, with `held` and `live` beside it), and `entry`: the record moved only by named transitions. No other room can write a status |
//! | `store/` | what is kept: the tasks in memory under one lock (`registry`), their expiry (`expiry`), the records on disk (`disk`, `read`, `writer`), the state directory's owner (`owner`), slots per worker (`capacity`), worktrees that outlive their records (`gc`), the usage report and task list over records (`usage`, pure) |
//! | `context.rs` | what every behaviour room shares: the registry, the configuration in force, the limits, the deadline's timer, a task read as status shows it |
//! | `turn/` | a turn's end read (`outcome`: the one sequence after every end), a remote task's work fetched back (`fetch`), a turn's confinement (`confine`), the next turn opened (`follow`) |
//! | `checks/` | the gateway's own verdicts before a waiter sees a turn: `hold` (the one place a held turn settles), `structured`, `commands` (and `run`), `escalation` |
//! | `tracking/` | a running turn followed: `tracker` (events in), `completion`, `budget`, `asks`, `abort` |
//! | `placement/` | where a task runs and getting it there, one `Placement` the service holds: `start`, `queue`, `servers`, `remote` (and `supervise`, `links`), `workspace` |
//! | `housekeeping.rs` | eviction and expiry for the gateway as a whole |
//! | `service.rs` | the facade the gateway's tool handlers call, its larger jobs beside it: `restore.rs` (tasks a previous gateway left, adopted), `follow_up.rs` (`continue_task`), `result.rs`, `wait.rs` |

pub mod checks;
mod context;
mod error;
mod follow_up;
mod housekeeping;
pub mod lifecycle;
mod model;
mod placement;
mod resolve;
mod restore;
mod result;
mod service;
pub mod spend;
pub mod store;
mod tracking;
mod turn;
mod wait;

pub use error::TaskError;
pub use follow_up::ContinueTask;
pub use lifecycle::record::{GroupMember, TaskRecord};
pub use model::*;
pub use placement::start::{default_title, StartTask};
pub use placement::workspace::{ApplyOutcome, DiscardOutcome};
pub use resolve::{check_variant, resolve_tier, AgentCatalog, TierResolution};
pub use result::Files;
pub use service::*;
pub use store::capacity::Slots;
pub use store::disk::{default_state_dir, read_stored, read_summaries, state_dir_of, Stored};
pub use store::owner::alive as gateway_alive;
pub use store::usage::slots_in_use;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The rooms in the order of the map above: a room imports only rooms of an earlier line.
    /// On one line, only the facade's jobs may import the facade.
    const ORDER: &[&[&str]] = &[
        &["model"],
        &["error"],
        &["resolve"],
        &["spend"],
        &["lifecycle"],
        &["store"],
        &["context"],
        &["turn"],
        &["checks"],
        &["tracking"],
        &["placement"],
        &["housekeeping"],
        &["service", "restore", "result", "wait", "follow_up"],
    ];

    fn rank(room: &str) -> Option<usize> {
        ORDER.iter().position(|line| line.contains(&room))
    }

    /// The rooms of `tasks` that production code in `source` names, the file being module
    /// `path` (below `tasks`): through `crate::tasks::` or through `super::` climbing to `tasks`.
    fn rooms_named(path: &[String], source: &str) -> Vec<String> {
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let mut named = Vec::new();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or_default();
            for (i, _) in line.match_indices("crate::tasks::") {
                named.push(ident(&line[i + "crate::tasks::".len()..]));
            }
            let mut rest = line;
            while let Some(i) = rest.find("super::") {
                let before = &rest[..i];
                if before.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                    rest = &rest[i + 7..];
                    continue;
                }
                let mut up = 0;
                let mut tail = &rest[i..];
                while let Some(t) = tail.strip_prefix("super::") {
                    up += 1;
                    tail = t;
                }
                if up == path.len() {
                    named.push(ident(tail));
                }
                rest = tail;
            }
        }
        named.retain(|n| !n.is_empty());
        named
    }

    fn ident(s: &str) -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    }

    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir)
            .expect("src/tasks is readable")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every room imports only rooms listed before it (so no room's methods call back into
    /// the room that called them), and `placement/` never reaches the service it serves.
    #[test]
    fn rooms_import_only_the_rooms_before_them() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tasks");
        let mut all = Vec::new();
        files(&root, &mut all);
        assert!(
            all.len() > 40,
            "found only {} files under {}",
            all.len(),
            root.display()
        );
        let mut wrong = Vec::new();
        for file in all {
            let rel = file.strip_prefix(&root).expect("below src/tasks");
            let mut path: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if path.last().is_some_and(|l| l == "mod") {
                path.pop();
            }
            let Some(room) = path.first().cloned() else {
                continue;
            };
            let source = std::fs::read_to_string(&file).expect("a source file");
            let Some(mine) = rank(&room) else {
                wrong.push(format!(
                    "{}: room `{room}` is not on the map",
                    rel.display()
                ));
                continue;
            };
            for other in rooms_named(&path, &source) {
                let Some(theirs) = rank(&other) else {
                    continue;
                };
                let facade_job = theirs == mine && other == "service";
                if other != room && (theirs > mine || (theirs == mine && !facade_job)) {
                    wrong.push(format!("{} (room `{room}`) names `{other}`", rel.display()));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports that point up the map:\n{}",
            wrong.join("\n")
        );
    }

    /// The check above sees what it must: a `super::` climbing to `tasks` and a crate path.
    #[test]
    fn the_room_check_reads_both_kinds_of_path() {
        let path = vec!["placement".to_string(), "queue".to_string()];
        let named = rooms_named(
            &path,
            "use super::super::service::TaskService;\nuse super::links::X;\nfn f() { crate::tasks::wait::g(); }\n#[cfg(test)]\nuse crate::tasks::restore;",
        );
        assert_eq!(named, vec!["service", "wait"]);
    }
}
