//! What the gateway knows of a task's running turn beside its record, in memory only: its
//! progress, the asks it showed, what it has spent so far (summed from the event stream).

use super::super::model::RetryInfo;
use super::stream::StreamedTurn;
use super::turn::ReplySeen;
use crate::opencode::ErrorInfo;
use crate::tasks::spend::spending::Spending;
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
    /// What the turn has spent so far, from the stream (see `spend/spending.rs`).
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
        }
    }
}
