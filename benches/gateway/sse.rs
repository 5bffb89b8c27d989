//! The benchmark's own subscriber to OpenCode's `GET /global/event`: it timestamps the first
//! `session.idle` of every session the moment its bytes arrive, for the direct baseline (which
//! waits on it) and for the "completion noticed" figure (which measures from it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{oneshot, watch};

use crate::BoxError;

struct Shared {
    idle: Mutex<HashMap<String, Instant>>,
    changed: watch::Sender<u64>,
}

/// A running subscription. Stops when dropped.
pub struct IdleWatch {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl IdleWatch {
    /// Subscribes and returns once OpenCode's `server.connected` frame has arrived, so that no
    /// later event is missed (the stream has no replay).
    pub async fn connect(base_url: &str, password: &str) -> Result<Self, BoxError> {
        let http = reqwest::Client::builder().no_proxy().build()?;
        let response = http
            .get(format!("{base_url}/global/event"))
            .basic_auth("opencode", Some(password))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("GET /global/event: {}", response.status()).into());
        }
        let shared = Arc::new(Shared {
            idle: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
        });
        let (connected_tx, connected_rx) = oneshot::channel();
        let task = tokio::spawn(read(response, shared.clone(), connected_tx));
        tokio::time::timeout(Duration::from_secs(10), connected_rx)
            .await
            .map_err(|_| "no server.connected on /global/event within 10 s")?
            .map_err(|_| "the event stream ended before server.connected")?;
        Ok(Self { shared, task })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.shared.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every session in `ids` has gone idle; returns when the last one did.
    pub async fn wait_all(&self, ids: &[String], timeout: Duration) -> Result<Instant, BoxError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.shared.changed.subscribe();
        loop {
            changes.borrow_and_update();
            {
                let idle = self.lock();
                let times: Option<Vec<Instant>> =
                    ids.iter().map(|id| idle.get(id).copied()).collect();
                if let Some(times) = times {
                    return Ok(times.into_iter().max().unwrap_or_else(Instant::now));
                }
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("the event stream reader stopped".into()),
                Err(_) => {
                    let idle = self.lock();
                    let missing = ids.iter().filter(|id| !idle.contains_key(*id)).count();
                    return Err(format!(
                        "{missing} of {} sessions not idle after {timeout:?}",
                        ids.len()
                    )
                    .into());
                }
            }
        }
    }
}

impl Drop for IdleWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read(response: reqwest::Response, shared: Arc<Shared>, connected: oneshot::Sender<()>) {
    let mut connected = Some(connected);
    let mut body = response.bytes_stream();
    let mut line: Vec<u8> = Vec::new();
    let mut data = String::new();
    while let Some(Ok(chunk)) = body.next().await {
        let arrived = Instant::now();
        for &b in chunk.iter() {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.is_empty() {
                if !data.is_empty() {
                    on_event(&data, arrived, &shared, &mut connected);
                    data.clear();
                }
            } else if let Some(rest) = line.strip_prefix(b"data:") {
                let rest = rest.strip_prefix(b" ").unwrap_or(rest);
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(&String::from_utf8_lossy(rest));
            }
            line.clear();
        }
    }
}

fn on_event(
    data: &str,
    arrived: Instant,
    shared: &Shared,
    connected: &mut Option<oneshot::Sender<()>>,
) {
    // Only two event types matter; skip the JSON parse for the rest (deltas are most frames).
    if connected.is_some() && data.contains("\"server.connected\"") {
        if let Some(tx) = connected.take() {
            let _ = tx.send(());
        }
        return;
    }
    if !data.contains("\"session.idle\"") {
        return;
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(data) else {
        return;
    };
    let payload = value.get("payload").unwrap_or(&value);
    if payload["type"] != "session.idle" {
        return;
    }
    let Some(session) = payload["properties"]["sessionID"].as_str() else {
        return;
    };
    let inserted = {
        let mut idle = shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.contains_key(session) {
            false
        } else {
            idle.insert(session.to_string(), arrived);
            true
        }
    };
    if inserted {
        shared.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}
