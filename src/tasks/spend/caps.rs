//! Spend guards: what a task's turn may cost, what it has cost so far, and the day's total.
//!
//! - **The caps of a task** are the lowest of `limits.max_cost_usd` / `limits.max_tokens`, its
//!   tier's, and its start call's `budget` ([`caps`]); a call may lower them, never raise them
//!   (it is refused, naming the cap in force). They are kept in the task's record and apply to
//!   each host turn of it (the first prompt, each `continue_task`) on its own. A structured
//!   answer's automatic corrections are rounds of the host turn they correct: the caps count
//!   every round together, and no correction is sent once they are reached (so
//!   `structured_retries` does not multiply them).
//! - **Spent so far** is summed from the event stream while the turn runs ([`Spending`]): every
//!   assistant message's cost and tokens as OpenCode reports them in `message.updated` (it
//!   updates them at each step's end), of the task's own session and of its subagents' child
//!   sessions, compaction summaries included. When the sum passes a cap, the tracker aborts the
//!   turn at once: the task ends `failed` (`BudgetExceeded`, saying what was spent against which
//!   cap), and its partial answer and changed files are read as after any abort. An abort
//!   OpenCode does not confirm is tried again until it does (`abort.rs`), and what the session
//!   spends meanwhile still counts. A turn whose last step passes a cap has already ended when
//!   its cost is reported: it is `completed`, and all it spent counts toward the day.
//! - **The day's spend** (`limits.max_cost_usd_per_day`) is kept in the state directory's
//!   ledger (`ledger.rs`), shared by every gateway on it: each turn counts once, with the most
//!   that was seen of it (streamed, or read over HTTP once it ended), on each UTC day it was
//!   seen spending. Once it reaches the cap, every turn that would call a model is refused until
//!   midnight UTC (a new task, a follow-up, the gateway's own correction of a structured answer);
//!   running turns finish. The cap counts what OpenCode reports as cost: a model OpenCode prices
//!   at $0 (a subscription, a local model) spends nothing by that measure, even where the usage
//!   report puts a catalog price on its tokens for the savings figure.

use crate::config::{Budget, Config};
use crate::tasks::error::TaskError;

/// The caps of a new task: `limits`, its tier's and the call's, the lowest of each. A call's cap
/// above the one in force is refused rather than ignored, so the caller knows its number was
/// not what applied.
pub fn caps(config: &Config, tier: Option<&str>, call: Budget) -> Result<Budget, TaskError> {
    let tier_caps = tier.and_then(|t| config.tier(t)).map(|t| t.budget());
    let in_force = config
        .limits
        .budget()
        .tightest(tier_caps.unwrap_or_default());
    // Tokens compare as f64 too: exact far beyond any cap accepted (MAX_TOKENS < 2^53).
    let checks = [
        (
            "max_cost_usd",
            call.max_cost_usd,
            in_force.max_cost_usd,
            tier_caps.and_then(|t| t.max_cost_usd),
        ),
        (
            "max_tokens",
            call.max_tokens.map(|v| v as f64),
            in_force.max_tokens.map(|v| v as f64),
            tier_caps.and_then(|t| t.max_tokens).map(|v| v as f64),
        ),
    ];
    for (key, asked, cap, tier_cap) in checks {
        if let (Some(asked), Some(cap)) = (asked, cap) {
            if asked > cap {
                let source = match tier {
                    Some(t) if tier_cap == Some(cap) => format!("tier `{t}`'s {key}"),
                    _ => format!("limits.{key}"),
                };
                return Err(TaskError::InvalidArgument(format!(
                    "`budget.{key}` {asked} is above the cap in force, {cap} ({source}): a call's \
                     budget may only lower it"
                )));
            }
        }
    }
    Ok(in_force.tightest(call))
}

/// Midnight UTC of today, and of tomorrow, in epoch milliseconds.
fn today_utc() -> (u64, u64) {
    let now = chrono::Utc::now();
    let start = now
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|d| d.and_utc().timestamp_millis())
        .unwrap_or_default();
    let start = u64::try_from(start).unwrap_or_default();
    (start, start + 24 * 3600 * 1000)
}

/// Refuses a turn that would call a model (a new task, a follow-up, an automatic correction)
/// once the day's spend reached `limits.max_cost_usd_per_day`. Turns already running go on.
/// `spent` is the day's spend so far, as the state directory's ledger has it.
pub(in crate::tasks) fn within_daily_cap(config: &Config, spent: f64) -> Result<(), TaskError> {
    let Some(cap) = config.limits.max_cost_usd_per_day else {
        return Ok(());
    };
    let (_, tomorrow) = today_utc();
    if spent < cap {
        return Ok(());
    }
    let now = crate::tasks::model::epoch_ms(std::time::SystemTime::now());
    let left = std::time::Duration::from_secs(tomorrow.saturating_sub(now) / 60_000 * 60);
    Err(TaskError::BudgetExceeded(format!(
        "today's recorded spend, ${spent:.4}, reached limits.max_cost_usd_per_day (${cap}): \
         no new task, follow-up or correction until it resets at 00:00 UTC (in {}); running \
         turns go on",
        humantime::format_duration(left)
    )))
}

/// Why no further round of a host turn may be sent (a structured answer's correction, a checks'
/// fix round) once it has spent `usd` and `tokens` under `budget`: a cap is reached, and a
/// round would be stopped at its first step.
pub fn reached(budget: &Budget, usd: f64, tokens: u64) -> Option<String> {
    let reached = budget.max_cost_usd.is_some_and(|cap| usd >= cap)
        || budget.max_tokens.is_some_and(|cap| tokens >= cap);
    reached.then(|| {
        budget
            .passed_by(usd, tokens)
            .unwrap_or_else(|| format!("it reached its caps (${usd:.4}, {tokens} tokens)"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(limit: Option<f64>, tier: Option<f64>) -> Config {
        let mut c = crate::gateway::test_config();
        c.limits.max_cost_usd = limit;
        c.limits.max_tokens = Some(1_000);
        if let Some(t) = c.tiers.first_mut() {
            t.max_cost_usd = tier;
        }
        c
    }

    /// The lowest cap wins, a call may lower any, and a call above the one in force is refused
    /// naming where that cap comes from.
    #[test]
    fn a_tasks_caps_are_the_lowest_and_a_call_only_lowers_them() {
        let fast = crate::gateway::test_config()
            .tiers
            .first()
            .map(|t| t.name.clone())
            .expect("a tier");
        let call = |cost: Option<f64>, tokens: Option<u64>| Budget {
            max_cost_usd: cost,
            max_tokens: tokens,
        };
        let c = config(Some(2.0), Some(0.5));
        let caps_of = |tier: Option<&str>, b| caps(&c, tier, b);
        assert_eq!(
            caps_of(Some(&fast), Budget::default()).ok(),
            Some(call(Some(0.5), Some(1_000)))
        );
        assert_eq!(
            caps_of(None, call(Some(1.0), None)).ok(),
            Some(call(Some(1.0), Some(1_000)))
        );
        let above_tier = caps_of(Some(&fast), call(Some(1.0), None))
            .expect_err("above the tier")
            .to_string();
        assert!(
            above_tier.contains(&format!("tier `{fast}`")),
            "{above_tier}"
        );
        let above_limits = caps_of(None, call(None, Some(5_000)))
            .expect_err("above limits")
            .to_string();
        assert!(above_limits.contains("limits.max_tokens"), "{above_limits}");
        // No cap in force: a call sets one.
        let open = config(None, None);
        assert_eq!(
            caps(&open, None, call(Some(3.0), None)).ok(),
            Some(call(Some(3.0), Some(1_000)))
        );
    }

    /// Passing a cap stops a turn; reaching one stops the next round from being sent.
    #[test]
    fn a_cap_is_passed_above_it_and_reached_at_it() {
        let cap = Budget {
            max_cost_usd: Some(0.4),
            max_tokens: Some(100),
        };
        let why = cap.passed_by(0.5, 27).expect("over");
        assert!(why.contains("max_cost_usd"), "{why}");
        assert!(
            cap.passed_by(0.4, 27).is_none(),
            "reaching a cap is not passing it"
        );
        assert!(reached(&cap, 0.4, 27).is_some(), "the cost cap is reached");
        assert!(
            reached(&cap, 0.1, 100).is_some(),
            "the token cap is reached"
        );
        assert_eq!(reached(&cap, 0.1, 99), None);
        assert_eq!(reached(&Budget::default(), 9.0, 9_999), None, "no caps");
    }
}
