//! A task's turn, decided in one place.
//!
//! A *turn* is everything OpenCode does in a session after the user message we sent: we pass our
//! own `messageID` with every prompt, and OpenCode's message ids ascend, so the turn is every
//! message after ours. It is *not* only the assistant messages whose `parentID` is ours:
//!
//! - **Auto-compaction** (observed on OpenCode 1.18.33): when a step's tokens approach the model's
//!   context limit, OpenCode writes a user message of its own holding a `compaction` part, asks
//!   the hidden `compaction` agent for a summary (an assistant message with `summary: true`),
//!   adds a synthetic user message ("Continue if you have next steps…") and asks the model again.
//!   The final answer is parented to that synthetic message. The session stays busy throughout
//!   and goes idle once, at the end.
//! - **Subagents** run in child sessions (a session whose `parentID` is the task's session); their
//!   messages are not in the parent's list, but their permission asks and activity belong to the
//!   parent task (the tracker maps child sessions to their task; this module only sees messages).
//!
//! The turn is over when the session is idle **and** its newest assistant message has
//! `time.completed` with a terminal finish (anything but `tool-calls`), or carries an error. A
//! compaction summary is never the end of a turn: OpenCode asks the model again after it. The
//! answer is the text of the newest assistant message that is not a summary; tokens and cost sum
//! over the whole turn, the summary steps included (and also reported apart).
//!
//! Everything here is pure: no I/O, no clock. The tracker feeds it messages read over HTTP
//! ([`derive`]) and replies seen on the event stream ([`ReplySeen`]); both reach their verdict
//! through [`conclude`], so "this task is finished, and this is its answer" has one definition.

use serde::{Deserialize, Serialize};

use crate::opencode::{is_terminal_finish, ErrorInfo, MessageView, Role, Tokens, ToolCall};
use crate::tasks::model::TaskStatus;

/// The state of one turn, derived from the session's messages. This is what a finished task's
/// result reports, and what is stored with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnState {
    /// Our user message is in the session.
    pub user_message_seen: bool,
    /// Assistant messages after our user message (summaries included).
    pub assistant_messages: usize,
    /// The newest of them has `time.completed` with a terminal finish, or an error, and is not a
    /// compaction summary.
    pub finished: bool,
    /// The newest of them has `time.completed` (whatever its finish). Completed with
    /// `tool-calls` while the session is idle means the agent loop stopped after a tool call
    /// without a final answer (a rejected permission does this).
    pub latest_completed: bool,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
    /// Text of the newest assistant message that is not a compaction summary.
    pub text: String,
    pub model: Option<String>,
    pub agent: Option<String>,
    /// Summed over every assistant message of the turn, compaction summaries included.
    pub tokens: Tokens,
    /// USD, summed like `tokens`.
    pub cost: f64,
    pub tools: Vec<ToolCall>,
    /// Completed steps (assistant messages with `time.completed`).
    pub steps: u32,
    /// Epoch ms the newest assistant message completed.
    pub completed_at: Option<u64>,
    /// `text` was cut at the gateway's `limits.max_result_chars`.
    #[serde(default)]
    pub text_capped: bool,
    /// How often OpenCode compacted the context during the turn.
    #[serde(default)]
    pub compactions: u32,
    /// The part of `tokens` spent writing compaction summaries.
    #[serde(default)]
    pub compaction_tokens: Tokens,
    /// The turn had more messages than the gateway reads back: our user message was not among
    /// them, and `tokens`, `cost`, `steps` and `tools` count the newest messages only. The verdict
    /// and the answer are unaffected (they come from the newest messages).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub messages_capped: bool,
    /// The newest message id of the session seen in the read (ours or OpenCode's): the next
    /// message id we mint must sort above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_message_id: Option<String>,
}

impl TurnState {
    /// The turn's newest step has neither completed nor failed (it is streaming, or its
    /// OpenCode stopped in the middle of it).
    pub fn newest_step_unfinished(&self) -> bool {
        self.assistant_messages > 0 && !self.latest_completed && self.error.is_none()
    }

    /// Keeps at most `max` characters of the text (memory and state files stay bounded).
    pub fn cap_text(mut self, max: usize) -> Self {
        if let Some((cut, _)) = self.text.char_indices().nth(max) {
            self.text.truncate(cut);
            self.text_capped = true;
        }
        self
    }
}

/// Derives the turn opened by `user_message_id` from a session's messages, oldest first (the
/// order OpenCode lists them in). Messages before ours belong to earlier turns; a list that does
/// not contain ours yields a turn with `user_message_seen: false` and nothing else.
pub fn derive(messages: &[MessageView], user_message_id: &str) -> TurnState {
    let mut state = TurnState {
        newest_message_id: messages.iter().map(|m| m.id.clone()).max(),
        ..TurnState::default()
    };
    // Message ids ascend, and ours was minted above every id seen before it: a list whose
    // oldest message is newer than ours was cut by the reader's page limit inside a very long
    // turn. It is judged from what was read (the newest messages decide), and says so.
    let turn = match messages.iter().position(|m| m.id == user_message_id) {
        Some(start) => &messages[start + 1..],
        None if messages
            .first()
            .is_some_and(|m| m.id.as_str() > user_message_id) =>
        {
            state.messages_capped = true;
            messages
        }
        None => return state,
    };
    state.user_message_seen = true;
    let mut newest: Option<&MessageView> = None;
    let mut answer: Option<&MessageView> = None;
    for m in turn {
        match m.role {
            Role::User => {
                if m.compaction {
                    state.compactions += 1;
                    // The answer is what the model said after the last compaction.
                    answer = None;
                }
            }
            Role::Assistant => {
                state.assistant_messages += 1;
                state.cost += m.cost;
                state.tokens.add(&m.tokens);
                if m.summary {
                    state.compaction_tokens.add(&m.tokens);
                }
                if m.completed {
                    state.steps += 1;
                }
                state.tools.extend(m.tools.iter().cloned());
                newest = Some(m);
                if !m.summary {
                    answer = Some(m);
                }
            }
            Role::Other => {}
        }
    }
    if let Some(last) = newest {
        state.finish = last.finish.clone();
        state.error = last.error.clone();
        state.completed_at = last.completed_at;
        state.latest_completed = last.completed;
        state.finished = reply_ends_turn(
            last.completed,
            last.finish.as_deref(),
            last.error.is_some(),
            last.summary,
        );
    }
    if let Some(a) = answer.or(newest) {
        state.model = a.model.clone();
        state.agent = a.agent.clone();
        if answer.is_some() {
            state.text = a.text.clone();
        }
    }
    state
}

/// The turn (see [`derive`]) from the JSON text of a `GET /session/{id}/message` answer, decoded
/// exactly as the live client decodes it. For tests and fuzzing.
pub fn from_messages_json(json: &str, user_message_id: &str) -> Result<TurnState, String> {
    Ok(derive(
        &crate::opencode::messages_from_json(json)?,
        user_message_id,
    ))
}

/// The one rule for "this assistant message ends the turn": it failed, or it completed with a
/// terminal finish and is not a compaction summary (OpenCode always asks the model again after
/// one).
pub fn reply_ends_turn(completed: bool, finish: Option<&str>, failed: bool, summary: bool) -> bool {
    failed || (completed && !summary && finish.is_some_and(is_terminal_finish))
}

/// The newest assistant message of the current turn, as the event stream reported it. When the
/// session goes idle with this final, the turn is over without a round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplySeen {
    pub message_id: String,
    pub completed: bool,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
    pub summary: bool,
    pub agent: Option<String>,
    /// `provider/model`.
    pub model: Option<String>,
}

impl ReplySeen {
    pub fn ends_turn(&self) -> bool {
        reply_ends_turn(
            self.completed,
            self.finish.as_deref(),
            self.error.is_some(),
            self.summary,
        )
    }

    /// Whether an assistant message `message_id` of the task's own session belongs to the turn
    /// opened by `user_message_id` (ids ascend, so later messages sort above ours).
    pub fn in_turn(message_id: &str, user_message_id: &str) -> bool {
        message_id > user_message_id
    }
}

/// How a turn ended, when it did.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub status: TaskStatus,
    pub error: Option<ErrorInfo>,
}

/// What is known about the session's activity when a turn is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Busy or retrying: the turn goes on.
    No,
    /// An idle event said so. It may be stale (the previous turn's idle can arrive after a
    /// continue), so it is enough only for a turn whose final reply is already there.
    Reported,
    /// A status read made for this judgement says idle.
    Confirmed,
}

/// How long an idle session may show no sign of our prompt before the turn is declared lost.
/// OpenCode marks a session busy before `prompt_async` answers, so on a healthy server this is
/// never reached; it guards against a prompt OpenCode dropped.
pub const NOT_STARTED_GRACE_MS: u64 = 10_000;

/// The verdict on a turn read over HTTP: `None` means "not over yet". `session_error` is a
/// `session.error` seen during the turn (an async prompt's failure can leave no assistant
/// message at all, e.g. an unknown model); `age_ms` is the time since the prompt was sent.
pub fn conclude(
    turn: &TurnState,
    idle: Idle,
    session_error: Option<&ErrorInfo>,
    age_ms: u64,
) -> Option<Verdict> {
    if idle == Idle::No {
        return None;
    }
    if turn.finished {
        return Some(Verdict {
            status: if turn.error.is_some() {
                TaskStatus::Failed
            } else {
                TaskStatus::Completed
            },
            error: turn.error.clone(),
        });
    }
    // Every other ending is read from an absence, which a stale idle cannot prove.
    if idle != Idle::Confirmed {
        return None;
    }
    let failed = |name: &str, message: &str| {
        Some(Verdict {
            status: TaskStatus::Failed,
            error: Some(ErrorInfo {
                provider_status: None,
                retryable: None,
                name: name.into(),
                message: message.into(),
            }),
        })
    };
    if let Some(error) = session_error {
        return Some(Verdict {
            status: TaskStatus::Failed,
            error: Some(error.clone()),
        });
    }
    if turn.latest_completed {
        // The loop ended after a tool step (or a summary) with no final answer.
        return failed(
            "TurnStopped",
            "the agent stopped after a tool call without a final answer (was a permission rejected?)",
        );
    }
    if age_ms < NOT_STARTED_GRACE_MS || turn.assistant_messages > 0 {
        return None;
    }
    if turn.user_message_seen {
        failed(
            "TurnNotStarted",
            "OpenCode recorded the prompt, but the session is idle and nothing answered it",
        )
    } else {
        failed(
            "PromptLost",
            "OpenCode accepted the prompt, but the session is idle and does not contain it",
        )
    }
}

/// How often, and for how long, checks that confirmed the session idle have found the turn's
/// newest step neither completed nor failed (the same step each time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unfinished {
    pub checks: u32,
    pub for_ms: u64,
}

/// A step that stays unfinished in an idle session this many confirmed checks in a row, over at
/// least [`ABANDONED_AFTER_MS`], was abandoned. OpenCode completes (or fails) a step before the
/// session goes idle, so on a healthy server this never holds for long; it does for good when
/// the OpenCode process died mid-step and came back (an attached server restarted), and only
/// the task's deadline would end the task otherwise.
pub const ABANDONED_AFTER_CHECKS: u32 = 3;
pub const ABANDONED_AFTER_MS: u64 = 10_000;

/// The verdict on a turn [`conclude`] leaves open although the session is confirmed idle: its
/// newest step never completed and never failed, and has stayed so (see [`Unfinished`]).
pub fn abandoned(turn: &TurnState, idle: Idle, stuck: Unfinished) -> Option<Verdict> {
    (idle == Idle::Confirmed
        && turn.newest_step_unfinished()
        && stuck.checks >= ABANDONED_AFTER_CHECKS
        && stuck.for_ms >= ABANDONED_AFTER_MS)
        .then(|| Verdict {
            status: TaskStatus::Failed,
            error: Some(ErrorInfo {
                provider_status: None,
                retryable: None,
                name: "StepAbandoned".into(),
                message: "the session is idle but its last step never completed: the OpenCode server likely stopped in the middle of it; continue the task to try again".into(),
            }),
        })
}

/// The verdict from the event stream alone: idle, and the newest reply of the turn is final.
pub fn conclude_from_events(latest: Option<&ReplySeen>) -> Option<Verdict> {
    let reply = latest.filter(|r| r.ends_turn())?;
    Some(Verdict {
        status: if reply.error.is_some() {
            TaskStatus::Failed
        } else {
            TaskStatus::Completed
        },
        error: reply.error.clone(),
    })
}

/// How a task whose session was deleted behind the gateway's back (`session.deleted`, or a 404
/// on reading it) ends.
pub fn session_deleted(session_id: &str) -> ErrorInfo {
    ErrorInfo {
        provider_status: None,
        retryable: None,
        name: "SessionDeleted".into(),
        message: format!("the task's OpenCode session {session_id} was deleted while the task ran"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: &str) -> MessageView {
        MessageView {
            id: id.into(),
            role: Role::User,
            ..MessageView::default()
        }
    }

    fn compaction_request(id: &str) -> MessageView {
        MessageView {
            compaction: true,
            ..user(id)
        }
    }

    fn reply(id: &str, parent: &str, finish: &str, text: &str) -> MessageView {
        MessageView {
            id: id.into(),
            role: Role::Assistant,
            parent_id: Some(parent.into()),
            completed: true,
            finish: Some(finish.into()),
            text: text.into(),
            agent: Some("build".into()),
            model: Some("fake/fake-model".into()),
            tokens: Tokens {
                input: 100,
                output: 10,
                ..Tokens::default()
            },
            cost: 0.5,
            ..MessageView::default()
        }
    }

    fn summary(id: &str, parent: &str) -> MessageView {
        MessageView {
            summary: true,
            agent: Some("compaction".into()),
            ..reply(id, parent, "stop", "SUMMARY")
        }
    }

    fn running(id: &str, parent: &str) -> MessageView {
        MessageView {
            completed: false,
            finish: None,
            ..reply(id, parent, "", "")
        }
    }

    const ERR: fn() -> ErrorInfo = || ErrorInfo {
        provider_status: None,
        retryable: None,
        name: "APIError".into(),
        message: "bad".into(),
    };

    /// (name, messages, our message, idle, session error) -> expected status (None = not over)
    /// and answer text.
    #[test]
    fn turns_conclude_by_one_rule() {
        type Case = (
            &'static str,
            Vec<MessageView>,
            Idle,
            Option<ErrorInfo>,
            Option<TaskStatus>,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (
                "plain text turn",
                vec![user("m1"), reply("m2", "m1", "stop", "done")],
                Idle::Confirmed,
                None,
                Some(TaskStatus::Completed),
                "done",
            ),
            (
                "tool step then answer",
                vec![
                    user("m1"),
                    reply("m2", "m1", "tool-calls", "let me look"),
                    reply("m3", "m1", "stop", "answer"),
                ],
                Idle::Confirmed,
                None,
                Some(TaskStatus::Completed),
                "answer",
            ),
            (
                "busy: never over",
                vec![user("m1"), reply("m2", "m1", "stop", "done")],
                Idle::No,
                None,
                None,
                "done",
            ),
            (
                "compaction mid-turn: the answer after it, parented to the synthetic message",
                vec![
                    user("m1"),
                    reply("m2", "m1", "tool-calls", "step"),
                    compaction_request("m3"),
                    summary("m4", "m3"),
                    user("m5"),
                    reply("m6", "m5", "stop", "final"),
                ],
                Idle::Confirmed,
                None,
                Some(TaskStatus::Completed),
                "final",
            ),
            (
                "compaction still running: a summary is not the end",
                vec![
                    user("m1"),
                    reply("m2", "m1", "tool-calls", "step"),
                    compaction_request("m3"),
                    summary("m4", "m3"),
                ],
                Idle::No,
                None,
                None,
                "",
            ),
            (
                "stale idle after a continue: the previous turn's reply is not ours",
                vec![user("m0"), reply("m05", "m0", "stop", "old"), user("m1")],
                Idle::Reported,
                None,
                None,
                "",
            ),
            (
                "error then idle",
                vec![user("m1"), {
                    let mut r = reply("m2", "m1", "", "");
                    r.finish = None;
                    r.error = Some(ERR());
                    r
                }],
                Idle::Confirmed,
                None,
                Some(TaskStatus::Failed),
                "",
            ),
            (
                "session error with no reply (unknown model)",
                vec![user("m1")],
                Idle::Confirmed,
                Some(ERR()),
                Some(TaskStatus::Failed),
                "",
            ),
            (
                "rejected permission: stopped after a tool step",
                vec![user("m1"), reply("m2", "m1", "tool-calls", "")],
                Idle::Confirmed,
                None,
                Some(TaskStatus::Failed),
                "",
            ),
            (
                "prompt recorded but never started, session idle",
                vec![user("m1")],
                Idle::Confirmed,
                None,
                Some(TaskStatus::Failed),
                "",
            ),
            (
                "prompt not recorded yet",
                vec![user("m0"), reply("m00", "m0", "stop", "x")],
                Idle::Reported,
                None,
                None,
                "",
            ),
            (
                "step still streaming",
                vec![user("m1"), running("m2", "m1")],
                Idle::Confirmed,
                None,
                None,
                "",
            ),
        ];
        for (name, messages, idle, session_error, expected, text) in cases {
            let turn = derive(&messages, "m1");
            let verdict = conclude(&turn, idle, session_error.as_ref(), NOT_STARTED_GRACE_MS);
            assert_eq!(verdict.map(|v| v.status), expected, "{name}");
            assert_eq!(turn.text, text, "{name}");
        }
    }

    /// A turn longer than what is read back (our message is older than every message read) is
    /// judged from its newest messages and says its counts are partial; a list that simply
    /// lacks our message (older messages only) is still a lost prompt.
    #[test]
    fn a_turn_longer_than_the_read_is_judged_from_its_newest_messages() {
        let cut = derive(
            &[
                reply("m5", "m4", "tool-calls", "step"),
                user("m6"),
                reply("m7", "m6", "stop", "final"),
            ],
            "m1",
        );
        assert!(cut.user_message_seen && cut.finished && cut.messages_capped);
        assert_eq!(cut.text, "final");
        let verdict = conclude(&cut, Idle::Confirmed, None, 60_000).expect("over");
        assert_eq!(verdict.status, TaskStatus::Completed);
        let lost = derive(&[user("m0"), reply("m00", "m0", "stop", "x")], "m1");
        assert!(!lost.user_message_seen && !lost.messages_capped);
        let whole = derive(&[user("m1"), reply("m2", "m1", "stop", "x")], "m1");
        assert!(!whole.messages_capped);
    }

    #[test]
    fn absences_need_a_fresh_idle_and_time() {
        let stopped = derive(&[user("m1"), reply("m2", "m1", "tool-calls", "")], "m1");
        assert!(conclude(&stopped, Idle::Reported, None, 60_000).is_none());
        assert!(conclude(&stopped, Idle::Confirmed, None, 0).is_some());
        let final_reply = derive(&[user("m1"), reply("m2", "m1", "stop", "x")], "m1");
        assert!(conclude(&final_reply, Idle::Reported, None, 0).is_some());
        let silent = derive(&[user("m1")], "m1");
        assert!(conclude(&silent, Idle::Confirmed, None, 1_000).is_none());
        let lost = derive(&[user("m0")], "m1");
        let verdict = conclude(&lost, Idle::Confirmed, None, 60_000).expect("lost");
        assert_eq!(verdict.error.map(|e| e.name).as_deref(), Some("PromptLost"));
    }

    /// An idle session whose newest step never completed (its OpenCode died mid-step) is
    /// concluded after enough confirmed checks over enough time, never from one check, a
    /// remembered idle, or a step that did complete.
    #[test]
    fn a_step_left_unfinished_in_an_idle_session_is_abandoned_after_a_while() {
        let stuck = derive(&[user("m1"), running("m2", "m1")], "m1");
        assert!(conclude(&stuck, Idle::Confirmed, None, 60_000).is_none());
        let long = Unfinished {
            checks: ABANDONED_AFTER_CHECKS,
            for_ms: ABANDONED_AFTER_MS,
        };
        let verdict = abandoned(&stuck, Idle::Confirmed, long).expect("abandoned");
        assert_eq!(verdict.status, TaskStatus::Failed);
        assert_eq!(
            verdict.error.map(|e| e.name).as_deref(),
            Some("StepAbandoned")
        );
        let few = Unfinished {
            checks: ABANDONED_AFTER_CHECKS - 1,
            ..long
        };
        let quick = Unfinished {
            for_ms: ABANDONED_AFTER_MS - 1,
            ..long
        };
        for (name, turn, idle, seen) in [
            ("too few checks", &stuck, Idle::Confirmed, few),
            ("too short", &stuck, Idle::Confirmed, quick),
            ("a remembered idle", &stuck, Idle::Reported, long),
            (
                "nothing answered yet",
                &derive(&[user("m1")], "m1"),
                Idle::Confirmed,
                long,
            ),
            (
                "a completed step",
                &derive(&[user("m1"), reply("m2", "m1", "tool-calls", "")], "m1"),
                Idle::Confirmed,
                long,
            ),
        ] {
            assert!(abandoned(turn, idle, seen).is_none(), "{name}");
        }
    }

    #[test]
    fn compaction_tokens_are_summed_and_labelled() {
        let turn = derive(
            &[
                user("m1"),
                reply("m2", "m1", "tool-calls", "step"),
                compaction_request("m3"),
                summary("m4", "m3"),
                user("m5"),
                reply("m6", "m5", "stop", "final"),
            ],
            "m1",
        );
        assert_eq!(turn.compactions, 1);
        assert_eq!(turn.assistant_messages, 3);
        assert_eq!(turn.tokens.input, 300);
        assert_eq!(turn.compaction_tokens.input, 100);
        assert!((turn.cost - 1.5).abs() < 1e-9);
        assert_eq!(
            turn.agent.as_deref(),
            Some("build"),
            "not the compaction agent"
        );
        assert_eq!(turn.newest_message_id.as_deref(), Some("m6"));
    }

    #[test]
    fn events_conclude_only_on_a_final_non_summary_reply() {
        let seen = |finish: &str, summary: bool| ReplySeen {
            message_id: "m2".into(),
            completed: true,
            finish: Some(finish.into()),
            error: None,
            summary,
            agent: None,
            model: None,
        };
        assert!(conclude_from_events(Some(&seen("stop", false))).is_some());
        assert!(conclude_from_events(Some(&seen("tool-calls", false))).is_none());
        assert!(conclude_from_events(Some(&seen("stop", true))).is_none());
        assert!(conclude_from_events(None).is_none());
        assert!(ReplySeen::in_turn("msg_002", "msg_001"));
        assert!(!ReplySeen::in_turn("msg_000", "msg_001"));
    }

    /// A recorded `GET /session/{id}/message` answer of the real OpenCode 1.18.33, decoded as the
    /// live client decodes it.
    fn recorded(name: &str) -> Vec<MessageView> {
        let path = format!(
            "{}/tests/fixtures/opencode/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("fixture exists");
        crate::opencode::messages_from_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn first_user(messages: &[MessageView]) -> String {
        messages
            .iter()
            .find(|m| m.role == Role::User)
            .map(|m| m.id.clone())
            .expect("a user message")
    }

    #[test]
    fn capping_keeps_whole_characters_and_says_so() {
        let turn = TurnState {
            text: "héllo".into(),
            ..TurnState::default()
        };
        let capped = turn.clone().cap_text(2);
        assert_eq!(capped.text, "hé");
        assert!(capped.text_capped);
        let whole = turn.cap_text(5);
        assert_eq!(whole.text, "héllo");
        assert!(!whole.text_capped);
    }

    #[test]
    fn a_text_turn_is_finished_with_its_text_and_tokens() {
        let messages = recorded("messages_text.json");
        let turn = derive(&messages, &first_user(&messages));
        assert!(turn.user_message_seen && turn.finished && turn.latest_completed);
        assert_eq!(turn.finish.as_deref(), Some("stop"));
        assert!(turn.text.starts_with("ECHO: "), "{}", turn.text);
        assert!(turn.tokens.input > 0 && turn.tokens.output > 0);
        assert_eq!(turn.model.as_deref(), Some("fake/fake-model"));
        assert!(turn.error.is_none());
    }

    #[test]
    fn a_tool_turn_lists_its_tools_and_ends_on_the_final_step() {
        let messages = recorded("messages_tool.json");
        let turn = derive(&messages, &first_user(&messages));
        assert!(turn.finished);
        assert!(turn.assistant_messages >= 2, "a tool step, then the answer");
        assert!(turn
            .tools
            .iter()
            .any(|t| t.tool == "bash" && t.status == "completed"));
        assert!(turn.steps >= 2);
    }

    #[test]
    fn error_and_abort_turns_carry_the_error() {
        let messages = recorded("messages_error.json");
        let turn = derive(&messages, &first_user(&messages));
        let error = turn.error.expect("error");
        assert_eq!(error.name, "APIError");
        assert!(
            error.message.contains("scripted bad request"),
            "{}",
            error.message
        );
        assert!(turn.finished);
        let aborted = recorded("messages_abort.json");
        let turn = derive(&aborted, &first_user(&aborted));
        assert_eq!(
            turn.error.map(|e| e.name).as_deref(),
            Some("MessageAbortedError")
        );
    }

    #[test]
    fn a_turn_belongs_to_its_own_user_message_only() {
        let messages = recorded("messages_text.json");
        let other = derive(&messages, "msg_someone_else");
        assert!(!other.user_message_seen && !other.finished && other.text.is_empty());
    }

    #[test]
    fn a_recorded_compaction_turn_completes_with_the_answer_after_the_summary() {
        let messages = recorded("messages_compaction.json");
        let turn = derive(&messages, &first_user(&messages));
        assert_eq!(turn.compactions, 1);
        assert!(turn.finished, "{turn:?}");
        assert_eq!(
            conclude(&turn, Idle::Reported, None, 0).map(|v| v.status),
            Some(TaskStatus::Completed)
        );
        assert!(turn.text.starts_with("ECHO: Continue"), "{}", turn.text);
        assert_eq!(turn.agent.as_deref(), Some("build"));
        assert_eq!(turn.assistant_messages, 3);
        assert!(
            turn.compaction_tokens.input > 0 && turn.tokens.input > turn.compaction_tokens.input
        );
        assert!(turn.tools.iter().any(|t| t.tool == "bash"));
    }

    #[test]
    fn a_recorded_subagent_turn_ends_on_the_parents_final_step() {
        let messages = recorded("messages_subagent_parent.json");
        let turn = derive(&messages, &first_user(&messages));
        assert!(turn.finished && turn.error.is_none(), "{turn:?}");
        assert!(turn.tools.iter().any(|t| t.tool == "task"));
    }
}
