//! What the open turn spends, in memory only: each assistant message's newest report from the
//! event stream (or a read over HTTP after a gap), and how much of it the day's ledger holds.

use std::collections::HashMap;

use crate::opencode::Tokens;

/// What the current turn has spent so far, per assistant message (its own session's and its
/// subagents'), as the newest `message.updated` of each reported it, and the part of it already
/// written to the day's ledger.
#[derive(Debug, Clone, Default)]
pub struct Spending {
    by_message: HashMap<String, (f64, u64)>,
    /// The turn's spend as last written to the day's ledger.
    ledgered: f64,
}

impl Spending {
    /// Notes the cost and tokens a message reports now. A message's figures only grow (OpenCode
    /// updates them at each step's end), and the stream and a read over HTTP may see it at
    /// different moments: the larger of what was seen counts.
    pub fn note(&mut self, message_id: &str, cost: f64, tokens: &Tokens) {
        let cost = if cost.is_finite() && cost > 0.0 {
            cost
        } else {
            0.0
        };
        let seen = self
            .by_message
            .entry(message_id.to_string())
            .or_insert((0.0, 0));
        seen.0 = seen.0.max(cost);
        seen.1 = seen.1.max(total_tokens(tokens));
    }

    /// USD and tokens so far.
    pub fn total(&self) -> (f64, u64) {
        self.by_message
            .values()
            .fold((0.0, 0u64), |(c, t), (mc, mt)| {
                (c + mc, t.saturating_add(*mt))
            })
    }

    /// What the turn has spent in USD: as streamed, or, if more, `read` (its cost as read over
    /// HTTP once it ended).
    pub fn usd(&self, read: f64) -> f64 {
        self.total().0.max(read)
    }

    /// The ledger's hook, run at every change of the task: the turn's spend if it grew since it
    /// was last written to the day's ledger (then it counts as written), else `None`.
    pub fn to_ledger(&mut self, read: f64) -> Option<f64> {
        let spent = self.usd(read);
        (spent > self.ledgered).then(|| {
            self.ledgered = spent;
            spent
        })
    }

    /// What a turn read back from its record spent is in the day's ledger already (written
    /// while it ran, or at the restore for records from before the ledger): only what it spends
    /// from now on is new.
    pub fn ledgered_already(&mut self, read: f64) {
        self.ledgered = self.usd(read);
    }
}

/// Every token a message used, as the caps count them.
pub fn total_tokens(t: &Tokens) -> u64 {
    t.input
        .saturating_add(t.output)
        .saturating_add(t.reasoning)
        .saturating_add(t.cache_read)
        .saturating_add(t.cache_write)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `n` input tokens.
    pub(in crate::tasks::spend) fn tokens(n: u64) -> Tokens {
        Tokens {
            input: n,
            ..Default::default()
        }
    }

    /// Each message counts with its largest report: an older view of the same message (read
    /// over HTTP before the stream's) lowers nothing, and a cost that is not a finite positive
    /// number counts as nothing.
    #[test]
    fn spending_sums_the_newest_report_of_each_message() {
        let mut s = Spending::default();
        let tokens = |n| Tokens {
            input: n,
            output: 1,
            ..Tokens::default()
        };
        s.note("msg_1", 0.25, &tokens(10));
        s.note("msg_1", 0.5, &tokens(20));
        s.note("msg_1", 0.25, &tokens(10));
        s.note("msg_2", f64::NAN, &tokens(5));
        s.note("msg_3", -1.0, &tokens(0));
        assert_eq!(s.total(), (0.5, 28));
    }

    /// The ledger is handed only what grew, once; a turn read back counts as written.
    #[test]
    fn the_ledger_gets_each_growth_once() {
        let mut s = Spending::default();
        assert_eq!(s.to_ledger(0.0), None, "nothing spent");
        s.note("a", 0.25, &tokens(1));
        assert_eq!(s.to_ledger(0.0), Some(0.25));
        assert_eq!(s.to_ledger(0.0), None, "written already");
        assert_eq!(s.to_ledger(0.5), Some(0.5), "read over HTTP, more");
        let mut back = Spending::default();
        back.ledgered_already(0.75);
        assert_eq!(back.to_ledger(0.75), None);
        assert_eq!(back.to_ledger(1.0), Some(1.0));
    }
}
