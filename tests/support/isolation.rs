//! An isolated home for one OpenCode process (or for the gateway, which passes its environment on
//! to the OpenCode it spawns).
//!
//! [`OpenCodeEnv`] owns a temp directory holding `config/`, `data/`, `cache/`, `state/` (the XDG
//! dirs), `tmp/`, `home/`, `managed/` (stands in for `/etc/opencode`) and `work/` (the directory
//! tasks run in). [`OpenCodeEnv::vars`] lists every variable such a process needs; spawn it with
//! [`OpenCodeEnv::apply`], which clears the inherited environment first (keeping only `PATH`), so
//! that no real config, credential or proxy setting leaks in. The only provider OpenCode knows is
//! `fake`, pointed at the [`FakeLlm`](super::fake_llm::FakeLlm) on 127.0.0.1, with two models:
//! `fake/fake-model` (the default) and `fake/fake-strong`; [`OpenCodeEnv::with_small_model`] adds
//! `fake/fake-small`, whose context is tiny so that OpenCode auto-compacts.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The provider id of the fake LLM in OpenCode's config.
pub const FAKE_PROVIDER: &str = "fake";
/// The default model (`fake/fake-model`).
pub const FAKE_MODEL: &str = "fake-model";
/// A second model, for tier tests (`fake/fake-strong`).
pub const FAKE_STRONG_MODEL: &str = "fake-strong";
/// An opt-in third model with a tiny context window (`fake/fake-small`, see
/// [`OpenCodeEnv::with_small_model`]).
pub const FAKE_SMALL_MODEL: &str = "fake-small";
/// `limit.context` of [`FAKE_SMALL_MODEL`].
pub const SMALL_CONTEXT: u64 = 2000;
/// `limit.output` of [`FAKE_SMALL_MODEL`]. OpenCode 1.18.33 compacts once a step's tokens reach
/// `context - min(output, 32000)`, here 1500: a step answered with `[[usage:5000]]` does it.
pub const SMALL_OUTPUT: u64 = 500;

/// Where the tests' temp trees go: not /tmp, since a delegated agent's commands run confined
/// with a private /tmp of their own (a gate or a repository a test puts in /tmp would be out of
/// their sight, and a secret planted there would prove nothing); and not under this crate's
/// `target/`, which lies inside this repository's own git tree (a directory there is never
/// "not a git repository", and OpenCode would take this repository for its project).
pub fn test_tmp() -> PathBuf {
    let base = PathBuf::from("/var/tmp/opencode-mcp-tests");
    std::fs::create_dir_all(&base).expect("create /var/tmp/opencode-mcp-tests");
    base
}

/// A temp directory tree that isolates one OpenCode process. Removed on drop.
pub struct OpenCodeEnv {
    root: tempfile::TempDir,
    /// Canonical path of `root` (OpenCode reports canonical directories).
    root_path: PathBuf,
    /// A 127.0.0.1 port nothing listens on: npm's registry for the OpenCode process, so its
    /// background plugin install fails at once instead of downloading.
    closed_port: u16,
    extra_config: Value,
}

impl OpenCodeEnv {
    /// Creates the tree. Panics if the temp directory cannot be made.
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("opencode-env-")
            .tempdir_in(test_tmp())
            .expect("create a temp dir for OpenCode");
        let root_path = root
            .path()
            .canonicalize()
            .expect("canonicalize the temp dir");
        for sub in [
            "config", "data", "cache", "state", "tmp", "home", "managed", "work",
        ] {
            std::fs::create_dir_all(root_path.join(sub)).expect("create an isolation subdir");
        }
        let closed_port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            listener.local_addr().expect("local addr").port()
            // Dropped here: nothing listens on this port any more.
        };
        OpenCodeEnv {
            root,
            root_path,
            closed_port,
            extra_config: json!({}),
        }
    }

    /// Merges `extra` into the generated `OPENCODE_CONFIG_CONTENT` (objects merge key by key,
    /// anything else replaces), e.g. `json!({"permission": {"bash": "ask"}})`.
    pub fn with_config(mut self, extra: Value) -> Self {
        merge(&mut self.extra_config, extra);
        self
    }

    /// Adds the model `fake/fake-small` ([`FAKE_SMALL_MODEL`]) with
    /// `limit: {context: 2000, output: 500}`. Not the default model: pass it as a task's `model`.
    /// Other tests are unaffected because it is opt-in.
    pub fn with_small_model(self) -> Self {
        self.with_config(json!({
            "provider": { FAKE_PROVIDER: { "models": { FAKE_SMALL_MODEL: {
                "name": "Fake Small",
                "tool_call": true,
                "attachment": false,
                "reasoning": false,
                "temperature": true,
                "cost": { "input": 1, "output": 2 },
                "limit": { "context": SMALL_CONTEXT, "output": SMALL_OUTPUT }
            } } } }
        }))
    }

    /// The root of the tree.
    pub fn root(&self) -> &Path {
        &self.root_path
    }

    /// The directory tasks run in (canonical, exists, empty at first).
    pub fn work_dir(&self) -> PathBuf {
        self.root_path.join("work")
    }

    /// The isolated `$HOME`.
    pub fn home_dir(&self) -> PathBuf {
        self.root_path.join("home")
    }

    /// OpenCode's data dir (`$XDG_DATA_HOME/opencode`): its database and `log/`.
    pub fn opencode_data_dir(&self) -> PathBuf {
        self.root_path.join("data/opencode")
    }

    /// The path of the temp dir as given by `tempfile`, which may differ from [`Self::root`]
    /// when the temp dir sits behind a symlink.
    pub fn raw_root(&self) -> &Path {
        self.root.path()
    }

    /// The config OpenCode gets through `OPENCODE_CONFIG_CONTENT`.
    pub fn config(&self, fake_llm_base_url: &str) -> Value {
        let mut config = json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                FAKE_PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake LLM",
                    "options": { "baseURL": fake_llm_base_url, "apiKey": "fake-key" },
                    "models": {
                        FAKE_MODEL: {
                            "name": "Fake Model",
                            "tool_call": true,
                            "attachment": false,
                            "reasoning": false,
                            "temperature": true,
                            "cost": { "input": 1, "output": 2 },
                            "limit": { "context": 128000, "output": 8192 }
                        },
                        FAKE_STRONG_MODEL: {
                            "name": "Fake Strong",
                            "tool_call": true,
                            "attachment": false,
                            "reasoning": false,
                            "temperature": true,
                            "cost": { "input": 3, "output": 15 },
                            "limit": { "context": 200000, "output": 16384 }
                        }
                    }
                }
            },
            "enabled_providers": [FAKE_PROVIDER],
            "model": format!("{FAKE_PROVIDER}/{FAKE_MODEL}"),
            "small_model": format!("{FAKE_PROVIDER}/{FAKE_MODEL}"),
            "autoupdate": false,
            "share": "disabled"
        });
        merge(&mut config, self.extra_config.clone());
        config
    }

    /// Every environment variable an isolated OpenCode process needs, given the fake LLM's base
    /// URL (`http://127.0.0.1:<port>/v1`). `PATH` is not included; [`Self::apply`] adds it.
    pub fn vars(&self, fake_llm_base_url: &str) -> Vec<(String, String)> {
        let dir = |sub: &str| self.root_path.join(sub).display().to_string();
        let registry = format!("http://127.0.0.1:{}/", self.closed_port);
        let mut vars: Vec<(String, String)> = vec![
            ("HOME".into(), dir("home")),
            ("XDG_CONFIG_HOME".into(), dir("config")),
            ("XDG_DATA_HOME".into(), dir("data")),
            ("XDG_CACHE_HOME".into(), dir("cache")),
            ("XDG_STATE_HOME".into(), dir("state")),
            ("TMPDIR".into(), dir("tmp")),
            ("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into()),
            ("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into()),
            ("OPENCODE_DISABLE_SHARE".into(), "1".into()),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD".into(), "1".into()),
            ("OPENCODE_DISABLE_CLAUDE_CODE".into(), "1".into()),
            ("OPENCODE_DISABLE_DEFAULT_PLUGINS".into(), "1".into()),
            ("OPENCODE_DISABLE_PROJECT_CONFIG".into(), "1".into()),
            ("OPENCODE_DISABLE_EXTERNAL_SKILLS".into(), "1".into()),
            // Otherwise OpenCode also reads /etc/opencode (its "managed" config dir).
            ("OPENCODE_TEST_MANAGED_CONFIG_DIR".into(), dir("managed")),
            ("npm_config_registry".into(), registry.clone()),
            ("NPM_CONFIG_REGISTRY".into(), registry),
            ("npm_config_update_notifier".into(), "false".into()),
            // Nothing is proxied; everything a test talks to is on 127.0.0.1.
            ("NO_PROXY".into(), "*".into()),
            ("no_proxy".into(), "*".into()),
        ];
        let config = serde_json::to_string(&self.config(fake_llm_base_url))
            .expect("serialize the OpenCode config");
        vars.push(("OPENCODE_CONFIG_CONTENT".into(), config));
        vars.extend(coverage_var());
        vars
    }

    /// Clears `cmd`'s environment, then sets `PATH` (inherited) and [`Self::vars`], and runs it
    /// in [`Self::work_dir`].
    pub fn apply<'c>(
        &self,
        cmd: &'c mut std::process::Command,
        fake_llm_base_url: &str,
    ) -> &'c mut std::process::Command {
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(self.vars(fake_llm_base_url))
            .current_dir(self.work_dir())
    }

    /// [`Self::apply`] for a tokio command (e.g. the gateway under rmcp's child-process
    /// transport).
    pub fn apply_tokio<'c>(
        &self,
        cmd: &'c mut tokio::process::Command,
        fake_llm_base_url: &str,
    ) -> &'c mut tokio::process::Command {
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(self.vars(fake_llm_base_url))
            .current_dir(self.work_dir())
    }

    /// Replaces this environment's machine-specific paths in `text` with fixed placeholders:
    /// the work dir becomes `/work/dir`, the rest of the tree `/work/env` (also without the
    /// leading slash, as OpenCode's session `path` field has it).
    pub fn redact_paths(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for root in [self.root_path.as_path(), self.root.path()] {
            let root = root.display().to_string();
            let work = format!("{root}/work");
            out = out.replace(&work, "/work/dir");
            out = out.replace(work.trim_start_matches('/'), "work/dir");
            out = out.replace(&root, "/work/env");
            out = out.replace(root.trim_start_matches('/'), "work/env");
        }
        out
    }
}

impl Default for OpenCodeEnv {
    fn default() -> Self {
        Self::new()
    }
}

/// Deep-merges `extra` into `base`: objects key by key, anything else replaces.
pub fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

/// `LLVM_PROFILE_FILE`, when the suite runs under coverage (`cargo tarpaulin`, see the README):
/// the gateway binaries the tests spawn are instrumented too, and write their counts where this
/// names (the pattern carries `%p`, so processes do not clobber each other). Without it a child
/// that lost its environment to `env_clear` would write `default_*.profraw` in its working
/// directory, and its lines would count as untested. Unset in a plain `cargo test`.
pub fn coverage_var() -> Option<(String, String)> {
    std::env::var("LLVM_PROFILE_FILE")
        .ok()
        .map(|v| ("LLVM_PROFILE_FILE".to_string(), v))
}
