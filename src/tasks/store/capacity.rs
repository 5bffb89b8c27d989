//! Room for unfinished tasks on each worker (`workers.<name>.max_tasks`; this machine's is
//! `workers.local.max_tasks`, else `limits.max_tasks`), taken at the check and held until the
//! task it was taken for is in the registry.
//!
//! A start checks the limit long before its task is registered: a session is created, a worktree
//! may be made (pushed to a worker), the prompt is sent in between. Checks that only counted let
//! parallel starts, or two `fan_out`s, all pass together. Here a check takes its room at once
//! ([`Capacity::spread`]): the room counts as an unfinished task of its worker until the
//! [`Slots`] holding it are dropped, which their holder does once its task is registered (or
//! when the start fails). A follow-up that brings a finished task back to work takes room on the
//! task's own worker the same way.
//!
//! Room on a worker is counted as the registry's unfinished tasks there plus the slots held for
//! it. A task becomes unfinished in the registry before its slot is released, so the sum can
//! only over-count for a moment, never under-count.
//!
//! Where a task goes when the call does not say: this machine first while it has room, then the
//! remote worker with the most free slots (the first named of equals), so work spreads over the
//! workers by what each can take.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::registry::Registry;
use crate::config::{Config, LOCAL_WORKER};
use crate::tasks::error::TaskError;

/// The slots held now, by worker, across every start and follow-up under way.
#[derive(Debug, Default)]
pub struct Capacity {
    held: Mutex<HashMap<String, usize>>,
}

/// A worker tasks may be placed on: its name, its slots, and the setting that gives them (for
/// the refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub worker: String,
    pub slots: usize,
    pub setting: String,
}

impl Place {
    /// Worker `worker` of `config` (this machine for `local` or a worker no longer declared).
    pub fn of(config: &Config, worker: &str) -> Self {
        crate::workers::from_config(config)
            .into_iter()
            .find(|w| w.name == worker)
            .map(|w| Self::from_worker(config, &w))
            .unwrap_or_else(|| Self::local(config))
    }

    /// This machine.
    pub fn local(config: &Config) -> Self {
        let declared = config.workers.get(LOCAL_WORKER).and_then(|w| w.max_tasks);
        Self {
            worker: LOCAL_WORKER.to_string(),
            slots: declared.unwrap_or(config.limits.max_tasks) as usize,
            setting: match declared {
                Some(_) => "workers.local.max_tasks".into(),
                None => "limits.max_tasks".into(),
            },
        }
    }

    pub fn from_worker(config: &Config, w: &crate::workers::Worker) -> Self {
        match w.remote {
            None => Self::local(config),
            Some(_) => Self {
                worker: w.name.clone(),
                slots: w.max_tasks as usize,
                setting: format!("workers.{}.max_tasks", w.name),
            },
        }
    }
}

impl Capacity {
    /// Takes one slot for each of `n` tasks on the workers of `places` (in order of preference:
    /// the first while it has room, then the others by most free slots), all of them or none.
    /// Refused (`limit_exceeded`, saying what each worker has in use and which setting limits
    /// it) when they have fewer than `n` free slots between them.
    pub fn spread(
        self: &Arc<Self>,
        registry: &Registry,
        places: &[Place],
        n: usize,
    ) -> Result<Vec<Slots>, TaskError> {
        let live = registry.live_by_worker();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut free: Vec<usize> = places
            .iter()
            .map(|p| p.slots.saturating_sub(in_use(p, &live, &held)))
            .collect();
        if free.iter().sum::<usize>() < n {
            return Err(refusal(places, &live, &held, n));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            // The first place while it has room; then the one with the most free slots.
            let pick = match free.first() {
                Some(f) if *f > 0 => 0,
                _ => (0..free.len())
                    .max_by_key(|&i| (free[i], std::cmp::Reverse(i)))
                    .unwrap_or(0),
            };
            free[pick] -= 1;
            let worker = places[pick].worker.clone();
            *held.entry(worker.clone()).or_default() += 1;
            out.push(Slots {
                capacity: self.clone(),
                worker,
            });
        }
        Ok(out)
    }

    fn release(&self, worker: &str) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(worker) {
            *n = n.saturating_sub(1);
        }
    }
}

/// The slots of `p`'s worker in use: its started unfinished tasks and the room held for it.
fn in_use(p: &Place, live: &HashMap<String, usize>, held: &HashMap<String, usize>) -> usize {
    live.get(&p.worker).copied().unwrap_or(0) + held.get(&p.worker).copied().unwrap_or(0)
}

/// Why there is no room: for one place, today's message; for several, each worker's use.
fn refusal(
    places: &[Place],
    live: &HashMap<String, usize>,
    held: &HashMap<String, usize>,
    n: usize,
) -> TaskError {
    let used = |p: &Place| in_use(p, live, held);
    let what = if n == 1 {
        String::new()
    } else {
        format!(" and {n} more were asked for at once")
    };
    match places {
        [one] => TaskError::LimitExceeded(format!(
            "{} tasks are unfinished or being started on {}{what}, and {} is {}; wait for \
             some to finish, or raise the limit",
            used(one),
            if one.worker == LOCAL_WORKER {
                "this machine".to_string()
            } else {
                format!("worker `{}`", one.worker)
            },
            one.setting,
            one.slots
        )),
        _ => TaskError::LimitExceeded(format!(
            "every worker's slots are taken{what}: {}; wait for some tasks to finish, or raise a \
             worker's max_tasks",
            places
                .iter()
                .map(|p| format!("{} {} of {} ({})", p.worker, used(p), p.slots, p.setting))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Room for one unfinished task on a worker, given back when dropped.
#[derive(Debug)]
pub struct Slots {
    capacity: Arc<Capacity>,
    worker: String,
}

impl Slots {
    /// The worker this room is on.
    pub fn worker(&self) -> &str {
        &self.worker
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.capacity.release(&self.worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(worker: &str, slots: usize) -> Place {
        Place {
            worker: worker.into(),
            slots,
            setting: format!("workers.{worker}.max_tasks"),
        }
    }

    /// Room taken counts until given back; a fan-out's room is handed out one slot at a time
    /// and comes back as each is dropped.
    #[test]
    fn room_is_taken_at_the_check_and_given_back_on_drop() {
        let registry = Registry::new(None);
        let capacity = Arc::new(Capacity::default());
        let local = [place(LOCAL_WORKER, 4)];
        let mut group = capacity.spread(&registry, &local, 3).expect("room for 3");
        let err = capacity
            .spread(&registry, &local, 2)
            .expect_err("3 held, 2 more pass 4");
        assert!(
            err.to_string().contains("workers.local.max_tasks is 4"),
            "{err}"
        );
        let one = capacity.spread(&registry, &local, 1).expect("the fourth");
        assert!(capacity.spread(&registry, &local, 1).is_err());
        drop(one);
        let first = group.remove(0);
        drop(group);
        // Two of the group's three went back with it; its first slot is still held.
        let two = capacity
            .spread(&registry, &local, 3)
            .expect("room for 3 again");
        assert!(capacity.spread(&registry, &local, 1).is_err());
        drop((first, two));
        assert!(capacity.spread(&registry, &local, 4).is_ok());
    }

    /// This machine first while it has room, then the worker with the most free slots; all or
    /// nothing, and a refusal names each worker's use.
    #[test]
    fn tasks_go_local_first_then_to_the_freest_worker() {
        let registry = Registry::new(None);
        let capacity = Arc::new(Capacity::default());
        let places = [place(LOCAL_WORKER, 2), place("a", 2), place("b", 3)];
        let taken = capacity.spread(&registry, &places, 5).expect("room for 5");
        let on: Vec<&str> = taken.iter().map(Slots::worker).collect();
        assert_eq!(on, ["local", "local", "b", "a", "b"]);
        let err = capacity
            .spread(&registry, &places, 3)
            .expect_err("2 left, 3 asked");
        let text = err.to_string();
        assert!(
            text.contains("local 2 of 2") && text.contains("a 1 of 2") && text.contains("b 2 of 3"),
            "{text}"
        );
        let more = capacity.spread(&registry, &places, 2).expect("the last 2");
        let on: Vec<&str> = more.iter().map(Slots::worker).collect();
        assert_eq!(on, ["a", "b"]);
        drop(taken);
        let again = capacity.spread(&registry, &places, 1).expect("room again");
        assert_eq!(again[0].worker(), "local");
    }
}
