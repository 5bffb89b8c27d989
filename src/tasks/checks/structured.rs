//! Structured answers: a task started with an `output_schema` (a JSON Schema) must end its
//! answer with one JSON value that matches it, and the gateway holds it to that.
//!
//! - **At start** the schema is checked ([`check_schema`]): a JSON object, at most
//!   [`MAX_SCHEMA_BYTES`], valid against its meta-schema, and compilable without fetching
//!   anything (jsonschema is built without its http and file resolvers, so a remote `$ref` is an
//!   error, never a request). The prompt gets [`instruction`] appended: end with the JSON in a
//!   ```` ```json ```` block, and here is the schema.
//! - **When a turn completes** the tracker does not report it finished: it marks the record
//!   `checking` (the task stays `running`, so no waiter ever sees an answer the gateway may still
//!   send back) and runs [`settle`]: read the answer, [`extract`] the JSON, validate it. A match
//!   finishes the task with the parsed value; a mismatch with retries left opens a correction
//!   turn in the same session through the service's one turn-opening path
//!   ([`crate::tasks::turn::follow::open_turn`]) with the errors ([`correction_prompt`]); otherwise the task
//!   finishes `completed` with `structured_error`. Every checked answer is one
//!   [`StructuredAttempt`] in the record, so each retry is visible in the result.
//! - **Restarts**: `checking` is durable. An adopted task still checking is concluded again by
//!   the tracker's first completion check, which re-runs the check (attempts are keyed by turn,
//!   so re-checking one replaces its entry rather than adding one).
//! - **A host's `continue_task`** on a structured task starts a new round: the schema still
//!   applies (the instruction is appended to the follow-up again), the attempts and the value are
//!   reset, and the retry budget is whole again.
//! - **Usage**: a correction is a turn like any other: the record keeps what the turns before it
//!   spent (`TaskRecord::earlier`), which the usage report counts.

use std::sync::Arc;

use serde_json::Value;

use crate::opencode::Server;
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::entry::{Claim, TaskEntry};
use crate::tasks::model::{StructuredAttempt, TaskStatus};
use crate::tasks::turn::follow::{open_turn, Follows};
use crate::tasks::turn::outcome;
use crate::tasks::turn::outcome::Attempts;

/// The largest `output_schema` accepted, serialized: it is sent to the model with the prompt
/// and kept in the task's record.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;
/// Most subschemas that checking one value may visit, `$ref`s expanded ([`expanded_size`]).
const MAX_EXPANDED: usize = 20_000;
/// Longest check of one answer: a schema that passed [`check_schema`] takes milliseconds. One that
/// takes longer (a pathological pattern the start-up checks do not foresee) fails the check
/// rather than hold the task `running`.
const CHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Validation errors reported per answer (to the model and in the result); the rest are counted.
const MAX_ERRORS: usize = 8;
/// Characters of one error message kept.
const MAX_ERROR_CHARS: usize = 300;
/// How far from the end of an answer without a ```` ```json ```` block the last JSON value is
/// looked for: the search tries each `{` and `[`, so it is bounded.
const FALLBACK_WINDOW_BYTES: usize = 64 * 1024;

/// Why an `output_schema` is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("`output_schema` must be a JSON Schema object, found {0}")]
    NotAnObject(&'static str),
    #[error("`output_schema` is {size} bytes as JSON, more than the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("`output_schema` is not a valid JSON Schema: {0}")]
    Invalid(String),
}

/// Checks an `output_schema` before a task is started with it.
pub fn check_schema(schema: &Value) -> Result<(), SchemaError> {
    let kind = match schema {
        Value::Object(_) => None,
        Value::Null => Some("null"),
        Value::Bool(_) => Some("a boolean"),
        Value::Number(_) => Some("a number"),
        Value::String(_) => Some("a string"),
        Value::Array(_) => Some("an array"),
    };
    if let Some(kind) = kind {
        return Err(SchemaError::NotAnObject(kind));
    }
    let size = serde_json::to_string(schema).map_or(usize::MAX, |s| s.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(SchemaError::TooLarge {
            size,
            max: MAX_SCHEMA_BYTES,
        });
    }
    if let Err(e) = jsonschema::meta::validate(schema) {
        return Err(SchemaError::Invalid(error_line(
            &e.instance_path().to_string(),
            &e.to_string(),
        )));
    }
    let expanded = expanded_size(schema, MAX_EXPANDED);
    if expanded > MAX_EXPANDED {
        return Err(SchemaError::Invalid(format!(
            "through its `$ref`s, checking one value may visit more than {MAX_EXPANDED} \
             subschemas (references that fan out, such as an `anyOf` of two references to a \
             definition that does the same, double at each level and take forever to check); \
             flatten the references"
        )));
    }
    if let Some((at, target)) = outside_ref(schema, String::new()) {
        return Err(SchemaError::Invalid(error_line(
            &at,
            &format!(
                "`$ref` `{target}` points outside the schema; only references within it \
                 (`#/...`) are followed, so put what it names under `$defs`"
            ),
        )));
    }
    jsonschema::validator_for(schema)
        .map(drop)
        .map_err(|e| SchemaError::Invalid(cap(&e.to_string(), MAX_ERROR_CHARS)))
}

/// How many subschemas checking one value against `schema` may visit, counting each `$ref` as
/// the subschema it names, expanded; stops counting past `limit`. A reference into its own chain
/// (recursion, which follows the value's own depth) counts once, and so does one that is not a
/// JSON pointer. Every object in the schema counts, keywords' values included: an estimate from
/// above, far below the limit for any schema of [`MAX_SCHEMA_BYTES`] without references that
/// fan out, and far above it for one whose references double at each level.
fn expanded_size(schema: &Value, limit: usize) -> usize {
    fn size<'a>(root: &'a Value, node: &'a Value, chain: &mut Vec<&'a str>, limit: usize) -> usize {
        let mut total = 1usize;
        let children: Box<dyn Iterator<Item = &Value>> = match node {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let named = target
                        .strip_prefix('#')
                        .filter(|_| !chain.contains(&target.as_str()))
                        .and_then(|pointer| root.pointer(pointer));
                    if let Some(named) = named {
                        chain.push(target);
                        total = total.saturating_add(size(root, named, chain, limit));
                        chain.pop();
                    }
                }
                Box::new(map.values())
            }
            Value::Array(items) => Box::new(items.iter()),
            _ => return 0,
        };
        for child in children {
            if total > limit {
                break;
            }
            total = total.saturating_add(size(root, child, chain, limit));
        }
        total
    }
    size(schema, schema, &mut Vec::new(), limit)
}

/// The first `$ref` (its JSON pointer and target) that does not point within the schema. Such
/// references are never fetched; saying so beats the validator's word for it.
fn outside_ref(value: &Value, at: String) -> Option<(String, String)> {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                if !target.starts_with('#') {
                    return Some((format!("{at}/$ref"), target.clone()));
                }
            }
            map.iter()
                .find_map(|(k, v)| outside_ref(v, format!("{at}/{k}")))
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| outside_ref(v, format!("{at}/{i}"))),
        _ => None,
    }
}

/// What is appended to the prompt of a structured task (and of a host's follow-up to one).
pub fn instruction(schema: &Value) -> String {
    let pretty = serde_json::to_string_pretty(schema).unwrap_or_else(|_| schema.to_string());
    format!(
        "\n\n---\nEnd your answer with one JSON value that matches the JSON Schema below, in a \
         ```json fenced code block. That block is your result: it is parsed and checked against \
         the schema.\n```json\n{pretty}\n```"
    )
}

/// The follow-up sent when an answer did not match.
pub fn correction_prompt(errors: &[String]) -> String {
    let mut prompt = String::from(
        "Your answer did not end with a JSON value that matches the required JSON Schema:\n",
    );
    for e in errors {
        prompt.push_str("- ");
        prompt.push_str(e);
        prompt.push('\n');
    }
    prompt.push_str(
        "Answer again, ending with the corrected JSON value (matching the same schema as before) \
         in a ```json fenced code block.",
    );
    prompt
}

/// The JSON value an answer ends with: the content of its last ```` ```json ```` fenced block;
/// without one, the last top-level JSON object or array in the text; without that, the whole
/// answer if it is one JSON value. The error says which rule failed.
pub fn extract(text: &str) -> Result<Value, String> {
    if let Some(block) = last_json_block(text) {
        return serde_json::from_str(block.trim())
            .map_err(|e| format!("the last ```json block is not valid JSON: {e}"));
    }
    if let Some(v) = last_top_level_value(text) {
        return Ok(v);
    }
    serde_json::from_str(text.trim()).map_err(|_| {
        "the answer holds no JSON value: end it with the JSON in a ```json fenced code block"
            .to_string()
    })
}

/// The content of the last fenced block whose info string is `json` (any case), if any. An
/// unclosed last block runs to the end of the text.
fn last_json_block(text: &str) -> Option<&str> {
    let mut last = None;
    let mut open: Option<(usize, bool)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            match open {
                None => {
                    open = Some((
                        offset + line.len(),
                        info.trim().eq_ignore_ascii_case("json"),
                    ))
                }
                Some((start, is_json)) if info.trim().is_empty() => {
                    if is_json {
                        last = Some(&text[start..offset]);
                    }
                    open = None;
                }
                Some(_) => {}
            }
        }
        offset += line.len();
    }
    match open {
        Some((start, true)) => Some(&text[start.min(text.len())..]),
        _ => last,
    }
}

/// The last JSON object or array that is not inside another, within the text's last
/// [`FALLBACK_WINDOW_BYTES`].
fn last_top_level_value(text: &str) -> Option<Value> {
    let mut from = text.len().saturating_sub(FALLBACK_WINDOW_BYTES);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let window = &text[from..];
    let mut last = None;
    let mut i = 0;
    while i < window.len() {
        let b = window.as_bytes()[i];
        if b == b'{' || b == b'[' {
            let mut values = serde_json::Deserializer::from_str(&window[i..]).into_iter::<Value>();
            if let Some(Ok(v)) = values.next() {
                i += values.byte_offset().max(1);
                last = Some(v);
                continue;
            }
        }
        i += 1;
    }
    last
}

/// Checks an answer against `schema`: the parsed value, or the errors (capped) to report.
pub fn check_answer(schema: &Value, text: &str) -> Result<Value, Vec<String>> {
    let value = extract(text).map_err(|e| vec![e])?;
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| vec![format!("the output_schema cannot be used: {e}")])?;
    let mut errors = Vec::new();
    let mut more = 0usize;
    for e in validator.iter_errors(&value) {
        if errors.len() < MAX_ERRORS {
            errors.push(error_line(&e.instance_path().to_string(), &e.to_string()));
        } else {
            more += 1;
        }
    }
    if errors.is_empty() {
        return Ok(value);
    }
    if more > 0 {
        errors.push(format!("… and {more} more"));
    }
    Err(errors)
}

/// [`check_answer`] on a blocking thread, within [`CHECK_LIMIT`]: validation is CPU work of a
/// size the schema decides, and on one of the runtime's workers a costly one would stall every
/// task (signals included). A check past the limit is a failed check, said so; its thread runs
/// on until the validator returns, which the start-up bound on `$ref` expansion keeps rare.
async fn check_off_runtime(schema: Value, text: String) -> Result<Value, Vec<String>> {
    let check = tokio::task::spawn_blocking(move || check_answer(&schema, &text));
    match tokio::time::timeout(CHECK_LIMIT, check).await {
        Ok(Ok(checked)) => checked,
        Ok(Err(e)) => Err(vec![format!("the check against output_schema failed: {e}")]),
        Err(_) => Err(vec![format!(
            "checking the answer against output_schema took longer than {} s and was stopped: \
             the schema is too costly to check; simplify it",
            CHECK_LIMIT.as_secs()
        )]),
    }
}

/// One error as `` `<instance path>`: <message> `` (the root is `/`), the message capped.
fn error_line(path: &str, message: &str) -> String {
    let path = if path.is_empty() { "/" } else { path };
    format!("`{path}`: {}", cap(message, MAX_ERROR_CHARS))
}

fn cap(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// What the check of an answer did, under the registry lock.
#[derive(Debug, PartialEq)]
enum After {
    /// Finished the task (or found it no longer held).
    Done,
    /// Settled the answer; the task's checks run next.
    Checks,
    /// A correction turn is to be opened (prompt, agent, model).
    Correct(String, Option<String>, Option<String>),
}

/// What happens after an answer was checked.
#[derive(Debug, PartialEq)]
enum Next {
    /// It matched: the task finishes with this value.
    Accept(Value),
    /// It did not, and a retry is left: continue the session with this prompt.
    Correct(String),
    /// It did not, and no retry is left (or there is nothing to correct): finish with this error.
    GiveUp(String),
}

/// Decides what follows the check of an answer, given how many answers of the round were
/// checked before it.
fn next(checked: Result<Value, Vec<String>>, earlier: usize, retries: u32) -> Next {
    match checked {
        Ok(v) => Next::Accept(v),
        Err(errors) if earlier < retries as usize => Next::Correct(correction_prompt(&errors)),
        Err(errors) => Next::GiveUp(format!(
            "the answer does not match output_schema after {} attempt{}: {}",
            earlier + 1,
            if earlier == 0 { "" } else { "s" },
            errors.join("; ")
        )),
    }
}

/// Whether `e` is still holding `turn` for its check (not cancelled, timed out or moved on).
fn holding(e: &TaskEntry, turn: u32) -> bool {
    e.is_checking(turn)
}

/// Checks the held structured answer of `turn` and finishes the task, or opens a correction
/// turn. Returns `true` when the answer is settled (accepted, or given up on) but the task has
/// checks to run before it finishes (`hold::settle` runs them).
pub(in crate::tasks) async fn check_held(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    turn: u32,
) -> bool {
    outcome::read_outcome(ctx, server, task_id, turn, Attempts::Patient).await;
    let Some(entry) = ctx.registry.get(task_id).filter(|e| holding(e, turn)) else {
        return false;
    };
    let Some(state) = entry.rec.structured.as_ref() else {
        return super::commands::wants_checks(&entry);
    };
    let earlier = state.attempts.iter().filter(|a| a.turn != turn).count();
    let (checked, next) = match &entry.rec.outcome {
        Some(o) => {
            let checked = check_off_runtime(state.schema.clone(), o.text.clone()).await;
            let next = next(
                checked.clone(),
                earlier,
                ctx.config.get().limits.structured_retries,
            );
            (checked, next)
        }
        // Nothing to correct: the agent answered, the gateway could not read it. That is not
        // an answer that fails the schema, and is not said as one.
        None => {
            let why =
                entry.rec.outcome_error.clone().unwrap_or_else(|| {
                    "the turn's final text could not be read from OpenCode".into()
                });
            let error = format!("the answer could not be checked against output_schema: {why}");
            (Err(vec![why]), Next::GiveUp(error))
        }
    };
    let attempt = StructuredAttempt {
        turn,
        ok: checked.is_ok(),
        errors: checked.as_ref().err().cloned().unwrap_or_default(),
    };
    // A settled answer finishes the task, unless its checks run next.
    let settled = |e: &mut TaskEntry| {
        if super::commands::wants_checks(e) {
            After::Checks
        } else {
            e.finish(Claim::Checked(turn), TaskStatus::Completed, None);
            After::Done
        }
    };
    let after = ctx
        .registry
        .update(task_id, |e| {
            if !holding(e, turn) {
                return After::Done;
            }
            let spent = e.caps_reached();
            let Some(s) = e.rec.structured.as_mut() else {
                return After::Done;
            };
            s.record(attempt);
            match next {
                Next::Accept(v) => {
                    s.value = Some(v);
                    settled(e)
                }
                Next::GiveUp(error) => {
                    s.error = Some(error);
                    settled(e)
                }
                // A correction is another round of the same host turn, under the same caps:
                // none once they are reached (it would be stopped at its first step).
                Next::Correct(_) if spent.is_some() => {
                    s.error = Some(format!(
                        "the answer does not match output_schema, and no correction was sent: {}",
                        spent.unwrap_or_default()
                    ));
                    settled(e)
                }
                Next::Correct(prompt) => {
                    After::Correct(prompt, e.rec.agent.clone(), e.rec.model.clone())
                }
            }
        })
        .unwrap_or(After::Done);
    let correction = match after {
        After::Checks => return true,
        After::Done => None,
        After::Correct(prompt, agent, model) => Some((prompt, agent, model)),
    };
    let mut go_on = false;
    if let Some((prompt, agent, model)) = correction {
        let opened = open_turn(
            ctx,
            server,
            task_id,
            turn,
            Follows::Correction,
            &prompt,
            agent,
            model,
            |_| {},
        )
        .await;
        if let Err(err) = opened {
            tracing::warn!(task_id, error = %err, "the correction turn could not be sent");
            ctx.registry.update(task_id, |e| {
                if holding(e, turn) {
                    if let Some(s) = e.rec.structured.as_mut() {
                        s.error = Some(format!(
                            "the answer does not match output_schema, and the correction could \
                             not be sent: {err}"
                        ));
                    }
                    go_on = settled(e) == After::Checks;
                }
            });
        }
    }
    go_on
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::checks::hold::{settle, Hold};
    use crate::tasks::lifecycle::entry::Claim;

    /// Holds a completed turn, as the tracker does.
    fn hold(e: &mut TaskEntry) -> Hold {
        crate::tasks::checks::hold::hold(
            e,
            TaskStatus::Completed,
            None,
            &crate::gateway::test_config(),
        )
    }
    use crate::tasks::lifecycle::record::StructuredState;
    use serde_json::json;

    fn person() -> Value {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        })
    }

    #[test]
    fn the_last_json_block_wins() {
        let text = "first\n```json\n{\"a\": 1}\n```\nthen\n```JSON\n{\"a\": 2}\n```\nbye";
        assert_eq!(extract(text), Ok(json!({"a": 2})));
        // Other fences do not count; an unclosed json block runs to the end.
        let text = "```rust\nlet x = [1];\n```\n```json\n[1, 2]";
        assert_eq!(extract(text), Ok(json!([1, 2])));
    }

    #[test]
    fn a_broken_json_block_is_reported_not_skipped() {
        let e = extract("```json\n{\"a\": }\n```\n{\"b\": 1}").expect_err("broken");
        assert!(
            e.starts_with("the last ```json block is not valid JSON"),
            "{e}"
        );
    }

    #[test]
    fn without_a_block_the_last_top_level_value_is_taken() {
        let text = "Checked {not json} and [x]. Result: {\"a\": {\"b\": [1]}} done.";
        assert_eq!(extract(text), Ok(json!({"a": {"b": [1]}})));
        assert_eq!(extract("  42 "), Ok(json!(42)));
        let e = extract("no json here").expect_err("none");
        assert!(e.contains("holds no JSON value"), "{e}");
    }

    #[test]
    fn mismatches_name_the_path_and_are_capped() {
        let errors = check_answer(
            &person(),
            "```json\n{\"name\": \"x\", \"age\": \"old\"}\n```",
        )
        .expect_err("mismatch");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("`/age`: "), "{errors:?}");
        assert!(errors[0].contains("integer"), "{errors:?}");
        let errors = check_answer(&person(), "[1]").expect_err("root");
        assert!(errors[0].starts_with("`/`: "), "{errors:?}");
        let many = json!({"type": "array", "items": {"type": "string"}});
        let text = serde_json::to_string(&(0..20).collect::<Vec<_>>()).expect("json");
        let errors = check_answer(&many, &text).expect_err("many");
        assert_eq!(errors.len(), MAX_ERRORS + 1);
        assert_eq!(errors[MAX_ERRORS], "… and 12 more");
        assert_eq!(
            check_answer(&person(), "{\"name\": \"x\", \"age\": 3}"),
            Ok(json!({"name": "x", "age": 3}))
        );
    }

    #[test]
    fn bad_schemas_are_refused_with_the_reason() {
        for (schema, kind) in [
            (json!([]), "an array"),
            (json!(null), "null"),
            (json!(true), "a boolean"),
            (json!(1), "a number"),
            (json!("object"), "a string"),
        ] {
            assert_eq!(check_schema(&schema), Err(SchemaError::NotAnObject(kind)));
        }
        let e = check_schema(&json!({"type": "strnig"})).expect_err("bad type");
        assert!(e.to_string().contains("`/type`"), "{e}");
        let big = json!({"description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(matches!(
            check_schema(&big),
            Err(SchemaError::TooLarge { .. })
        ));
        // A remote reference is an error, never a request (nothing listens there anyway).
        let remote = json!({"properties": {"a": {"$ref": "http://127.0.0.1:9/schema.json"}}});
        let e = check_schema(&remote).expect_err("a remote reference");
        assert!(
            e.to_string().contains("/properties/a/$ref") && e.to_string().contains("`#/...`"),
            "{e}"
        );
        let local = json!({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}});
        assert_eq!(check_schema(&local), Ok(()));
        assert_eq!(check_schema(&person()), Ok(()));
    }

    #[test]
    fn a_long_answer_is_searched_near_its_end_only() {
        // 1 MB of prose with braces and brackets that are not JSON, then the value.
        let mut text = "fn f() { let v = [a, b]; } {\"unclosed\": [1, 2, ".repeat(20_000);
        text.push_str("\nResult: {\"ok\": true}");
        assert_eq!(extract(&text), Ok(json!({"ok": true})));
    }

    #[test]
    fn a_completed_turn_is_held_once_and_released_by_finishing() {
        use crate::tasks::lifecycle::record::TaskRecord;
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        assert_eq!(hold(&mut e), Hold::No, "not a structured task");
        e.rec.structured = Some(StructuredState::new(person()));
        assert_eq!(hold(&mut e), Hold::Held(1));
        assert_eq!(
            e.rec.status(),
            TaskStatus::Running,
            "not finished while checked"
        );
        assert!(holding(&e, 1));
        assert_eq!(hold(&mut e), Hold::Already);
        // The durable record says what is pending, and an older gateway's reader ignores it.
        let saved = serde_json::to_value(&e.rec).expect("json");
        assert_eq!(saved["structured"]["checking"], json!(1));
        let back: TaskRecord = serde_json::from_value(saved).expect("loads");
        assert_eq!(back.structured.as_ref().and_then(|s| s.checking), Some(1));
        // A cancel (any finish) releases the hold.
        e.finish(Claim::Gone(e.rec.turn), TaskStatus::Cancelled, None);
        assert!(!holding(&e, 1));
        assert_eq!(e.rec.structured.as_ref().and_then(|s| s.checking), None);
    }

    #[test]
    fn a_correction_carries_the_earlier_turns_spend() {
        use crate::tasks::lifecycle::turn::TurnState;
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        e.rec.structured = Some(StructuredState::new(person()));
        let mut outcome = TurnState::default();
        outcome.tokens.input = 100;
        outcome.cost = 0.5;
        e.rec.outcome = Some(outcome);
        assert_eq!(hold(&mut e), Hold::Held(1));
        e.begin_correction(1, "msg_2".into(), None, None)
            .expect("a held turn opens a correction");
        let s = e.rec.structured.as_ref().expect("state");
        assert_eq!(s.checking, None);
        assert_eq!(
            (
                e.rec.spend.earlier().tokens.input,
                e.rec.spend.earlier().cost
            ),
            (100, 0.5)
        );
        // A host's follow-up starts a new round under the same schema.
        let mut s = s.clone();
        s.record(StructuredAttempt {
            turn: 1,
            ok: false,
            errors: vec!["x".into()],
        });
        s.restart();
        assert_eq!(s, StructuredState::new(person()));
    }

    #[test]
    fn retries_are_bounded() {
        let bad = || Err(vec!["`/a`: wrong".to_string()]);
        match next(bad(), 0, 2) {
            Next::Correct(p) => assert!(p.contains("- `/a`: wrong"), "{p}"),
            other => panic!("expected a correction, got {other:?}"),
        }
        assert!(matches!(next(bad(), 1, 2), Next::Correct(_)));
        match next(bad(), 2, 2) {
            Next::GiveUp(e) => assert!(e.contains("after 3 attempts: `/a`: wrong"), "{e}"),
            other => panic!("expected giving up, got {other:?}"),
        }
        assert!(matches!(next(bad(), 0, 0), Next::GiveUp(_)));
        assert_eq!(next(Ok(json!(1)), 5, 0), Next::Accept(json!(1)));
    }

    /// References that fan out (each level an `anyOf` of two references to the next) are
    /// refused at once: 4 KB of schema whose check takes 2^60 steps. A recursive schema (a
    /// tree) and shared definitions are fine.
    #[test]
    fn references_that_fan_out_are_refused_and_recursion_is_not() {
        let mut defs = serde_json::Map::new();
        for i in 0..60 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next, "minimum": 1}]}),
            );
        }
        defs.insert("d60".into(), json!({"type": "string"}));
        let bomb = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(serde_json::to_string(&bomb).expect("json").len() < MAX_SCHEMA_BYTES);
        let err = check_schema(&bomb).expect_err("fans out").to_string();
        assert!(err.contains("flatten the references"), "{err}");

        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}},
            "$ref": "#/$defs/node"
        });
        assert!(check_schema(&tree).is_ok());
        assert!(expanded_size(&tree, MAX_EXPANDED) < 100);
        let shared = json!({
            "$defs": {"id": {"type": "string", "pattern": "^[a-z]+$"}},
            "type": "object",
            "properties": (0..50).map(|i| (format!("f{i}"), json!({"$ref": "#/$defs/id"})))
                .collect::<serde_json::Map<_, _>>()
        });
        assert!(check_schema(&shared).is_ok());
    }

    /// A structured answer held for its check while a cancel claims the task: the check gives
    /// way to the abort. If the abort then fails (the task runs on), the turn can be held and
    /// checked again, rather than every later check finding it `Already` held.
    #[tokio::test]
    async fn a_check_that_gave_way_to_a_failed_abort_lets_the_turn_be_held_again() {
        let registry = crate::tasks::context::fixtures::registry_with(|e| {
            e.rec.structured = Some(crate::tasks::lifecycle::record::StructuredState::new(
                serde_json::json!({ "type": "object" }),
            ));
            e.rec.outcome = Some(crate::tasks::lifecycle::turn::TurnState {
                text: "{}".into(),
                ..Default::default()
            });
        });
        let ctx = crate::tasks::context::fixtures::context(registry.clone());
        let server = Arc::new(crate::tasks::context::fixtures::unreachable_server());
        assert_eq!(registry.update("tsk_a", hold), Some(Hold::Held(1)));
        assert_eq!(registry.update("tsk_a", |e| e.claim_abort(1)), Some(true));
        settle(&ctx, &server, "tsk_a", 1).await;
        registry.update("tsk_a", |e| e.abort_refused(1));
        assert_eq!(registry.update("tsk_a", hold), Some(Hold::Held(1)));
        settle(&ctx, &server, "tsk_a", 1).await;
        let e = registry.get("tsk_a").expect("task");
        assert_eq!(e.rec.status(), TaskStatus::Completed);
        assert_eq!(
            e.rec.structured.and_then(|s| s.value),
            Some(serde_json::json!({}))
        );
    }
}
