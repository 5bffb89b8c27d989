//! `opencode-mcp dashboard`: a live, read-only page of the fleet (tasks grouped by fan-out,
//! the queue, workers and their slots, today's spend against its cap, what delegation saved)
//! over the state directory, served on loopback behind a token.
//!
//! - `view`: the page's data, read from the state directory (no gateway needed);
//! - `access`: the token, the host check and the headers every answer carries;
//! - this file: the routes, and the poller that makes the page live.
//!
//! **Live.** One poller re-reads what changed in the state directory every [`POLL`] and, when
//! something did (or [`REFRESH`] passed, for the ages), publishes the page's data once; every
//! open page gets it over one server-sent event stream. A task's change therefore shows within
//! a poll and a frame, well under a second, whichever gateway wrote it, and a thousand open
//! pages cost one read of the directory, not a thousand.
//!
//! **Assets** are the three files of `assets/dashboard/`, compiled into the binary: the page
//! needs no build step and nothing from the network.

mod access;
pub mod view;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use crate::config::Config;

pub use access::Access;

/// How often the state directory is looked at.
const POLL: Duration = Duration::from_millis(250);
/// The page's data is published at least this often, so ages and running durations move.
const REFRESH: Duration = Duration::from_secs(5);

const INDEX: &str = include_str!("../../assets/dashboard/index.html");
const SCRIPT: &str = include_str!("../../assets/dashboard/app.js");
const STYLE: &str = include_str!("../../assets/dashboard/style.css");

/// `<state_dir>/dashboard.json`: the running page's address (token included) and its pid,
/// written `0600` in the `0700` state directory while it serves, so `doctor` can print it. The
/// page holds a lock on the file while it serves: as with a gateway's owner lock, a held lock
/// means alive, and a page that was killed leaves a file whose lock anyone can take (a pid
/// alone could have been reused since).
pub const ADDRESS_FILE: &str = "dashboard.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct Address {
    url: String,
    pid: u32,
}

/// The address of a dashboard serving `state_dir` now, if one says so and its process lives.
pub fn running_address(state_dir: &std::path::Path) -> Option<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(state_dir.join(ADDRESS_FILE))
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    let a: Address = serde_json::from_str(&text).ok()?;
    let file = std::fs::File::open(state_dir.join(ADDRESS_FILE)).ok()?;
    let alive = matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock));
    (alive && a.url.starts_with("http://127.0.0.1:")).then_some(a.url)
}

/// Writes the address file when the state directory exists (the page creates nothing), and
/// returns it locked: the lock lasts as long as the returned file is open.
fn note_address(state_dir: &std::path::Path, url: &str) -> Option<std::fs::File> {
    if !state_dir.is_dir() {
        return None;
    }
    let a = Address {
        url: url.to_string(),
        pid: std::process::id(),
    };
    let bytes = serde_json::to_vec(&a).ok()?;
    let path = state_dir.join(ADDRESS_FILE);
    let locked = crate::private_files::write_atomic(state_dir, &path, "dashboard", &bytes, None)
        .and_then(|()| std::fs::File::open(&path))
        .and_then(|file| file.try_lock().map(|()| file).map_err(std::io::Error::from));
    match locked {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot note the dashboard's address for doctor");
            None
        }
    }
}

/// Removes the address file if it is still this process's.
fn forget_address(state_dir: &std::path::Path) {
    let path = state_dir.join(ADDRESS_FILE);
    let ours = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Address>(&b).ok())
        .is_some_and(|a| a.pid == std::process::id());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// Why the page could not be served.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("cannot listen on 127.0.0.1:{port}: {source} (choose another with --port, or 0 for any free port)")]
    Bind { port: u16, source: std::io::Error },
    #[error("{0}")]
    Token(String),
    #[error("the page stopped: {0}")]
    Serve(std::io::Error),
}

#[derive(Clone)]
struct App {
    config: Arc<Config>,
    state_dir: PathBuf,
    /// The page's data as JSON, newest first published by the poller.
    latest: watch::Receiver<Arc<String>>,
}

/// A bound, not yet serving page: its address is known before anything is served, so the
/// caller can print it (and a test can read it).
pub struct Dashboard {
    listener: tokio::net::TcpListener,
    access: Access,
    app: App,
    publish: watch::Sender<Arc<String>>,
}

impl Dashboard {
    /// Binds `127.0.0.1:port` (0: any free port) for the state directory `state_dir`.
    pub async fn bind(
        config: Config,
        state_dir: PathBuf,
        port: u16,
    ) -> Result<Self, DashboardError> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
            .map_err(|source| DashboardError::Bind { port, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| DashboardError::Bind { port, source })?
            .port();
        let access = Access::new(bound).map_err(DashboardError::Token)?;
        let (publish, latest) = watch::channel(Arc::new(String::new()));
        Ok(Self {
            listener,
            access,
            app: App {
                config: Arc::new(config),
                state_dir,
                latest,
            },
            publish,
        })
    }

    /// The page's address, token included.
    pub fn url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/?token={}",
            self.access.port, self.access.token
        )
    }

    /// Serves until `stop` resolves.
    pub async fn serve(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), DashboardError> {
        let url = self.url();
        let Dashboard {
            listener,
            access,
            app,
            publish,
        } = self;
        let _noted = note_address(&app.state_dir, &url);
        let state_dir = app.state_dir.clone();
        let poller = tokio::spawn(poll(app.config.clone(), app.state_dir.clone(), publish));
        // Stopping ends the poller first: its sender goes, so every open page's event stream
        // ends and the graceful shutdown does not wait on them for ever.
        let ending = poller.abort_handle();
        let stop = async move {
            stop.await;
            ending.abort();
        };
        let routes = Router::new()
            .route("/", get(page))
            .route("/task", get(page))
            .route("/app.js", get(script))
            .route("/style.css", get(style))
            .route("/api/state", get(state))
            .route("/api/events", get(events))
            .route("/api/task", get(task))
            .with_state(app)
            .layer(axum::middleware::from_fn_with_state(access, access::guard));
        let served = axum::serve(listener, routes)
            .with_graceful_shutdown(stop)
            .await
            .map_err(DashboardError::Serve);
        poller.abort();
        forget_address(&state_dir);
        served
    }
}

/// Publishes the page's data whenever the state directory changed, and every [`REFRESH`].
/// Reading runs on the blocking pool: it is file I/O, and a slow disk must not stall the pages.
async fn poll(config: Arc<Config>, state_dir: PathBuf, publish: watch::Sender<Arc<String>>) {
    let records = Arc::new(std::sync::Mutex::new(view::Records::new(state_dir)));
    // When the data was last published (`None`: not yet).
    let mut last: Option<Instant> = None;
    loop {
        let (records, config) = (records.clone(), config.clone());
        let due = last.is_none_or(|t| t.elapsed() >= REFRESH);
        let json = tokio::task::spawn_blocking(move || {
            let mut records = records
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let changed = records.refresh();
            (changed || due).then(|| serde_json::to_string(&records.state(&config)))
        })
        .await;
        match json {
            Ok(Some(Ok(json))) => {
                last = Some(Instant::now());
                if publish.send(Arc::new(json)).is_err() {
                    return;
                }
            }
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "dashboard: cannot encode the page's data")
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "dashboard: reading the state directory failed"),
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The latest published data; before the first publication, waits for it (bounded).
async fn current(mut latest: watch::Receiver<Arc<String>>) -> Option<Arc<String>> {
    let ready = latest.wait_for(|s| !s.is_empty()).await.map(|s| s.clone());
    ready.ok()
}

async fn state(State(app): State<App>) -> Response {
    match tokio::time::timeout(Duration::from_secs(30), current(app.latest)).await {
        Ok(Some(s)) => json(s.as_ref().clone()),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the state directory could not be read yet\n",
        )
            .into_response(),
    }
}

async fn events(
    State(app): State<App>,
) -> Sse<impl futures::Stream<Item = Result<Event, std::convert::Infallible>>> {
    let stream = futures::stream::unfold((app.latest, true), |(mut rx, first)| async move {
        if !first || rx.borrow().is_empty() {
            rx.changed().await.ok()?;
        }
        let data = rx.borrow_and_update().clone();
        Some((
            Ok(Event::default().event("state").data(data.as_str())),
            (rx, false),
        ))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[derive(serde::Deserialize)]
struct TaskQuery {
    id: String,
}

async fn task(State(app): State<App>, Query(q): Query<TaskQuery>) -> Response {
    // The store's reader refuses an id that is not a plain name (never a path).
    let id = q.id.trim();
    match view::task_page(&app.config, &app.state_dir, id).await {
        Some(page) => match serde_json::to_string(&page) {
            Ok(body) => json(body),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        None => (StatusCode::NOT_FOUND, "no such task\n").into_response(),
    }
}
