//! Shared harness for the integration tests: `mod support;` in a test file brings it in.
//!
//! - [`opencode_bin`]: the pinned OpenCode binary (`$OPENCODE_BIN`, or npm `opencode-ai@<pinned>`
//!   installed once under the target dir).
//! - [`isolation`]: [`OpenCodeEnv`], a temp home plus every env var an OpenCode (or a gateway that
//!   spawns one) needs so that it touches nothing outside the temp dir and no network but
//!   127.0.0.1.
//! - [`fake_llm`]: [`FakeLlm`], an OpenAI-compatible chat completions server on 127.0.0.1,
//!   scripted by markers in the prompt (`[[bash:...]]`, `[[slow:ms]]`, `[[error400]]`, ...), that
//!   records every request.
//! - [`opencode_server`]: [`OpenCodeServer`], a real `opencode serve` in such an env, and
//!   [`EventStream`], its `GET /event` stream, for tests that drive OpenCode directly.
//! - [`mcp`]: an MCP host (rmcp client) that spawns the gateway binary.
//! - [`git`]: real `git` with no user config, for the worktree tests.
//! - [`tmux`]: a private tmux server, for the tests that drive a terminal UI.
//! - [`npm`]: pinned npm packages (OpenCode, the MCP TypeScript SDK) installed once under the
//!   target dir.
//!
//! - [`browser`]: Debian's headless Chromium driven over WebDriver, for the dashboard.
//!
//! Not every test file uses every item.
#![allow(dead_code, unused_imports)]

pub mod browser;
pub mod fake_anthropic;
pub mod fake_llm;
pub mod fake_responses;
pub mod git;
pub mod held;
pub mod http;
pub mod isolation;
pub mod mcp;
pub mod npm;
pub mod opencode_bin;
pub mod opencode_server;

pub use fake_llm::{FakeLlm, Marker, RecordedRequest, Reply, StreamEnd};
pub use isolation::{OpenCodeEnv, FAKE_MODEL, FAKE_PROVIDER, FAKE_STRONG_MODEL};
pub use opencode_bin::{opencode_bin, pinned_version};
pub use opencode_server::{EventStream, OpenCodeServer};
pub mod procs;
pub mod rig;
pub mod server_thread;
pub mod sshd;
pub mod tcp_proxy;
pub mod tmux;
