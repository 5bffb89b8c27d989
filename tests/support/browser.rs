//! A real headless Chromium, driven over WebDriver by Debian's `chromedriver`: plain HTTP and
//! JSON, so the tests need no browser crate (and every build compiles none).
//!
//! As root (CI, these machines) Chromium needs `--no-sandbox`; the background-networking flags
//! keep it from reaching for Google's hosts, which this machine cannot reach.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One browser session; the driver (and its browser) go when it is dropped.
pub struct Browser {
    http: reqwest::Client,
    base: String,
    _driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

fn missing(what: &str) -> ! {
    panic!(
        "{what} is missing: the dashboard's tests drive Debian's Chromium. Install it with \
         `apt-get install -y chromium chromium-driver` (.ci/run does)"
    )
}

/// The first line `child` prints (a dashboard's address), within 30 s.
pub async fn printed_address(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncBufReadExt as _;
    let stdout = child.stdout.take().expect("a piped stdout");
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("the address is printed within 30 s")
    .expect("its stdout")
    .expect("a line")
}

impl Browser {
    pub async fn start() -> Self {
        for (path, what) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromedriver")] {
            if !Path::new(path).is_file() {
                missing(what);
            }
        }
        let port = super::opencode_server::free_port();
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("chromedriver does not start: {e}"));
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        let base = format!("http://127.0.0.1:{port}");
        let ready = super::rig::poll_for(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .await;
        assert!(ready.is_some(), "chromedriver never listened on {port}");
        let profile = tempfile::tempdir().expect("a profile directory");
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-quic", "--no-first-run",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("POST /session")
            .json()
            .await
            .expect("the session's JSON");
        let id = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver made no session: {r}"))
            .to_string();
        Self {
            http,
            base: format!("{base}/session/{id}"),
            _driver: driver,
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r: Value = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"));
        if r["value"].get("error").is_some() {
            panic!("WebDriver {path}: {r}");
        }
        r["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page; its return value.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Evaluates `script` until it returns something other than `null` or `false`, for at
    /// most `within`; panics naming `what` otherwise.
    pub async fn wait_for(&self, what: &str, within: Duration, script: &str, args: Value) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let v = self.eval(script, args.clone()).await;
            if !v.is_null() && v != Value::Bool(false) {
                return v;
            }
            if tokio::time::Instant::now() >= deadline {
                let body = self
                    .eval(
                        "return document.body ? document.body.innerText : ''",
                        json!([]),
                    )
                    .await;
                panic!("{what}: not seen within {within:?}; the page shows:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves a screenshot of the page under `target/test-artifacts/dashboard/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("a base64 screenshot");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts/dashboard");
        std::fs::create_dir_all(&dir).expect("the artifacts directory");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, &bytes).expect("the screenshot is written");
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG screenshot");
        path
    }
}
