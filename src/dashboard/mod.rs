//! `opencode-mcp dashboard`: a live, read-only page of the fleet (tasks grouped by fan-out,
//! the queue, workers and their slots, today's spend against its cap, what delegation saved)
//! over the state directory, served on loopback behind a token.
//!
//! - `view`: the page's data, read from the state directory (no gateway needed);
//! - `access`: the token, the host check, the cross-site guard of cancel and the headers every
//!   answer carries;
//! - this file: the routes, the one page per state directory, and the poller that makes the
//!   page live.
//!
//! **Who serves it.** `opencode-mcp dashboard` serves it read-only. A gateway whose user's file
//! sets `dashboard.serve` serves it too, and that page can cancel the gateway's own tasks (the
//! only thing the page can change). One page per state directory: whoever starts first takes
//! [`LOCK_FILE`] and notes its address; a gateway that finds it taken serves none, and names the
//! page that serves (a second `opencode-mcp dashboard`, asked for by hand, serves anyway).
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

/// `<state_dir>/dashboard.lock`: held by the page that serves the state directory, for as long
/// as it serves. Apart from the address file, which is replaced whole when written: two pages
/// starting at once would each lock their own copy of a replaced file.
pub const LOCK_FILE: &str = "dashboard.lock";

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
    let lock = std::fs::File::open(state_dir.join(LOCK_FILE)).ok()?;
    let alive = matches!(lock.try_lock(), Err(std::fs::TryLockError::WouldBlock));
    (alive && a.url.starts_with("http://127.0.0.1:")).then_some(a.url)
}

/// The right to serve a state directory's page, held while the value lives.
pub struct Claim {
    _lock: std::fs::File,
}

/// Whether this process may serve `state_dir`'s page.
pub enum Claimed {
    /// It may: nobody serves it.
    Ours(Claim),
    /// Another page serves it (its address, when it noted one).
    Taken(Option<String>),
    /// There is no state directory (the page creates nothing), or its lock cannot be made.
    Unclaimable,
}

/// Takes the state directory's page lock, if free.
pub fn claim(state_dir: &std::path::Path) -> Claimed {
    use std::os::unix::fs::OpenOptionsExt as _;
    if !state_dir.is_dir() {
        return Claimed::Unclaimable;
    }
    let path = state_dir.join(LOCK_FILE);
    let opened = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path);
    let file = match opened {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot make the dashboard's lock");
            return Claimed::Unclaimable;
        }
    };
    match file.try_lock() {
        Ok(()) => Claimed::Ours(Claim { _lock: file }),
        Err(std::fs::TryLockError::WouldBlock) => Claimed::Taken(running_address(state_dir)),
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot lock the dashboard's lock");
            Claimed::Unclaimable
        }
    }
}

/// Writes the address file, for `doctor`, under a claim.
fn note_address(state_dir: &std::path::Path, url: &str) {
    let a = Address {
        url: url.to_string(),
        pid: std::process::id(),
    };
    let Ok(bytes) = serde_json::to_vec(&a) else {
        return;
    };
    let path = state_dir.join(ADDRESS_FILE);
    if let Err(e) = crate::private_files::write_atomic(state_dir, &path, "dashboard", &bytes, None)
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot note the dashboard's address for doctor");
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
    /// The gateway serving the page: its tasks can be cancelled here. `None`: read-only.
    control: Option<Arc<crate::tasks::TaskService>>,
    access: Access,
}

/// A bound, not yet serving page: its address is known before anything is served, so the
/// caller can print it (and a test can read it).
pub struct Dashboard {
    listener: tokio::net::TcpListener,
    access: Access,
    app: App,
    publish: watch::Sender<Arc<String>>,
    claim: Option<Claim>,
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
            app: App {
                config: Arc::new(config),
                state_dir,
                latest,
                control: None,
                access: access.clone(),
            },
            access,
            publish,
            claim: None,
        })
    }

    /// Serves under `claim`, taken before binding (a gateway binds no port for a page that
    /// another process serves).
    pub fn claimed(mut self, claim: Claim) -> Self {
        self.claim = Some(claim);
        self
    }

    /// Lets the page cancel the tasks of the gateway whose service `tasks` is.
    pub fn with_control(mut self, tasks: Arc<crate::tasks::TaskService>) -> Self {
        self.app.control = Some(tasks);
        self
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
            claim,
        } = self;
        // The claim lives as long as this call: the lock is let go when the page stops.
        let claim = match claim {
            Some(claim) => Some(claim),
            None => match self::claim(&app.state_dir) {
                Claimed::Ours(claim) => Some(claim),
                Claimed::Taken(other) => {
                    tracing::warn!(
                        other = other.as_deref().unwrap_or("unknown"),
                        "another page serves this state directory; `doctor` names that one"
                    );
                    None
                }
                Claimed::Unclaimable => None,
            },
        };
        if claim.is_some() {
            note_address(&app.state_dir, &url);
        }
        let state_dir = app.state_dir.clone();
        let controller = app.control.as_ref().map(|_| std::process::id());
        let poller = tokio::spawn(poll(
            app.config.clone(),
            app.state_dir.clone(),
            controller,
            publish,
        ));
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
            .route("/api/cancel", axum::routing::post(cancel))
            .route("/api/probe", axum::routing::post(probe))
            .with_state(app)
            .layer(axum::middleware::from_fn_with_state(access, access::guard));
        let served = axum::serve(listener, routes)
            .with_graceful_shutdown(stop)
            .await
            .map_err(DashboardError::Serve);
        poller.abort();
        if claim.is_some() {
            forget_address(&state_dir);
        }
        drop(claim);
        served
    }
}

/// Publishes the page's data whenever the state directory changed, and every [`REFRESH`].
/// Reading runs on the blocking pool: it is file I/O, and a slow disk must not stall the pages.
/// `controller` is the pid of the gateway serving the page, whose tasks it can cancel.
async fn poll(
    config: Arc<Config>,
    state_dir: PathBuf,
    controller: Option<u32>,
    publish: watch::Sender<Arc<String>>,
) {
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
            (changed || due).then(|| serde_json::to_string(&records.state(&config, controller)))
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
    let controller = app.control.as_ref().map(|_| std::process::id());
    match view::task_page(&app.config, &app.state_dir, id, controller).await {
        Some(page) => match serde_json::to_string(&page) {
            Ok(body) => json(body),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        None => (StatusCode::NOT_FOUND, "no such task\n").into_response(),
    }
}

/// `POST /api/cancel?id=`: cancels a task of the gateway serving the page. Besides the token,
/// the request must come from the page itself ([`Access::same_origin_for`]): another site open in
/// the same browser cannot send it, even holding a leaked address.
async fn cancel(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Query(q): Query<TaskQuery>,
) -> Response {
    if !app.access.same_origin_for(&headers, "cancel") {
        return (
            StatusCode::FORBIDDEN,
            "cancel is taken from this page only\n",
        )
            .into_response();
    }
    let Some(tasks) = &app.control else {
        return (
            StatusCode::FORBIDDEN,
            "this page is read-only: only a page a gateway serves (dashboard.serve) can cancel \
             that gateway's tasks\n",
        )
            .into_response();
    };
    let id = q.id.trim();
    match tasks.cancel(id).await {
        Ok(snapshot) => json(
            serde_json::json!({ "task_id": snapshot.task_id, "status": snapshot.status })
                .to_string(),
        ),
        Err(e) => {
            use crate::error::{Coded as _, ErrorCode};
            let status = match e.code() {
                ErrorCode::NotFound => StatusCode::NOT_FOUND,
                ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::CONFLICT,
            };
            (status, format!("{e}\n")).into_response()
        }
    }
}

#[derive(serde::Deserialize)]
struct ProbeQuery {
    worker: String,
}

/// `POST /api/probe?worker=`: probes a remote worker of the user's configuration now (one
/// `ssh` round trip, bounded), notes what it found, and answers with it. From the page only,
/// as cancel: it runs `ssh`, so no other site may make it do so.
async fn probe(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    Query(q): Query<ProbeQuery>,
) -> Response {
    if !app.access.same_origin_for(&headers, "probe") {
        return (
            StatusCode::FORBIDDEN,
            "a probe is taken from this page only\n",
        )
            .into_response();
    }
    let worker = crate::workers::from_config(&app.config)
        .into_iter()
        .find(|w| w.name == q.worker.trim() && w.remote.is_some());
    let Some(worker) = worker else {
        return (StatusCode::NOT_FOUND, "no such remote worker\n").into_response();
    };
    let limit = crate::workers::probe::PROBE_LIMIT + Duration::from_secs(5);
    let Ok(health) = tokio::time::timeout(limit, crate::workers::probe::probe(&worker)).await
    else {
        return (StatusCode::GATEWAY_TIMEOUT, "the probe took too long\n").into_response();
    };
    let seen = crate::workers::seen::Sighting::of_probe(&health);
    if app.state_dir.is_dir() {
        crate::workers::seen::note(&app.state_dir, &worker.name, &seen);
    }
    let problems: Vec<String> = health
        .problems(&worker)
        .into_iter()
        .map(|(problem, fix)| format!("{problem}: {fix}"))
        .collect();
    json(
        serde_json::json!({
            "worker": worker.name, "ready": health.ready(), "seen": seen, "problems": problems,
        })
        .to_string(),
    )
}
