//! Where a reload's `list_changed` notifications go, in either era of the protocol.
//!
//! A host that opened with `initialize` (protocol up to 2025-11-25) takes a bare
//! `notifications/tools/list_changed` at any time. A host on protocol 2026-07-28 (`server/discover`,
//! per-request `_meta`; Claude Code from about 2.1.304) instead opens a long-lived
//! `subscriptions/listen` request naming the notifications it wants. rmcp acknowledges it
//! (`notifications/subscriptions/acknowledged`, stamped with the listen's request id: without it
//! Claude Code stalls its start-up for about 27 s and retries) and hands the stream to
//! [`ServerHandler::listen`](rmcp::ServerHandler::listen), which must not return while the
//! subscription lives: its answer closes it. The gateway keeps each open stream's sink here, and
//! a reload sends on every one of them, each notification stamped with its `subscriptionId`; on a
//! 2026-07-28 session without a stream nothing is sent, since that protocol has no bare
//! notifications.

use std::sync::Mutex;

use rmcp::model::{RequestId, SubscriptionFilter};
use rmcp::service::{Peer, SubscriptionSink};
use rmcp::RoleServer;

use super::surface::Changes;

/// The open `subscriptions/listen` streams of this session.
#[derive(Debug, Default)]
pub struct Listeners {
    sinks: Mutex<Vec<SubscriptionSink>>,
}

/// What a `subscriptions/listen` is granted: the list changes the gateway announces, when it
/// announces any (`reload: true`). rmcp then keeps only what was both asked for and advertised.
pub fn granted(reload: bool) -> SubscriptionFilter {
    let mut filter = SubscriptionFilter::new();
    if reload {
        filter.tools_list_changed = Some(true);
        filter.prompts_list_changed = Some(true);
    }
    filter
}

impl Listeners {
    /// Keeps `sink` until [`Self::remove`] with its id.
    pub fn add(&self, sink: SubscriptionSink) {
        self.lock().push(sink);
    }

    /// Forgets the stream of listen request `id` (it was cancelled or the session ended).
    pub fn remove(&self, id: &RequestId) {
        self.lock().retain(|sink| sink.id() != id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SubscriptionSink>> {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells the host what a reload changed: on every open listen stream, else (a session that
    /// began with `initialize`) as bare notifications. Returns how many notifications went out.
    pub async fn notify(&self, changes: Changes, peer: &Peer<RoleServer>) -> usize {
        let sinks = self.lock().clone();
        let mut sent = 0;
        if sinks.is_empty() {
            if peer.peer_info().is_none() {
                tracing::debug!(
                    "no subscriptions/listen stream is open: the host is not told of the reload"
                );
                return 0;
            }
            if changes.tools {
                match peer.notify_tool_list_changed().await {
                    Ok(()) => sent += 1,
                    Err(e) => tracing::warn!("cannot send notifications/tools/list_changed: {e}"),
                }
            }
            if changes.prompts {
                match peer.notify_prompt_list_changed().await {
                    Ok(()) => sent += 1,
                    Err(e) => tracing::warn!("cannot send notifications/prompts/list_changed: {e}"),
                }
            }
            return sent;
        }
        for sink in sinks {
            // A stream that did not ask for one kind is not sent it (rmcp would refuse it).
            if changes.tools && sink.accepted().tools_list_changed == Some(true) {
                match sink.notify_tool_list_changed().await {
                    Ok(()) => sent += 1,
                    Err(e) => tracing::debug!(id = %sink.id(), "tools/list_changed not sent: {e}"),
                }
            }
            if changes.prompts && sink.accepted().prompts_list_changed == Some(true) {
                match sink.notify_prompt_list_changed().await {
                    Ok(()) => sent += 1,
                    Err(e) => {
                        tracing::debug!(id = %sink.id(), "prompts/list_changed not sent: {e}")
                    }
                }
            }
        }
        sent
    }
}
