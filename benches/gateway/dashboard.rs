//! The dashboard in a real headless Chromium (see `tests/support/browser.rs`), over the state
//! directory of a real gateway:
//! - **a change shown**: from a task's start answered through MCP to its row on an open page,
//!   and from `opencode_wait_for_task` saying it is done to the row saying `completed`;
//! - **a page of many tasks**: from navigating to a page over `records` stored tasks until its
//!   table shows its first page (the newest [`PAGE`] rows) and counts them all (copies of one
//!   real record under new ids).
//!
//! Goals are the issue's: a change shown within 1 s, the page of 1,000 tasks within 1 s.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::browser::{printed_address, Browser};
use crate::support::rig::Rig;
use crate::BoxError;

pub struct DashboardTimes {
    pub records: usize,
    /// Start answered → its row on the page (ms).
    pub appear_ms: Vec<f64>,
    /// Wait answered `done` → the row says completed (ms).
    pub complete_ms: Vec<f64>,
    /// Navigate → the first page of stored tasks drawn, all of them counted (ms).
    pub page_ms: Vec<f64>,
    /// The baseline: the same navigation over the run's own few tasks (ms).
    pub few_ms: Vec<f64>,
}

const ROW: &str =
    "const r = document.querySelector(`#tasks tr[data-task-id=\"${arguments[0]}\"]`); \
                   return r ? r.dataset.status : null";

/// Polls the page every few milliseconds until `script` answers `want` (any value if `None`).
async fn until(
    browser: &Browser,
    script: &str,
    args: Value,
    want: Option<&str>,
) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = browser.eval(script, args.clone()).await;
        let ok = match want {
            Some(w) => v == w,
            None => !v.is_null() && v != Value::Bool(false),
        };
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("dashboard: not seen within 60 s ({script} → {v})").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many tasks the page's table shows at a time (`assets/dashboard/app.js`).
pub const PAGE: usize = 100;

/// A script answering whether the page shows `n` tasks: its table holds the first page's rows
/// (`n`, or [`PAGE`] when there are more), and its count, when it is paged, says `n`.
fn shows_tasks(n: usize) -> String {
    let rows = n.min(PAGE);
    format!(
        "const c = document.getElementById('tasks-count'); \
         const rows = document.querySelectorAll('#tasks tr[data-task-id]').length; \
         const total = c ? Number(c.dataset.total) : rows; \
         return rows >= {rows} && total >= {n} ? true : null"
    )
}

/// `reps` times: from navigating to `url` (from a blank page) until it shows `rows` tasks.
async fn time_pages(
    browser: &Browser,
    url: &str,
    rows: usize,
    reps: usize,
) -> Result<Vec<f64>, BoxError> {
    let mut took = Vec::with_capacity(reps);
    for _ in 0..reps {
        browser.goto("about:blank").await;
        let t = Instant::now();
        browser.goto(url).await;
        until(browser, &shows_tasks(rows), json!([]), None).await?;
        took.push(ms(t.elapsed()));
    }
    Ok(took)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub async fn measure(records: usize, reps: usize) -> Result<DashboardTimes, BoxError> {
    let rig = Rig::start(&[]).await;
    let mut page = rig.spawn_cli(&["dashboard"]);
    let url = printed_address(&mut page).await;
    let browser = Browser::start().await;
    browser.goto(&url).await;
    until(
        &browser,
        "return document.querySelector('#live.on') ? true : null",
        json!([]),
        None,
    )
    .await?;
    let mut out = DashboardTimes {
        records,
        appear_ms: Vec::new(),
        complete_ms: Vec::new(),
        page_ms: Vec::new(),
        few_ms: Vec::new(),
    };
    let mut last = String::new();
    for i in 0..reps {
        let started = rig
            .start_task(&format!("dashboard bench {i} [[delay:1500]]"))
            .await;
        let t = Instant::now();
        let id = started["task_id"].as_str().ok_or("no task id")?.to_string();
        until(&browser, ROW, json!([id]), None).await?;
        out.appear_ms.push(ms(t.elapsed()));
        let w = rig.wait(&[&id], "all", 120_000).await;
        let t = Instant::now();
        if w["done"] != true {
            return Err(format!("dashboard bench: task not done: {w}").into());
        }
        until(&browser, ROW, json!([id]), Some("completed")).await?;
        out.complete_ms.push(ms(t.elapsed()));
        last = id;
    }

    // The baseline: the page over the run's own tasks (what navigating and drawing any page
    // costs in this browser, on this machine, now).
    out.few_ms = time_pages(&browser, &url, reps, reps).await?;

    // Many stored tasks: copies of the last real record under fresh ids.
    let tasks_dir = rig.env.root().join("state/opencode-mcp/tasks");
    let record = std::fs::read_to_string(tasks_dir.join(format!("{last}.json")))?;
    for n in 0..records {
        let copy_id = format!("tsk_bench{n:06}");
        std::fs::write(
            tasks_dir.join(format!("{copy_id}.json")),
            record.replace(&last, &copy_id),
        )?;
    }
    let total = records + reps;
    // The page's server has read them all before the clock starts.
    until(&browser, &shows_tasks(total), json!([]), None).await?;
    out.page_ms = time_pages(&browser, &url, total, reps).await?;
    drop(browser);
    let _ = page.kill().await;
    Ok(out)
}
