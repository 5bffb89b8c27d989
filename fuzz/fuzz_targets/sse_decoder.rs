//! The SSE frame decoder: any bytes, split anywhere, give the same payloads as in one piece, and
//! decoding a payload never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opencode_mcp::opencode::events::{decode_event, SseParser};

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let mut whole = SseParser::default();
    let expected = whole.feed(stream);
    let mut split = SseParser::default();
    let mut got = Vec::new();
    for chunk in stream.chunks(usize::from(step).max(1)) {
        got.extend(split.feed(chunk));
    }
    assert_eq!(got, expected);
    for payload in &expected {
        let _ = decode_event(payload);
    }
    let _ = decode_event(&String::from_utf8_lossy(stream));
});
