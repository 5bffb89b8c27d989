//! What a server offers (its model catalog and its agents), remembered for a short while.
//!
//! `start_task` and `continue_task` check a tier, model, variant or agent against the server
//! before the prompt goes out, on the path the host waits on. Asking OpenCode every time cost a
//! round trip there: on the pinned OpenCode, `GET /config/providers` took 12 ms (median of 30)
//! and `GET /agent` 6 ms, against about 20 ms for creating the session and sending the prompt.
//! So a listing read less than [`FRESH_FOR`] ago is used again.
//!
//! A remembered listing can only be out of date in two ways, and neither makes a call wrong for
//! long: a model or agent added to OpenCode meanwhile is not in it, so a choice it refuses is
//! checked again against a fresh listing before the call fails (see `tasks/resolve.rs`); one
//! removed meanwhile is still in it, and OpenCode itself fails the turn when the prompt runs.
//! `list_agents` always reads afresh (and refreshes what is remembered): it is where a user
//! looks after changing OpenCode's configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a listing is used again without asking the server.
pub const FRESH_FOR: Duration = Duration::from_secs(60);

/// One kind of listing per OpenCode directory (a server answers per directory: a project's own
/// configuration may add providers or agents). Entries older than [`FRESH_FOR`] are dropped
/// whenever one is added, so a gateway that runs a worktree task per directory keeps only the
/// recent ones.
#[derive(Debug)]
pub(crate) struct Remembered<T> {
    by_directory: Mutex<HashMap<String, (Instant, Arc<T>)>>,
}

impl<T> Default for Remembered<T> {
    fn default() -> Self {
        Self {
            by_directory: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Remembered<T> {
    /// The listing of `directory` if it was read less than `FRESH_FOR` before `now`.
    pub(crate) fn recent(&self, directory: &str, now: Instant) -> Option<Arc<T>> {
        let map = self.by_directory.lock().unwrap_or_else(|p| p.into_inner());
        map.get(directory)
            .filter(|(at, _)| now.saturating_duration_since(*at) < FRESH_FOR)
            .map(|(_, value)| value.clone())
    }

    /// Remembers `value` as the listing of `directory` read at `at`, and forgets stale ones.
    pub(crate) fn put(&self, directory: &str, value: T, at: Instant) -> Arc<T> {
        let value = Arc::new(value);
        let mut map = self.by_directory.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (then, _)| at.saturating_duration_since(*then) < FRESH_FOR);
        map.insert(directory.to_string(), (at, value.clone()));
        value
    }

    /// The listing of `directory`: the remembered one if `reuse` and it is recent, else what
    /// `read` reads now, remembered from the moment the read started.
    pub(crate) async fn get<E>(
        &self,
        directory: &str,
        reuse: bool,
        read: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<Listing<T>, E> {
        if let Some(value) = reuse
            .then(|| self.recent(directory, Instant::now()))
            .flatten()
        {
            return Ok(Listing {
                value,
                remembered: true,
            });
        }
        let at = Instant::now();
        let value = read.await?;
        Ok(Listing {
            value: self.put(directory, value, at),
            remembered: false,
        })
    }

    /// How many directories have a listing remembered (stale or not).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_directory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// A listing and whether it was remembered rather than read just now.
#[derive(Debug)]
pub struct Listing<T> {
    pub value: Arc<T>,
    pub remembered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_used_again_only_while_fresh() {
        let listings = Remembered::<Vec<&str>>::default();
        let t0 = Instant::now();
        assert!(listings.recent("/repo", t0).is_none());
        listings.put("/repo", vec!["a/one"], t0);
        let again = listings.recent("/repo", t0 + FRESH_FOR / 2);
        assert_eq!(again.as_deref(), Some(&vec!["a/one"]));
        assert!(listings.recent("/other", t0).is_none(), "per directory");
        assert!(listings.recent("/repo", t0 + FRESH_FOR).is_none());
    }

    #[test]
    fn stale_directories_are_forgotten_when_one_is_added() {
        let listings = Remembered::<u32>::default();
        let t0 = Instant::now();
        for (i, dir) in ["/w/1", "/w/2", "/w/3"].into_iter().enumerate() {
            listings.put(dir, i as u32, t0);
        }
        assert_eq!(listings.len(), 3);
        listings.put("/w/4", 4, t0 + FRESH_FOR);
        assert_eq!(listings.len(), 1);
        assert_eq!(listings.recent("/w/4", t0 + FRESH_FOR).as_deref(), Some(&4));
    }
}
