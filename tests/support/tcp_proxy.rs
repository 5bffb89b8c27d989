//! A TCP proxy on 127.0.0.1 that a test can break on command, to put between the gateway and
//! OpenCode.
//!
//! [`TcpProxy::start`] listens on `127.0.0.1:0` and forwards every connection to `upstream`. Then:
//!
//! - [`TcpProxy::cut`] drops every live connection at once (both sockets are closed); new
//!   connections are accepted as before. This is an event stream (or a request) dying mid-flight.
//! - [`TcpProxy::refuse`] stops listening (connections are refused) until
//!   [`TcpProxy::resume`] listens again on the same port. This is OpenCode unreachable for a
//!   while.
//!
//! It records the first line of every connection (the HTTP request line), so a test can count
//! how often the event stream was (re)opened.
//!
//! Everything runs as tasks on the caller's tokio runtime; dropping the proxy stops them all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

struct Shared {
    next_id: AtomicU64,
    /// Live connections by id.
    live: Mutex<HashMap<u64, JoinHandle<()>>>,
    /// The first line each connection sent, in accept order.
    first_lines: Mutex<Vec<String>>,
    /// Bumped on every recorded first line.
    recorded: tokio::sync::watch::Sender<usize>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            first_lines: Mutex::new(Vec::new()),
            recorded: tokio::sync::watch::channel(0).0,
        }
    }
}

/// A breakable TCP proxy. See the module docs.
pub struct TcpProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)));
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let acceptor = Some(tokio::spawn(accept_loop(
            listener,
            upstream,
            shared.clone(),
        )));
        Self {
            addr,
            upstream,
            shared,
            acceptor,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every live connection; returns how many there were. New ones are still accepted
    /// (unless [`TcpProxy::refuse`] is in force).
    pub async fn cut(&self) -> usize {
        let handles: Vec<JoinHandle<()>> = {
            let mut live = self.shared.live.lock().expect("live lock");
            live.drain().map(|(_, h)| h).collect()
        };
        let n = handles.len();
        for h in &handles {
            h.abort();
        }
        // Aborted tasks drop their sockets when they finish; wait for that, so the cut is done
        // when this returns.
        for h in handles {
            let _ = h.await;
        }
        n
    }

    /// Stops listening: from when this returns until [`TcpProxy::resume`], connecting is refused.
    /// Live connections are left alone (combine with [`TcpProxy::cut`]).
    pub async fn refuse(&mut self) {
        if let Some(acceptor) = self.acceptor.take() {
            acceptor.abort();
            let _ = acceptor.await;
        }
    }

    /// Listens again on the same port.
    pub fn resume(&mut self) {
        if self.acceptor.is_some() {
            return;
        }
        let listener = bind(self.addr);
        self.acceptor = Some(tokio::spawn(accept_loop(
            listener,
            self.upstream,
            self.shared.clone(),
        )));
    }

    /// The first line of every connection accepted so far.
    pub fn first_lines(&self) -> Vec<String> {
        self.shared.first_lines.lock().expect("lines lock").clone()
    }

    /// How many connections opened with a request line starting with `prefix`
    /// (e.g. `GET /global/event`).
    pub fn connections_starting(&self, prefix: &str) -> usize {
        self.first_lines()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// Waits until `n` connections have opened with a request line starting with `prefix`;
    /// panics after `timeout`.
    pub async fn wait_connections(&self, prefix: &str, n: usize, timeout: std::time::Duration) {
        let mut changes = self.shared.recorded.subscribe();
        let wait = async {
            loop {
                if self.connections_starting(prefix) >= n {
                    return;
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(timeout, wait).await.is_err() {
            panic!(
                "fewer than {n} connections starting {prefix:?} after {timeout:?}: {:?}",
                self.first_lines()
            );
        }
    }

    /// Connections currently open.
    pub fn live(&self) -> usize {
        self.shared.live.lock().expect("live lock").len()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(a) = self.acceptor.take() {
            a.abort();
        }
        if let Ok(mut live) = self.shared.live.lock() {
            for (_, h) in live.drain() {
                h.abort();
            }
        }
    }
}

/// A listener with SO_REUSEADDR, so that [`TcpProxy::resume`] can take the port back at once.
fn bind(addr: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().expect("proxy socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket
        .bind(addr)
        .unwrap_or_else(|e| panic!("proxy bind {addr}: {e}"));
    socket.listen(128).expect("proxy listen")
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let task_shared = shared.clone();
        // Registered under the lock the task's own removal takes, so the removal comes after.
        let mut live = shared.live.lock().expect("live lock");
        let handle = tokio::spawn(async move {
            forward(client, upstream, &task_shared).await;
            if let Ok(mut live) = task_shared.live.lock() {
                live.remove(&id);
            }
        });
        live.insert(id, handle);
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr, shared: &Shared) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    // The first chunk carries the request line; record it, pass it on, then pipe both ways.
    let mut first = vec![0u8; 8192];
    let n = match client.read(&mut first).await {
        Ok(0) | Err(_) => return,
        Ok(n) => n,
    };
    let line = String::from_utf8_lossy(&first[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    if let Ok(mut lines) = shared.first_lines.lock() {
        lines.push(line);
    }
    shared.recorded.send_modify(|n| *n += 1);
    if server.write_all(&first[..n]).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
