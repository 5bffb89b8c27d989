//! Real MCP hosts' clients against the gateway, with a real OpenCode behind it.
//!
//! - TypeScript SDK 1.x (`@modelcontextprotocol/sdk`, the client of the MCP Inspector and of many
//!   hosts): it validates `structuredContent` against the tool's `outputSchema` even on error
//!   results. The pinned version is installed from npm under the target dir on first use
//!   (needs Node.js and npm); the client script is `tests/hosts/ts_sdk_client.mjs`.

mod support;

use std::process::{Command, Stdio};

use serde_json::Value;
use support::npm::Install;
use support::{opencode_bin, FakeLlm, OpenCodeEnv};

/// The TypeScript SDK 1.x release the suite is pinned to.
const TS_SDK_1: &str = "1.32.2";

fn ts_sdk(version: &str) -> std::path::PathBuf {
    Install {
        package: "@modelcontextprotocol/sdk",
        version,
        dir_name: &format!("ts-sdk-{version}"),
        skip_hint: "install it there yourself with npm",
    }
    .ensure(|dir| {
        let manifest = dir.join("node_modules/@modelcontextprotocol/sdk/package.json");
        let text = std::fs::read_to_string(&manifest).map_err(|e| e.to_string())?;
        let found: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if found["version"] == version {
            Ok(dir.to_path_buf())
        } else {
            Err(format!("found version {}", found["version"]))
        }
    })
}

/// Every tool's success and error paths reach a TypeScript SDK 1.x client as results it accepts:
/// before, every error result failed on the client with "-32602 Structured content does not
/// match the tool's output schema".
#[test]
fn the_typescript_sdk_1_accepts_every_result() {
    let sdk = ts_sdk(TS_SDK_1);
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let mut vars: serde_json::Map<String, Value> = env
        .vars(&fake.url())
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    vars.insert(
        "OPENCODE_MCP_OPENCODE__COMMAND".into(),
        Value::String(opencode_bin().display().to_string()),
    );
    if let Ok(path) = std::env::var("PATH") {
        vars.insert("PATH".into(), Value::String(path));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hosts/ts_sdk_client.mjs");
    let output = Command::new("node")
        .arg(script)
        .env("SDK_DIR", &sdk)
        .env("GATEWAY_BIN", env!("CARGO_BIN_EXE_opencode-mcp"))
        .env("GATEWAY_CWD", env.work_dir())
        .env("GATEWAY_ENV", Value::Object(vars).to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run node (install Node.js to run this test): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the client script failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not the client's report ({e}): {stdout}"));
    assert_eq!(report["sdkVersion"], TS_SDK_1);
    let calls = report["calls"].as_array().expect("calls");
    let tools = report["tools"].as_array().expect("tools");
    assert!(tools.len() >= 10, "{tools:?}");
    let rejected: Vec<&Value> = calls.iter().filter(|c| c["ok"] != true).collect();
    assert!(
        rejected.is_empty(),
        "the SDK rejected results: {rejected:#?}"
    );
    for c in calls {
        let expect_error = c["case"] == "error";
        assert_eq!(c["isError"], expect_error, "{c}");
        if expect_error {
            // The model reads the error as JSON text: code and message.
            let body: Value = serde_json::from_str(c["text"].as_str().unwrap_or_default())
                .unwrap_or_else(|e| panic!("error text is not JSON ({e}): {c}"));
            assert!(body["error"]["code"].is_string(), "{c}");
            assert!(body["error"]["message"].is_string(), "{c}");
        }
    }
    let errors = calls.iter().filter(|c| c["case"] == "error").count();
    assert_eq!(errors, tools.len(), "every tool's error path was called");
}
