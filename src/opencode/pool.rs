//! The OpenCode servers the gateway knows: managed children it started and servers it attached
//! to, keyed by a `server_id` the host passes back.
//!
//! One server per directory: a second `start_server` for the same directory returns the running
//! one (the original spawned a second process on the same fixed port). That holds in attach mode
//! too: each directory gets its own attached `Server` on the configured URL, because a server's
//! `directory` is where tasks that name none run, and handing directory A's server to a caller
//! that asked for B would run B's later tasks in A's repository. Each server gets its event
//! pump the moment it is known, before any task can be started on it, because OpenCode's stream
//! has no replay.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api::Api;
use super::credentials::{Credentials, CredentialsFile};
use super::error::OpencodeError;
use super::events::{run_pump, PumpEvent};
use super::process::{ManagedProcess, SpawnRequest};
use crate::config::Config;
use crate::ids;
use crate::sandbox::{Confinement, Decision, ServerSandbox};
use crate::workers::sandbox::WorkerShell;

/// What `start_server` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ServerInfo {
    pub server_id: String,
    /// Base URL of the server's HTTP API.
    pub url: String,
    /// `true` when the gateway started the process (and will stop it); `false` when attached.
    pub managed: bool,
    /// OpenCode's version.
    pub version: String,
    /// The directory tasks on this server run in unless they name their own.
    pub directory: String,
    /// `true` when an already running server for this directory was returned.
    pub reused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// What `stop_server` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct StopInfo {
    pub server_id: String,
    /// `true` if a process was terminated; `false` for an attached server (only forgotten).
    pub terminated: bool,
    /// How the process ended, for a managed server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
    /// Tasks that were still running and are now `failed`.
    pub failed_tasks: Vec<String>,
}

/// One known server.
#[derive(Debug)]
pub struct Server {
    pub id: String,
    pub api: Api,
    pub directory: String,
    pub version: String,
    pub process: Option<ManagedProcess>,
    /// Stops the pump (and the tracker listening to it).
    pub stop: CancellationToken,
    /// Where `opencode-mcp watch` finds this managed server's password (see `credentials`);
    /// removed when the server is stopped or forgotten.
    pub credentials: Option<CredentialsFile>,
    /// The worker whose OpenCode this is, reached through an ssh forward (`workers::serve`);
    /// `None` for this machine's.
    pub worker: Option<String>,
    /// What confines its agents' commands (a managed server on this machine with the sandbox
    /// on); `None` leaves them unconfined, for the reason in `confinement`.
    pub sandbox: Option<Arc<ServerSandbox>>,
    /// A worker's OpenCode with its tasks confined there: the script it runs commands through
    /// (written again before every turn).
    pub worker_shell: Option<Arc<WorkerShell>>,
    /// Whether tasks on this server run confined, and why not.
    pub confinement: Confinement,
}

impl Server {
    pub fn info(&self, reused: bool) -> ServerInfo {
        ServerInfo {
            server_id: self.id.clone(),
            url: self.api.base_url().to_string(),
            managed: self.process.is_some(),
            version: self.version.clone(),
            directory: self.directory.clone(),
            reused,
            pid: self.process.as_ref().map(|p| p.pid),
        }
    }

    /// `Some(how)` when the managed process has exited.
    pub fn exited(&self) -> Option<String> {
        self.process.as_ref().and_then(ManagedProcess::exit_status)
    }
}

/// A newly known server and the stream of its events, for the tracker.
pub struct Started {
    pub server: Arc<Server>,
    pub events: mpsc::UnboundedReceiver<PumpEvent>,
}

/// The servers, by id.
pub struct ServerPool {
    config: Arc<Config>,
    servers: Mutex<HashMap<String, Arc<Server>>>,
    /// Serialises starts so two concurrent `start_server` calls for one directory cannot spawn
    /// two processes.
    starting: tokio::sync::Mutex<()>,
    /// The state directory managed servers' credentials files go to (for `watch`); `None`
    /// writes none.
    credentials_dir: Option<PathBuf>,
}

impl ServerPool {
    pub fn new(config: Arc<Config>) -> Self {
        Self {
            config,
            servers: Mutex::new(HashMap::new()),
            starting: tokio::sync::Mutex::new(()),
            credentials_dir: None,
        }
    }

    /// Publishes each managed server's URL and password in a private file under `state_dir`
    /// while the server runs, so that `opencode-mcp watch` can attach to it (see
    /// `credentials`). Files a gone gateway left there are swept first (`gateway_alive` says
    /// whether a gateway pid still runs).
    pub fn publishing_credentials(
        mut self,
        state_dir: &Path,
        gateway_alive: impl Fn(u32) -> bool,
    ) -> Self {
        let swept = super::credentials::sweep(state_dir, gateway_alive);
        if swept > 0 {
            tracing::debug!(swept, "removed credentials files of gateways that are gone");
        }
        let swept = super::linger::sweep(state_dir);
        if swept > 0 {
            tracing::debug!(
                swept,
                "removed the files of servers that stopped lingering long ago"
            );
        }
        self.credentials_dir = Some(state_dir.to_path_buf());
        self
    }

    /// The server with this id.
    pub fn get(&self, server_id: &str) -> Option<Arc<Server>> {
        self.lock().get(server_id).cloned()
    }

    /// Every known server.
    pub fn all(&self) -> Vec<Arc<Server>> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Server>>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map.
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a managed server for `directory` (default: the gateway's working directory), or
    /// attaches to `opencode.url` when configured. Returns `Ok((info, None))` when a running
    /// server for that directory (attached to that URL, in attach mode) already exists.
    /// The live server a start for `directory` would return rather than start another.
    fn running_for(&self, directory: &str) -> Option<Arc<Server>> {
        let attach_url = self.config.opencode.url.as_deref();
        self.lock()
            .values()
            .find(|s| {
                s.exited().is_none()
                    && answers_start(
                        s.api.base_url(),
                        s.process.is_some(),
                        &s.directory,
                        attach_url,
                        directory,
                    )
            })
            .cloned()
    }

    /// The id of the server `server_id: "default"` stands for (the one a start with no
    /// directory returns), if it is running; nothing is started.
    pub fn default_id(&self) -> Option<String> {
        let directory = resolve_directory(None).ok()?;
        self.running_for(&directory).map(|s| s.id.clone())
    }

    pub async fn start(
        &self,
        port: Option<u16>,
        directory: Option<String>,
    ) -> Result<(ServerInfo, Option<Started>), OpencodeError> {
        let directory = resolve_directory(directory)?;
        let _guard = self.starting.lock().await;
        if let Some(server) = self.running_for(&directory) {
            return Ok((server.info(true), None));
        }
        // Forget servers whose process died: a fresh start replaces them.
        self.lock().retain(|_, s| s.exited().is_none());

        let request_timeout = self.config.timeouts.request.get();
        let id = ids::server_id();
        let mut credentials = None;
        let mut sandbox = None;
        let (api, process, confinement) = match &self.config.opencode.url {
            Some(url) => (
                self.attach(url, request_timeout)?,
                None,
                Confinement::Unconfined(
                    "the gateway attached to this OpenCode (opencode.url) rather than start it, \
                     so it cannot confine its agents"
                        .into(),
                ),
            ),
            None => {
                let confinement;
                (sandbox, confinement) = self.sandbox_for(&id)?;
                let password = ids::secret().map_err(|e| {
                    OpencodeError::Start(format!(
                        "cannot make a password for the server: the system's random number \
                         generator failed ({e})"
                    ))
                })?;
                let process = ManagedProcess::spawn(SpawnRequest {
                    config: &self.config.opencode,
                    port: port.unwrap_or(self.config.opencode.port),
                    directory: Path::new(&directory),
                    password: &password,
                    start_timeout: self.config.timeouts.server_start.get(),
                    shell: sandbox.as_ref().map(|s| s.shell()),
                })
                .await?;
                let api = Api::new(&process.url, Some(&password), request_timeout)?;
                credentials = self.publish(&id, &process.url, &password);
                (api, Some(process), confinement)
            }
        };
        let version = match api.health().await {
            Ok(v) => v,
            Err(e) => {
                if let Some(p) = &process {
                    p.stop().await;
                    return Err(e);
                }
                return Err(self.attach_error(api.base_url(), e));
            }
        };
        let server = Arc::new(Server {
            id,
            api: api.clone(),
            directory,
            version,
            process,
            stop: CancellationToken::new(),
            credentials,
            worker: None,
            sandbox,
            worker_shell: None,
            confinement,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_pump(api, tx, server.stop.clone()));
        self.lock().insert(server.id.clone(), server.clone());
        tracing::info!(server_id = %server.id, url = server.api.base_url(), managed = server.process.is_some(), "OpenCode server ready");
        Ok((server.info(false), Some(Started { server, events: rx })))
    }

    /// Takes in the OpenCode of worker `worker`, already running there and reached here at `url`
    /// (its forward) with `password`, serving from `directory` on the worker. It is never
    /// handed to a `start_server` (that starts or attaches this machine's); tasks placed on the
    /// worker run on it. Its process is the worker's (`workers::serve`), so stopping it here
    /// only forgets it.
    pub async fn adopt_worker(
        &self,
        worker: &str,
        url: &str,
        password: &str,
        directory: &str,
        shell: Result<Arc<WorkerShell>, String>,
    ) -> Result<Started, OpencodeError> {
        let api = Api::new(url, Some(password), self.config.timeouts.request.get())?;
        let version = api.health().await?;
        let id = ids::server_id();
        // `watch` reaches it through the same forward while this gateway runs.
        let credentials = self.publish(&id, url, password);
        let server = Arc::new(Server {
            id,
            api: api.clone(),
            directory: directory.to_string(),
            version,
            process: None,
            stop: CancellationToken::new(),
            credentials,
            worker: Some(worker.to_string()),
            sandbox: None,
            confinement: match &shell {
                Ok(_) => Confinement::Confined,
                Err(why) => Confinement::Unconfined(why.clone()),
            },
            worker_shell: shell.ok(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_pump(api, tx, server.stop.clone()));
        self.lock().insert(server.id.clone(), server.clone());
        tracing::info!(server_id = %server.id, worker, url, "the worker's OpenCode is in use");
        Ok(Started { server, events: rx })
    }

    /// The sandbox a managed server `id` gets under the user's `sandbox` settings. Refused
    /// (the server is not started) when confinement is on but cannot work here.
    fn sandbox_for(
        &self,
        id: &str,
    ) -> Result<(Option<Arc<ServerSandbox>>, Confinement), OpencodeError> {
        let dir = self.credentials_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("opencode-mcp-{}", std::process::id()))
        });
        let policy = match crate::sandbox::decide(&self.config.sandbox, &dir) {
            Decision::Confine(policy) => policy,
            Decision::Unconfined(why) => return Ok((None, Confinement::Unconfined(why))),
            Decision::Refuse(why) => return Err(OpencodeError::Start(why)),
        };
        // The confining shell is this binary, named by its real path: `/proc/self/exe`, which
        // the supervisor is started as, would name the script's own `sh` there. Library use
        // (no supervisor enabled) has no such binary.
        let exe = super::supervisor::program()
            .and_then(|_| std::env::current_exe().ok())
            .ok_or_else(|| {
                OpencodeError::Start(
                    "tasks run confined by default, but this binary's own path is unknown, and \
                     the confining shell runs it"
                        .into(),
                )
            })?;
        let sandbox =
            ServerSandbox::create(&dir.join("sandbox"), id, policy, &exe).map_err(|e| {
                OpencodeError::Start(format!(
                    "cannot write the sandbox's files under {}: {e}",
                    dir.display()
                ))
            })?;
        Ok((Some(Arc::new(sandbox)), Confinement::Confined))
    }

    /// Writes the credentials file of a managed server. A failure costs only `watch` on this
    /// server, so it is logged and the server is used anyway.
    fn publish(&self, server_id: &str, url: &str, password: &str) -> Option<CredentialsFile> {
        let dir = self.credentials_dir.as_deref()?;
        let credentials = Credentials {
            server_id: server_id.to_string(),
            url: url.to_string(),
            password: password.to_string(),
            gateway_pid: std::process::id(),
        };
        CredentialsFile::write(dir, &credentials)
            .inspect_err(|e| {
                tracing::warn!(server_id, error = %e, "cannot write the server's credentials file; `opencode-mcp watch` cannot attach to it")
            })
            .ok()
    }

    /// A client for the configured server. Its password comes from the environment variable named
    /// by `opencode.password_env`; without one, only a loopback URL is accepted (anyone on the
    /// network could otherwise drive an agent that runs tools with the user's rights, and the
    /// traffic would be readable).
    fn attach(
        &self,
        url: &str,
        request_timeout: std::time::Duration,
    ) -> Result<Api, OpencodeError> {
        let env = &self.config.opencode.password_env;
        let password = std::env::var(env).ok().filter(|p| !p.is_empty());
        if password.is_none() && !is_loopback_url(url) {
            return Err(OpencodeError::Attach {
                url: url.to_string(),
                reason: format!(
                    "it is not a loopback address, so the gateway only talks to it with a \
                     password: set the environment variable {env} (opencode.password_env) to the \
                     password that server was started with (its OPENCODE_SERVER_PASSWORD)"
                ),
            });
        }
        Api::new(url, password.as_deref(), request_timeout)
    }

    /// Rewrites a failed first contact with an attached server as what the user must change.
    fn attach_error(&self, url: &str, e: OpencodeError) -> OpencodeError {
        let env = &self.config.opencode.password_env;
        let has_password = std::env::var(env).is_ok_and(|p| !p.is_empty());
        let reason = match &e {
            OpencodeError::Unauthorized { .. } if has_password => format!(
                "it refused the password (HTTP 401): the environment variable {env} \
                 (opencode.password_env) must hold the password that server was started \
                 with (its OPENCODE_SERVER_PASSWORD)"
            ),
            OpencodeError::Unauthorized { .. } => format!(
                "it requires a password (HTTP 401): set the environment variable {env} \
                 (opencode.password_env) to the password that server was started with \
                 (its OPENCODE_SERVER_PASSWORD)"
            ),
            OpencodeError::NotTheApi { .. } => "GET /global/health answered with a web page \
                 instead of OpenCode's JSON, so this URL is not the API of `opencode serve` (an \
                 unknown route of OpenCode answers with its web UI too): set opencode.url to the \
                 base URL that `opencode serve` prints, e.g. http://127.0.0.1:4096"
                .to_string(),
            OpencodeError::Unreachable { reason, .. } => format!(
                "it is unreachable ({reason}): check that `opencode serve` runs there and that \
                 opencode.url names it, or unset opencode.url to let the gateway start its own"
            ),
            OpencodeError::Decode { detail, .. } => format!(
                "its answer to GET /global/health did not decode ({detail}): is it OpenCode, and \
                 the version this gateway was built for?"
            ),
            OpencodeError::Http {
                status, message, ..
            } => format!(
                "GET /global/health answered HTTP {status} ({message}): check opencode.url and \
                 the server's logs"
            ),
            _ => return e,
        };
        OpencodeError::Attach {
            url: url.to_string(),
            reason,
        }
    }

    /// Lets managed server `server_id` run on for `grace` after this gateway (it exits cleanly
    /// while tasks run there), for the next gateway on the state directory to take over (see
    /// [`super::linger`]): its supervisor is asked to linger, the file the next gateway reads is
    /// written, its sandbox's files are kept, and it is forgotten here without being stopped.
    /// On an error the server is untouched (the caller stops it as usual).
    pub async fn let_linger(
        &self,
        server_id: &str,
        grace: std::time::Duration,
        deadlines: &[super::process::OpenTurn],
    ) -> Result<(), String> {
        let server = self.get(server_id).ok_or("no such server")?;
        let (Some(process), None) = (&server.process, &server.worker) else {
            return Err("not a managed server on this machine".into());
        };
        let dir = self
            .credentials_dir
            .as_deref()
            .ok_or("no state directory to leave it in")?;
        let socket = super::linger::socket_path(dir, &server.id).ok_or_else(|| {
            format!(
                "the state directory's path ({}) is too long for a Unix socket",
                dir.display()
            )
        })?;
        let saved = super::linger::Lingering {
            server_id: server.id.clone(),
            url: process.url.clone(),
            password: process.password().to_string(),
            directory: server.directory.clone(),
            confined: server.sandbox.is_some(),
            gateway_pid: std::process::id(),
        };
        // Saved before the supervisor is asked: a file with no lingering server behind it is
        // harmless (the next gateway cannot connect), a lingering server with no file is lost.
        super::linger::save(dir, &saved).map_err(|e| e.to_string())?;
        if let Err(e) = process.linger(grace, &socket, deadlines).await {
            super::linger::remove(dir, &server.id);
            return Err(e);
        }
        if let Some(sandbox) = &server.sandbox {
            sandbox.keep();
        }
        self.lock().remove(server_id);
        server.stop.cancel();
        if let Some(c) = &server.credentials {
            c.remove();
        }
        Ok(())
    }

    /// Takes over managed server `server_id`, which a gateway now gone left lingering (see
    /// [`super::linger`]), under the same id: its supervisor's socket becomes this gateway's
    /// lifeline, its sandbox's files are its own again. `None` when no gateway left it (no
    /// file), an error when it cannot be reached.
    pub async fn adopt_lingering(&self, server_id: &str) -> Option<Result<Started, OpencodeError>> {
        let dir = self.credentials_dir.as_deref()?;
        let saved = super::linger::load(dir, server_id)?;
        Some(self.take_lingering(dir, saved).await)
    }

    async fn take_lingering(
        &self,
        dir: &Path,
        saved: super::linger::Lingering,
    ) -> Result<Started, OpencodeError> {
        let lost = |why: String| {
            OpencodeError::Start(format!(
                "the OpenCode left running by the previous gateway cannot be taken over: {why}"
            ))
        };
        if let Some(server) = self.get(&saved.server_id) {
            return Err(lost(format!("server {} is already in use here", server.id)));
        }
        let socket = super::linger::socket_path(dir, &saved.server_id)
            .ok_or_else(|| lost("no socket path".into()))?;
        let within = self.config.timeouts.server_start.get();
        let attached =
            ManagedProcess::attach(&socket, saved.url.clone(), saved.password.clone(), within)
                .await;
        // Taken over, or never to be: a supervisor that does not answer stopped (its grace
        // passed), and one that does has this gateway's connection as its lifeline from now on
        // (an error below drops it, and the supervisor stops OpenCode as a gateway's end would).
        super::linger::remove(dir, &saved.server_id);
        let process = attached.map_err(lost)?;
        let sandbox = match saved.confined {
            false => None,
            true => {
                let exe = std::env::current_exe().map_err(|e| lost(e.to_string()))?;
                let sandbox = ServerSandbox::reopen(&dir.join("sandbox"), &saved.server_id, &exe)
                    .map_err(|e| lost(format!("its sandbox's files: {e}")))?;
                Some(Arc::new(sandbox))
            }
        };
        let api = Api::new(
            &saved.url,
            Some(&saved.password),
            self.config.timeouts.request.get(),
        )?;
        let version = api.health().await.map_err(|e| lost(e.to_string()))?;
        let credentials = self.publish(&saved.server_id, &saved.url, &saved.password);
        let server = Arc::new(Server {
            id: saved.server_id,
            api: api.clone(),
            directory: saved.directory,
            version,
            process: Some(process),
            stop: CancellationToken::new(),
            credentials,
            worker: None,
            confinement: match &sandbox {
                Some(_) => Confinement::Confined,
                None => Confinement::Unconfined(
                    "its OpenCode was started unconfined by the previous gateway".into(),
                ),
            },
            sandbox,
            worker_shell: None,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_pump(api, tx, server.stop.clone()));
        self.lock().insert(server.id.clone(), server.clone());
        tracing::info!(server_id = %server.id, url = server.api.base_url(), "took over the OpenCode a previous gateway left running for its tasks");
        Ok(Started { server, events: rx })
    }

    /// Removes the server, stops its pump and, for a managed one, its process.
    pub async fn stop(&self, server_id: &str) -> Option<(Arc<Server>, Option<String>)> {
        let server = self.lock().remove(server_id)?;
        server.stop.cancel();
        // The password goes before the process: `watch` finds no file for a stopping server.
        if let Some(c) = &server.credentials {
            c.remove();
        }
        let exit = match &server.process {
            Some(p) => Some(p.stop().await),
            None => None,
        };
        Some((server, exit))
    }

    /// Stops every server (shutdown).
    pub async fn stop_all(&self) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        let stops = ids.iter().map(|id| self.stop(id));
        futures::future::join_all(stops).await;
    }
}

/// Whether a known server answers a `start_server` for `directory`: it runs in that directory,
/// and it is of the kind the config asks for (attached to `attach_url` when one is configured,
/// managed otherwise). `directory` is already resolved (canonical), as every server's is.
fn answers_start(
    server_url: &str,
    managed: bool,
    server_directory: &str,
    attach_url: Option<&str>,
    directory: &str,
) -> bool {
    server_directory == directory
        && match attach_url {
            Some(url) => !managed && server_url == url.trim_end_matches('/'),
            None => managed,
        }
}

/// The directory a server or task runs in: absolute, existing, canonical.
pub fn resolve_directory(directory: Option<String>) -> Result<String, OpencodeError> {
    let path = match directory {
        Some(d) => PathBuf::from(d),
        None => std::env::current_dir().map_err(|e| {
            OpencodeError::Config(format!("cannot read the working directory: {e}"))
        })?,
    };
    if !path.is_absolute() {
        return Err(OpencodeError::Config(format!(
            "directory `{}` must be an absolute path",
            path.display()
        )));
    }
    let canonical = path.canonicalize().map_err(|e| {
        OpencodeError::Config(format!("directory `{}` is not usable: {e}", path.display()))
    })?;
    if !canonical.is_dir() {
        return Err(OpencodeError::Config(format!(
            "`{}` is not a directory",
            canonical.display()
        )));
    }
    // Kept as text from here on (records, OpenCode's `directory`): a real path that is not
    // UTF-8 would be kept changed, naming a directory that does not exist.
    canonical.into_os_string().into_string().map_err(|raw| {
        OpencodeError::Config(format!(
            "directory `{}` resolves to `{}`, which is not valid UTF-8: the gateway keeps task \
             directories as text; rename the directory",
            path.display(),
            std::path::Path::new(&raw).display()
        ))
    })
}

/// Whether `url` names this machine: an IP loopback address (`127.0.0.0/8`, `::1`) or
/// `localhost`. Parsed as a URL, so a host that merely starts like one
/// (`127.0.0.1.evil.example`) is a domain name, not a loopback address.
pub fn is_loopback_url(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    // An IPv6 host comes bracketed (`[::1]`); the parser has already normalised IPv4 forms.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a known managed server can linger; a takeover needs a state directory and a file
    /// a gateway left, and a file whose server no longer answers is removed, not kept.
    #[tokio::test]
    async fn lingering_needs_a_server_a_state_directory_and_an_answer() {
        let config = Arc::new(crate::gateway::test_config());
        let bare = ServerPool::new(config.clone());
        let refused = bare
            .let_linger("srv_none", std::time::Duration::from_secs(1), &[])
            .await;
        assert_eq!(refused, Err("no such server".to_string()));
        assert!(bare.adopt_lingering("srv_none").await.is_none());

        let dir = tempfile::tempdir().expect("a directory");
        let pool = ServerPool::new(config).publishing_credentials(dir.path(), |_| false);
        assert!(pool.adopt_lingering("srv_gone").await.is_none(), "no file");
        let saved = super::super::linger::Lingering {
            server_id: "srv_gone".into(),
            url: "http://127.0.0.1:1".into(),
            password: "pw".into(),
            directory: dir.path().display().to_string(),
            confined: false,
            gateway_pid: 1,
        };
        super::super::linger::save(dir.path(), &saved).expect("saved");
        match pool.adopt_lingering("srv_gone").await {
            Some(Err(e)) => assert!(e.to_string().contains("cannot be taken over"), "{e}"),
            other => panic!(
                "expected an error, found {:?}",
                other.map(|r| r.map(|_| ()))
            ),
        }
        assert!(
            super::super::linger::load(dir.path(), "srv_gone").is_none(),
            "the file of a server that no longer answers was kept"
        );
    }

    #[test]
    fn loopback_urls_are_recognised() {
        assert!(is_loopback_url("http://127.0.0.1:4096"));
        assert!(is_loopback_url("http://localhost:4096/"));
        assert!(is_loopback_url("http://[::1]:4096"));
        assert!(is_loopback_url("http://127.9.8.7"));
        assert!(is_loopback_url("http://[::1]:1"));
        assert!(is_loopback_url("https://LOCALHOST"));
        assert!(!is_loopback_url("http://10.0.0.2:4096"));
        assert!(!is_loopback_url("https://example.invalid"));
        // Hosts that only start like a loopback address are somewhere else.
        assert!(!is_loopback_url("http://127.0.0.1.evil.example"));
        assert!(!is_loopback_url("http://localhost.evil.example:4096"));
        assert!(!is_loopback_url("http://[::1].evil.example"));
        assert!(!is_loopback_url("http://evil.example/127.0.0.1"));
        assert!(!is_loopback_url("http://127.0.0.1@evil.example"));
        assert!(!is_loopback_url("http://[::2]:4096"));
        assert!(!is_loopback_url("not a url"));
    }

    #[test]
    fn a_server_is_reused_only_for_its_own_directory_and_kind() {
        let url = "http://127.0.0.1:4096";
        let attach = Some("http://127.0.0.1:4096/");
        // Attach mode: the same URL and directory is reused; another directory is not.
        assert!(answers_start(url, false, "/repo/a", attach, "/repo/a"));
        assert!(!answers_start(url, false, "/repo/a", attach, "/repo/b"));
        // Not another URL, and not a managed server, even in the same directory.
        assert!(!answers_start(
            "http://127.0.0.1:5000",
            false,
            "/repo/a",
            attach,
            "/repo/a"
        ));
        assert!(!answers_start(url, true, "/repo/a", attach, "/repo/a"));
        // Managed mode: one per directory, and an attached leftover does not count.
        assert!(answers_start(url, true, "/repo/a", None, "/repo/a"));
        assert!(!answers_start(url, true, "/repo/a", None, "/repo/b"));
        assert!(!answers_start(url, false, "/repo/a", None, "/repo/a"));
    }

    #[test]
    fn relative_and_missing_directories_are_rejected() {
        assert!(resolve_directory(Some("relative/dir".into())).is_err());
        assert!(resolve_directory(Some("/definitely/not/here/xyz".into())).is_err());
        assert!(resolve_directory(Some("/".into())).is_ok());
    }
}
