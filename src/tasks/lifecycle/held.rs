//! What a held task keeps across its turns, saved with its record: a structured task's schema
//! and the answers checked so far, a checked task's commands and where they stand.

use super::super::model::{CheckResult, ChecksStatus, ChecksView, StructuredAttempt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A task's checks and where they stand, saved with its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChecksState {
    /// The commands, in the order they run.
    pub commands: Vec<String>,
    /// The turn whose checks are running: the task is reported running until they end it or
    /// open a fix round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checking: Option<u32>,
    /// Fix rounds opened on the current tier in this host turn.
    #[serde(default)]
    pub rounds: u32,
    /// Fix rounds opened in this host turn, over every tier.
    #[serde(default)]
    pub rounds_total: u32,
    /// The checks' latest run: one result per command, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last: Vec<CheckResult>,
    /// The turn `last` ran after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_turn: Option<u32>,
    /// Whether the latest run passed: `None` until the checks have run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// Why the checks could not run or no fix round was sent, when that is what ended them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Our user messages of the host turn's earlier rounds: the round's changed files are
    /// those of all its turns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixed_messages: Vec<String>,
}

impl ChecksState {
    pub fn new(commands: Vec<String>) -> Self {
        Self {
            commands,
            checking: None,
            rounds: 0,
            rounds_total: 0,
            last: Vec::new(),
            last_turn: None,
            passed: None,
            note: None,
            fixed_messages: Vec::new(),
        }
    }

    /// How status, wait and result show these checks; `finished`: its turn is over (the verdict is the latest
    /// run's).
    pub fn view(&self, finished: bool, turn: u32) -> ChecksView {
        let current = self.last_turn == Some(turn);
        let status = match self.passed {
            Some(true) if finished && current => ChecksStatus::Passed,
            Some(false) if finished && current => ChecksStatus::Failed,
            _ if finished && self.note.is_some() => ChecksStatus::Failed,
            // The turn ended otherwise (failed, cancelled, timed out) before its checks ran.
            _ if finished => ChecksStatus::NotRun,
            _ => ChecksStatus::Pending,
        };
        ChecksView {
            status,
            commands: self.commands.clone(),
            rounds: self.rounds_total,
            last: self.last.clone(),
            note: self.note.clone(),
        }
    }

    /// A host's follow-up: a new host turn, its rounds whole again; `more` commands join.
    pub fn restart(&mut self, more: &[String]) {
        let mut commands = std::mem::take(&mut self.commands);
        for c in more {
            if !commands.contains(c) {
                commands.push(c.clone());
            }
        }
        *self = Self::new(commands);
    }
}

/// What a structured task's record keeps across its turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StructuredState {
    /// The `output_schema` the task was started with.
    pub schema: Value,
    /// The answers of the current round checked so far, oldest first.
    #[serde(default)]
    pub attempts: Vec<StructuredAttempt>,
    /// The parsed value of the accepted answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// Why no answer was accepted (the last attempt's errors), once the round is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The turn whose completed answer is being checked: the task is reported running until the
    /// check accepts it, gives up, or opens a correction turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checking: Option<u32>,
    /// Our user messages of the round's turns before the current one (the answers that were
    /// corrected). OpenCode reports changed files per turn, and a correction usually rewrites
    /// only the JSON: the round's files are those of all its turns, or a task whose first answer
    /// edited files would report none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corrected_messages: Vec<String>,
}

impl StructuredState {
    pub fn new(schema: Value) -> Self {
        Self {
            schema,
            attempts: Vec::new(),
            value: None,
            error: None,
            checking: None,
            corrected_messages: Vec::new(),
        }
    }

    /// A host's follow-up: a new round under the same schema.
    pub fn restart(&mut self) {
        *self = Self::new(std::mem::take(&mut self.schema));
    }

    /// Records the check of `attempt.turn` (replacing an earlier check of the same turn, which a
    /// restart can repeat).
    pub(in crate::tasks) fn record(&mut self, attempt: StructuredAttempt) {
        self.attempts.retain(|a| a.turn != attempt.turn);
        self.attempts.push(attempt);
    }
}
