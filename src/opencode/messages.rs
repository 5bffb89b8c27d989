//! Session messages, normalised: the generated `Message`/`Part` unions of
//! `GET /session/{id}/message` become [`MessageView`]s, the one view the turn logic judges.
//!
//! Kept apart from the facade because it is the part of OpenCode's model the gateway's
//! correctness rests on (which message is a compaction request, which reply is a summary), and
//! because tests and fuzzing decode recorded responses through [`messages_from_json`] exactly as
//! the live client does.

use super::client::types;
use super::types::{error_info_from_json, ErrorInfo, MessageView, Role, Tokens, ToolCall};

/// Normalises one listed message.
pub(crate) fn view(item: &types::SessionMessagesResponseItem) -> MessageView {
    match &item.info {
        types::Message::UserMessage(u) => MessageView {
            id: u.id.clone(),
            role: Role::User,
            compaction: item
                .parts
                .iter()
                .any(|p| matches!(p, types::Part::CompactionPart(_))),
            agent: Some(u.agent.clone()),
            text: text_of(&item.parts),
            ..MessageView::default()
        },
        types::Message::AssistantMessage(a) => {
            let t = &a.tokens;
            MessageView {
                id: a.id.clone(),
                role: Role::Assistant,
                parent_id: Some(a.parent_id.clone()),
                completed: a.time.completed.is_some(),
                completed_at: a.time.completed,
                finish: a.finish.clone(),
                error: a.error.as_ref().map(error_info),
                summary: a.summary == Some(true),
                compaction: false,
                agent: Some(a.agent.clone()),
                model: Some(format!("{}/{}", a.provider_id, a.model_id)),
                tokens: Tokens {
                    input: t.input.max(0.0) as u64,
                    output: t.output.max(0.0) as u64,
                    reasoning: t.reasoning.max(0.0) as u64,
                    cache_read: t.cache.read.max(0.0) as u64,
                    cache_write: t.cache.write.max(0.0) as u64,
                },
                cost: a.cost,
                text: text_of(&item.parts),
                tools: item
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        types::Part::ToolPart(tp) => Some(tool_call(tp)),
                        _ => None,
                    })
                    .collect(),
            }
        }
        // A message kind from a newer OpenCode: keep its id (it still orders the session).
        types::Message::Object(o) => MessageView {
            id: o
                .get("id")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
            ..MessageView::default()
        },
    }
}

/// The message views of a `GET /session/{id}/message` answer given as JSON text, decoded with
/// the generated types exactly as the live client decodes it. For tests and fuzzing: no
/// generated type crosses this boundary.
pub fn messages_from_json(json: &str) -> Result<Vec<MessageView>, String> {
    let de = &mut serde_json::Deserializer::from_str(json);
    let items: Vec<types::SessionMessagesResponseItem> =
        serde_path_to_error::deserialize(de).map_err(|e| format!("at {}: {}", e.path(), e))?;
    Ok(items.iter().map(view).collect())
}

/// What the model wrote: text parts that are neither synthetic nor ignored.
fn text_of(parts: &[types::Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            types::Part::TextPart(t) if t.synthetic != Some(true) && t.ignored != Some(true) => {
                Some(t.text.as_str())
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn tool_call(tp: &types::ToolPart) -> ToolCall {
    let (status, title, error) = match &tp.state {
        types::ToolState::ToolStatePending(_) => ("pending", None, None),
        types::ToolState::ToolStateRunning(r) => ("running", r.title.clone(), None),
        types::ToolState::ToolStateCompleted(c) => ("completed", Some(c.title.clone()), None),
        types::ToolState::ToolStateError(e) => ("error", None, Some(e.error.clone())),
        types::ToolState::Object(o) => (
            o.get("status")
                .and_then(|s| s.as_str())
                .unwrap_or("unknown"),
            None,
            None,
        ),
    };
    ToolCall {
        tool: tp.tool.clone(),
        status: status.to_string(),
        title,
        error,
    }
}

/// OpenCode's message errors all look like `{name, data: {message, ...}}`; read them as JSON so
/// that a variant we do not know still yields its name and message.
fn error_info(e: &types::AssistantMessageError) -> ErrorInfo {
    let value = serde_json::to_value(e).unwrap_or(serde_json::Value::Null);
    error_info_from_json(&value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes a recorded response of the real OpenCode 1.18.33 with the generated types, naming
    /// the JSON path on failure.
    fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
        let path = format!(
            "{}/tests/fixtures/opencode/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("fixture exists");
        let de = &mut serde_json::Deserializer::from_str(&text);
        serde_path_to_error::deserialize(de)
            .unwrap_or_else(|e| panic!("{name} does not decode at {}: {e}", e.path()))
    }

    #[test]
    fn recorded_agents_and_providers_decode() {
        let agents: Vec<types::Agent> = fixture("agents.json");
        assert!(agents.iter().any(|a| a.name == "build"));
        let providers: types::ConfigProvidersResponse = fixture("config_providers.json");
        let fake = providers
            .providers
            .iter()
            .find(|p| p.id == "fake")
            .expect("fake provider");
        assert!(fake.models.contains_key("fake-model"));
    }

    #[test]
    fn enum_values_from_a_newer_opencode_still_decode() {
        let mut agents: serde_json::Value = fixture("agents.json");
        if let Some(list) = agents.as_array_mut() {
            for a in list {
                a["mode"] = serde_json::json!("a-mode-from-the-future");
            }
        }
        let decoded: Vec<types::Agent> =
            serde_json::from_value(agents).expect("unknown enum values decode");
        assert!(decoded.iter().all(|a| a.mode == "a-mode-from-the-future"));
    }

    #[test]
    fn recorded_sessions_statuses_and_permissions_decode() {
        let s: types::Session = fixture("session.json");
        assert!(s.id.starts_with("ses"));
        let _: types::Session = fixture("session_after_turn.json");
        let busy: std::collections::HashMap<String, types::SessionStatus> =
            fixture("session_status_busy.json");
        assert!(busy
            .values()
            .any(|v| matches!(v, types::SessionStatus::Busy)));
        let retry: std::collections::HashMap<String, types::SessionStatus> =
            fixture("session_status_retry.json");
        assert!(retry
            .values()
            .any(|v| matches!(v, types::SessionStatus::Retry { .. })));
        let asks: Vec<types::PermissionRequest> = fixture("permission_list.json");
        assert!(asks.iter().all(|a| a.id.starts_with("per")));
    }

    #[test]
    fn compaction_requests_and_summaries_are_recognised() {
        let json = serde_json::json!([
            {"info": {"id": "msg_1", "sessionID": "ses_1", "role": "user", "agent": "build",
                      "model": {"providerID": "fake", "modelID": "m"}, "time": {"created": 1}},
             "parts": [{"id": "prt_1", "sessionID": "ses_1", "messageID": "msg_1",
                        "type": "compaction", "auto": true}]},
            {"info": {"id": "msg_2", "sessionID": "ses_1", "role": "assistant", "parentID": "msg_1",
                      "agent": "compaction", "mode": "compaction", "summary": true,
                      "modelID": "m", "providerID": "fake", "path": {"cwd": "/", "root": "/"},
                      "cost": 0, "finish": "stop",
                      "tokens": {"input": 1, "output": 2, "reasoning": 0, "cache": {"read": 0, "write": 0}},
                      "time": {"created": 2, "completed": 3}},
             "parts": [{"id": "prt_2", "sessionID": "ses_1", "messageID": "msg_2", "type": "text", "text": "SUMMARY"}]}
        ]);
        let views = messages_from_json(&json.to_string()).expect("decodes");
        assert!(views[0].compaction && views[0].role == Role::User);
        assert!(views[1].summary && views[1].completed && views[1].text == "SUMMARY");
        assert_eq!(views[1].tokens.output, 2);
    }
}
