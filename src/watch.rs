//! `opencode-mcp watch <task_id>`: OpenCode's own terminal UI on a task's session, so a person
//! can watch a delegated agent at work, read a finished one's session, or take it over.
//!
//! It reads the task's record from the state directory, as `tasks` and `usage` do (no call to
//! the gateway, which speaks MCP on stdio only), and runs
//! `opencode attach <url> --session <session_id> --dir <directory>` with the configured
//! `opencode.command`. On Unix that program *replaces* this process (exec): the TUI owns the
//! terminal and its signals, and its exit status is the command's. `--dir` is the task's own
//! directory (its worktree for `isolation: worktree`): OpenCode scopes every request to a
//! directory, and the TUI shows the session in the project it belongs to.
//!
//! **The password never reaches a command line.** OpenCode 1.18.33's `attach` takes
//! `--password`, or else reads `OPENCODE_SERVER_PASSWORD` (and `OPENCODE_SERVER_USERNAME`,
//! default `opencode`). Any local user can read any process's command line (`ps`,
//! `/proc/<pid>/cmdline`); only the process's owner can read its environment
//! (`/proc/<pid>/environ` is `0400`). So the password goes in the environment. For a managed
//! server it comes from the private file its gateway keeps while the server runs (see
//! [`crate::opencode::credentials`] for that choice); for an attached server (`opencode.url`)
//! from the variable named by `opencode.password_env`, as the gateway's own does. Neither is
//! logged.
//!
//! **Checked before the exec**, so that a dead end is one clear line here rather than a TUI that
//! spins on a dead URL: the task exists; its server is alive, answers with that password, and
//! still has the session (one bounded `GET /session/{id}`); its directory exists; the binary is
//! found. A task on a remote worker is reached the same way, through the forward its gateway
//! keeps to the worker's OpenCode; its directory is the worker's (OpenCode's `attach` passes a
//! directory it does not find here through to the server).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;
use crate::opencode::credentials::{self, CredentialsError};
use crate::opencode::{find_program, Api, OpencodeError, AUTH_USER};
use crate::tasks::{gateway_alive, read_stored, Stored, TaskRecord};

/// The environment variables `opencode attach` reads its basic-auth credentials from.
pub const PASSWORD_ENV: &str = "OPENCODE_SERVER_PASSWORD";

/// Proxy settings the TUI is not given when its server is on loopback.
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];
pub const USERNAME_ENV: &str = "OPENCODE_SERVER_USERNAME";

/// Why `watch` cannot open the task's session. Every message names what is wrong and the way on.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(
        "no state directory: set `state_dir` in delegation.yaml (or XDG_STATE_HOME or HOME) to \
         the one the gateway uses"
    )]
    NoStateDir,
    #[error(
        "no task `{task_id}` in {}: `opencode-mcp tasks` lists the stored tasks (a finished \
         task's record is removed after limits.finished_task_ttl)", .dir.display()
    )]
    UnknownTask { task_id: String, dir: PathBuf },
    #[error("the record of task `{task_id}` cannot be read: {reason}")]
    UnreadableRecord { task_id: String, reason: String },
    #[error(
        "the OpenCode server of task `{task_id}` ({server_id}, {url}) is not reachable: \
         {reason}. `watch` opens the session on the server the task ran on, so the gateway that \
         started the task must still be running (its managed servers stop with it); a finished \
         task's answer stays readable with opencode_get_task_result"
    )]
    ServerGone {
        task_id: String,
        server_id: String,
        url: String,
        reason: String,
    },
    #[error("the OpenCode server at {url} refused the password: {fix}")]
    Unauthorized { url: String, fix: String },
    #[error(
        "the session {session_id} of task `{task_id}` no longer exists on {url} (deleted in \
         OpenCode?)"
    )]
    SessionGone {
        task_id: String,
        session_id: String,
        url: String,
    },
    #[error(
        "the directory of task `{task_id}`, {directory}, no longer exists (a discarded \
         worktree?); OpenCode's UI opens a session in its own directory"
    )]
    DirectoryGone { task_id: String, directory: String },
    #[error(
        "the `{command}` binary was not found: install OpenCode with `npm install -g \
         opencode-ai@{version}`, or set opencode.command in delegation.yaml (or \
         OPENCODE_MCP_OPENCODE__COMMAND) to the path of the `opencode` binary",
        version = crate::OPENCODE_API_VERSION
    )]
    BinaryMissing { command: String },
    #[error("reading the session of task `{task_id}` from {url} failed: {source}")]
    Opencode {
        task_id: String,
        url: String,
        source: Box<OpencodeError>,
    },
    #[error("cannot run `{command} attach`: {reason}")]
    Exec { command: String, reason: String },
}

/// What to run: `<program> attach <url> --session <id> --dir <directory>`, with the password
/// (if any) in the environment.
pub struct AttachPlan {
    pub program: String,
    pub url: String,
    pub session_id: String,
    pub directory: String,
    password: Option<String>,
}

impl std::fmt::Debug for AttachPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachPlan")
            .field("program", &self.program)
            .field("url", &self.url)
            .field("session_id", &self.session_id)
            .field("directory", &self.directory)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl AttachPlan {
    /// The command: arguments hold no secret, the password is in the environment. An inherited
    /// `OPENCODE_SERVER_PASSWORD` (meant for some other server) is removed when there is none.
    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.program);
        cmd.arg("attach")
            .arg(&self.url)
            .arg("--session")
            .arg(&self.session_id)
            .arg("--dir")
            .arg(&self.directory)
            .env(USERNAME_ENV, AUTH_USER);
        match &self.password {
            Some(p) => cmd.env(PASSWORD_ENV, p),
            None => cmd.env_remove(PASSWORD_ENV),
        };
        // The TUI talks to the server only (the server talks to the model providers). A proxy
        // cannot reach this machine's loopback, and whether the TUI's runtime exempts loopback
        // IPs through NO_PROXY is not something to rely on (the gateway's own HTTP client did
        // not), so for a loopback server the proxy settings are not passed on.
        if crate::opencode::is_loopback_url(&self.url) {
            for var in PROXY_VARS {
                cmd.env_remove(var);
            }
        }
        cmd
    }

    /// Runs the TUI in place of this process. Returns only if that failed (on Unix); elsewhere
    /// it waits for the TUI and returns its exit code.
    pub fn run(&self) -> Result<std::process::ExitCode, WatchError> {
        let exec_error = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => WatchError::BinaryMissing {
                command: self.program.clone(),
            },
            _ => WatchError::Exec {
                command: self.program.clone(),
                reason: e.to_string(),
            },
        };
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            Err(exec_error(self.command().exec()))
        }
        #[cfg(not(unix))]
        {
            let status = self.command().status().map_err(exec_error)?;
            let code = status
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .unwrap_or(1);
            Ok(std::process::ExitCode::from(code))
        }
    }
}

/// Decides what to attach to for `task_id`, checking each step (see the module comment).
/// `password_from_env` reads an environment variable (the process's own, in `main`).
pub async fn plan(
    config: &Config,
    state_dir: Option<&Path>,
    task_id: &str,
    password_from_env: impl Fn(&str) -> Option<String>,
) -> Result<AttachPlan, WatchError> {
    let state_dir = state_dir.ok_or(WatchError::NoStateDir)?;
    let record = match read_stored(state_dir, task_id) {
        Stored::Record(r) => *r,
        Stored::Missing => {
            return Err(WatchError::UnknownTask {
                task_id: task_id.to_string(),
                dir: state_dir.join("tasks"),
            })
        }
        Stored::Unreadable(reason) => {
            return Err(WatchError::UnreadableRecord {
                task_id: task_id.to_string(),
                reason,
            })
        }
    };
    let gone = |url: &str, reason: String| WatchError::ServerGone {
        task_id: record.id.clone(),
        server_id: record.server_id.clone(),
        url: url.to_string(),
        reason,
    };
    // A remote task's OpenCode is the worker's, reached through the gateway's forward: its
    // credentials file is written like a managed server's, and its directory is the worker's.
    let remote = record.worker() != crate::config::LOCAL_WORKER;
    let (url, password) = if record.managed || remote {
        managed_credentials(state_dir, &record)
            .map_err(|reason| gone(&record.server_url, reason))?
    } else {
        let env = &config.opencode.password_env;
        (
            record.server_url.clone(),
            password_from_env(env).filter(|p| !p.is_empty()),
        )
    };
    if url.is_empty() {
        return Err(gone(
            "no URL yet",
            "the task has not reached its server yet; try again in a moment".into(),
        ));
    }
    if !remote && !Path::new(&record.directory).is_dir() {
        return Err(WatchError::DirectoryGone {
            task_id: record.id.clone(),
            directory: record.directory.clone(),
        });
    }
    let program = config.opencode.command.clone();
    if find_program(&program, Path::is_file).is_none() {
        return Err(WatchError::BinaryMissing { command: program });
    }
    check_session(config, &record, &url, password.as_deref()).await?;
    Ok(AttachPlan {
        program,
        url,
        session_id: record.session_id,
        directory: record.directory,
        password,
    })
}

/// The URL and password of a managed task's server, from its credentials file; `Err(reason)`
/// when the server is gone.
fn managed_credentials(
    state_dir: &Path,
    record: &TaskRecord,
) -> Result<(String, Option<String>), String> {
    match credentials::read(state_dir, &record.server_id) {
        Ok(c) if c.url == record.server_url || record.server_url.is_empty() => {
            Ok((c.url, Some(c.password)))
        }
        Ok(c) => Err(format!(
            "the credentials file of {} names another URL ({}): the server was replaced",
            record.server_id, c.url
        )),
        Err(CredentialsError::Missing(path)) => {
            let gateway = if gateway_alive(state_dir, record.owner_pid) {
                format!(
                    "the server was stopped (its gateway, pid {}, runs on)",
                    record.owner_pid
                )
            } else {
                format!(
                    "the gateway that started it (pid {}) has exited",
                    record.owner_pid
                )
            };
            Err(format!("{gateway}; {} does not exist", path.display()))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// One bounded read of the task's session: proves the server lives, takes the password, and
/// still has the session.
async fn check_session(
    config: &Config,
    record: &TaskRecord,
    url: &str,
    password: Option<&str>,
) -> Result<(), WatchError> {
    let timeout: Duration = config.timeouts.request.get();
    let opencode = |source| WatchError::Opencode {
        task_id: record.id.clone(),
        url: url.to_string(),
        source: Box::new(source),
    };
    let api = Api::new(url, password, timeout).map_err(opencode)?;
    match api
        .session_parent(&record.directory, &record.session_id)
        .await
    {
        Ok(_) => Ok(()),
        Err(OpencodeError::Unreachable { reason, .. }) => Err(WatchError::ServerGone {
            task_id: record.id.clone(),
            server_id: record.server_id.clone(),
            url: url.to_string(),
            reason: format!("it does not answer ({reason})"),
        }),
        Err(OpencodeError::Unauthorized { .. }) => Err(WatchError::Unauthorized {
            url: url.to_string(),
            fix: if record.managed {
                "the password in its credentials file is not the server's (another process \
                 took over its port?); restart the task's gateway"
                    .into()
            } else {
                let env = &config.opencode.password_env;
                format!(
                    "set the environment variable {env} (opencode.password_env) to the \
                     password that server was started with (its OPENCODE_SERVER_PASSWORD)"
                )
            },
        }),
        Err(OpencodeError::Http { status: 404, .. }) => Err(WatchError::SessionGone {
            task_id: record.id.clone(),
            session_id: record.session_id.clone(),
            url: url.to_string(),
        }),
        Err(e) => Err(opencode(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_with(password: Option<&str>) -> AttachPlan {
        AttachPlan {
            program: "opencode".into(),
            url: "http://127.0.0.1:4096".into(),
            session_id: "ses_1".into(),
            directory: "/repo".into(),
            password: password.map(String::from),
        }
    }

    #[test]
    fn the_password_is_in_the_environment_and_nowhere_else() {
        let plan = plan_with(Some("s3cret"));
        let cmd = plan.command();
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args,
            [
                "attach",
                "http://127.0.0.1:4096",
                "--session",
                "ses_1",
                "--dir",
                "/repo"
            ]
        );
        let envs: Vec<_> = cmd
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy(), v.map(|v| v.to_string_lossy())))
            .collect();
        assert!(envs.contains(&(PASSWORD_ENV.into(), Some("s3cret".into()))));
        assert!(envs.contains(&(USERNAME_ENV.into(), Some(AUTH_USER.into()))));
        assert!(!format!("{plan:?}").contains("s3cret"));
        // A loopback server is reached without the user's proxy.
        for var in PROXY_VARS {
            assert!(envs.contains(&(var.into(), None)), "{var} removed");
        }
    }

    #[test]
    fn without_a_password_an_inherited_one_is_not_passed_on() {
        let cmd = plan_with(None).command();
        assert!(cmd
            .get_envs()
            .any(|(k, v)| k == PASSWORD_ENV && v.is_none()));
    }

    /// Writes `record` where the gateway keeps it under `state_dir`.
    fn store(state_dir: &Path, record: &TaskRecord) {
        let dir = state_dir.join("tasks");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let bytes = serde_json::to_vec(record).expect("json");
        std::fs::write(dir.join(format!("{}.json", record.id)), bytes).expect("write");
    }

    fn record(id: &str, directory: &Path) -> TaskRecord {
        let mut r = TaskRecord::new(
            id.into(),
            "srv_1".into(),
            "ses_1".into(),
            directory.display().to_string(),
            "t".into(),
        );
        r.owner_pid = u32::MAX;
        r
    }

    /// Each step that cannot lead to a session says which and why: no state directory, no such
    /// task, an unreadable record, a managed server whose gateway is gone, an attached server
    /// with no URL yet or that does not answer, a directory gone, no `opencode` to run.
    #[tokio::test]
    async fn each_step_that_fails_says_which() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (state, work) = (tmp.path().join("state"), tmp.path().join("work"));
        std::fs::create_dir_all(&work).expect("mkdir");
        let mut config = crate::gateway::test_config();
        config.opencode.command = "/bin/sh".into();
        config.timeouts.request = "2s".parse().expect("a duration");
        let plan_of = |config: Config, id: &'static str| {
            let state = state.clone();
            async move { plan(&config, Some(&state), id, |_| None).await }
        };
        assert!(matches!(
            plan(&config, None, "tsk_a", |_| None).await,
            Err(WatchError::NoStateDir)
        ));
        assert!(matches!(
            plan_of(config.clone(), "tsk_none").await,
            Err(WatchError::UnknownTask { .. })
        ));
        std::fs::create_dir_all(state.join("tasks")).expect("mkdir");
        std::fs::write(state.join("tasks/tsk_torn.json"), "{").expect("write");
        assert!(matches!(
            plan_of(config.clone(), "tsk_torn").await,
            Err(WatchError::UnreadableRecord { .. })
        ));

        let mut managed = record("tsk_managed", &work);
        managed.managed = true;
        managed.server_url = "http://127.0.0.1:9".into();
        store(&state, &managed);
        match plan_of(config.clone(), "tsk_managed").await {
            Err(WatchError::ServerGone { reason, .. }) => {
                assert!(reason.contains("has exited"), "{reason}")
            }
            other => panic!("{:?}", other.map(|p| p.url)),
        }

        let mut attached = record("tsk_attached", &work);
        store(&state, &attached);
        match plan_of(config.clone(), "tsk_attached").await {
            Err(WatchError::ServerGone { reason, .. }) => {
                assert!(reason.contains("has not reached its server"), "{reason}")
            }
            other => panic!("{:?}", other.map(|p| p.url)),
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        attached.server_url = format!("http://127.0.0.1:{port}");
        store(&state, &attached);
        match plan_of(config.clone(), "tsk_attached").await {
            Err(WatchError::ServerGone { reason, .. }) => {
                assert!(reason.contains("does not answer"), "{reason}")
            }
            other => panic!("{:?}", other.map(|p| p.url)),
        }
        let mut missing = config.clone();
        missing.opencode.command = "/nonexistent/opencode".into();
        assert!(matches!(
            plan_of(missing, "tsk_attached").await,
            Err(WatchError::BinaryMissing { .. })
        ));
        let mut moved = record("tsk_moved", &tmp.path().join("gone"));
        moved.server_url = attached.server_url.clone();
        store(&state, &moved);
        assert!(matches!(
            plan_of(config, "tsk_moved").await,
            Err(WatchError::DirectoryGone { .. })
        ));
    }
}
