//! Delegated tasks as native MCP tasks (the `io.modelcontextprotocol/tasks` extension of protocol
//! 2026-07-28), for hosts that ask for them request by request.
//!
//! A host that can run a tool call in the background (Claude Code from about 2.1.304, in its
//! interactive CLI) declares the extension in the `_meta` client capabilities of each
//! `tools/call`. For such a call of an action that starts work (`start_task`, `continue_task`,
//! `fan_out`, and presets of them) the gateway runs the action exactly as for any host and then
//! answers with a task *handle* whose `taskId` is the task id (or the fan-out group id), so every
//! other tool still works on it. The host then polls `tasks/get` and hands the final result to
//! its model when the task ends: the model makes one call instead of a start and a series of
//! waits. A request without the capability gets the plain result, exactly as before (a handle
//! would be an error for that host).
//!
//! What each task method means here:
//!
//! - `tasks/get` is a zero-timeout `wait_for_task` on that id: `working` (with what the task is
//!   doing now as the status message), `input_required` when a permission ask waits (an
//!   `elicitation/create` form: allow once, always, or reject), and once finished the wait's own
//!   result for that task (answer and changed files, sized for the host, `next_offset` when cut)
//!   as `completed`; a failed or timed-out task is `failed` with its error, a cancelled one
//!   `cancelled`. A fan-out group is `completed` with every answer once all have finished. The
//!   records answer by id, so a restarted gateway still answers for its tasks.
//!   A terminal state is final ([`Settled`]): a follow-up gets a handle of its own, naming the
//!   turn it opened (`tsk_x.2`), and the earlier handle keeps its answer.
//! - `tasks/update` carries the user's choice in that form to OpenCode, as
//!   `opencode_reply_permission` does, answering the ask each response's key names.
//! - `tasks/cancel` is `cancel_task` (for a group: all of its tasks at once, each failure
//!   reported); idempotent, since hosts send it twice at once.
//! - Both act only when an enabled tool offers the same action: the user's configuration decides
//!   what the host may do, whichever way it asks.
//!
//! Claude Code polls every `pollIntervalMs` and ignores pushed task notifications, so the
//! interval alone decides how soon a finished task is seen: [`POLL_INTERVAL_MS`].

use chrono::{DateTime, Utc};
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, InputRequest, InputResponses, JsonObject,
    RequestMetaObject, Task, TaskPayload, TaskStatus as McpTaskStatus,
};
use serde_json::{json, Value};

use super::actions::{self, Ctx};
use super::error::ToolError;
use crate::config::Action;
use crate::error::ErrorCode;
use crate::opencode::PermissionAsk;
use crate::tasks::{TaskSnapshot, TaskStatus, WaitOutcome};

/// How often the host should poll `tasks/get`: a finished task is seen within about a second,
/// and a poll is a read of memory, so one a second per running task costs nothing.
pub const POLL_INTERVAL_MS: u64 = 1000;

/// Between a task id and the turn a follow-up's handle stands for (`tsk_x.2`): task and group
/// ids never hold it.
const TURN_MARK: char = '.';

/// The task or group id a handle stands for.
fn task_of(handle: &str) -> &str {
    handle.split_once(TURN_MARK).map_or(handle, |(id, _)| id)
}

/// The terminal states already reported, by handle: SEP-2663's terminal states are final, so a
/// handle reported `completed` stays so, also once a follow-up opens a new turn of the same task
/// (that turn has a handle of its own). Held for the handles' time to live, at most
/// [`MAX_SETTLED`] of them; a restarted gateway works them out again from the records.
pub struct Settled {
    states: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, DetailedTask)>>,
    /// Most states kept ([`MAX_SETTLED`]).
    max: usize,
}

impl Default for Settled {
    fn default() -> Self {
        Self {
            states: std::sync::Mutex::default(),
            max: MAX_SETTLED,
        }
    }
}

/// Most terminal states [`Settled`] keeps (the oldest go first).
const MAX_SETTLED: usize = 10_000;

impl Settled {
    fn get(&self, handle: &str) -> Option<DetailedTask> {
        let states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        states.get(handle).map(|(_, t)| t.clone())
    }

    fn keep(&self, handle: &str, task: &DetailedTask, ttl_ms: u64) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = std::time::Duration::from_millis(ttl_ms);
        states.retain(|_, (at, _)| at.elapsed() < ttl);
        if states.len() >= self.max {
            if let Some(oldest) = states
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            {
                states.remove(&oldest);
            }
        }
        states.insert(
            handle.to_string(),
            (std::time::Instant::now(), task.clone()),
        );
    }
}

/// Whether the configuration offers `action` through an enabled tool: a task method that acts
/// (`tasks/update`, `tasks/cancel`) does only what a tool the user left enabled would.
fn offered(ctx: &Ctx<'_>, action: Action, method: &str) -> Result<(), ToolError> {
    if ctx
        .config
        .tools
        .values()
        .any(|t| t.enabled && t.action == action)
    {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::InvalidArgument,
        format!(
            "{method} is refused: no enabled tool in delegation.yaml performs `{}`",
            action.as_str()
        ),
    ))
}

/// The error code of a `failed` task's error object: JSON-RPC's range for server-defined errors.
/// `data.code` carries the gateway's own code (`failed`, `timed_out`, ...).
const TASK_FAILED: i64 = -32000;

/// How long the host may ask for a task: as long as its record stays answerable
/// (`limits.finished_task_ttl`).
pub fn ttl_ms(config: &crate::config::Config) -> u64 {
    u64::try_from(config.limits.finished_task_ttl.get().as_millis()).unwrap_or(u64::MAX)
}

/// Whether this request's own `_meta` declares the tasks extension. Only the request counts: a
/// host that negotiated with `initialize` never gets a handle (it did not say it can read one
/// for this call).
pub fn requested(meta: &RequestMetaObject) -> bool {
    meta.client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

/// Whether a call of `action` is answered with a handle when the host asks for one: the actions
/// that start work the host would otherwise wait for.
pub fn runs_as_task(action: Action) -> bool {
    matches!(
        action,
        Action::StartTask | Action::ContinueTask | Action::FanOut
    )
}

/// The handle for a started task or group, from the action's own result (`task_id`, or a fan-out's
/// `group_id`). `None` when the result names neither (then the plain result is returned).
pub fn handle(result: &Value, ttl_ms: u64, follow_up: Option<u32>) -> Option<CreateTaskResult> {
    // A task's own id first: a follow-up of a fan-out member carries its `group_id` too, and
    // its handle is that one task (cancelling it must not cancel the other members). Only a
    // fan-out's result names a group and no task.
    let id = result
        .get("task_id")
        .or_else(|| result.get("group_id"))
        .and_then(Value::as_str)?;
    // A follow-up is a task of its own for the host: its handle names the turn it opened, so
    // the handle of the earlier turn, reported finished, stays finished.
    let id = match follow_up {
        Some(turn) => format!("{id}{TURN_MARK}{turn}"),
        None => id.to_string(),
    };
    let now = timestamp(Utc::now());
    let task = Task::new(id, McpTaskStatus::Working, now.clone(), now)
        .with_status_message(status_word(result))
        .with_ttl_ms(ttl_ms)
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    Some(CreateTaskResult::new(task))
}

/// `tasks/get`: the task or group `id` now, as the host's task states.
pub async fn get(
    handle: &str,
    ttl_ms: u64,
    ctx: &Ctx<'_>,
    settled: &Settled,
) -> Result<DetailedTask, ToolError> {
    if let Some(task) = settled.get(handle) {
        return Ok(task);
    }
    let task = state(handle, ttl_ms, ctx).await?;
    if task.task.status.is_terminal() {
        settled.keep(handle, &task, ttl_ms);
    }
    Ok(task)
}

/// The state of the task or group a handle stands for, now.
async fn state(handle: &str, ttl_ms: u64, ctx: &Ctx<'_>) -> Result<DetailedTask, ToolError> {
    let id = task_of(handle);
    // The wait tool's answer for `id` at once: every state below is read from it.
    let outcome = actions::wait_now(id, ctx).await?;
    // Created when its turn (the earliest, for a group) was sent; updated when the last of
    // them moved. Read from the tasks, so a poll does not move them.
    let created = outcome.tasks.iter().map(|t| t.turn_started_ms).min();
    let updated = outcome.tasks.iter().map(|t| t.updated_ms).max();
    let at = |ms: Option<u64>| {
        ms.and_then(|ms| DateTime::<Utc>::from_timestamp_millis(i64::try_from(ms).ok()?))
            .map_or_else(|| timestamp(Utc::now()), timestamp)
    };
    let (created, updated) = (at(created), at(updated));
    let base = |status| {
        Task::new(handle, status, created.clone(), updated.clone())
            .with_ttl_ms(ttl_ms)
            .with_poll_interval_ms(POLL_INTERVAL_MS)
    };
    if !outcome.done {
        // Every pending ask, shown before or not: the wait's `asking` lists only asks the host
        // has not seen, but a task stays `input_required` until someone answers.
        let asking: Vec<&TaskSnapshot> = outcome
            .tasks
            .iter()
            .filter(|t| !t.status.is_terminal() && !t.permissions.is_empty())
            .collect();
        if !asking.is_empty() {
            // One form per pending ask, keyed by its id: two subagents asking at once are two
            // questions, each answered on its own.
            let requests = asking
                .iter()
                .flat_map(|t| {
                    t.permissions
                        .iter()
                        .filter_map(|ask| ask_form(&t.task_id, &t.title, ask))
                })
                .collect();
            let task = base(McpTaskStatus::InputRequired)
                .with_status_message(actions::describe_unfinished(&outcome));
            return Ok(DetailedTask::new(
                task,
                TaskPayload::InputRequired {
                    input_requests: requests,
                },
            ));
        }
        let task = base(McpTaskStatus::Working)
            .with_status_message(actions::describe_unfinished(&outcome));
        return Ok(DetailedTask::new(task, TaskPayload::Working));
    }
    // One task (not a group): its own ending decides the state.
    if let [task] = outcome.tasks.as_slice() {
        if task.group_id.as_deref() != Some(id) {
            match task.status {
                TaskStatus::Cancelled => {
                    let task = base(McpTaskStatus::Cancelled).with_status_message("cancelled");
                    return Ok(DetailedTask::new(task, TaskPayload::Cancelled));
                }
                TaskStatus::Failed | TaskStatus::TimedOut => {
                    let (message, error) = failure(task);
                    let task = base(McpTaskStatus::Failed).with_status_message(message);
                    return Ok(DetailedTask::new(task, TaskPayload::Failed { error }));
                }
                _ => {}
            }
        }
    }
    let result = final_result(outcome)?;
    let task = base(McpTaskStatus::Completed).with_status_message("completed");
    Ok(DetailedTask::new(task, TaskPayload::Completed { result }))
}

/// `tasks/update`: each response answers the permission ask its key names (the ask's id). A key
/// that names no ask still pending is skipped: the ask was answered another way (the model's
/// `opencode_reply_permission`, a cancel) between the host's poll and the user's choice.
pub async fn update(id: &str, responses: InputResponses, ctx: &Ctx<'_>) -> Result<(), ToolError> {
    offered(ctx, Action::ReplyPermission, "tasks/update")?;
    let outcome = actions::wait_now(task_of(id), ctx).await?;
    for (key, response) in responses {
        let Some(task) = outcome
            .tasks
            .iter()
            .find(|t| t.permissions.iter().any(|ask| ask.id == key))
        else {
            tracing::debug!(task = id, ask = %key, "tasks/update for an ask no longer pending");
            continue;
        };
        let reply = reply_of(&response);
        // The answer goes to the ask the key names, never to whichever ask is pending now.
        let args = json!({"task_id": task.task_id, "reply": reply, "permission_id": key});
        run(Action::ReplyPermission, args, ctx).await?;
    }
    Ok(())
}

/// `tasks/cancel`: cancels the task, or each task of a group. Cancelling a finished task
/// changes nothing, so the host's second, simultaneous cancel is answered like the first.
pub async fn cancel(id: &str, ctx: &Ctx<'_>) -> Result<(), ToolError> {
    offered(ctx, Action::CancelTask, "tasks/cancel")?;
    let ids = ctx
        .tasks
        .expand_groups(vec![task_of(id).to_string()])
        .await?;
    // Every member at once: one abort that fails (or waits on OpenCode) holds up no other.
    let results = futures::future::join_all(ids.iter().map(|task_id| async move {
        let outcome = run(Action::CancelTask, json!({ "task_id": task_id }), ctx).await;
        (task_id, outcome)
    }))
    .await;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|(task_id, r)| r.err().map(|e| format!("{task_id}: {}", e.message)))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::OpencodeError,
        format!(
            "cancelled {} of {} tasks; not cancelled: {}",
            ids.len() - failed.len(),
            ids.len(),
            failed.join("; ")
        ),
    ))
}

/// A JSON-RPC error object for a failed call of a task method.
pub fn error_object(error: &ToolError) -> rmcp::ErrorData {
    let data = Some(json!({"code": error.code.as_str()}));
    match error.code {
        ErrorCode::NotFound | ErrorCode::InvalidArgument => {
            rmcp::ErrorData::invalid_params(error.message.clone(), data)
        }
        _ => rmcp::ErrorData::internal_error(error.message.clone(), data),
    }
}

async fn run(action: Action, args: Value, ctx: &Ctx<'_>) -> Result<Value, ToolError> {
    let Value::Object(args) = args else {
        return Err(ToolError::internal(
            "task method arguments are not an object",
        ));
    };
    actions::run(action, args, ctx).await
}

/// The tool result the host hands its model: the wait's result as a finished wait gives it
/// (progress is only asked for the status messages).
fn final_result(mut outcome: WaitOutcome) -> Result<JsonObject, ToolError> {
    for task in &mut outcome.tasks {
        task.progress = None;
    }
    let value = serde_json::to_value(outcome)
        .map_err(|e| ToolError::internal(format!("cannot serialize the result: {e}")))?;
    match serde_json::to_value(CallToolResult::structured(value)) {
        Ok(Value::Object(result)) => Ok(result),
        Ok(_) | Err(_) => Err(ToolError::internal("cannot serialize the tool result")),
    }
}

/// What a failed or timed-out task's state says: its error in words, and the error object
/// carrying them with the gateway's code.
fn failure(task: &TaskSnapshot) -> (String, JsonObject) {
    let why = task
        .error
        .as_ref()
        .map(|e| format!("{}: {}", e.name, e.message))
        .unwrap_or_else(|| "no error was reported".to_string());
    let message = format!(
        "task {} \"{}\" {}: {why}. Its partial answer, if any: opencode_get_task_result; \
         go on with opencode_continue_task.",
        task.task_id,
        task.title,
        match task.status {
            TaskStatus::TimedOut => "timed out",
            _ => "failed",
        }
    );
    let mut error = JsonObject::new();
    error.insert("code".into(), json!(TASK_FAILED));
    error.insert("message".into(), json!(message));
    let mut data = json!({"code": task.status.as_str(), "task_id": task.task_id});
    // What the turn wrote before it failed is part of its answer.
    if let Some(text) = task.text.as_deref().filter(|t| !t.is_empty()) {
        data["partial_text"] = json!(text);
        if let Some(offset) = task.next_offset {
            data["next_offset"] = json!(offset);
        }
    }
    error.insert("data".into(), data);
    (message, error)
}

/// The form that asks the user about one pending permission: what the task wants to run, and
/// the three answers OpenCode takes. Keyed by the ask's id.
fn ask_form(task_id: &str, title: &str, ask: &PermissionAsk) -> Option<(String, InputRequest)> {
    let request = json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": format!(
                "OpenCode task \"{}\" asks permission to run: {}",
                shorten(title, 80),
                ask.summary(400)
            ),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "decision": {
                        "type": "string",
                        "title": "Allow this?",
                        "oneOf": [
                            {"const": "once", "title": "Allow once"},
                            {"const": "always", "title": "Allow always (this pattern, this task)"},
                            {"const": "reject", "title": "Reject"}
                        ]
                    }
                },
                "required": ["decision"]
            }
        }
    });
    match serde_json::from_value::<InputRequest>(request) {
        Ok(request) => Some((ask.id.clone(), request)),
        Err(e) => {
            tracing::warn!(task = task_id, "cannot build the permission form: {e}");
            None
        }
    }
}

/// The reply an elicitation result stands for: the chosen decision when accepted; a declined or
/// dismissed dialog refuses (the safe answer, and the task cannot go on without one).
fn reply_of(response: &Value) -> &'static str {
    let accepted = response.get("action").and_then(Value::as_str) == Some("accept");
    let decision = response
        .get("content")
        .and_then(|c| c.get("decision"))
        .and_then(Value::as_str);
    match (accepted, decision) {
        (true, Some("once")) => "once",
        (true, Some("always")) => "always",
        _ => "reject",
    }
}

/// The status word of a just-started task or group, as the handle's first message.
fn status_word(result: &Value) -> String {
    match result.get("status").and_then(Value::as_str) {
        Some(status) => status.replace('_', " "),
        None => "starting".to_string(),
    }
}

/// ISO 8601 with milliseconds, as the extension's timestamps are.
fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal state is kept per handle, within its time to live and a bound (the oldest
    /// goes first).
    #[test]
    fn settled_states_are_kept_within_a_bound() {
        let settled = Settled {
            states: std::sync::Mutex::default(),
            max: 2,
        };
        let task = |id: &str| {
            let t = Task::new(id, McpTaskStatus::Working, "a", "b");
            DetailedTask::new(t, TaskPayload::Cancelled)
        };
        let hour = 3_600_000;
        settled.keep("t1", &task("t1"), hour);
        settled.keep("t2", &task("t2"), hour);
        settled.keep("t3", &task("t3"), hour);
        assert!(settled.get("t1").is_none(), "the oldest went");
        assert_eq!(
            settled.get("t3").map(|t| t.task.status),
            Some(McpTaskStatus::Cancelled)
        );
        // Past their time to live, the others go with the next one kept.
        settled.keep("t4", &task("t4"), 0);
        assert!(settled.get("t2").is_none() && settled.get("t3").is_none());
        assert!(settled.get("t4").is_some());
    }

    #[test]
    fn a_dialog_answer_becomes_a_reply_and_anything_else_refuses() {
        let accept = |d: &str| json!({"action": "accept", "content": {"decision": d}});
        assert_eq!(reply_of(&accept("once")), "once");
        assert_eq!(reply_of(&accept("always")), "always");
        assert_eq!(reply_of(&accept("reject")), "reject");
        assert_eq!(reply_of(&accept("sure")), "reject");
        assert_eq!(reply_of(&json!({"action": "decline"})), "reject");
        assert_eq!(reply_of(&json!({"action": "cancel"})), "reject");
        assert_eq!(reply_of(&json!(null)), "reject");
    }

    #[test]
    fn a_handle_names_the_task_and_a_fan_outs_group() {
        let h = handle(&json!({"task_id": "t1", "status": "pending"}), 5, None).expect("handle");
        assert_eq!(h.task.task_id, "t1");
        assert_eq!(h.task.poll_interval_ms, Some(POLL_INTERVAL_MS));
        assert_eq!(h.task.ttl_ms, Some(5));
        let g = handle(&json!({"group_id": "g1", "task_ids": ["a"]}), 5, None).expect("handle");
        assert_eq!(g.task.task_id, "g1");
        // A follow-up of a fan-out member is that member's, not the group's.
        let member = json!({"task_id": "t2", "group_id": "g1", "status": "pending"});
        assert_eq!(
            handle(&member, 5, Some(3)).expect("handle").task.task_id,
            "t2.3"
        );
        assert_eq!(task_of("t2.3"), "t2");
        assert_eq!(task_of("g1"), "g1");
        assert!(handle(&json!({"servers": []}), 5, None).is_none());
        let wire = serde_json::to_value(h).expect("serializes");
        assert_eq!(wire["resultType"], "task");
        assert_eq!(wire["status"], "working");
    }

    #[test]
    fn the_permission_form_is_an_elicitation_keyed_by_the_ask() {
        let ask = PermissionAsk {
            id: "per_1".into(),
            session_id: "ses_1".into(),
            permission: "bash".into(),
            patterns: vec!["rm -rf build".into()],
            metadata: json!({}),
        };
        let (key, request) = ask_form("t1", "Tidy", &ask).expect("a form");
        assert_eq!(key, "per_1");
        let wire = serde_json::to_value(request).expect("serializes");
        assert_eq!(wire["method"], "elicitation/create");
        let message = wire["params"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("bash rm -rf build"), "{message}");
        assert!(message.contains("\"Tidy\""), "{message}");
        assert_eq!(
            wire["params"]["requestedSchema"]["required"],
            json!(["decision"])
        );
    }
}
