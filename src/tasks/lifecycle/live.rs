//! What the gateway knows of a task's running turn beside its record, in memory only: its
//! progress, the asks it showed, what it has spent so far (summed from the event stream).

use super::super::model::RetryInfo;
use super::stream::StreamedTurn;
use super::turn::ReplySeen;
use crate::opencode::ErrorInfo;
use crate::opencode::Tokens;
use std::collections::HashMap;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the gateway knows about a task's current turn that is not worth saving: progress fed by
/// events, and the monotonic clocks durations are measured with.
#[derive(Debug, Clone)]
pub struct Live {
    pub turn_started: Instant,
    pub finished_at: Option<Instant>,
    /// When a call last read or changed the task: a finished task leaves memory only once it
    /// has been finished *and* unused for the memory TTL, so one just read back from disk for a
    /// follow-up, an apply or a discard stays while that operation runs.
    pub last_used: Instant,
    /// Cancels the turn's `timeouts.task` timer (`abort.rs`): the timer task goes when the turn
    /// ends, instead of sleeping out the whole deadline (30 minutes by default) for every turn
    /// that ended long before, which made memory grow with history at a steady rate.
    pub deadline: Option<CancellationToken>,
    /// A `session.error` seen during this turn (async failures arrive only this way).
    pub session_error: Option<ErrorInfo>,
    /// The newest assistant message of the turn, as the event stream reported it.
    pub latest_reply: Option<ReplySeen>,
    /// The turn's messages as the event stream showed them (see `stream.rs`).
    pub streamed: StreamedTurn,
    /// What the turn has spent so far, from the stream (see `spend/caps.rs`).
    pub spending: Spending,
    pub current_tool: Option<(String, Option<String>)>,
    pub text_tail: String,
    pub steps: u32,
    pub tools_run: u32,
    pub retry: Option<RetryInfo>,
    pub last_event: Instant,
    /// What is known of each pending ask (by id) beyond the record. Not saved: after a restart
    /// an ask is news again.
    pub asks: HashMap<String, AskSeen>,
    /// Confirmed-idle checks in a row that found this turn's newest step unfinished: the step's
    /// id, how many checks, since when (see [`super::turn::abandoned`]).
    pub unfinished: Option<(String, u32, Instant)>,
    /// Set on a view of another live gateway's unfinished task read from its record (see
    /// [`Registry::get`]): its owner's pid. Such a view is never held in memory nor changed.
    pub foreign: Option<u32>,
    /// The turn's spend as last written to the day's ledger.
    pub ledgered: f64,
}

/// What the gateway knows of one pending permission ask beyond the record.
#[derive(Debug, Clone, Copy)]
pub struct AskSeen {
    /// When the ask was recorded: a permission list read before that cannot clear it.
    pub since: Instant,
    /// Shown to the host (in a status or the return of a wait): a wait returns early only for
    /// an ask the host has not been shown yet.
    pub shown: bool,
}

impl AskSeen {
    pub(in crate::tasks) fn now() -> Self {
        Self {
            since: Instant::now(),
            shown: false,
        }
    }
}

impl Live {
    pub(in crate::tasks) fn new(turn_started: Instant) -> Self {
        Self {
            turn_started,
            finished_at: None,
            last_used: Instant::now(),
            deadline: None,
            session_error: None,
            latest_reply: None,
            streamed: StreamedTurn::default(),
            spending: Spending::default(),
            current_tool: None,
            text_tail: String::new(),
            steps: 0,
            tools_run: 0,
            retry: None,
            last_event: Instant::now(),
            asks: HashMap::new(),
            unfinished: None,
            foreign: None,
            ledgered: 0.0,
        }
    }
}

/// What the current turn has spent so far, per assistant message (its own session's and its
/// subagents'), as the newest `message.updated` of each reported it.
#[derive(Debug, Clone, Default)]
pub struct Spending {
    by_message: HashMap<String, (f64, u64)>,
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
}

/// Every token a message used, as the caps count them.
pub fn total_tokens(t: &Tokens) -> u64 {
    t.input
        .saturating_add(t.output)
        .saturating_add(t.reasoning)
        .saturating_add(t.cache_read)
        .saturating_add(t.cache_write)
}
