//! Moving a task to another model in the same session: when its checks still fail after the
//! fix rounds (`checks`), or when its model fails with a provider error that OpenCode's own
//! retries did not clear (a rate limit, an overload, a server error).
//!
//! On a provider error the next model is the tier's next `fallback_models` entry the server
//! offers, then the tier's `escalate_to` tier (its models, then its own fallbacks). Each model
//! and each tier is used at most once per task, so a chain always ends. The turn that failed is
//! held meanwhile (the task stays `running`, its error in `Live::outage`), and the next turn is
//! opened through the one turn-opening path (`follow::open_turn`), so it is capped and timed like
//! any other; the task's caps and the daily cap apply to the whole chain. Each move is an
//! [`Escalation`] in the record, shown with the result. A restarted gateway reads the failed turn
//! again and makes the same move.

use std::sync::Arc;

use crate::config::Config;
use crate::opencode::{ErrorInfo, Server};
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::entry::{Claim, TaskEntry};
use crate::tasks::lifecycle::record::TaskRecord;
use crate::tasks::model::{Escalation, TaskStatus};
use crate::tasks::turn::follow::{open_turn, Follows};

/// Where a task goes next after a provider error.
#[derive(Debug, Clone, PartialEq)]
pub struct NextModel {
    /// The tier it runs under then.
    pub tier: String,
    pub model: Option<String>,
    pub variant: Option<String>,
    /// That tier's caps (with `limits`'): a move tightens the task's caps to them, never
    /// loosens them.
    pub caps: crate::config::Budget,
}

impl NextModel {
    /// Why the move cannot be made: the task already spent what the caps it would run under
    /// (its own, tightened to the tier's) allow.
    pub fn spent_past(&self, e: &TaskEntry) -> Option<String> {
        let caps = e.rec.budget.unwrap_or_default().tightest(self.caps);
        let (usd, tokens) = e.budget_spend();
        let reached = caps.max_cost_usd.is_some_and(|cap| usd >= cap)
            || caps.max_tokens.is_some_and(|cap| tokens >= cap);
        reached.then(|| {
            let what = caps
                .passed_by(usd, tokens)
                .unwrap_or_else(|| format!("it reached the caps (${usd:.4}, {tokens} tokens)"));
            format!("the move to tier `{}` was not made: {what}", self.tier)
        })
    }
}

/// Whether a turn that failed with `error` is held for a move to another model: a provider
/// outage, on a tier that names a fallback model or a tier to escalate to.
pub fn wants_move(config: &Config, rec: &TaskRecord, error: Option<&ErrorInfo>) -> bool {
    let Some(tier) = rec
        .tier
        .as_deref()
        .and_then(|t| config.tiers.iter().find(|x| x.name == t))
    else {
        return false;
    };
    error.is_some_and(ErrorInfo::is_provider_outage)
        && (!tier.fallback_models.is_empty() || tier.escalate_to.is_some())
}

/// The models already used by the task (the one it ran on first and every move's).
fn used(rec: &TaskRecord) -> Vec<String> {
    let mut out: Vec<String> = rec.model.iter().cloned().collect();
    for e in &rec.escalations {
        out.extend(e.from_model.iter().cloned());
        out.extend(e.model.iter().cloned());
    }
    out
}

/// Candidates after a provider error, in order: the tier's unused fallbacks, then (each tier
/// once) its `escalate_to` tier's models and fallbacks, and so on.
fn candidates(config: &Config, rec: &TaskRecord) -> Vec<(String, Option<String>)> {
    let used = used(rec);
    let mut visited: Vec<String> = rec.escalations.iter().map(|e| e.from.clone()).collect();
    let mut out = Vec::new();
    let mut tier = rec
        .tier
        .as_deref()
        .and_then(|t| config.tiers.iter().find(|x| x.name == t));
    let mut first = true;
    while let Some(t) = tier {
        if visited.contains(&t.name) && !first {
            break;
        }
        visited.push(t.name.clone());
        let models = if first {
            t.fallback_models.clone()
        } else {
            t.models.iter().chain(&t.fallback_models).cloned().collect()
        };
        if !first && models.is_empty() {
            // A tier naming no model runs on the server's default.
            out.push((t.name.clone(), None));
        }
        for m in models {
            if !used.contains(&m) && !out.iter().any(|(_, o)| o.as_deref() == Some(m.as_str())) {
                out.push((t.name.clone(), Some(m)));
            }
        }
        first = false;
        tier = t
            .escalate_to
            .as_deref()
            .and_then(|to| config.tiers.iter().find(|x| x.name == to));
    }
    out
}

/// Tier `tier` on this server, resolved as a start resolves it: `model` when given (a fallback),
/// else the first of the tier's models the server offers (or its default for a tier naming none).
pub(in crate::tasks) async fn on_tier(
    config: &Config,
    server: &Server,
    rec: &TaskRecord,
    tier: &str,
    model: Option<&str>,
) -> Result<NextModel, crate::tasks::error::TaskError> {
    let choice = crate::tasks::resolve::choose(
        config,
        server,
        &rec.directory,
        rec.agent.as_deref(),
        model,
        model.is_none().then_some(tier),
        None,
    )
    .await?;
    let tier_caps = config.tier(tier).map(|t| t.budget()).unwrap_or_default();
    Ok(NextModel {
        tier: tier.to_string(),
        model: choice.model.or(model.map(str::to_string)),
        variant: choice.variant,
        caps: config.limits.budget().tightest(tier_caps),
    })
}

/// The first candidate the server offers.
async fn next_model(config: &Config, server: &Server, rec: &TaskRecord) -> Option<NextModel> {
    for (tier, model) in candidates(config, rec) {
        match on_tier(config, server, rec, &tier, model.as_deref()).await {
            Ok(next) => return Some(next),
            Err(e) => {
                tracing::info!(task_id = %rec.id, tier, ?model, error = %e, "fallback model not offered; trying the next");
            }
        }
    }
    None
}

/// Records the move of the task to `next` as the turn after `turn` opens (called under the
/// registry lock by the turn's `prepare`, so a turn that cannot be sent leaves no record of it).
pub(in crate::tasks) fn record_move(e: &mut TaskEntry, next: NextModel, why: String, turn: u32) {
    e.rec.spend.leave(e.rec.tier.clone(), e.rec.model.clone());
    e.rec.escalations.push(Escalation {
        from: e.rec.tier.clone().unwrap_or_default(),
        to: next.tier.clone(),
        from_model: e.rec.model.clone(),
        model: next.model,
        why,
        turn: turn + 1,
    });
    let caps = e.rec.budget.unwrap_or_default().tightest(next.caps);
    e.rec.budget = (!caps.is_unlimited()).then_some(caps);
    e.rec.tier = Some(next.tier);
    e.rec.variant = next.variant;
}

/// The prompt of the turn that carries on after a provider error. It names the error's kind
/// and status only: the provider's message is not the agent's business (and is not ours to
/// forward into a prompt).
fn carry_on_prompt(error: &ErrorInfo) -> String {
    let status = error
        .provider_status
        .map(|s| format!(" {s}"))
        .unwrap_or_default();
    format!(
        "The model that worked on this task before you stopped on a provider error ({}{status}). \
         Carry on with the task from where it stopped; the conversation above is the work so far.",
        error.name
    )
}

/// Moves the task whose turn `turn` failed with a provider outage (held, its error saved with
/// the hold) to the next model, or ends it failed with that error when there is none
/// (or its caps are reached, or the next turn could not be sent).
pub async fn settle_outage(ctx: &TaskContext, server: &Arc<Server>, task_id: &str, turn: u32) {
    let Some(entry) = ctx.registry.get(task_id).filter(|e| e.is_checking(turn)) else {
        return;
    };
    let Some(error) = entry.rec.outage().cloned() else {
        return;
    };
    let config = ctx.config.get();
    let fail = |e: &mut TaskEntry, error: ErrorInfo| {
        e.finish(Claim::Checked(turn), TaskStatus::Failed, Some(error));
    };
    if entry.caps_reached().is_some() {
        ctx.registry.update(task_id, |e| fail(e, error.clone()));
        return;
    }
    let Some(next) = next_model(&config, server, &entry.rec).await else {
        ctx.registry.update(task_id, |e| {
            if e.is_checking(turn) {
                fail(e, error.clone());
            }
        });
        return;
    };
    if let Some(why) = next.spent_past(&entry) {
        ctx.registry.update(task_id, |e| {
            if e.is_checking(turn) {
                let mut error = error.clone();
                error.message = format!("{}; {why}", error.message);
                fail(e, error);
            }
        });
        return;
    }
    let why = format!(
        "provider error: {}{}: {}",
        error.name,
        error
            .provider_status
            .map(|s| format!(" ({s})"))
            .unwrap_or_default(),
        error.message.chars().take(300).collect::<String>()
    );
    let prompt = carry_on_prompt(&error);
    let model = next.model.clone();
    let opened = open_turn(
        ctx,
        server,
        task_id,
        turn,
        Follows::Correction,
        &prompt,
        entry.rec.agent.clone(),
        model,
        |e| record_move(e, next, why, turn),
    )
    .await;
    match opened {
        Ok(_) => {}
        Err(err) => {
            tracing::warn!(task_id, error = %err, "the turn on the next model could not be sent");
            ctx.registry.update(task_id, |e| {
                if e.is_checking(turn) {
                    let mut error = error.clone();
                    error.message =
                        format!("{}; moving to another model failed: {err}", error.message);
                    fail(e, error);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::spend::spent::TaskSpend;

    fn config() -> Config {
        let mut c = crate::gateway::test_config();
        c.tiers[0].models = vec!["p/cheap".into()];
        c.tiers[0].fallback_models = vec!["p/cheap-2".into(), "p/cheap".into()];
        c.tiers[0].escalate_to = Some(c.tiers[2].name.clone());
        c.tiers[2].models = vec!["p/strong".into()];
        c.tiers[2].escalate_to = Some(c.tiers[0].name.clone());
        c
    }

    /// A move tightens the task's caps to the tier it moves to, never loosens them, and is not
    /// made once the caps it would run under are spent.
    #[test]
    fn a_move_tightens_the_caps_and_is_not_made_once_they_are_spent() {
        let mut c = config();
        c.tiers[2].max_cost_usd = Some(0.25);
        let strong = c.tiers[2].name.clone();
        let next = NextModel {
            tier: strong.clone(),
            model: Some("p/strong".into()),
            variant: None,
            caps: c.limits.budget().tightest(c.tiers[2].budget()),
        };
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        e.rec.budget = Some(crate::config::Budget {
            max_cost_usd: Some(1.0),
            max_tokens: Some(5000),
        });
        assert_eq!(next.spent_past(&e), None);
        e.rec.spend = TaskSpend::with(Default::default(), Vec::new(), (0.3, 10));
        let why = next.spent_past(&e).expect("the tier's cap is spent");
        assert!(
            why.contains(&strong) && why.contains("max_cost_usd"),
            "{why}"
        );
        e.rec.spend = TaskSpend::with(Default::default(), Vec::new(), (0.1, 10));
        record_move(&mut e, next, "checks still fail".into(), 1);
        let caps = e.rec.budget.expect("caps");
        assert_eq!(caps.max_cost_usd, Some(0.25), "tightened to the tier's");
        assert_eq!(caps.max_tokens, Some(5000), "the task's own kept");
        assert_eq!(e.rec.tier.as_deref(), Some(strong.as_str()));
    }

    /// The segment of the tier and model a task leaves is closed by the opening of the turn on
    /// the next one, in the same change: with what the left turn spent, and not at all when
    /// that turn is never opened.
    #[test]
    fn the_segment_left_closes_as_the_next_turn_opens() {
        use crate::tasks::lifecycle::phase::Held;
        let c = config();
        let next = NextModel {
            tier: c.tiers[2].name.clone(),
            model: Some("p/strong".into()),
            variant: None,
            caps: c.limits.budget(),
        };
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        e.rec.tier = Some(c.tiers[0].name.clone());
        e.rec.model = Some("p/fast".into());
        e.rec.outcome = Some(crate::tasks::lifecycle::turn::TurnState {
            cost: 0.5,
            ..Default::default()
        });
        assert!(e.hold(Held::Checks, None));
        let before = e.clone();
        record_move(&mut e, next, "checks still fail".into(), 1);
        assert!(
            e.rec.spend.segments().is_empty(),
            "not before the turn opens"
        );
        e.begin_correction(1, "msg_2".into(), None, Some("p/strong".into()))
            .expect("a held turn opens a correction");
        assert_eq!(e.rec.spend.segments().len(), 1, "{:?}", e.rec.spend);
        let s = &e.rec.spend.segments()[0];
        assert_eq!(
            (s.tier.as_deref(), s.model.as_deref(), s.spent.cost),
            (Some(c.tiers[0].name.as_str()), Some("p/fast"), 0.5)
        );
        // A turn that could not be sent is undone whole: no segment is left behind.
        assert!(before.rec.spend.segments().is_empty() && !before.rec.spend.is_leaving());
    }

    #[test]
    fn a_provider_outage_tries_the_fallbacks_then_the_stronger_tier_each_once() {
        let c = config();
        let (fast, strong) = (c.tiers[0].name.clone(), c.tiers[2].name.clone());
        let mut rec = TaskRecord::new(
            "t".into(),
            "s".into(),
            "ses".into(),
            "/w".into(),
            "x".into(),
        );
        rec.tier = Some(fast.clone());
        rec.model = Some("p/cheap".into());
        let outage = ErrorInfo {
            name: "APIError".into(),
            message: "overloaded".into(),
            provider_status: Some(529),
            retryable: None,
        };
        assert!(wants_move(&c, &rec, Some(&outage)));
        let refused = ErrorInfo {
            provider_status: Some(400),
            ..outage.clone()
        };
        assert!(
            !wants_move(&c, &rec, Some(&refused)),
            "a refused request is not an outage"
        );
        assert_eq!(
            candidates(&c, &rec),
            [
                (fast.clone(), Some("p/cheap-2".to_string())),
                (strong.clone(), Some("p/strong".to_string()))
            ]
        );
        // After the fallback was used, only the stronger tier is left; after that, nothing
        // (the cycle back to `fast` ends).
        rec.escalations.push(Escalation {
            from: fast.clone(),
            to: fast.clone(),
            from_model: Some("p/cheap".into()),
            model: Some("p/cheap-2".into()),
            why: String::new(),
            turn: 2,
        });
        rec.model = Some("p/cheap-2".into());
        assert_eq!(
            candidates(&c, &rec),
            [(strong.clone(), Some("p/strong".to_string()))]
        );
        rec.escalations.push(Escalation {
            from: fast.clone(),
            to: strong.clone(),
            from_model: Some("p/cheap-2".into()),
            model: Some("p/strong".into()),
            why: String::new(),
            turn: 3,
        });
        rec.tier = Some(strong);
        rec.model = Some("p/strong".into());
        assert_eq!(candidates(&c, &rec), []);
    }

    /// A held provider failure with nowhere to go (the server offers none of the candidates, or
    /// the caps are reached) ends failed with the provider's error, unchanged.
    #[tokio::test]
    async fn an_outage_with_nowhere_to_go_fails_with_the_providers_error() {
        use crate::tasks::context::fixtures;
        for capped in [false, true] {
            let registry = fixtures::registry_with(|e| {
                e.rec.tier = Some("fast".into());
                e.rec.model = Some("p/cheap".into());
                // The failed turn as the completion check read it.
                e.rec.outcome = Some(crate::tasks::lifecycle::turn::TurnState::default());
                if capped {
                    e.rec.budget = Some(crate::config::Budget {
                        max_cost_usd: None,
                        max_tokens: Some(0),
                    });
                }
            });
            let ctx = fixtures::context(registry.clone());
            let mut config = config();
            config.tiers[0].name = "fast".into();
            ctx.config.set(std::sync::Arc::new(config));
            let server = Arc::new(fixtures::unreachable_server());
            let outage = ErrorInfo {
                name: "APIError".into(),
                message: "overloaded".into(),
                provider_status: Some(529),
                retryable: Some(true),
            };
            let held = registry.update("tsk_a", |e| {
                crate::tasks::checks::hold::hold(
                    e,
                    TaskStatus::Failed,
                    Some(&outage),
                    &ctx.config.get(),
                )
            });
            assert_eq!(
                held,
                Some(crate::tasks::checks::hold::Hold::Held(1)),
                "capped {capped}"
            );
            assert_eq!(
                registry.get("tsk_a").map(|e| e.rec.status()),
                Some(TaskStatus::Running),
                "held, not failed"
            );
            crate::tasks::checks::hold::settle(&ctx, &server, "tsk_a", 1).await;
            let e = registry.get("tsk_a").expect("task");
            assert_eq!(e.rec.status(), TaskStatus::Failed, "capped {capped}");
            assert_eq!(e.rec.error.as_ref(), Some(&outage), "capped {capped}");
            assert!(e.rec.escalations.is_empty() && e.rec.outage().is_none());
        }
    }
}
