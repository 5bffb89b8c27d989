// opencode-mcp dashboard. Everything in the data is untrusted text written by
// AI agents: the DOM is built with createElement and textContent only.
"use strict";
(() => {
  const params = new URLSearchParams(location.search);
  const token = params.get("token") || "";
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const live = document.getElementById("live");
  const spendEl = document.getElementById("spend");

  // el(tag, attrs, ...children): strings become text nodes, null/false are skipped.
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v == null || v === false) continue;
        if (k === "class") e.className = String(v);
        else e.setAttribute(k, String(v));
      }
    }
    for (const c of kids) {
      if (c == null || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  const show = (...nodes) => main.replaceChildren(...nodes.filter((n) => n != null && n !== false));
  const str = (v) => (v == null ? "" : String(v));
  const num = (v) => { const n = Number(v); return Number.isFinite(n) ? n : 0; };
  const arr = (v) => (Array.isArray(v) ? v : []);
  const usd = (v, d) => "$" + num(v).toFixed(d);
  const usdAuto = (v) => usd(v, Math.abs(num(v)) < 1 ? 4 : 2);
  const cls = (v) => str(v).toLowerCase().replace(/[^a-z0-9_-]/g, "");
  const plural = (n, w) => `${n} ${w}${n === 1 ? "" : "s"}`;
  const taskHref = (id) => "/task?id=" + encodeURIComponent(id) + "&token=" + encodeURIComponent(token);
  const api = (path, extra) => path + "?" + new URLSearchParams({ ...(extra || {}), token });

  function dur(ms) {
    let s = Math.max(0, Math.floor(num(ms) / 1000));
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60);
    s %= 60;
    if (m < 60) return `${m}m ${s}s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h}h ${m % 60}m`;
    return `${Math.floor(h / 24)}d ${h % 24}h`;
  }
  const durShort = (ms) => (num(ms) < 1000 ? Math.round(num(ms)) + "ms" : dur(ms));
  const when = (ms) => (ms == null ? "" : new Date(num(ms)).toLocaleString());

  function badge(status, phase) {
    const b = el("span", { class: "status status-" + cls(status) });
    b.textContent = str(status);
    const out = [b];
    if (phase != null && phase !== "") out.push(el("span", { class: "phase" }, ` (${str(phase)})`));
    return out;
  }

  function checksText(c) {
    if (!c) return ["", ""];
    const t = c.passed === true ? "passed" : c.passed === false ? "failed" : "running";
    const k = c.passed === true ? "pass" : c.passed === false ? "fail" : "";
    return [c.rounds != null ? `${t} · ${plural(num(c.rounds), "round")}` : t, k];
  }

  // Cancel: only on a page a gateway serves, for its unfinished tasks (`cancellable`). The
  // header tells the server the request comes from this page (a cross-site one cannot send it).
  async function cancelTask(id, button) {
    button.disabled = true;
    button.textContent = "cancelling…";
    let said = "";
    try {
      const r = await fetch(api("/api/cancel", { id }), {
        method: "POST", cache: "no-store", headers: { "x-opencode-mcp-dashboard": "cancel" },
      });
      said = (await r.text()).trim();
      if (r.ok) { button.textContent = "cancelled"; return; }
    } catch (e) {
      said = "could not reach the page's gateway";
    }
    button.disabled = false;
    button.textContent = "cancel";
    button.title = said;
    button.dataset.error = said;
    button.classList.add("failed");
  }
  function cancelButton(id) {
    const b = el("button", { type: "button", class: "cancel", "data-cancel": id, title: "cancel this task (its edits stay)" }, "cancel");
    b.addEventListener("click", () => cancelTask(id, b));
    return b;
  }

  function setLive(text, on) {
    live.textContent = text;
    live.className = "live " + (on ? "on" : "off");
  }

  function listen(onState) {
    const es = new EventSource(api("/api/events"));
    es.onopen = () => setLive("live", true);
    es.addEventListener("state", (ev) => {
      // The stream opens with the state the page may have just drawn: the same text is not
      // drawn again (a thousand rows cost a layout each time).
      if (ev.data === lastState) { setLive("live", true); return; }
      lastState = ev.data;
      let d;
      try { d = JSON.parse(ev.data); } catch (_) { return; }
      setLive("live", true);
      if (d && typeof d === "object") onState(d);
    });
    es.onerror = () => {
      setLive("reconnecting…", false);
      if (es.readyState === EventSource.CLOSED) {
        es.close();
        setTimeout(() => listen(onState), 5000);
      }
    };
  }

  function tokenRejected() {
    setLive("no access", false);
    show(el("p", { class: "notice" }, "The token was not accepted. Open the address printed by ",
      el("code", null, "opencode-mcp dashboard"), " again."));
  }

  async function getJSON(url) {
    const r = await fetch(url, { cache: "no-store" });
    if (r.status === 401 || r.status === 403) return { denied: true };
    if (!r.ok) return { status: r.status };
    const text = await r.text();
    return { data: JSON.parse(text), text };
  }

  function renderSpend(sp) {
    spendEl.replaceChildren();
    if (!sp || typeof sp !== "object") return;
    const today = num(sp.today_usd);
    if (sp.daily_cap_usd == null) {
      spendEl.append(`${usd(today, 2)} today, no daily cap`);
      return;
    }
    const cap = num(sp.daily_cap_usd);
    spendEl.append(`${usd(today, 2)} of ${usd(cap, 2)} today`);
    const fill = el("div", { class: "fill" });
    fill.style.width = (cap > 0 ? Math.min(100, (today / cap) * 100) : 100) + "%";
    spendEl.append(el("div", { class: "bar" + (today >= cap ? " over" : ""), title: "daily cap" }, fill));
  }

  // ---------- index page ----------
  let stateAt = Date.now();
  // The text of the state last drawn (see `listen`).
  let lastState = null;

  function taskRow(t, member) {
    const id = str(t.task_id);
    const [ct, ck] = checksText(t.checks);
    const age = el("td", { class: "num age", "data-ms": num(t.age_ms) }, dur(t.age_ms));
    const esc = num(t.escalations);
    return el("tr", { "data-task-id": id, "data-status": str(t.status), class: member ? "member" : null },
      el("td", null, ...badge(t.status, t.phase), t.cancellable === true ? cancelButton(id) : null),
      el("td", { class: "title" },
        el("a", { href: taskHref(id), title: id }, str(t.title) || id),
        t.unconfined != null ? el("span", { class: "flag", title: str(t.unconfined) }, "unconfined") : null,
        t.gateway_gone ? el("span", { class: "flag", title: "the gateway that ran this task is gone" }, "gateway gone") : null),
      el("td", null, str(t.tier)),
      el("td", null, str(t.model)),
      el("td", null, t.worker == null ? "local" : str(t.worker)),
      age,
      el("td", { class: "num" }, t.duration_ms == null ? "" : dur(t.duration_ms)),
      el("td", { class: "num" }, usd(t.spend_usd, 4)),
      el("td", { class: ck || null }, ct),
      el("td", { class: "num" }, esc ? String(esc) : ""));
  }

  // A fan-out's tasks are one unit, kept together on one page, its members in target order.
  const gid = (t) => (t.group && typeof t.group === "object" && t.group.id != null ? str(t.group.id) : null);
  function unitsOf(tasks) {
    const groups = new Map(), units = [];
    for (const t of tasks) {
      const g = gid(t);
      if (g == null) { units.push({ group: null, tasks: [t] }); continue; }
      let u = groups.get(g);
      if (!u) { u = { group: g, tasks: [] }; groups.set(g, u); units.push(u); }
      u.tasks.push(t);
    }
    for (const u of groups.values()) u.tasks.sort((a, b) => num(a.group.index) - num(b.group.index));
    return units;
  }

  // The table shows PAGE tasks at a time, newest first: a thousand rows cost the browser a
  // second to lay out, and nobody reads them at once. A fan-out is never split (a larger one
  // is a page of its own).
  const PAGE = 100;
  let page = 0;
  function pagesOf(units) {
    const pages = [];
    let cur = [], n = 0;
    for (const u of units) {
      if (n && n + u.tasks.length > PAGE) { pages.push(cur); cur = []; n = 0; }
      cur.push(u);
      n += u.tasks.length;
    }
    if (cur.length || !pages.length) pages.push(cur);
    return pages;
  }

  function tasksTable(tasks, redraw) {
    const head = el("tr", null, ...["Status", "Title", "Tier", "Model", "Worker", "Age", "Duration", "Spend", "Checks", "Esc."]
      .map((h, i) => el("th", { class: i >= 5 && i <= 7 ? "num" : null }, h)));
    const body = el("tbody");
    const pages = pagesOf(unitsOf(tasks));
    page = Math.max(0, Math.min(page, pages.length - 1));
    let before = 0;
    for (const p of pages.slice(0, page)) for (const u of p) before += u.tasks.length;
    let shown = 0;
    for (const u of pages[page]) {
      shown += u.tasks.length;
      if (u.group == null) { body.append(taskRow(u.tasks[0], false)); continue; }
      body.append(el("tr", { class: "group", "data-group-id": u.group },
        el("td", { colspan: 10 }, `fan-out ${u.group}, ${plural(u.tasks.length, "task")}`)));
      for (const m of u.tasks) body.append(taskRow(m, true));
    }
    if (!tasks.length) body.append(el("tr", { class: "none" }, el("td", { colspan: 10, class: "empty" }, "No tasks yet.")));
    const table = el("table", { id: "tasks" }, el("thead", null, head), body);
    if (pages.length < 2) return table;
    const turn = (to) => () => { page = to; redraw(); };
    const newer = el("button", { type: "button", id: "newer", disabled: page === 0 }, "← newer");
    const older = el("button", { type: "button", id: "older", disabled: page === pages.length - 1 }, "older →");
    newer.addEventListener("click", turn(page - 1));
    older.addEventListener("click", turn(page + 1));
    const pager = el("div", { class: "pager", id: "pager" }, newer,
      el("span", { id: "tasks-count", "data-total": tasks.length, "data-page": page + 1 },
        `tasks ${before + 1}–${before + shown} of ${tasks.length}, page ${page + 1} of ${pages.length}`),
      older);
    return el("div", null, pager, table);
  }

  function queueList(q) {
    if (!q.length) return el("p", { class: "empty", id: "queue-empty" }, "Nothing queued.");
    const ol = el("ol", { id: "queue" });
    for (const e of q.slice().sort((a, b) => num(a.position) - num(b.position))) {
      ol.append(el("li", { "data-task-id": str(e.task_id), value: Math.max(1, Math.floor(num(e.position))) || null },
        el("a", { href: taskHref(str(e.task_id)), title: str(e.task_id) }, str(e.title) || str(e.task_id)),
        e.tier != null ? el("span", { class: "muted" }, ` · ${str(e.tier)}`) : null,
        e.worker != null ? el("span", { class: "muted" }, ` · on ${str(e.worker)}`) : null));
    }
    return ol;
  }

  // What was last seen of a worker, with its age: a note is a claim about the past.
  function seenText(seen) {
    if (!seen || typeof seen !== "object") return ["never seen", ""];
    const ago = dur(Date.now() - num(seen.at_ms)) + " ago";
    const by = str(seen.by);
    const detail = seen.detail == null ? "" : ": " + str(seen.detail);
    return seen.reachable === true
      ? [`reachable ${ago} (${by})${detail}`, "pass"]
      : [`out of reach ${ago} (${by})${detail}`, "fail"];
  }

  // A probe on request: one ssh round trip from the page's process, noted for every page.
  async function probeWorker(name, button, cell) {
    button.disabled = true;
    button.textContent = "probing…";
    try {
      const r = await fetch(api("/api/probe", { worker: name }), {
        method: "POST", cache: "no-store", headers: { "x-opencode-mcp-dashboard": "probe" },
      });
      if (r.ok) {
        const d = JSON.parse(await r.text());
        const [t, k] = seenText(d && d.seen);
        const problems = arr(d && d.problems).map(str);
        cell.replaceChildren(t, ...problems.map((p) => el("div", { class: "muted" }, p)));
        cell.className = k;
      } else {
        cell.textContent = `probe refused (HTTP ${r.status}): ${(await r.text()).trim()}`;
        cell.className = "fail";
      }
    } catch (_) {
      cell.textContent = "could not reach the dashboard server";
    }
    button.disabled = false;
    button.textContent = "probe";
  }

  function workersTable(ws) {
    if (!ws.length) return el("p", { class: "empty" }, "No workers.");
    const body = el("tbody");
    for (const w of ws) {
      const name = str(w.name);
      const [st, sk] = w.remote ? seenText(w.seen) : ["this machine", ""];
      const health = el("td", { class: "health " + sk }, st);
      let probe = null;
      if (w.remote) {
        probe = el("button", { type: "button", class: "probe", "data-probe": name }, "probe");
        probe.addEventListener("click", () => probeWorker(name, probe, health));
      }
      body.append(el("tr", { "data-worker": name },
        el("td", null, name),
        el("td", { class: "num" }, `${num(w.in_use)} / ${num(w.slots)}`),
        el("td", { class: "num" }, String(num(w.free))),
        el("td", null, w.confined === true ? "yes" : w.confined === false ? "no" : "unknown"),
        el("td", null, w.remote ? "remote" : "local"),
        health,
        el("td", null, probe)));
    }
    return el("table", { id: "workers" },
      el("thead", null, el("tr", null, el("th", null, "Name"), el("th", { class: "num" }, "In use / slots"),
        el("th", { class: "num" }, "Free"), el("th", null, "Confined"), el("th", null, "Where"),
        el("th", null, "Health"), el("th", null, ""))), body);
  }

  // Savings over days, newest first: one stacked bar per day, a segment per tier (the same
  // tier keeps its colour across days).
  function daysChart(days) {
    const box = el("div", { id: "days" }, el("h3", null, "By day"));
    const colour = new Map();
    for (const d of days) for (const t of arr(d.tiers)) if (!colour.has(str(t.name))) colour.set(str(t.name), colour.size % 6);
    const max = Math.max(0, ...days.map((d) => num(d.saved_usd)));
    for (const d of days) {
      const bar = el("div", { class: "sbar stack" });
      for (const t of arr(d.tiers)) {
        const saved = Math.max(0, num(t.saved_usd));
        if (!(max > 0) || saved <= 0) continue;
        const seg = el("div", { class: "seg seg-" + colour.get(str(t.name)), title: `${str(t.name)}: ${usdAuto(t.saved_usd)} saved` });
        seg.style.width = (saved / max) * 100 + "%";
        bar.append(seg);
      }
      const parts = arr(d.tiers).map((t) => `${str(t.name)} ${usdAuto(t.saved_usd)}`).join(", ");
      box.append(el("div", { class: "srow day", "data-day": str(d.day) },
        el("div", { class: "sname" }, str(d.day)),
        bar,
        el("div", { class: "slabel", title: parts },
          `${usdAuto(d.saved_usd)} saved, ${usdAuto(d.cost_usd)} spent, ${plural(num(d.tasks), "task")}`)));
    }
    const legend = el("div", { class: "legend" });
    for (const [name, i] of colour) legend.append(el("span", { class: "key" }, el("span", { class: "swatch seg-" + i }), name));
    box.append(legend);
    return box;
  }

  function savingsView(sv) {
    const s = sv && typeof sv === "object" ? sv : {};
    const tiers = arr(s.tiers), models = arr(s.models);
    const wrap = el("div", { id: "savings" });
    if (s.reference != null && s.reference !== "") wrap.append(el("p", { class: "caption" }, str(s.reference)));
    const days = arr(s.days).filter((d) => d && typeof d === "object");
    if (days.length) wrap.append(daysChart(days));
    if (!tiers.length && !models.length) {
      wrap.append(el("p", { class: "empty" }, "Nothing finished yet."));
      return wrap;
    }
    const max = Math.max(0, ...tiers.concat(models).map((r) => num(r.saved_usd)));
    for (const [label, rows, kind] of [["By tier", tiers, "tier"], ["By model", models, "model"]]) {
      if (!rows.length) continue;
      wrap.append(el("h3", null, label));
      for (const r of rows) {
        const fill = el("div", { class: "fill" });
        fill.style.width = (max > 0 ? (Math.max(0, num(r.saved_usd)) / max) * 100 : 0) + "%";
        wrap.append(el("div", { class: "srow " + kind },
          el("div", { class: "sname", title: str(r.name) }, str(r.name)),
          el("div", { class: "sbar" }, fill),
          el("div", { class: "slabel" },
            `${usdAuto(r.saved_usd)} saved, ${usdAuto(r.cost_usd)} spent, ${plural(num(r.tasks), "task")}`)));
      }
    }
    return wrap;
  }

  // `again`: the same state drawn again (another page of it), whose ages keep their clock.
  function renderIndex(s, again) {
    if (!again) stateAt = Date.now();
    renderSpend(s.spend);
    if (!s.exists) {
      show(el("p", { class: "notice", id: "no-state" }, "No state directory yet at ", el("code", null, str(s.state_dir)),
        ". Start a task through your host (for example Claude Code with ",
        el("code", null, "claude mcp add opencode -- opencode-mcp"), "), then this page fills in."));
      return;
    }
    const bad = num(s.unreadable);
    show(
      el("h2", null, "Tasks"),
      s.gateway_pid != null
        ? el("p", { class: "muted", id: "control" }, `Served by the gateway with pid ${num(s.gateway_pid)}: its unfinished tasks can be cancelled here.`)
        : null,
      tasksTable(arr(s.tasks), () => renderIndex(s, true)),
      bad ? el("p", { class: "muted" }, `${plural(bad, "task record")} could not be read.`) : null,
      el("h2", null, "Queue"), queueList(arr(s.queue)),
      el("h2", null, "Workers"), workersTable(arr(s.workers)),
      el("h2", null, "Savings"), savingsView(s.savings),
      el("p", { class: "muted" }, "State directory: ", el("code", null, str(s.state_dir))));
  }

  async function indexPage() {
    setInterval(() => {
      const dt = Date.now() - stateAt;
      for (const td of main.querySelectorAll("td.age")) td.textContent = dur(num(td.getAttribute("data-ms")) + dt);
    }, 1000);
    try {
      const r = await getJSON(api("/api/state"));
      if (r.denied) return tokenRejected();
      if (r.data && typeof r.data === "object") { lastState = r.text; renderIndex(r.data); }
      else if (r.status) show(el("p", { class: "notice" }, `Could not load the state (HTTP ${r.status}).`));
    } catch (_) {
      show(el("p", { class: "notice" }, "Could not reach the dashboard server."));
    }
    listen(renderIndex);
  }

  // ---------- task page ----------
  function section(title, ...nodes) { return [el("h2", null, title), ...nodes]; }

  function filesView(files) {
    if (files == null) return el("p", { class: "empty" }, "No file changes recorded.");
    const list = arr(files);
    if (!list.length) return el("p", { class: "empty" }, "No files changed.");
    const body = el("tbody");
    for (const f of list) {
      body.append(el("tr", null,
        el("td", null, el("code", null, str(f.file))),
        el("td", null, str(f.status)),
        el("td", { class: "num add" }, "+" + num(f.additions)),
        el("td", { class: "num del" }, "-" + num(f.deletions))));
    }
    return el("table", { id: "files" }, el("thead", null, el("tr", null, el("th", null, "Path"), el("th", null, "Change"),
      el("th", { class: "num" }, "Added"), el("th", { class: "num" }, "Deleted"))), body);
  }

  function diffView(diff) {
    if (diff == null || diff === "") return el("p", { class: "empty" }, "No diff.");
    const pre = el("pre", { id: "diff" });
    const lines = str(diff).split("\n");
    if (lines.length && lines[lines.length - 1] === "") lines.pop();
    for (const line of lines) {
      const c = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null;
      pre.append(el("span", { class: c }, line));
    }
    return pre;
  }

  function checksView(c) {
    if (!c || typeof c !== "object") return el("p", { class: "empty" }, "No checks for this task.");
    const [ct, ck] = checksText(c);
    const wrap = el("div", { id: "checks" }, el("p", null, "Result: ", el("span", { class: ck || null }, ct)));
    for (const r of arr(c.results)) {
      const state = r.ok ? "ok" : "failed";
      wrap.append(el("div", { class: "check" },
        el("div", { class: "check-head" }, el("code", null, str(r.command)), " ",
          el("span", { class: r.ok ? "pass" : "fail" }, state),
          r.exit != null ? ` · exit ${num(r.exit)}` : "",
          r.duration_ms != null ? ` · ${durShort(r.duration_ms)}` : ""),
        r.error != null ? el("p", { class: "error" }, str(r.error)) : null,
        el("pre", { class: "output" }, str(r.output))));
    }
    return wrap;
  }

  // Every turn, oldest first: the past ones in short (what the record keeps), then the
  // current one, whose whole answer is below.
  function turnsView(t) {
    const past = arr(t.past_turns).filter((p) => p && typeof p === "object");
    const body = el("tbody");
    const row = (n, status, model, started, finished, cost, answer, cut, error, current) => body.append(
      el("tr", { "data-turn": String(num(n)), class: current ? "current" : null },
        el("td", { class: "num" }, String(num(n))),
        el("td", null, ...badge(status, null)),
        el("td", null, str(model)),
        el("td", null, when(started)),
        el("td", { class: "num" }, finished == null ? "" : dur(num(finished) - num(started))),
        el("td", { class: "num" }, usd(cost, 4)),
        el("td", { class: "answer" },
          error ? el("div", { class: "error" }, str(error)) : null,
          current ? el("span", { class: "muted" }, "(the answer below)") : str(answer) + (cut ? " …" : ""))));
    for (const p of past) row(p.turn, p.status, p.model, p.started_ms, p.finished_ms, p.cost, p.answer, p.cut === true, p.error, false);
    row(t.turn, t.status, t.model, t.turn_started_ms, t.finished_ms, t.turn_cost_usd, "", false, null, true);
    return el("table", { id: "turns" },
      el("thead", null, el("tr", null, ...["Turn", "Status", "Model", "Started", "Took", "Spend", "Answer"]
        .map((h, i) => el("th", { class: i === 0 || (i >= 4 && i <= 5) ? "num" : null }, h)))), body);
  }

  function renderTask(t) {
    document.title = `${str(t.title) || str(t.task_id)} · opencode-mcp`;
    const dl = el("dl", { id: "meta" });
    const add = (k, ...v) => dl.append(el("dt", null, k), el("dd", null, ...v));
    add("Status", ...badge(t.status, t.phase));
    add("Task", el("code", null, str(t.task_id)));
    add("Tier", str(t.tier) || "—");
    add("Model", str(t.model) || "—");
    add("Worker", t.worker == null ? "local" : str(t.worker));
    add("Directory", el("code", null, str(t.directory)));
    add("Turn", String(num(t.turn)));
    add("Started", when(t.started_ms));
    if (t.finished_ms != null) add("Finished", `${when(t.finished_ms)} (took ${dur(num(t.finished_ms) - num(t.started_ms))})`);
    add("Spend", usd(t.spend_usd, 4));
    if (t.cancellable === true) add("", cancelButton(str(t.task_id)));
    const esc = arr(t.escalations);
    show(
      el("h1", { id: "title" }, str(t.title) || str(t.task_id)),
      dl,
      el("p", { class: "watch" }, "Follow it live: ", el("code", { id: "watch" }, str(t.watch))),
      ...(t.error != null && t.error !== "" ? section("Error", el("pre", { id: "error", class: "error" }, str(t.error))) : []),
      ...section("Turns", turnsView(t)),
      ...section("Answer", el("pre", { id: "answer" }, str(t.answer))),
      ...section("Files changed", filesView(t.files_changed)),
      ...section("Diff", diffView(t.diff)),
      ...section("Checks", checksView(t.checks)),
      ...section("Escalations", esc.length
        ? el("pre", { id: "escalations" }, JSON.stringify(esc, null, 2))
        : el("p", { class: "empty" }, "None.")));
  }

  function taskPage() {
    const id = params.get("id") || "";
    nav.append(el("a", { href: "/?token=" + encodeURIComponent(token), class: "back" }, "← all tasks"));
    let loaded = false, pending = null, lastFetch = 0, lastKey;

    async function load() {
      lastFetch = Date.now();
      try {
        const r = await getJSON(api("/api/task", { id }));
        if (r.denied) return tokenRejected();
        if (r.status === 404) { loaded = false; return show(el("p", { class: "notice", id: "missing" }, "No such task")); }
        if (r.status) { if (!loaded) show(el("p", { class: "notice" }, `Could not load the task (HTTP ${r.status}).`)); return; }
        if (r.data && typeof r.data === "object") { loaded = true; renderTask(r.data); }
      } catch (_) {
        if (!loaded) show(el("p", { class: "notice" }, "Could not reach the dashboard server."));
      }
    }
    function schedule() {
      if (pending) return;
      pending = setTimeout(() => { pending = null; load(); }, Math.max(0, lastFetch + 1000 - Date.now()));
    }
    listen((s) => {
      renderSpend(s.spend);
      const t = arr(s.tasks).find((x) => x && str(x.task_id) === id);
      const key = t ? JSON.stringify([t.status, t.phase, t.duration_ms, t.spend_usd, t.checks, t.escalations]) : null;
      if (key !== lastKey) {
        lastKey = key;
        if (t) schedule();
      }
    });
    if (!id) return show(el("p", { class: "notice", id: "missing" }, "No such task"));
    load();
  }

  // ---------- start ----------
  if (!token) {
    setLive("no token", false);
    show(el("p", { class: "notice", id: "no-token" }, "This page needs the address printed by ",
      el("code", null, "opencode-mcp dashboard"), " (it holds a token)."));
    return;
  }
  if (location.pathname === "/task" || location.pathname.endsWith("/task")) taskPage();
  else indexPage();
})();
