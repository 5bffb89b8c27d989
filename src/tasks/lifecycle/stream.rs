//! The turn as the event stream shows it, so that a turn concluded at its `session.idle` frame
//! already has its answer, tokens, cost and tools, and the wait that returns at that moment
//! makes no HTTP read.
//!
//! OpenCode publishes every change of a message (`message.updated`, with the whole message
//! info: role, parent, completion, finish, error, tokens, cost) and of its parts
//! (`message.part.updated` with the whole part, `message.part.delta` with appended text). Fed
//! those, [`StreamedTurn`] keeps the same normalised [`MessageView`]s a read over HTTP yields,
//! and [`StreamedTurn::derive`] hands them to [`turn::derive`]: one rule, whichever way the
//! messages arrived.
//!
//! The view is trusted only when nothing can be missing. It is not ([`StreamedTurn::derive`]
//! says `None`, and the tracker reads the turn over HTTP) when the stream broke, reconnected or
//! dropped an oversized frame while the turn was open (the tracker marks that with
//! [`StreamedTurn::mark_gap`]), or when a message's parts arrived without its info.
//!
//! Memory: only the messages after the task's own user message are kept, and the text of an
//! assistant message is dropped once a newer one (not a compaction summary) starts, because the
//! answer is the newest such message's text.

use std::collections::BTreeMap;

use super::turn::{self, TurnState};
use crate::opencode::events::{Event, PartEvent};
use crate::opencode::{MessageView, Role, ToolCall};

/// One message of the turn as streamed so far.
#[derive(Debug, Clone, Default)]
struct Streamed {
    /// Everything but the text and tools, from the newest `message.updated`.
    info: Option<MessageView>,
    /// Text parts that count (neither synthetic nor ignored), by part id (ids ascend). Deltas
    /// grow only these, so a synthetic or ignored part's never reach the answer.
    texts: BTreeMap<String, String>,
    tools: BTreeMap<String, ToolCall>,
    /// A newer answer started: this message's text can no longer be the answer and is gone.
    text_dropped: bool,
    /// A user message holding a `compaction` part (the part may come before the message).
    compaction: bool,
}

/// The messages of one turn, assembled from events.
#[derive(Debug, Clone, Default)]
pub struct StreamedTurn {
    messages: BTreeMap<String, Streamed>,
    gap: bool,
}

impl StreamedTurn {
    /// Something of the turn may have been missed (the stream broke, reconnected or dropped a
    /// frame): the view is not used, the turn is read over HTTP.
    pub fn mark_gap(&mut self) {
        self.gap = true;
        self.messages.clear();
    }

    /// Whether the view has been given up for this turn.
    pub fn has_gap(&self) -> bool {
        self.gap
    }

    /// Takes in one event of the task's own session. Messages that are not after
    /// `user_message_id` (an earlier turn's, arriving late) are ignored.
    pub fn apply(&mut self, user_message_id: &str, event: &Event) {
        if self.gap {
            return;
        }
        match event {
            Event::MessageUpdated {
                message_id,
                role,
                parent_id,
                completed,
                finish,
                error,
                summary,
                agent,
                model,
                completed_at,
                tokens,
                cost,
                ..
            } if turn::ReplySeen::in_turn(message_id, user_message_id) => {
                let role = match role.as_str() {
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    _ => Role::Other,
                };
                let starts_answer =
                    role == Role::Assistant && !*summary && !self.messages.contains_key(message_id);
                if starts_answer {
                    // The answer is the newest assistant message's text: older ones' go.
                    for (_, older) in self.messages.range_mut(..message_id.clone()) {
                        older.texts.clear();
                        older.text_dropped = true;
                    }
                }
                let m = self.messages.entry(message_id.clone()).or_default();
                m.info = Some(MessageView {
                    id: message_id.clone(),
                    role,
                    parent_id: parent_id.clone(),
                    completed: *completed,
                    completed_at: *completed_at,
                    finish: finish.clone(),
                    error: error.clone(),
                    summary: *summary,
                    compaction: false,
                    agent: agent.clone(),
                    model: model.clone(),
                    tokens: *tokens,
                    cost: *cost,
                    text: String::new(),
                    tools: Vec::new(),
                });
            }
            Event::PartUpdated {
                message_id,
                part_id,
                part,
                ..
            } if turn::ReplySeen::in_turn(message_id, user_message_id) => {
                let m = self.messages.entry(message_id.clone()).or_default();
                match part {
                    PartEvent::Text { text, counted } => {
                        if *counted && !m.text_dropped {
                            m.texts.insert(part_id.clone(), text.clone());
                        }
                    }
                    PartEvent::Tool { call, .. } => {
                        m.tools.insert(part_id.clone(), call.clone());
                    }
                    PartEvent::Compaction => m.compaction = true,
                    PartEvent::StepStart | PartEvent::StepFinish | PartEvent::Other => {}
                }
            }
            Event::PartDelta {
                message_id,
                part_id,
                field,
                delta,
                ..
            } if field == "text" && turn::ReplySeen::in_turn(message_id, user_message_id) => {
                // Only a part already known as counted text grows; a reasoning part's deltas
                // also say `text`, and any text part's final `message.part.updated` carries
                // its whole text anyway.
                if let Some(m) = self.messages.get_mut(message_id) {
                    if let Some(text) = m.texts.get_mut(part_id) {
                        text.push_str(delta);
                    }
                }
            }
            _ => {}
        }
    }

    /// The turn as [`turn::derive`] judges it from the streamed messages, or `None` when the
    /// view cannot be trusted (a gap, or a message whose info never arrived).
    pub fn derive(&self, user_message_id: &str) -> Option<TurnState> {
        if self.gap {
            return None;
        }
        let mut views = Vec::with_capacity(self.messages.len() + 1);
        views.push(MessageView {
            id: user_message_id.to_string(),
            role: Role::User,
            ..MessageView::default()
        });
        for m in self.messages.values() {
            let mut view = m.info.clone()?;
            view.compaction = m.compaction;
            view.text = m
                .texts
                .values()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("\n");
            view.tools = m.tools.values().cloned().collect();
            views.push(view);
        }
        Some(turn::derive(&views, user_message_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opencode::events::decode_event;
    use crate::opencode::Tokens;

    fn updated(id: &str, role: &str, extra: &str) -> Event {
        decode_event(&format!(
            r#"{{"type":"message.updated","properties":{{"info":{{"id":"{id}","sessionID":"s","role":"{role}","parentID":"msg_1"{extra}}}}}}}"#
        ))
    }

    fn part(message: &str, id: &str, part: &str) -> Event {
        decode_event(&format!(
            r#"{{"type":"message.part.updated","properties":{{"part":{{"id":"{id}","sessionID":"s","messageID":"{message}",{part}}}}}}}"#
        ))
    }

    fn delta(message: &str, id: &str, text: &str) -> Event {
        decode_event(&format!(
            r#"{{"type":"message.part.delta","properties":{{"sessionID":"s","messageID":"{message}","partID":"{id}","field":"text","delta":"{text}"}}}}"#
        ))
    }

    const DONE: &str = r#","finish":"stop","time":{"created":1,"completed":5},"cost":0.5,"tokens":{"input":10,"output":2,"reasoning":0,"cache":{"read":3,"write":0}}"#;
    const STEP: &str = r#","finish":"tool-calls","time":{"created":1,"completed":3},"cost":0.25,"tokens":{"input":7,"output":1,"reasoning":0,"cache":{"read":0,"write":0}}"#;

    /// A two-step turn streamed as OpenCode streams it: a tool step, then the answer built from
    /// deltas and closed by the part's final update.
    #[test]
    fn a_streamed_turn_is_judged_like_one_read_over_http() {
        let mut t = StreamedTurn::default();
        let events = [
            updated("msg_0", "assistant", DONE), // an earlier turn's reply, late: ignored
            updated("msg_2", "assistant", ""),
            part("msg_2", "prt_1", r#""type":"text","text":"let me look""#),
            part(
                "msg_2",
                "prt_2",
                r#""type":"tool","tool":"bash","state":{"status":"completed","title":"ls","input":{}}"#,
            ),
            updated("msg_2", "assistant", STEP),
            updated("msg_3", "assistant", ""),
            part("msg_3", "prt_3", r#""type":"reasoning","text":""#),
            delta("msg_3", "prt_3", "thinking"),
            part("msg_3", "prt_4", r#""type":"text","text":"""#),
            delta("msg_3", "prt_4", "the "),
            delta("msg_3", "prt_4", "answer"),
            part(
                "msg_3",
                "prt_5",
                r#""type":"text","text":"note","synthetic":true"#,
            ),
            updated("msg_3", "assistant", DONE),
        ];
        for e in &events {
            t.apply("msg_1", e);
        }
        let state = t.derive("msg_1").expect("nothing missing");
        assert!(state.finished && state.user_message_seen);
        assert_eq!(state.text, "the answer");
        assert_eq!(state.assistant_messages, 2);
        assert_eq!(state.steps, 2);
        assert_eq!(
            state.tokens,
            Tokens {
                input: 17,
                output: 3,
                reasoning: 0,
                cache_read: 3,
                cache_write: 0
            }
        );
        assert!((state.cost - 0.75).abs() < 1e-9);
        assert_eq!(state.tools.len(), 1);
        assert_eq!(state.tools[0].title.as_deref(), Some("ls"));
        // The final update of a text part is its whole text, whatever the deltas said.
        t.apply(
            "msg_1",
            &part(
                "msg_3",
                "prt_4",
                r#""type":"text","text":"the whole answer""#,
            ),
        );
        assert_eq!(
            t.derive("msg_1").map(|s| s.text).as_deref(),
            Some("the whole answer")
        );
    }

    /// A gap, or parts of a message whose info never came, make the view untrusted.
    #[test]
    fn a_view_with_anything_missing_is_not_used() {
        let mut t = StreamedTurn::default();
        t.apply(
            "msg_1",
            &part("msg_2", "prt_1", r#""type":"text","text":"x""#),
        );
        assert!(t.derive("msg_1").is_none(), "parts without their message");
        t.apply("msg_1", &updated("msg_2", "assistant", DONE));
        assert_eq!(t.derive("msg_1").map(|s| s.text).as_deref(), Some("x"));
        t.mark_gap();
        t.apply("msg_1", &updated("msg_3", "assistant", DONE));
        assert!(t.has_gap() && t.derive("msg_1").is_none());
    }

    /// After a compaction the answer is what came after it, and the summary is counted apart.
    #[test]
    fn a_compaction_streamed_is_judged_as_read() {
        let mut t = StreamedTurn::default();
        let summary = r#","summary":true,"finish":"stop","time":{"created":1,"completed":4},"cost":0,"tokens":{"input":5,"output":1,"reasoning":0,"cache":{"read":0,"write":0}}"#;
        for e in [
            updated("msg_2", "assistant", STEP),
            part("msg_2", "prt_1", r#""type":"text","text":"before""#),
            part("msg_3", "prt_2", r#""type":"compaction","auto":true"#),
            updated("msg_3", "user", ""),
            updated("msg_4", "assistant", summary),
            part("msg_4", "prt_3", r#""type":"text","text":"the summary""#),
            updated("msg_5", "user", ""),
            updated("msg_6", "assistant", DONE),
            part("msg_6", "prt_4", r#""type":"text","text":"after""#),
        ] {
            t.apply("msg_1", &e);
        }
        let state = t.derive("msg_1").expect("complete");
        assert_eq!(state.compactions, 1);
        assert_eq!(state.text, "after");
        assert_eq!(state.compaction_tokens.input, 5);
        assert!(state.finished);
    }
}
