// Troupe dashboard: polls the admin API and renders it. No dependencies,
// no network beyond this server. Every value from the API goes through
// textContent, never innerHTML.
"use strict";

const STATES = ["PENDING", "APPROVAL_REQUIRED", "SCHEDULED", "DISPATCHED", "RUNNING",
  "SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "DENIED", "OUTPUT_QUARANTINED"];
const POLL_MS = 3000;          // one refresh every 3 s keeps the Redis cost of stats negligible
const RECENT_PER_STATE = 25;   // jobs per state in the "recent jobs" view (50 shown in all)

const ui = {
  key: sessionStorage.getItem("troupe.key") || "",
  state: "",          // selected state ("" = recent jobs across states)
  job: "",            // selected job id
  cursor: "",         // next page of the selected state
  samples: [],        // {t, received, completed}, from the server's history
  statsAllowed: true,
};

function $(id) { return document.getElementById(id); }

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function fmtTime(s) {
  if (!s) return "";
  const d = new Date(s);
  if (isNaN(d) || d.getFullYear() < 2000) return "";
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function ago(s) {
  const d = (Date.now() - new Date(s).getTime()) / 1000;
  if (!isFinite(d)) return "";
  if (d < 60) return Math.max(0, Math.round(d)) + "s ago";
  if (d < 3600) return Math.round(d / 60) + "m ago";
  return Math.round(d / 3600) + "h ago";
}

class HTTPError extends Error {
  constructor(status, body) { super((body && body.error) || ("HTTP " + status)); this.status = status; }
}

async function api(path, opts = {}) {
  const headers = { "Accept": "application/json" };
  if (ui.key) headers["Authorization"] = "Bearer " + ui.key;
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method: opts.method || "GET", headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  if (res.status === 401) {
    $("login").hidden = false;
    throw new HTTPError(401, { error: "API key required" });
  }
  const text = await res.text();
  const body = text ? JSON.parse(text) : null;
  if (!res.ok) throw new HTTPError(res.status, body);
  return body;
}

function status(msg, isError) {
  const s = $("status");
  s.textContent = msg;
  s.className = isError ? "error" : "muted";
}

// --- routing: #job=<id>&state=<STATE> -----------------------------------

function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.get("key")) {
    // A key handed over in the fragment (never sent to the server) is kept
    // for this tab only and removed from the address bar.
    ui.key = h.get("key");
    sessionStorage.setItem("troupe.key", ui.key);
    h.delete("key");
    history.replaceState(null, "", "#" + h.toString());
  }
  ui.job = h.get("job") || "";
  const st = h.get("state") || "";
  if (st !== ui.state) { ui.state = st; ui.cursor = ""; }
}

function setHash(changes) {
  const h = new URLSearchParams(location.hash.slice(1));
  for (const [k, v] of Object.entries(changes)) { if (v) h.set(k, v); else h.delete(k); }
  location.hash = h.toString();
}

// --- panels ----------------------------------------------------------------

async function refreshStats() {
  if (!ui.statsAllowed) return null;
  try {
    const s = await api("/v1/stats");
    $("node").textContent = "node " + s.node;
    renderStates(s.states);
    sample(s);
    return s;
  } catch (e) {
    if (e.status === 403) {
      ui.statsAllowed = false;
      $("states-panel").hidden = true;
      $("throughput-panel").hidden = true;
      return null;
    }
    throw e;
  }
}

function renderStates(states) {
  const box = $("states");
  clear(box);
  for (const st of STATES) {
    const t = el("div", null, "tile st-" + st + (ui.state === st ? " selected" : ""));
    t.dataset.state = st;
    t.dataset.count = states[st] || 0;
    t.append(el("div", states[st] || 0, "n"), el("div", st, "s"));
    t.addEventListener("click", () => setHash({ state: ui.state === st ? "" : st }));
    box.append(t);
  }
}

function sample(s) {
  // The server samples the counters itself; the page just draws them.
  ui.samples = (s.history || []).map(h => ({ t: new Date(h.at).getTime(), received: h.received, completed: h.completed }));
  drawChart();
}

function rates() {
  const out = [];
  for (let i = 1; i < ui.samples.length; i++) {
    const a = ui.samples[i - 1], b = ui.samples[i];
    const dt = (b.t - a.t) / 1000;
    if (dt <= 0) continue;
    out.push({ t: b.t, completed: Math.max(0, (b.completed - a.completed) / dt),
      received: Math.max(0, (b.received - a.received) / dt) });
  }
  return out;
}

function drawChart() {
  const svg = $("chart");
  clear(svg);
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 160, PAD = 4;
  const r = rates();
  const max = Math.max(1, ...r.map(p => Math.max(p.completed, p.received)));
  for (const f of [0.25, 0.5, 0.75]) {
    const g = document.createElementNS(NS, "line");
    g.setAttribute("x1", 0); g.setAttribute("x2", W);
    g.setAttribute("y1", H * f); g.setAttribute("y2", H * f);
    g.setAttribute("class", "grid");
    svg.append(g);
  }
  const label = document.createElementNS(NS, "text");
  label.setAttribute("x", 4); label.setAttribute("y", 12);
  label.textContent = max.toFixed(max < 10 ? 1 : 0) + "/s";
  svg.append(label);
  // The x axis spans the history the server has (up to 5 minutes), so a
  // freshly started node still fills the chart.
  const t0 = r.length ? r[0].t : 0, span = r.length > 1 ? r[r.length - 1].t - t0 : 1;
  for (const series of ["received", "completed"]) {
    if (r.length < 1) break;
    const pts = r.map(p => {
      const x = r.length === 1 ? W : ((p.t - t0) / span) * W;
      const y = H - PAD - (p[series] / max) * (H - 2 * PAD);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    if (pts.length === 1) pts.unshift("0," + pts[0].split(",")[1]);
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("class", series);
    svg.append(line);
  }
  if (r.length > 1) {
    const span_s = Math.round(span / 1000);
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", W - 4); t.setAttribute("y", H - 4); t.setAttribute("text-anchor", "end");
    t.textContent = "last " + (span_s < 120 ? span_s + " s" : Math.round(span_s / 60) + " min");
    svg.append(t);
  }
  const last = r[r.length - 1];
  $("rates").textContent = last ? `now ${last.completed.toFixed(1)} completed/s, ${last.received.toFixed(1)} received/s` : "";
}

async function refreshWorkers() {
  const w = await api("/v1/workers");
  const pools = $("pools").tBodies[0];
  clear(pools);
  for (const p of w.pools) {
    const tr = el("tr");
    tr.dataset.pool = p.pool;
    const bar = el("div", null, "bar" + (p.load >= 0.9 ? " hot" : ""));
    const fill = el("span");
    fill.style.width = Math.min(100, Math.round(p.load * 100)) + "%";
    bar.append(fill);
    const loadCell = el("td");
    loadCell.append(bar);
    tr.append(el("td", p.pool), el("td", p.workers),
      el("td", p.in_flight + " / " + (p.max_parallel || "∞")), loadCell);
    pools.append(tr);
  }
  if (w.pools.length === 0) pools.append(emptyRow(4, "no live workers"));
  const workers = $("workers").tBodies[0];
  clear(workers);
  for (const x of w.workers) {
    const tr = el("tr");
    tr.dataset.worker = x.id;
    tr.append(el("td", x.id), el("td", x.unrouted ? x.pool + " (no topic routes here)" : x.pool), el("td", x.in_flight), el("td", x.active_jobs),
      el("td", x.max_parallel || "∞"), el("td", x.cpu_load ? x.cpu_load.toFixed(0) + "%" : ""), el("td", ago(x.last_seen)));
    workers.append(tr);
  }
}

function emptyRow(cols, text) {
  const tr = el("tr");
  const td = el("td", text, "muted");
  td.colSpan = cols;
  tr.append(td);
  return tr;
}

function jobRow(j) {
  const tr = el("tr");
  tr.dataset.jobId = j.id;
  tr.dataset.state = j.state;
  const link = el("a", j.id);
  link.href = "#job=" + encodeURIComponent(j.id) + (ui.state ? "&state=" + ui.state : "");
  const idCell = el("td");
  idCell.append(link);
  const stCell = el("td");
  stCell.append(el("span", j.state, "badge st-" + j.state));
  tr.append(idCell, stCell, el("td", j.topic), el("td", j.tenant), el("td", j.reason || ""),
    el("td", j.worker || ""), el("td", fmtTime(j.updated)));
  return tr;
}

async function refreshJobs(stats) {
  const body = $("jobs").tBodies[0];
  let jobs = [];
  if (ui.state) {
    $("jobs-title").textContent = "Jobs in " + ui.state;
    const page = await api("/v1/jobs?state=" + ui.state + "&limit=50");
    jobs = page.jobs;
    ui.cursor = page.next || "";
  } else {
    $("jobs-title").textContent = "Recent jobs";
    // Only states that hold jobs, when the counts are known.
    const states = stats ? STATES.filter(s => stats.states[s] > 0) : STATES;
    const pages = await Promise.all(states.map(s => api("/v1/jobs?state=" + s + "&limit=" + RECENT_PER_STATE)));
    for (const p of pages) jobs.push(...p.jobs);
    jobs.sort((a, b) => new Date(b.updated) - new Date(a.updated));
    jobs = jobs.slice(0, 50);
    ui.cursor = "";
  }
  clear(body);
  for (const j of jobs) body.append(jobRow(j));
  if (jobs.length === 0) body.append(emptyRow(7, "no jobs"));
  $("jobs-more").hidden = !ui.cursor;
}

async function moreJobs() {
  if (!ui.state || !ui.cursor) return;
  const page = await api("/v1/jobs?state=" + ui.state + "&limit=50&cursor=" + encodeURIComponent(ui.cursor));
  for (const j of page.jobs) $("jobs").tBodies[0].append(jobRow(j));
  ui.cursor = page.next || "";
  $("jobs-more").hidden = !ui.cursor;
}

async function refreshJob() {
  const panel = $("job-panel");
  if (!ui.job) { panel.hidden = true; return; }
  panel.hidden = false;
  let j;
  try {
    j = await api("/v1/jobs/" + encodeURIComponent(ui.job));
  } catch (e) {
    $("job-id").textContent = ui.job;
    $("job-state").textContent = e.status === 404 ? "not found" : e.message;
    clear($("job-meta")); clear($("timeline")); clear($("trace").tBodies[0]);
    return;
  }
  panel.dataset.jobId = j.id;
  panel.dataset.state = j.state;
  $("job-id").textContent = j.id;
  const badge = $("job-state");
  badge.textContent = j.state;
  badge.className = "badge st-" + j.state;
  const meta = $("job-meta");
  clear(meta);
  const add = (k, v) => { if (v === undefined || v === "" || v === null) return; const d = el("div"); d.append(el("b", k), document.createTextNode(String(v))); meta.append(d); };
  add("topic", j.topic); add("tenant", j.tenant); add("reason", j.reason); add("worker", j.worker);
  add("subject", j.subject); add("attempts", j.attempts); add("trace id", j.trace_id); add("owner", j.owner);
  add("result", j.result_ptr);
  if (j.error_code || j.error_message) add("error", (j.error_code || "") + ": " + (j.error_message || ""));
  add("retry of", j.retry_of); if (j.retries) add("retried as", j.retries.join(", "));
  for (const d of j.decisions || []) add(d.kind, [d.decision, d.by && "by " + d.by, d.reason, d.rule_id && "rule " + d.rule_id].filter(Boolean).join(" · "));

  const tl = $("timeline");
  clear(tl);
  const t0 = j.history.length ? new Date(j.history[0].at).getTime() : 0;
  for (const h of j.history) {
    const li = el("li", null, "st-" + h.to);
    li.dataset.state = h.to;
    const off = new Date(h.at).getTime() - t0;
    li.append(el("span", "+" + off + " ms", "offset"), el("span", (h.from || "·") + " → "),
      el("span", h.to, "st-" + h.to), el("span", "  " + h.reason + " · " + h.node + " · " + fmtTime(h.at), "muted"));
    tl.append(li);
  }
  const terminal = ["SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "DENIED", "OUTPUT_QUARANTINED"].includes(j.state);
  for (const b of $("job-actions").querySelectorAll("button")) {
    const a = b.dataset.action;
    b.hidden = a === "cancel" ? terminal : j.state !== "APPROVAL_REQUIRED";
  }
  await refreshTrace(j.id);
}

async function refreshTrace(id) {
  const body = $("trace").tBodies[0];
  const note = $("trace-note");
  let t;
  try {
    t = await api("/v1/jobs/" + encodeURIComponent(id) + "/trace");
  } catch (e) {
    note.textContent = e.message;
    return;
  }
  clear(body);
  note.textContent = t.entries.length ? "(" + t.entries.length + " messages)" :
    (t.tracing ? "(no messages recorded yet)" : "(tracing is off on this node)");
  t.entries.forEach((e, i) => {
    const tr = el("tr");
    tr.dataset.type = e.type;
    const flow = (e.before || "·") + " → " + (e.after || "·");
    tr.append(el("td", i + 1), el("td", fmtTime(e.at)), el("td", e.node || ""), el("td", e.sender || ""),
      el("td", e.type + (e.panicked ? " (panicked)" : "") + (e.dropped ? " [" + e.dropped + " earlier dropped]" : "")),
      el("td", flow), el("td", e.reason || ""), el("td", (e.handle_ns / 1000).toFixed(1)));
    body.append(tr);
  });
}

async function refreshDLQ() {
  const d = await api("/v1/dlq?limit=50");
  const body = $("dlq").tBodies[0];
  clear(body);
  for (const e of d.entries) {
    const tr = el("tr");
    tr.dataset.entry = e.id;
    const job = el("td");
    if (e.job_id) { const a = el("a", e.job_id); a.href = "#job=" + encodeURIComponent(e.job_id); job.append(a); }
    const acts = el("td");
    if (e.job_id) acts.append(actionButton("retry", () => api("/v1/dlq/" + e.id + "/retry", { method: "POST", body: {} })));
    acts.append(actionButton("delete", () => api("/v1/dlq/" + e.id, { method: "DELETE" })));
    const reason = e.reason + (e.last_reason ? " (" + e.last_reason + ")" : "");
    tr.append(el("td", e.id), el("td", fmtTime(e.at)), job, el("td", e.tenant || ""), el("td", reason),
      el("td", e.message || ""), el("td", e.retried_as || ""), acts);
    body.append(tr);
  }
  if (d.entries.length === 0) body.append(emptyRow(8, "empty"));
}

function actionButton(label, fn) {
  const b = el("button", label);
  b.addEventListener("click", async () => {
    try { await fn(); status(label + " done"); } catch (e) { status(label + ": " + e.message, true); }
    refresh();
  });
  return b;
}

async function jobAction(action) {
  if (!ui.job) return;
  try {
    await api("/v1/jobs/" + encodeURIComponent(ui.job) + "/" + action, { method: "POST", body: {} });
    status(action + " sent for " + ui.job);
  } catch (e) {
    status(action + ": " + e.message, true);
  }
  refresh();
}

// --- main loop ---------------------------------------------------------------

let refreshing = false;

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    const who = await api("/v1/whoami");
    $("who").textContent = "tenant " + who.tenant;
    $("login").hidden = true;
    const stats = await refreshStats();
    await Promise.all([refreshWorkers(), refreshJobs(stats), refreshJob(), refreshDLQ()]);
    status("updated " + new Date().toLocaleTimeString([], { hour12: false }));
    document.body.dataset.loaded = "true";
  } catch (e) {
    status(e.message, true);
  } finally {
    refreshing = false;
  }
}

function init() {
  readHash();
  window.addEventListener("hashchange", () => { readHash(); refresh(); });
  $("find").addEventListener("submit", ev => {
    ev.preventDefault();
    const id = $("find-id").value.trim();
    if (id) setHash({ job: id });
  });
  $("login").addEventListener("submit", ev => {
    ev.preventDefault();
    ui.key = $("key").value.trim();
    sessionStorage.setItem("troupe.key", ui.key);
    $("key").value = "";
    ui.statsAllowed = true;
    $("states-panel").hidden = false;
    $("throughput-panel").hidden = false;
    refresh();
  });
  $("jobs-more").addEventListener("click", () => moreJobs().catch(e => status(e.message, true)));
  for (const b of $("job-actions").querySelectorAll("button")) {
    b.addEventListener("click", () => jobAction(b.dataset.action));
  }
  refresh();
  setInterval(refresh, POLL_MS);
}

init();
