//! What a host's model reads of the gateway on every request: each tool's name, description
//! and input schema, as `tools/list` gives them, plus the `initialize` instructions. Hosts
//! without a tool search (Codex, the SDK hosts, Claude Code with search off) pay all of it on
//! every request of a session; Claude Code with its default tool search pays the always-loaded
//! tools (`_meta` `anthropic/alwaysLoad`) and the instructions, and finds the rest by search.
//!
//! Counted in characters: name + description + the input schema as JSON written with `", "` and
//! `": "` between items (as the outside measurement did), and the same with no spaces
//! (what Claude Code puts in its API request body) as a note. Output schemas and titles are not
//! shown to the model, so they are not counted.

use serde_json::Value;

use crate::support::mcp::Launch as Spawn;
use crate::BoxError;

/// The measured surface.
pub struct Surface {
    pub tools: usize,
    pub always_loaded: Vec<String>,
    /// Characters of the always-loaded tools plus the instructions (spaced JSON).
    pub always: usize,
    /// Characters of every tool plus the instructions (spaced JSON).
    pub whole: usize,
    /// The same two with compact JSON.
    pub always_compact: usize,
    pub whole_compact: usize,
    pub instructions: usize,
}

/// JSON text of `v` with `", "` and `": "` between items.
fn spaced(v: &Value) -> String {
    match v {
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(spaced).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), spaced(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// Starts a gateway with `launch`, reads `initialize` and `tools/list`, and counts.
pub async fn measure(launch: &Spawn) -> Result<Surface, BoxError> {
    let client = launch.connect().await?;
    let instructions = client
        .server_info()
        .and_then(|i| i.instructions)
        .unwrap_or_default()
        .chars()
        .count();
    let tools = client.list_tools().await?;
    client.close().await?;
    let mut s = Surface {
        tools: tools.len(),
        always_loaded: Vec::new(),
        always: instructions,
        whole: instructions,
        always_compact: instructions,
        whole_compact: instructions,
        instructions,
    };
    for tool in &tools {
        let schema = Value::Object(tool.input_schema.as_ref().clone());
        let head =
            tool.name.chars().count() + tool.description.as_deref().unwrap_or("").chars().count();
        let (wide, narrow) = (
            head + spaced(&schema).chars().count(),
            head + schema.to_string().chars().count(),
        );
        s.whole += wide;
        s.whole_compact += narrow;
        let always = tool
            .meta
            .as_ref()
            .and_then(|m| m.0.get("anthropic/alwaysLoad"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if always {
            s.always += wide;
            s.always_compact += narrow;
            s.always_loaded.push(tool.name.to_string());
        }
    }
    Ok(s)
}
