//! What a task spent, as its record keeps it: its finished turns' totals, what it spent on each
//! tier and model it moved away from, and what the earlier rounds of the host's current turn
//! spent (the caps hold for the host's turn as a whole).
//!
//! The record holds one [`TaskSpend`]; only this room writes it, through the moves below, which
//! the lifecycle calls as a turn opens.

use serde::{Deserialize, Serialize};

use super::spending::Spending;
use crate::opencode::Tokens;

/// Tokens, cost and wall time of finished turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    #[serde(default)]
    pub tokens: Tokens,
    #[serde(default)]
    pub cost: f64,
    #[serde(default)]
    pub wall_ms: u64,
}

impl Spent {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Takes away `other`, saturating at zero.
    pub fn minus(mut self, other: &Spent) -> Spent {
        self.tokens.sub(&other.tokens);
        self.cost = (self.cost - other.cost).max(0.0);
        self.wall_ms = self.wall_ms.saturating_sub(other.wall_ms);
        self
    }

    pub fn plus(mut self, other: &Spent) -> Spent {
        self.tokens.add(&other.tokens);
        self.cost += other.cost;
        self.wall_ms = self.wall_ms.saturating_add(other.wall_ms);
        self
    }
}

/// What a task spent on one tier and model before it moved to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub tier: Option<String>,
    pub model: Option<String>,
    pub spent: Spent,
}

/// A task's spend as its record keeps it (flattened into the record: the fields keep their
/// names on disk).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSpend {
    /// What the task's turns before the current one spent: a new turn replaces the record's
    /// outcome, so their tokens, cost and time are kept here for the usage report.
    #[serde(default, skip_serializing_if = "Spent::is_empty")]
    earlier: Spent,
    /// What the task spent on each tier and model it left (one per escalation, in order), so
    /// the usage report counts each model's share under its own tier and model; the rest of
    /// `earlier` and the current turn are the current tier's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    segments: Vec<Segment>,
    /// What the earlier rounds of this host turn spent, USD and tokens (a structured answer's
    /// corrections and the checks' fix rounds are turns of their own, but one request of the
    /// host): the caps hold for the host's turn as a whole. Saved, so a restart between rounds
    /// still counts them.
    #[serde(default, skip_serializing_if = "is_nothing_spent")]
    spent_before: (f64, u64),
    /// The tier and model the task is leaving, set by a move to another model just before the
    /// turn on the new one opens: that opening closes their segment, in the same change, so a
    /// turn that cannot be sent (its change undone) leaves no segment, and no restart comes
    /// between the two.
    #[serde(skip)]
    leaving: Option<(Option<String>, Option<String>)>,
}

fn is_nothing_spent(spent: &(f64, u64)) -> bool {
    spent.0 == 0.0 && spent.1 == 0
}

impl TaskSpend {
    /// What the task's turns before the current one spent.
    pub fn earlier(&self) -> &Spent {
        &self.earlier
    }

    /// What the task spent on the tiers and models it left, oldest first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether a move to another model waits for its turn to open.
    pub fn is_leaving(&self) -> bool {
        self.leaving.is_some()
    }

    /// The task moves to another model: the spend on `tier` and `model` closes as the next
    /// turn opens ([`TaskSpend::open_turn`]).
    pub fn leave(&mut self, tier: Option<String>, model: Option<String>) {
        self.leaving = Some((tier, model));
    }

    /// The next turn opens. The one that ended (if any) spent `finished` (its read outcome's
    /// tokens and cost, and `wall_ms`); `rounds_before` is what the host turn's earlier rounds
    /// spent (zero for a turn the host asked for). A move to another model closes its segment
    /// here, in the same change.
    pub fn open_turn(
        &mut self,
        finished: Option<(Option<(&Tokens, f64)>, u64)>,
        rounds_before: (f64, u64),
    ) {
        if let Some((outcome, wall_ms)) = finished {
            if let Some((tokens, cost)) = outcome {
                self.earlier.tokens.add(tokens);
                self.earlier.cost += cost;
            }
            self.earlier.wall_ms += wall_ms;
        }
        if let Some((tier, model)) = self.leaving.take() {
            let closed = self
                .segments
                .iter()
                .fold(Spent::default(), |acc, s| acc.plus(&s.spent));
            let spent = self.earlier.minus(&closed);
            self.segments.push(Segment { tier, model, spent });
        }
        self.spent_before = rounds_before;
    }

    /// What the host's turn has spent against its caps: the open round (`now`) and the earlier
    /// ones.
    pub fn for_caps(&self, now: &Spending) -> (f64, u64) {
        let (usd, tokens) = now.total();
        let (usd_before, tokens_before) = self.spent_before;
        (usd + usd_before, tokens.saturating_add(tokens_before))
    }

    /// A record's spend as a test needs it: `earlier`, and the earlier rounds' spend.
    #[cfg(test)]
    pub fn with(earlier: Spent, segments: Vec<Segment>, spent_before: (f64, u64)) -> Self {
        Self {
            earlier,
            segments,
            spent_before,
            leaving: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::spending::tests::tokens;
    use super::*;

    /// Each turn that ends adds to `earlier`; a move closes the segment of what was spent since
    /// the last move, as the next turn opens and not before.
    #[test]
    fn a_move_closes_its_segment_as_the_next_turn_opens() {
        let mut s = TaskSpend::default();
        s.open_turn(None, (0.0, 0));
        s.open_turn(Some((Some((&tokens(10), 0.5)), 1_000)), (0.0, 0));
        s.leave(Some("fast".into()), Some("m1".into()));
        assert!(
            s.segments().is_empty() && s.is_leaving(),
            "not before the turn opens"
        );
        s.open_turn(Some((Some((&tokens(5), 0.25)), 500)), (0.75, 15));
        assert_eq!(s.segments().len(), 1);
        assert_eq!(s.segments()[0].spent.cost, 0.75);
        assert_eq!(s.segments()[0].tier.as_deref(), Some("fast"));
        s.leave(Some("strong".into()), None);
        s.open_turn(Some((None, 250)), (0.0, 0));
        assert_eq!(
            s.segments()[1].spent.cost,
            0.0,
            "only what came after the last move"
        );
        assert_eq!(s.segments()[1].spent.wall_ms, 250);
        assert_eq!(s.earlier().cost, 0.75);
        assert!(!s.is_leaving());
    }

    /// The caps count the earlier rounds of the host's turn with the open one; a record keeps
    /// them, and a record without them reads as nothing spent.
    #[test]
    fn the_caps_count_the_earlier_rounds_and_a_record_keeps_them() {
        let mut s = TaskSpend::default();
        s.open_turn(None, (0.5, 100));
        let mut now = Spending::default();
        now.note("msg", 0.25, &tokens(20));
        assert_eq!(s.for_caps(&now), (0.75, 120));
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json, serde_json::json!({"spent_before": [0.5, 100]}));
        let back: TaskSpend = serde_json::from_value(json).expect("read back");
        assert_eq!(back, s);
        let none: TaskSpend = serde_json::from_str("{}").expect("an old record");
        assert_eq!(none.for_caps(&Spending::default()), (0.0, 0));
    }
}
