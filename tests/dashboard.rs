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
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
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
