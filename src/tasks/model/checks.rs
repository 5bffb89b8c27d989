//! What a task's checks and escalations show: each command's run, the checks' verdict, and the
//! models a task moved through.

use serde::{Deserialize, Serialize};

/// One command's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CheckResult {
    pub command: String,
    /// It succeeded (exit status 0 within `timeouts.check`).
    pub ok: bool,
    /// Its exit status, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i32>,
    /// How it ended when it did not exit on its own: stopped at `timeouts.check`, or could not
    /// be run (with why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
    /// The end of its output (stdout and stderr), at most `checks.output_chars` characters.
    pub output: String,
    /// `output` is the end of a longer output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_cut: bool,
    /// The command never ran (it could not be started, or its worker was out of reach): not
    /// the agent's to fix, so no fix round follows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_run: bool,
}

impl CheckResult {
    /// A check that could not be run, and why.
    pub fn not_run(command: &str, why: String) -> Self {
        Self {
            command: command.to_string(),
            ok: false,
            exit: None,
            error: Some(why),
            duration_ms: 0,
            output: String::new(),
            output_cut: false,
            not_run: true,
        }
    }

    /// How it ended, in words, for the fix prompt.
    pub fn status_words(&self) -> String {
        match (&self.error, self.exit) {
            (Some(e), _) => e.clone(),
            (None, Some(code)) => format!("exit status {code}"),
            (None, None) => "ended without an exit status".into(),
        }
    }
}

/// Where a task's checks stand, as status, wait and result show it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ChecksView {
    /// `passed`, `failed`, `pending` (not run yet for this turn, running, or a fix round under
    /// way) or `not_run` (the turn ended another way first). Only `passed` means verified.
    pub status: ChecksStatus,
    /// Commands run after each turn.
    pub commands: Vec<String>,
    /// Fix rounds sent after failing checks in this host turn (escalations included).
    pub rounds: u32,
    /// The latest run, one entry per command: exit status, duration, the end of its output.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub last: Vec<CheckResult>,
    /// Why no fix round was sent, when that ended the checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// See [`ChecksView::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChecksStatus {
    Passed,
    Failed,
    /// Not run yet for this turn, running, or a fix round under way.
    Pending,
    /// The turn ended another way (failed, cancelled, timed out) before its checks ran.
    NotRun,
}

/// Characters of a check's output a status or wait snapshot shows (the result shows all that
/// was kept).
pub(in crate::tasks) const SNAPSHOT_OUTPUT_CHARS: usize = 800;

impl ChecksView {
    /// For a status or wait snapshot: each output cut to its last [`SNAPSHOT_OUTPUT_CHARS`],
    /// a passing check's left out.
    pub fn brief(mut self) -> Self {
        for r in &mut self.last {
            if r.ok {
                r.output.clear();
                r.output_cut = false;
                continue;
            }
            let n = r.output.chars().count();
            if n > SNAPSHOT_OUTPUT_CHARS {
                r.output = r.output.chars().skip(n - SNAPSHOT_OUTPUT_CHARS).collect();
                r.output_cut = true;
            }
        }
        self
    }
}

/// A move of a task to another model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Escalation {
    /// The tier it left and the one it moved to (the same tier for a fallback model).
    pub from: String,
    pub to: String,
    /// The model the task ran on before (absent: the server's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_model: Option<String>,
    /// The model it runs on now (absent: the server's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Why: the checks still failed after the fix rounds, or the model's provider error.
    pub why: String,
    /// The turn that runs on the new model.
    pub turn: u32,
}
