//! What an attacker's tries come to when the sandbox holds, as the agent and its check read
//! them: shared by the hostile-agent tests here and on a worker.

use serde_json::Value;

/// The agent's tool outputs (`out`) show each way out closed: no `leaked` text reached it, a
/// write outside failed read-only, a signal found no process, a failed command said it ran
/// confined, and OpenCode's own tools (and a `workdir` outside) were refused by a rule.
pub fn agent_was_held(out: &str, leaked: &[&str]) {
    for leaked in leaked {
        assert!(!out.contains(leaked), "{leaked} reached the agent:\n{out}");
    }
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.contains("No such process"), "{out}");
    assert!(
        out.contains("opencode-mcp sandbox:"),
        "a failed command says it ran confined: {out}"
    );
    assert!(
        out.contains("rule which prevents you"),
        "OpenCode's own tools and a workdir outside are refused: {out}"
    );
}

/// The same for the first check's output in task result `done`: read-only writes, no process
/// to signal, no `leaked` text.
pub fn check_was_held(done: &Value, leaked: &[&str]) {
    let out = done["checks"]["last"][0]["output"]
        .as_str()
        .unwrap_or_default();
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.contains("No such process"), "{out}");
    for leaked in leaked {
        assert!(!out.contains(leaked), "{leaked} reached the check:\n{out}");
    }
}
