//! The end-to-end rig: a fake LLM, an isolated environment, the gateway binary spawned over stdio
//! with the pinned OpenCode as its `opencode.command`, and one managed OpenCode server started
//! through the gateway's own `opencode_start_server` tool, exactly as a host would do it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::fake_llm::{FakeLlm, RecordedRequest};
use super::isolation::OpenCodeEnv;
use super::mcp::{Launch, McpClient};
use super::opencode_bin::opencode_bin;
use super::opencode_server::OpenCodeServer;

/// Generous bound for a task that should finish quickly (OpenCode's first turn loads plugins).
pub const TASK_TIMEOUT_MS: u64 = 60_000;

pub struct Rig {
    pub fake: FakeLlm,
    pub env: OpenCodeEnv,
    pub client: McpClient,
    /// How the gateway was launched (to launch it again after a kill).
    pub launch: Launch,
    /// The `opencode_start_server` result.
    pub server: Value,
}

impl Rig {
    /// Starts everything; `extra_env` are `OPENCODE_MCP_*` overrides for this gateway.
    pub async fn start(extra_env: &[(&str, &str)]) -> Self {
        Self::start_in(FakeLlm::start(), OpenCodeEnv::new(), extra_env).await
    }

    /// Starts a gateway in `env` (whose fake LLM is `fake`), then a server through it.
    /// An OpenCode the test starts itself in `env` (known password, outliving gateway restarts),
    /// and a gateway attached to it (`opencode.url`) with `extra_env`. Drop order: the gateway
    /// first, then OpenCode.
    pub async fn attached(env: OpenCodeEnv, extra_env: &[(&str, &str)]) -> (Self, OpenCodeServer) {
        let fake = FakeLlm::start();
        let opencode = OpenCodeServer::start(&env, &fake.url()).await;
        let mut vars: Vec<(&str, &str)> = vec![
            ("OPENCODE_MCP_OPENCODE__URL", opencode.url()),
            ("OPENCODE_SERVER_PASSWORD", opencode.password()),
        ];
        vars.extend_from_slice(extra_env);
        let rig = Rig::start_in(fake, env, &vars).await;
        assert_eq!(rig.server["managed"], false, "{}", rig.server);
        (rig, opencode)
    }

    pub async fn start_in(fake: FakeLlm, env: OpenCodeEnv, extra_env: &[(&str, &str)]) -> Self {
        Self::start_launched(fake, env, extra_env, |launch| launch).await
    }

    /// [`Self::start_in`], with the launch adjusted by `adjust` (e.g. [`Launch::modern`]).
    pub async fn start_launched(
        fake: FakeLlm,
        env: OpenCodeEnv,
        extra_env: &[(&str, &str)],
        adjust: impl FnOnce(Launch) -> Launch,
    ) -> Self {
        let mut launch = Launch::new(env.work_dir(), &env.home_dir())
            .envs(env.vars(&fake.url()))
            .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin())
            .env("OPENCODE_MCP_LOG", "info,opencode=debug");
        for (k, v) in extra_env {
            launch = launch.env(*k, *v);
        }
        let launch = adjust(launch);
        let client = launch
            .connect()
            .await
            .expect("the gateway starts and initializes");
        let server = match client.call_ok("opencode_start_server", json!({})).await {
            Ok(v) => v,
            Err(e) => panic!(
                "start_server: {e}\n--- gateway stderr ---\n{}",
                client.stderr()
            ),
        };
        Self {
            fake,
            env,
            client,
            launch,
            server,
        }
    }

    /// Task `id`'s status once it is `running` (or after a minute, whatever it is then).
    pub async fn running(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut status = self.status(id).await;
        while status["status"] != "running" && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            status = self.status(id).await;
        }
        status
    }

    /// The status of task `id` once its start is done and its turn under way (or over): a
    /// start that makes a worktree or runs on a worker answers before that (phase
    /// `starting`), and its worktree is known only then. Panics, with the status, if that
    /// takes more than 60 s.
    pub async fn started(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.status(id).await;
            // Past `pending`: its prompt was taken (a task whose first turn is registered may
            // still be sending it).
            if !["pending", "queued"].contains(&status["status"].as_str().unwrap_or_default()) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} still pending after 60 s: {status}\n{}",
                self.client.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The worktree of task `id` (see [`Self::started`]).
    pub async fn worktree(&self, id: &str) -> std::path::PathBuf {
        let status = self.started(id).await;
        let path = status["workspace"]["path"].as_str();
        std::path::PathBuf::from(
            path.unwrap_or_else(|| panic!("task {id} has no worktree: {status}")),
        )
    }

    /// Appends `yaml` to the user's file `file` and waits (bounded) until this gateway has
    /// reloaded it: for a setting that must hold only from now on (a reload applies to the
    /// turns opened after it), such as a short `timeouts.task` that a task started earlier
    /// must not be held to.
    pub async fn append_and_reload(&self, file: &std::path::Path, yaml: &str) {
        const RELOADED: &str = "configuration reloaded";
        let before = self.client.stderr().matches(RELOADED).count();
        let text = std::fs::read_to_string(file).expect("the user's file");
        std::fs::write(file, format!("{text}{yaml}")).expect("edit the user's file");
        let reloaded = poll_for(Duration::from_secs(30), || {
            (self.client.stderr().matches(RELOADED).count() > before).then_some(())
        })
        .await;
        assert!(
            reloaded.is_some(),
            "{} was not reloaded:\n{}",
            file.display(),
            self.client.stderr()
        );
    }

    /// Ends this gateway cleanly with no gateway left running (as a host's reconnect would,
    /// but with the new one gone at once), then waits for the stream of the model's request
    /// `request` to be closed by an abort, no sooner than `deadline` after `started`: a task's
    /// deadline held while no gateway ran. What the exited gateway wrote to stderr.
    pub async fn exit_and_see_aborted_at(
        &mut self,
        request: usize,
        started: std::time::Instant,
        deadline: Duration,
    ) -> String {
        let next = self
            .launch
            .connect()
            .await
            .expect("a gateway to replace it");
        let old = std::mem::replace(&mut self.client, next);
        let said = old.stderr_handle();
        // The replacement is killed first, so that no gateway runs until a relaunch.
        self.kill_gateway().await;
        old.close().await.expect("the gateway exits cleanly");
        let end = self
            .fake
            .wait_for_stream_end(request, deadline + Duration::from_secs(30))
            .await;
        assert!(
            end.client_closed,
            "the stream ended on its own, not by an abort: {end:?}"
        );
        let after = end.at.saturating_duration_since(started);
        assert!(
            after >= deadline,
            "the session was aborted {after:?} after its start, before its {deadline:?} deadline:\n{}",
            said()
        );
        said()
    }

    /// After [`Self::exit_and_see_aborted_at`]: a new gateway on the same state directory
    /// reports the aborted task `open` `timed_out`, saying no gateway ran, and the task `held`
    /// (whose gate the test opened) completes.
    pub async fn relaunch_and_see_timed_out(&mut self, open: &str, held: &str) {
        self.relaunch().await;
        let w = self.wait(&[open], "all", 30_000).await;
        assert_eq!(w["done"], true, "{w}");
        let st = self.status(open).await;
        assert_eq!(st["status"], "timed_out", "{st}\n{}", self.client.stderr());
        let message = st["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("no gateway"), "{st}");
        let h = self.finish(held).await;
        assert_eq!(h["status"], "completed", "{h}\n{}", self.client.stderr());
    }

    /// SIGKILLs the gateway (no chance to clean up) and waits until it is gone.
    pub async fn kill_gateway(&self) {
        let pid = self.client.pid().expect("gateway pid");
        let pid_t = libc::pid_t::try_from(pid).expect("pid fits");
        // SAFETY: kill(2) on a pid we spawned; no memory is involved.
        unsafe {
            libc::kill(pid_t, libc::SIGKILL);
        }
        assert!(
            wait_gone(pid, Duration::from_secs(10)).await,
            "gateway {pid} survived SIGKILL"
        );
    }

    /// Runs the gateway binary's subcommand `args` in this rig's environment (its state
    /// directory, its configuration), with `extra` variables; (ok, stdout, stderr).
    pub fn cli(&self, args: &[&str], extra: &[(&str, &str)]) -> (bool, String, String) {
        let mut cmd = self.cli_command(args);
        cmd.envs(extra.iter().copied());
        let out = cmd.output().expect("the gateway binary runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts the gateway binary's subcommand `args` in this rig's environment, with its stdout
    /// piped; killed when dropped.
    pub fn spawn_cli(&self, args: &[&str]) -> tokio::process::Child {
        let mut cmd = tokio::process::Command::from(self.cli_command(args));
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        cmd.spawn().expect("the gateway binary runs")
    }

    /// The gateway binary's subcommand `args` in this rig's environment (and `PATH`).
    fn cli_command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
        cmd.args(args).current_dir(self.env.work_dir()).env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(self.env.vars(&self.fake.url()));
        cmd
    }

    /// A host's reconnect (Claude Code's `/mcp`, an update): a new gateway with the same
    /// configuration and environment starts, and the old one's stdin closes, so it exits
    /// cleanly (asserted) while the new one serves.
    pub async fn reconnect(&mut self) {
        let new = self.launch.connect().await.expect("the new gateway starts");
        let old = std::mem::replace(&mut self.client, new);
        old.close().await.expect("the old gateway exits cleanly");
    }

    /// Launches a new gateway with the same configuration and environment (same state dir).
    pub async fn relaunch(&mut self) {
        self.client = self
            .launch
            .connect()
            .await
            .expect("the gateway starts again");
    }

    /// A gate for tasks' turns: a file path under the env (absent), and the prompt marker that
    /// holds a turn (its agent in its shell) until the test writes that file.
    pub fn gate(&self) -> (std::path::PathBuf, String) {
        let gate = self.env.root().join("gate");
        let held = format!(
            "[[bash:until test -f {}; do sleep 0.1; done]]",
            gate.display()
        );
        (gate, held)
    }

    pub fn server_id(&self) -> String {
        self.server["server_id"]
            .as_str()
            .expect("server_id")
            .to_string()
    }

    /// The managed OpenCode's pid.
    pub fn opencode_pid(&self) -> u32 {
        self.server["pid"]
            .as_u64()
            .expect("a managed server has a pid") as u32
    }

    /// Calls a tool and returns its structured content, panicking with the gateway's stderr on
    /// a tool error.
    pub async fn ok(&self, tool: &str, args: Value) -> Value {
        match self.client.call(tool, args.clone()).await {
            Ok(r) if !r.is_error => r.structured,
            Ok(r) => panic!(
                "{tool}({args}) failed: {}\n--- gateway stderr ---\n{}",
                r.text,
                self.client.stderr()
            ),
            Err(e) => panic!(
                "{tool}({args}) protocol error: {e}\n--- gateway stderr ---\n{}",
                self.client.stderr()
            ),
        }
    }

    /// Calls a tool that must fail; returns (code, message).
    pub async fn err(&self, tool: &str, args: Value) -> (String, String) {
        let r = self
            .client
            .call(tool, args.clone())
            .await
            .unwrap_or_else(|e| panic!("{tool}({args}) protocol error: {e}"));
        assert!(
            r.is_error,
            "{tool}({args}) should fail but returned {}",
            r.text
        );
        (
            r.error_code().unwrap_or_default().to_string(),
            r.error_message().unwrap_or_default().to_string(),
        )
    }

    /// Starts a task on the rig's server; returns the start reply.
    pub async fn start_task(&self, prompt: &str) -> Value {
        self.start_task_with(json!({ "prompt": prompt })).await
    }

    /// Starts a task with extra arguments (server_id is filled in, and detail `full` unless
    /// `args` says otherwise: the tests read the ids).
    pub async fn start_task_with(&self, mut args: Value) -> Value {
        args["server_id"] = json!(self.server_id());
        if args.get("detail").is_none() {
            args["detail"] = json!("full");
        }
        let answer = self.ok("opencode_start_task", args).await;
        if answer["phase"] != "starting" {
            return answer;
        }
        // A worktree's or a worker's start answers before its session and worktree exist
        // (the tests of that call the tool themselves); most tests read them, so they get the
        // task as it stands once started.
        let id = answer["task_id"].as_str().expect("task_id").to_string();
        self.started(&id).await
    }

    /// Starts a task with `output_schema` (detail `full`) whose turns the fake model answers
    /// with `answers` in order (its `[[answers:…]]` marker, after `prompt`).
    pub async fn start_answering(&self, prompt: &str, answers: &[&str], schema: Value) -> Value {
        self.start_task_with(json!({
            "prompt": format!("{prompt} [[answers:{}]]", answers.join(";;")),
            "output_schema": schema,
        }))
        .await
    }

    /// Waits (bounded) until the gateway's automatic correction of a structured answer has
    /// reached the model in `session`.
    pub async fn wait_for_correction(&self, session: &str) {
        self.fake
            .wait_for_request(Duration::from_secs(30), |r| {
                r.session_id() == Some(session)
                    && r.last_user_text
                        .starts_with("Your answer did not end with a JSON value")
            })
            .await;
    }

    /// Waits for `ids` in `mode` for at most `timeout_ms`, with detail `full`.
    pub async fn wait(&self, ids: &[&str], mode: &str, timeout_ms: u64) -> Value {
        self.ok(
            "opencode_wait_for_task",
            json!({ "task_ids": ids, "mode": mode, "timeout_ms": timeout_ms, "detail": "full" }),
        )
        .await
    }

    /// Waits until `id` is finished and returns its result.
    pub async fn finish(&self, id: &str) -> Value {
        let w = self.wait(&[id], "all", TASK_TIMEOUT_MS).await;
        assert_eq!(
            w["done"],
            true,
            "task {id} did not finish: {w}\n--- gateway stderr ---\n{}",
            self.client.stderr()
        );
        self.ok(
            "opencode_get_task_result",
            json!({ "task_id": id, "detail": "full" }),
        )
        .await
    }

    /// A task's status with detail `full`.
    pub async fn status(&self, id: &str) -> Value {
        self.ok(
            "opencode_get_task_status",
            json!({ "task_id": id, "detail": "full" }),
        )
        .await
    }

    /// The model calls of one OpenCode session's turns: its chat requests other than the title
    /// OpenCode asks for.
    pub fn model_calls(&self, session_id: &str) -> usize {
        self.requests_for(session_id)
            .into_iter()
            .filter(|q| !q.is_title_request())
            .count()
    }

    /// What the model was told each of the session's tool calls returned (the `tool`
    /// messages of its last request), joined.
    pub fn tool_outputs(&self, session_id: &str) -> String {
        let requests = self.requests_for(session_id);
        let last = requests.last().expect("the session called the model");
        last.messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// Chat requests the fake received for one OpenCode session.
    pub fn requests_for(&self, session_id: &str) -> Vec<RecordedRequest> {
        self.fake
            .chat_requests()
            .into_iter()
            .filter(|r| r.session_id() == Some(session_id))
            .collect()
    }
}

/// The `output_schema` of the structured-answer tests: a person with a name and an integer age.
pub fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": { "name": { "type": "string" }, "age": { "type": "integer" } },
        "required": ["name", "age"]
    })
}

/// `true` while a process with this pid exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Waits (bounded) for a process that is not our child to disappear. There is no event to await
/// for another process's exit, so this polls `/proc`.
pub async fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !alive(pid)
}

/// Calls `f` every 20 ms until it returns `Some`, for at most `within`: for state the test can
/// only observe from outside (a process table, a file the gateway writes).
pub async fn poll_for<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
