//! Decoding `GET /session/{id}/message` and `GET /session/status` answers and deriving a turn:
//! any input is a result or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opencode_mcp::opencode::session_activity_from_json;
use opencode_mcp::tasks::turn::from_messages_json as turn_from_messages_json;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = turn_from_messages_json(&text, "msg_fuzz");
    if let Ok(value) = serde_json::from_str(&text) {
        let _ = session_activity_from_json(&value);
    }
});
