//! `opencode-mcp dashboard` in a real headless Chromium, over the state directory of a real
//! gateway driven through MCP: a started task appears and its status changes without a reload;
//! an agent's answer holding markup is shown as text and runs nothing; a request without the
//! token, with another one, or naming another host is refused. Screenshots are kept under
//! `target/test-artifacts/dashboard/`.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::browser::{printed_address, Browser};
use support::rig::Rig;

/// How long the page may take to show a change: it polls every 250 ms, so this is slack for a
/// loaded machine, not the goal (the bench measures that).
const SHOWN: Duration = Duration::from_secs(20);

fn id(v: &Value) -> String {
    v["task_id"].as_str().expect("a task id").to_string()
}

/// A client for the page's address (never through a proxy: it is loopback).
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

/// The page's data at `url` (the address it printed, token included).
async fn page_state(url: &str) -> Value {
    let (origin, token) = url.split_once("/?token=").expect("a token in the address");
    http()
        .get(format!("{origin}/api/state?token={token}"))
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("the state")
}

/// Ends a dashboard as Ctrl-C does and waits (bounded) for it to exit on its own, cleanly: it
/// stops serving, forgets its address file, and (in coverage runs) writes its profile, which a
/// killed process never does.
async fn interrupt(mut page: tokio::process::Child) {
    let pid = page.id().expect("the dashboard runs");
    let pid = i32::try_from(pid).expect("a pid");
    // SAFETY: a signal to our own child.
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGINT) },
        0,
        "SIGINT is sent"
    );
    let status = tokio::time::timeout(Duration::from_secs(20), page.wait())
        .await
        .expect("the dashboard exits within 20 s of Ctrl-C")
        .expect("its status");
    assert!(status.success(), "a clean exit: {status}");
}

/// The dashboard of `rig`'s state directory, and its address (the first line it prints).
async fn dashboard(rig: &Rig) -> (tokio::process::Child, String) {
    let mut child = rig.spawn_cli(&["dashboard"]);
    let url = printed_address(&mut child).await;
    assert!(
        url.starts_with("http://127.0.0.1:") && url.contains("/?token="),
        "{url}"
    );
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_task_appears_and_changes_live_and_markup_stays_text() {
    let env = support::OpenCodeEnv::new();
    support::git::init_repo(&env.work_dir(), &[("README", "before\n")]);
    let rig = Rig::start_in(support::FakeLlm::start(), env, &[]).await;
    let (page, url) = dashboard(&rig).await;
    let (origin, token) = url.split_once("/?token=").expect("a token in the address");

    // Refused without the token, with another one, and for another host name (a rebinding
    // site's request names its own).
    let http = http();
    // Another token: the real one with its first digit changed (to one it is not).
    let other = if token.starts_with('0') { '1' } else { '0' };
    for bad in [
        format!("{origin}/api/state"),
        format!("{origin}/api/state?token={other}{}", &token[1..]),
        format!("{origin}/?token="),
    ] {
        let r = http.get(&bad).send().await.expect("an answer");
        assert_eq!(r.status(), 403, "{bad}");
    }
    let r = http
        .get(format!("{origin}/api/state?token={token}"))
        .header(
            "Host",
            format!(
                "rebound.example:{}",
                origin.rsplit(':').next().unwrap_or("")
            ),
        )
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 403, "another host name");
    let r = http
        .get(format!("{origin}/api/state?token={token}"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .unwrap_or("")
            .contains("script-src 'self'"),
        "{:?}",
        r.headers()
    );

    let browser = Browser::start().await;
    browser.goto(&url).await;
    browser
        .wait_for(
            "the live indicator",
            SHOWN,
            "return document.querySelector('#tasks') && document.querySelector('#live.on') ? true : null",
            json!([]),
        )
        .await;
    browser
        .eval("window.__loaded_once = 42; return true", json!([]))
        .await;
    browser.screenshot("empty").await;

    // A task that runs for a while: seen running, then completed, on the same page.
    let slow = id(&rig.start_task("dashboard: slow work [[delay:4000]]").await);
    let row_status =
        "const r = document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"]`); \
                      return r ? r.dataset.status : null";
    let seen = browser
        .wait_for(
            "the started task's row",
            SHOWN,
            &format!("const s = (() => {{ {row_status} }})(); return s === 'running' || s === 'pending' ? s : null"),
            json!([slow]),
        )
        .await;
    assert!(seen == "running" || seen == "pending", "{seen}");
    browser.screenshot("running").await;
    let w = rig.wait(&[&slow], "all", 120_000).await;
    assert_eq!(w["done"], true, "{w}");
    browser
        .wait_for(
            "the task completed",
            SHOWN,
            &format!("const s = (() => {{ {row_status} }})(); return s === 'completed' ? s : null"),
            json!([slow]),
        )
        .await;
    let same_page = browser.eval("return window.__loaded_once", json!([])).await;
    assert_eq!(same_page, 42, "the change came without a reload");
    browser.screenshot("completed").await;

    // An agent's answer with markup in it: text on the list and on the task's page.
    let hostile =
        "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\"> done";
    let marked = id(&rig.start_task(hostile).await);
    let r = rig.finish(&marked).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(r["text"].as_str().unwrap_or("").contains("<script>"), "{r}");
    browser
        .wait_for(
            "the hostile task's row",
            SHOWN,
            "const r = document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"]`); \
             return r && r.dataset.status === 'completed' ? r.innerText : null",
            json!([marked]),
        )
        .await;
    let title_text = browser
        .eval(
            "return document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"] td.title`).textContent",
            json!([marked]),
        )
        .await;
    assert!(
        title_text.as_str().unwrap_or("").contains("<script>"),
        "the title is shown as text: {title_text}"
    );
    browser
        .goto(&format!("{origin}/task?id={marked}&token={token}"))
        .await;
    let answer = browser
        .wait_for(
            "the task page's answer",
            SHOWN,
            "const a = document.querySelector('#answer'); return a && a.textContent ? a.textContent : null",
            json!([]),
        )
        .await;
    assert!(
        answer
            .as_str()
            .unwrap_or("")
            .contains("<script>window.__pwned = 1</script>"),
        "the answer is shown as text: {answer}"
    );
    let ran = browser
        .eval(
            "return { pwned: window.__pwned === undefined ? null : window.__pwned, \
                      scripts: document.querySelectorAll('script').length, \
                      images: document.querySelectorAll('img').length }",
            json!([]),
        )
        .await;
    assert_eq!(
        ran,
        json!({ "pwned": null, "scripts": 1, "images": 0 }),
        "nothing of the answer ran or became an element"
    );
    let watch = browser
        .eval(
            "return document.querySelector('#watch').textContent",
            json!([]),
        )
        .await;
    assert_eq!(watch, format!("opencode-mcp watch {marked}"));
    browser.screenshot("task-page").await;

    // A follow-up: the page lists both turns, the first in short (its answer still text).
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": marked, "prompt": "and a second turn" }),
    )
    .await;
    assert_eq!(rig.finish(&marked).await["status"], "completed");
    browser
        .goto(&format!("{origin}/task?id={marked}&token={token}"))
        .await;
    let turns = browser
        .wait_for(
            "both turns",
            SHOWN,
            "const rows = document.querySelectorAll('#turns tr[data-turn]');              return rows.length === 2 ? [...rows].map((r) => r.textContent) : null",
            json!([]),
        )
        .await;
    assert!(
        turns[0]
            .as_str()
            .is_some_and(|t| t.contains("<script>window.__pwned = 1</script>")),
        "the first turn's answer, as text: {turns}"
    );
    assert!(
        turns[1]
            .as_str()
            .is_some_and(|t| t.contains("(the answer below)")),
        "{turns}"
    );
    assert_eq!(
        browser
            .eval("return window.__pwned === undefined", json!([]))
            .await,
        true
    );
    browser.screenshot("task-turns").await;

    // A worktree task's page shows its change as a diff, read from its worktree.
    let changed = id(&rig
        .start_task_with(json!({
            "prompt": "[[write:notes.txt:written by the agent\n]]",
            "isolation": "worktree",
        }))
        .await);
    let r = rig.finish(&changed).await;
    assert_eq!(r["status"], "completed", "{r}");
    browser
        .goto(&format!("{origin}/task?id={changed}&token={token}"))
        .await;
    let diff = browser
        .wait_for(
            "the worktree task's diff",
            SHOWN,
            "const d = document.querySelector('#diff'); return d && d.textContent.includes('notes.txt') ? d.textContent : null",
            json!([]),
        )
        .await;
    assert!(
        diff.as_str()
            .unwrap_or("")
            .contains("+written by the agent"),
        "{diff}"
    );
    let files = browser
        .eval(
            "return document.querySelector('#files').textContent",
            json!([]),
        )
        .await;
    assert!(
        files.as_str().unwrap_or("").contains("notes.txt"),
        "the changed file is named: {files}"
    );
    browser.screenshot("task-diff").await;

    // Many stored tasks are shown a page at a time, newest first: copies of a real record.
    let tasks_dir = rig.env.root().join("state/opencode-mcp/tasks");
    let record =
        std::fs::read_to_string(tasks_dir.join(format!("{marked}.json"))).expect("a record");
    for n in 0..120 {
        let copy = format!("tsk_page{n:06}");
        std::fs::write(
            tasks_dir.join(format!("{copy}.json")),
            record.replace(&marked, &copy),
        )
        .expect("a copy");
    }
    browser.goto(&url).await;
    let rows = "return document.querySelectorAll('#tasks tr[data-task-id]').length";
    let has = "return !!document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"]`)";
    let count = browser
        .wait_for(
            "the pager over 123 tasks",
            SHOWN,
            "const c = document.getElementById('tasks-count'); \
             return c && c.dataset.total === '123' ? c.textContent : null",
            json!([]),
        )
        .await;
    assert_eq!(count, "tasks 1–100 of 123, page 1 of 2");
    assert_eq!(browser.eval(rows, json!([])).await, 100);
    assert_eq!(
        browser.eval(has, json!([changed])).await,
        true,
        "the newest first"
    );
    assert_eq!(browser.eval(has, json!([slow])).await, false);
    browser.screenshot("paged").await;
    browser
        .eval(
            "document.getElementById('older').click(); return true",
            json!([]),
        )
        .await;
    assert_eq!(browser.eval(rows, json!([])).await, 23);
    assert_eq!(
        browser.eval(has, json!([slow])).await,
        true,
        "the oldest last"
    );
    let older = browser
        .eval(
            "return document.getElementById('older').disabled",
            json!([]),
        )
        .await;
    assert_eq!(older, true, "no page after the last");
    browser
        .eval(
            "document.getElementById('newer').click(); return true",
            json!([]),
        )
        .await;
    assert_eq!(browser.eval(rows, json!([])).await, 100);

    // `doctor` prints the address of the page serving this state directory.
    let (_, doctor, _) = rig.cli(&["doctor"], &[]);
    assert!(doctor.contains(&url), "doctor names the page: {doctor}");
    let noted = rig.env.root().join("state/opencode-mcp/dashboard.json");
    assert!(noted.is_file(), "the address is noted while it serves");
    interrupt(page).await;
    assert!(!noted.exists(), "and forgotten when it stops");
    let (_, doctor, _) = rig.cli(&["doctor"], &[]);
    assert!(
        !doctor.contains(&url),
        "doctor no longer names it: {doctor}"
    );
}

/// With no state directory yet, the page says so and how to begin, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_directory_the_page_says_how_to_start() {
    let env = support::OpenCodeEnv::new();
    let state = env.root().join("never-made");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
    cmd.arg("dashboard")
        .current_dir(env.work_dir())
        .env_clear()
        .envs(env.vars("http://127.0.0.1:9/v1"))
        .env("OPENCODE_MCP_STATE_DIR", &state)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let mut page = cmd.spawn().expect("the dashboard starts");
    let url = printed_address(&mut page).await;
    let browser = Browser::start().await;
    browser.goto(&url).await;
    let said = browser
        .wait_for(
            "the no-state message",
            SHOWN,
            "const p = document.querySelector('#no-state'); return p ? p.textContent : null",
            json!([]),
        )
        .await;
    let said = said.as_str().unwrap_or("");
    assert!(
        said.contains(&state.display().to_string()) && said.contains("claude mcp add"),
        "{said}"
    );
    assert!(!state.exists(), "the page created nothing");
    browser.screenshot("no-state").await;
    interrupt(page).await;
}

/// A gateway whose user's configuration sets `dashboard.serve` serves the page too, and that
/// page cancels the gateway's unfinished tasks: from the page only (another site's request, or
/// one without the page's header, is refused), and only there (a page `opencode-mcp dashboard`
/// serves stays read-only). One page per state directory: a second gateway serves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_serves_the_page_and_it_cancels_that_gateways_tasks() {
    let env = support::OpenCodeEnv::new();
    let noted = env.root().join("state/opencode-mcp/dashboard.json");
    let rig = Rig::start_in(
        support::FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_DASHBOARD__SERVE", "true")],
    )
    .await;
    let read_url = || {
        let text = std::fs::read_to_string(&noted).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        v["url"].as_str().map(str::to_string)
    };
    let url = support::rig::poll_for(SHOWN, read_url)
        .await
        .unwrap_or_else(|| panic!("no page noted\n{}", rig.client.stderr()));
    assert!(
        rig.client.stderr().contains(&url),
        "the gateway logs the page's address at start"
    );
    let (_, doctor, _) = rig.cli(&["doctor"], &[]);
    assert!(doctor.contains(&url), "doctor names the page: {doctor}");
    let (origin, token) = url.split_once("/?token=").expect("a token in the address");

    // A second gateway over the same state directory serves no page of its own.
    let second = rig
        .launch
        .clone()
        .connect()
        .await
        .expect("a second gateway");
    let said = support::rig::poll_for(SHOWN, || {
        second
            .stderr()
            .contains("another process serves this state directory's page")
            .then_some(())
    })
    .await;
    assert!(said.is_some(), "{}", second.stderr());
    assert_eq!(
        read_url().as_deref(),
        Some(url.as_str()),
        "the first page stays noted"
    );
    second.close().await.expect("the second gateway ends");

    let running = id(&rig.start_task("cancel me [[delay:120000]]").await);
    let done = id(&rig.start_task("finished already").await);
    assert_eq!(rig.finish(&done).await["status"], "completed");
    assert_eq!(rig.running(&running).await["status"], "running");

    // Requests that are not the page's own are refused, and cancel nothing.
    let http = http();
    let cancel_url = format!("{origin}/api/cancel?id={running}&token={token}");
    let refused = [
        http.post(&cancel_url)
            .header("Origin", origin)
            .header("Sec-Fetch-Site", "same-origin"),
        http.post(&cancel_url)
            .header("Origin", "http://evil.example")
            .header("Sec-Fetch-Site", "cross-site")
            .header("x-opencode-mcp-dashboard", "cancel"),
        http.post(format!("{origin}/api/cancel?id={running}&token=0"))
            .header("Origin", origin)
            .header("x-opencode-mcp-dashboard", "cancel"),
    ];
    for request in refused {
        let r = request.send().await.expect("an answer");
        assert_eq!(r.status(), 403);
    }
    let r = http.get(&cancel_url).send().await.expect("an answer");
    assert_eq!(r.status(), 405, "cancel is a POST");
    assert_eq!(rig.status(&running).await["status"], "running");

    // A read-only page over the same directory (asked for by hand, it serves anyway) offers
    // no cancel and refuses one.
    let (page, ro_url) = dashboard(&rig).await;
    let (ro_origin, ro_token) = ro_url.split_once("/?token=").expect("a token");
    let r = http
        .post(format!(
            "{ro_origin}/api/cancel?id={running}&token={ro_token}"
        ))
        .header("Origin", ro_origin)
        .header("x-opencode-mcp-dashboard", "cancel")
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap_or_default().contains("read-only"));
    let ro = page_state(&ro_url).await;
    assert!(ro["gateway_pid"].is_null(), "{ro}");
    interrupt(page).await;
    assert_eq!(
        read_url().as_deref(),
        Some(url.as_str()),
        "the read-only page did not take the gateway's note"
    );

    // The gateway's page: a cancel button on the running task only; a click cancels it.
    let browser = Browser::start().await;
    browser.goto(&url).await;
    let button = "return document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"] button.cancel`) ? true : null";
    browser
        .wait_for(
            "the running task's cancel button",
            SHOWN,
            button,
            json!([running]),
        )
        .await;
    let finished_row = browser
        .eval(
            "const r = document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"]`); \
             return r ? !!r.querySelector('button.cancel') : null",
            json!([done]),
        )
        .await;
    assert_eq!(finished_row, false, "a finished task has no cancel");
    browser.screenshot("gateway-page").await;
    browser
        .eval(
            "document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"] button.cancel`).click(); return true",
            json!([running]),
        )
        .await;
    browser
        .wait_for(
            "the task cancelled on the page",
            SHOWN,
            "const r = document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"]`); \
             return r && r.dataset.status === 'cancelled' ? true : null",
            json!([running]),
        )
        .await;
    assert_eq!(rig.status(&running).await["status"], "cancelled");
    browser.screenshot("gateway-page-cancelled").await;

    // The page goes with its gateway, and its note with it (a clean exit: a host closing
    // stdin). A killed gateway's lock goes with the process, so doctor would not name it either.
    let Rig { client, .. } = rig;
    client.close().await.expect("the gateway exits cleanly");
    assert!(!noted.exists(), "the note is forgotten");
    assert!(
        http.get(format!("{origin}/api/state?token={token}"))
            .send()
            .await
            .is_err(),
        "nothing answers there"
    );
}

/// A worker's health on the page: what a gateway last saw of it (a start there that could not
/// reach it), and a probe on request from the page (one `ssh` round trip, noted for every
/// page). A probe from anywhere but the page is refused. Workers are real `sshd`s on 127.0.0.1;
/// one of them is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_show_what_was_last_seen_of_them_and_a_probe_on_request() {
    use support::sshd::{SshKey, Sshd};
    let env = support::OpenCodeEnv::new();
    support::git::init_repo(&env.work_dir(), &[("README", "x\n")]);
    let key = SshKey::new();
    let ready = Sshd::start("ready", &key);
    let mut gone = Sshd::start("gone", &key);
    gone.stop();
    let entry = |sshd: &Sshd| {
        format!(
            "  {name}:\n    ssh: {name}\n    ssh_config: {config}\n    max_tasks: 2\n    opencode: {bin}\n    root: {root}\n    sandbox: off\n",
            name = sshd.name,
            config = key.config_file().display(),
            bin = support::opencode_bin().display(),
            root = sshd.root.join("mcp").display(),
        )
    };
    let user_file = env.root().join("user-delegation.yaml");
    std::fs::write(
        &user_file,
        format!("workers:\n{}{}", entry(&ready), entry(&gone)),
    )
    .expect("the user's file");
    let config = user_file.display().to_string();
    let notes = env.root().join("state/opencode-mcp/worker-health");
    let rig = Rig::start_in(
        support::FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_CONFIG", config.as_str())],
    )
    .await;
    let gateway = rig.client.pid().expect("the gateway's pid");

    // A start on the stopped worker fails, and the gateway notes that it could not reach it.
    let started = rig
        .start_task_with(json!({ "prompt": "x", "worker": "gone" }))
        .await;
    let w = rig.wait(&[&id(&started)], "all", 120_000).await;
    assert_eq!(w["done"], true, "{w}");
    let noted = support::rig::poll_for(SHOWN, || {
        let text = std::fs::read_to_string(notes.join("gone.json")).ok()?;
        serde_json::from_str::<Value>(&text).ok()
    })
    .await
    .unwrap_or_else(|| panic!("no note of the worker\n{}", rig.client.stderr()));
    assert_eq!(noted["reachable"], false, "{noted}");
    assert_eq!(noted["by"], format!("gateway {gateway}"), "{noted}");

    // The page reads the same user's file, to know the workers.
    let mut page = rig.spawn_cli(&["dashboard", "--config", &config]);
    let url = printed_address(&mut page).await;
    let (origin, token) = url.split_once("/?token=").expect("a token");
    let http = http();
    let state = page_state(&url).await;
    let worker = |state: &Value, name: &str| {
        state["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no worker {name}: {state}"))
    };
    assert_eq!(
        worker(&state, "gone")["seen"]["reachable"],
        false,
        "{state}"
    );
    assert!(
        worker(&state, "ready")["seen"].is_null(),
        "never seen yet: {state}"
    );

    // A probe is the page's own request only; a worker must be one of the user's file.
    let probe = |name: &str| format!("{origin}/api/probe?worker={name}&token={token}");
    let r = http
        .post(probe("ready"))
        .header("Origin", "http://evil.example")
        .header("x-opencode-mcp-dashboard", "probe")
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 403);
    let r = http
        .post(probe("local"))
        .header("Origin", origin)
        .header("x-opencode-mcp-dashboard", "probe")
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 404, "this machine is not probed over ssh");
    assert!(!notes.join("ready.json").exists(), "nothing probed yet");

    let browser = Browser::start().await;
    browser.goto(&url).await;
    let health = "const r = document.querySelector(`#workers tr[data-worker=\"${arguments[0]}\"] td.health`); \
                  return r ? r.textContent : null";
    let gone_text = browser
        .wait_for(
            "the stopped worker's health",
            SHOWN,
            health,
            json!(["gone"]),
        )
        .await;
    assert!(
        gone_text.as_str().is_some_and(
            |t| t.starts_with("out of reach") && t.contains(&format!("gateway {gateway}"))
        ),
        "{gone_text}"
    );
    assert_eq!(browser.eval(health, json!(["ready"])).await, "never seen");
    browser
        .eval(
            "document.querySelector('button[data-probe=\"ready\"]').click(); return true",
            json!([]),
        )
        .await;
    let probed = browser
        .wait_for(
            "the probe's finding",
            Duration::from_secs(60),
            "const r = document.querySelector('#workers tr[data-worker=\"ready\"] td.health'); \
             return r && r.textContent.startsWith('reachable') ? r.textContent : null",
            json!([]),
        )
        .await;
    assert!(
        probed
            .as_str()
            .is_some_and(|t| t.contains("(probe)") && t.contains("ready: opencode")),
        "{probed}"
    );
    browser.screenshot("workers-health").await;
    let note: Value = serde_json::from_str(
        &std::fs::read_to_string(notes.join("ready.json")).expect("the probe was noted"),
    )
    .expect("a note");
    assert_eq!(note["reachable"], true, "{note}");
    assert_eq!(note["by"], "probe", "{note}");
    interrupt(page).await;
}

/// Savings over days outlive the task records: a record that expires (`finished_task_ttl`,
/// here 2 s) leaves what it spent in the state directory's daily rollup, and the page still
/// counts that task on the day it finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savings_by_day_outlive_the_task_records() {
    let env = support::OpenCodeEnv::new();
    let state = env.root().join("state/opencode-mcp");
    let rig = Rig::start_in(
        support::FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_LIMITS__FINISHED_TASK_TTL", "2s")],
    )
    .await;
    let task = id(&rig.start_task("a task that expires").await);
    assert_eq!(rig.finish(&task).await["status"], "completed");
    let record = state.join(format!("tasks/{task}.json"));
    let gone =
        support::rig::poll_for(Duration::from_secs(60), || (!record.exists()).then_some(())).await;
    assert!(
        gone.is_some(),
        "the record expires\n{}",
        rig.client.stderr()
    );
    let kept = std::fs::read_dir(state.join("savings"))
        .expect("the rollup's folder")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    assert!(kept.contains(&task), "the task's spend is kept: {kept}");

    let (page, url) = dashboard(&rig).await;
    let s = page_state(&url).await;
    assert_eq!(s["tasks"].as_array().map(Vec::len), Some(0), "{s}");
    let day = &s["savings"]["days"][0];
    assert_eq!(day["tasks"], 1, "{s}");
    assert!(day["saved_usd"].as_f64().is_some_and(|v| v > 0.0), "{s}");
    let browser = Browser::start().await;
    browser.goto(&url).await;
    let shown = browser
        .wait_for(
            "the day's savings",
            SHOWN,
            "const r = document.querySelector('#days .srow.day'); return r ? r.textContent : null",
            json!([]),
        )
        .await;
    assert!(
        shown
            .as_str()
            .is_some_and(|t| t.contains("saved") && t.contains("1 task")),
        "{shown}"
    );
    browser.screenshot("savings-by-day").await;
    interrupt(page).await;
}
