//! Room for unfinished tasks (`limits.max_tasks`), taken at the check and held until the task it
//! was taken for is in the registry.
//!
//! A start checks the limit long before its task is registered: a session is created, a worktree
//! may be made, the prompt is sent in between. Checks that only counted let parallel starts, or
//! two `fan_out`s, all pass together. Here a check takes its room at once ([`Capacity::reserve`]):
//! the room counts as an unfinished task until the [`Slots`] holding it are dropped, which their
//! holder does once its task is registered (or when the start fails). A follow-up that brings a
//! finished task back to work takes room the same way.
//!
//! Room is counted as the registry's unfinished tasks plus the slots held. A task becomes
//! unfinished in the registry before its slot is released, so the sum can only over-count for a
//! moment, never under-count.

use std::sync::{Arc, Mutex};

use super::error::TaskError;
use super::registry::Registry;

/// The slots held now, across every start and follow-up under way.
#[derive(Debug, Default)]
pub struct Capacity {
    held: Mutex<usize>,
}

impl Capacity {
    /// Takes room for `n` more unfinished tasks, or refuses (`limit_exceeded`, saying how many
    /// are unfinished and what the limit is) when that would pass `max`.
    pub fn reserve(
        self: &Arc<Self>,
        registry: &Registry,
        n: usize,
        max: usize,
    ) -> Result<Slots, TaskError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let live = registry.live_count() + *held;
        if live + n > max {
            let what = if n == 1 {
                String::new()
            } else {
                format!(" and {n} more were asked for at once")
            };
            return Err(TaskError::LimitExceeded(format!(
                "{live} tasks are unfinished or being started{what}, and limits.max_tasks is \
                 {max}; wait for some to finish, or raise the limit"
            )));
        }
        *held += n;
        Ok(Slots {
            capacity: self.clone(),
            n,
        })
    }

    fn release(&self, n: usize) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        *held = held.saturating_sub(n);
    }
}

/// Room for `n` unfinished tasks, given back when dropped.
#[derive(Debug)]
pub struct Slots {
    capacity: Arc<Capacity>,
    n: usize,
}

impl Slots {
    /// One slot of these, as slots of its own (for one of a fan-out's starts).
    pub fn take_one(&mut self) -> Option<Slots> {
        (self.n > 0).then(|| {
            self.n -= 1;
            Slots {
                capacity: self.capacity.clone(),
                n: 1,
            }
        })
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.capacity.release(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room taken counts until given back; a fan-out's room is handed out one slot at a time
    /// and comes back as each is dropped.
    #[test]
    fn room_is_taken_at_the_check_and_given_back_on_drop() {
        let registry = Registry::new(None);
        let capacity = Arc::new(Capacity::default());
        let mut group = capacity.reserve(&registry, 3, 4).expect("room for 3");
        let err = capacity
            .reserve(&registry, 2, 4)
            .expect_err("3 held, 2 more pass 4");
        assert!(err.to_string().contains("limits.max_tasks is 4"), "{err}");
        let one = capacity.reserve(&registry, 1, 4).expect("the fourth");
        assert!(capacity.reserve(&registry, 1, 4).is_err());
        drop(one);
        let first = group.take_one().expect("a slot of the group");
        drop(group);
        // Two of the group's three went back with it; its first slot is still held.
        let two = capacity.reserve(&registry, 3, 4).expect("room for 3 again");
        assert!(capacity.reserve(&registry, 1, 4).is_err());
        drop((first, two));
        assert!(capacity.reserve(&registry, 4, 4).is_ok());
    }
}
