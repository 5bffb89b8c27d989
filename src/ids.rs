//! Identifiers and secrets: task and server ids the host sees, OpenCode-compatible message ids,
//! and the random passwords managed servers get.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

fn random_base62(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness is a broken machine; fall back to time-derived noise rather than
        // panicking, since ids only need to be unique, not secret.
        let seed = now_nanos();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (seed >> ((i % 8) * 8)) as u8 ^ (i as u8).wrapping_mul(31);
        }
    }
    base62(&bytes)
}

fn base62(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| BASE62[(*b as usize) % 62] as char)
        .collect()
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A task id the host passes back: `tsk_` + 16 base62 characters.
pub fn task_id() -> String {
    format!("tsk_{}", random_base62(16))
}

/// A fan-out group id: `grp_` + 12 base62 characters. Not a task id, so it can never be
/// confused with one where both are accepted (`wait_for_task`).
pub fn group_id() -> String {
    format!("{GROUP_PREFIX}{}", random_base62(12))
}

/// What starts every group id.
pub const GROUP_PREFIX: &str = "grp_";

/// A server id: `srv_` + 10 base62 characters.
pub fn server_id() -> String {
    format!("srv_{}", random_base62(10))
}

/// A password for a managed server: 32 base62 characters (about 190 bits). Unlike ids, a
/// password must be unpredictable, so without the OS's randomness there is none.
pub fn secret() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(base62(&bytes))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A message id in OpenCode's own ascending format (`msg_` + 12 hex digits of
/// `millis * 0x1000 + counter` + 14 base62 characters), so that our user messages sort among
/// OpenCode's by creation time, as its own ids do.
pub fn message_id() -> String {
    message_id_after(None)
}

/// A message id that sorts above `floor` (the newest id seen in the session) even when this
/// machine's clock runs behind the server's: OpenCode orders a session's messages by id, and a
/// prompt whose id sorts below the last reply is never answered.
pub fn message_id_after(floor: Option<&str>) -> String {
    let millis = (now_nanos() / 1_000_000) as u64;
    let counter = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xfff;
    let mut value = (millis.wrapping_mul(0x1000).wrapping_add(counter)) & 0xffff_ffff_ffff;
    let floor_value = floor
        .and_then(|f| f.strip_prefix("msg_"))
        .and_then(|f| f.get(..12))
        .and_then(|hex| u64::from_str_radix(hex, 16).ok());
    if let Some(floor_value) = floor_value {
        if value <= floor_value {
            value = (floor_value + 1) & 0xffff_ffff_ffff;
        }
    }
    format!("msg_{value:012x}{}", random_base62(14))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_their_prefix_and_length() {
        assert!(task_id().starts_with("tsk_") && task_id().len() == 20);
        assert!(server_id().starts_with("srv_") && server_id().len() == 14);
        assert_eq!(secret().map(|s| s.len()).ok(), Some(32));
        assert_ne!(task_id(), task_id());
    }

    #[test]
    fn message_ids_ascend() {
        let a = message_id();
        let b = message_id();
        assert!(a.starts_with("msg_") && a.len() == 4 + 12 + 14);
        assert!(a[..16] < b[..16], "{a} then {b}");
    }

    #[test]
    fn message_ids_sort_above_a_server_running_ahead() {
        // An id minted an hour ahead of this clock.
        let ahead_ms = (now_nanos() / 1_000_000) as u64 + 3_600_000;
        let floor = format!("msg_{:012x}zzzzzzzzzzzzzz", ahead_ms * 0x1000);
        let id = message_id_after(Some(&floor));
        assert!(id > floor, "{id} must sort above {floor}");
        let plain = message_id_after(Some("msg_000000000001AAAAAAAAAAAAAA"));
        assert!(plain.as_str() > "msg_000000000001AAAAAAAAAAAAAA");
    }
}
