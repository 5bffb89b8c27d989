//! A real `opencode serve` for a test, plus a reader for its SSE event stream.
//!
//! [`OpenCodeServer::start`] picks a free 127.0.0.1 port (OpenCode's own `--port 0` prefers
//! 4096), runs [`opencode_bin`](super::opencode_bin::opencode_bin) in an
//! [`OpenCodeEnv`](super::isolation::OpenCodeEnv) with a random `OPENCODE_SERVER_PASSWORD`, and
//! waits for the `opencode server listening on http://...` line before returning: requests sent
//! earlier can hang forever. The process is killed (and reaped) on drop. Requests made through
//! [`OpenCodeServer::get`] and friends carry Basic auth (user `opencode`) and never use a proxy.
//!
//! This is test plumbing for driving OpenCode directly; the product's own client lives in
//! `src/opencode/`.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::isolation::OpenCodeEnv;
use super::opencode_bin::opencode_bin;

/// How long `opencode serve` may take to print its listening line (it takes 1 to 3 s; tests run
/// in parallel on small machines).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `opencode serve`. Killed on drop.
pub struct OpenCodeServer {
    child: Child,
    base_url: String,
    password: String,
    http: reqwest::Client,
    output: Arc<Mutex<String>>,
    /// From spawn to the listening line.
    pub startup: Duration,
}

impl OpenCodeServer {
    /// Starts OpenCode in `env`, pointed at the fake LLM at `fake_llm_url`.
    pub async fn start(env: &OpenCodeEnv, fake_llm_url: &str) -> Self {
        let mut last_failure = String::new();
        // A port picked by binding and dropping can be taken by someone else before OpenCode
        // binds it; then OpenCode exits without its listening line, and we try another one.
        for _ in 0..3 {
            match Self::try_start(env, fake_llm_url).await {
                Ok(server) => return server,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("opencode serve did not start: {last_failure}");
    }

    async fn try_start(env: &OpenCodeEnv, fake_llm_url: &str) -> Result<Self, String> {
        let port = free_port();
        let password = random_password();
        let mut cmd = Command::new(opencode_bin());
        env.apply(&mut cmd, fake_llm_url);
        cmd.args([
            "serve",
            "--hostname",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("OPENCODE_SERVER_PASSWORD", &password)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn {}: {e}", opencode_bin().display()))?;
        let output = Arc::new(Mutex::new(String::new()));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Option<String>>();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        // Both pipes are drained for the life of the process, or OpenCode would block on a full
        // pipe.
        {
            let output = output.clone();
            std::thread::spawn(move || {
                let mut ready_tx = Some(ready_tx);
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(url) = line
                        .split_once("listening on ")
                        .map(|(_, url)| url.trim().to_owned())
                    {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(Some(url));
                        }
                    }
                    push_line(&output, "stdout", &line);
                }
                if let Some(tx) = ready_tx.take() {
                    let _ = tx.send(None);
                }
            });
        }
        {
            let output = output.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stderr);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match reader.by_ref().read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            push_line(&output, "stderr", String::from_utf8_lossy(&line).trim_end())
                        }
                    }
                }
            });
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("build reqwest client");
        let mut server = OpenCodeServer {
            child,
            base_url: String::new(),
            password,
            http,
            output,
            startup: Duration::ZERO,
        };
        match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(Some(url))) => {
                server.base_url = url.trim_end_matches('/').to_owned();
                server.startup = started.elapsed();
                Ok(server)
            }
            Ok(_) => Err(format!(
                "it exited before listening; output:\n{}",
                server.output()
            )),
            Err(_) => Err(format!(
                "no listening line after {START_TIMEOUT:?}; output:\n{}",
                server.output()
            )),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.base_url
    }

    /// The address it listens on (to put a proxy in front of it).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.base_url
            .strip_prefix("http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("not an http://ip:port url: {}", self.base_url))
    }

    /// The Basic-auth password (user `opencode`).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything OpenCode printed so far, each line prefixed with its stream.
    pub fn output(&self) -> String {
        self.output.lock().expect("output lock").clone()
    }

    /// A request to `path` (which may carry a query) with Basic auth.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base_url))
            .basic_auth("opencode", Some(&self.password))
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::GET, path)
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, path)
    }

    /// GET `path`; returns the status and the body as JSON (panics if it is not JSON).
    pub async fn get_json(&self, path: &str) -> (reqwest::StatusCode, Value) {
        send_json(self.get(path), path).await
    }

    /// POST `body` to `path`; returns the status and the body as JSON (`Null` when empty).
    pub async fn post_json(&self, path: &str, body: &Value) -> (reqwest::StatusCode, Value) {
        send_json(self.post(path).json(body), path).await
    }

    /// Subscribes to `GET /event?directory=<dir>` and waits for `server.connected`, so that
    /// everything that happens afterwards is seen.
    pub async fn events(&self, directory: &Path) -> EventStream {
        let path = format!(
            "/event?directory={}",
            encode(&directory.display().to_string())
        );
        self.subscribe(&path, |e| e["type"] == "server.connected")
            .await
    }

    /// Subscribes to `GET /global/event` (every directory's events, each wrapped as
    /// `{directory, payload}`) and waits for `server.connected`.
    pub async fn global_events(&self) -> EventStream {
        self.subscribe("/global/event", |e| {
            e["payload"]["type"] == "server.connected" || e["type"] == "server.connected"
        })
        .await
    }

    async fn subscribe(&self, path: &str, connected: impl Fn(&Value) -> bool) -> EventStream {
        let response = self
            .get(path)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert!(
            response.status().is_success(),
            "GET {path}: {}",
            response.status()
        );
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "GET {path}: content type {content_type}"
        );
        let mut events = EventStream::new(response);
        events.wait_for(Duration::from_secs(60), connected).await;
        events
    }
}

impl Drop for OpenCodeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn push_line(output: &Mutex<String>, stream: &str, line: &str) {
    if let Ok(mut output) = output.lock() {
        output.push_str(stream);
        output.push_str(": ");
        output.push_str(line);
        output.push('\n');
    }
}

async fn send_json(request: reqwest::RequestBuilder, what: &str) -> (reqwest::StatusCode, Value) {
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = response.status();
    let text = response
        .text()
        .await
        .unwrap_or_else(|e| panic!("{what}: reading the body: {e}"));
    if text.is_empty() {
        return (status, Value::Null);
    }
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{what}: {status}: body is not JSON ({e}): {text:.300}"));
    (status, value)
}

/// Percent-encodes a query value (unreserved characters and `/` pass).
pub fn encode(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

fn random_password() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("test-{:016x}", hasher.finish())
}

/// The events of one `GET /event` stream, parsed from its `data:` lines.
pub struct EventStream {
    rx: mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
    raw: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventStream {
    fn new(response: reqwest::Response) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let raw = Arc::new(Mutex::new(Vec::new()));
        let task_raw = raw.clone();
        let task = tokio::spawn(async move {
            let mut body = response.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            let mut data: Vec<String> = Vec::new();
            while let Some(Ok(bytes)) = body.next().await {
                buf.extend_from_slice(&bytes);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let line = String::from_utf8_lossy(&line);
                    let line = line.trim_end_matches(['\n', '\r']);
                    if line.is_empty() {
                        if data.is_empty() {
                            continue;
                        }
                        let payload = data.join("\n");
                        data.clear();
                        if let Ok(mut raw) = task_raw.lock() {
                            raw.push(payload.clone());
                        }
                        match serde_json::from_str::<Value>(&payload) {
                            Ok(event) => {
                                if tx.send(event).is_err() {
                                    return;
                                }
                            }
                            Err(e) => eprintln!("event stream: not JSON ({e}): {payload:.200}"),
                        }
                    } else if let Some(rest) = line.strip_prefix("data:") {
                        data.push(rest.strip_prefix(' ').unwrap_or(rest).to_owned());
                    }
                }
            }
        });
        EventStream {
            rx,
            seen: Vec::new(),
            raw,
            task,
        }
    }

    /// The next event, or `None` on timeout or end of stream.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Some(event)) => {
                self.seen.push(event.clone());
                Some(event)
            }
            _ => None,
        }
    }

    /// Consumes events until one matches `pred` and returns it. Panics after `timeout`, listing
    /// the event types seen.
    pub async fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => {
                    self.seen.push(event.clone());
                    if pred(&event) {
                        return event;
                    }
                }
                Ok(None) => panic!("event stream ended; seen: {:?}", self.seen_types()),
                Err(_) => panic!(
                    "no matching event after {timeout:?}; seen: {:?}",
                    self.seen_types()
                ),
            }
        }
    }

    /// Waits for `session.idle` of `session_id`.
    pub async fn wait_idle(&mut self, session_id: &str, timeout: Duration) -> Value {
        self.wait_for(timeout, |e| {
            e["type"] == "session.idle" && e["properties"]["sessionID"] == session_id
        })
        .await
    }

    /// Every event consumed so far (through `next` / `wait_for`).
    pub fn seen(&self) -> &[Value] {
        &self.seen
    }

    /// The `type` of every event consumed so far.
    pub fn seen_types(&self) -> Vec<String> {
        self.seen
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    /// The raw `data:` payloads received so far (consumed or not), in order.
    pub fn raw(&self) -> Vec<String> {
        self.raw.lock().expect("raw events lock").clone()
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
