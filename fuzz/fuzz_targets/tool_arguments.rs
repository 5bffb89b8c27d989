//! Tool-argument parsing: any JSON object, for every action, is accepted or refused with an
//! `invalid_argument` error; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opencode_mcp::config::Action;
use opencode_mcp::error::ErrorCode;
use opencode_mcp::gateway::parse_tool_arguments;

fuzz_target!(|data: &[u8]| {
    let Ok(serde_json::Value::Object(args)) = serde_json::from_slice(data) else {
        return;
    };
    for action in Action::ALL {
        if let Err(e) = parse_tool_arguments(action, args.clone()) {
            assert_eq!(e.code, ErrorCode::InvalidArgument);
            assert!(!e.message.is_empty());
        }
    }
});
