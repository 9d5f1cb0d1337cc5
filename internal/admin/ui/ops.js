// The cluster's side: topic routes with pause and resume, live workers per
// pool, and the dead-letter queue.

import { $, el, clear, api, ui, status, emptyRow, cell, jobLink, fmtTime, ago, setHash, FILTER_KEYS, actionButton } from "./api.js";

// refreshPools lists the topic routes; an all-tenant key pauses and
// resumes them (POST /v1/pools/{topic}/pause, /resume).
export async function refreshPools(refresh) {
  const p = await api("/v1/pools");
  const body = $("topics").tBodies[0];
  clear(body);
  const pools = new Map((p.pools || []).map(x => [x.name, x]));
  const pausedPool = name => (pools.get(name) || {}).paused;
  for (const t of p.topics || []) {
    const tr = el("tr");
    const paused = !!t.paused || (t.pools || []).some(pausedPool);
    tr.dataset.topic = t.topic;
    tr.dataset.paused = String(paused);
    const dispatch = (t.pools || []).map(n => (pools.get(n) || {}).dispatch).filter(Boolean).join(", ");
    const acts = el("td");
    if (ui.statsAllowed) {
      const path = "/v1/pools/" + t.topic.split("/").map(encodeURIComponent).join("/");
      acts.append(paused ?
        actionButton("Resume", () => api(path + "/resume", { method: "POST", body: {} }), refresh) :
        actionButton("Pause", () => api(path + "/pause", { method: "POST", body: {} }), refresh, "danger"));
    }
    const state = cell(el("span", t.topic));
    if (paused) state.append(" ", el("span", "paused", "badge paused"));
    tr.append(state, el("td", (t.pools || []).join(", ")), el("td", t.source || ""), el("td", dispatch), acts);
    body.append(tr);
  }
  if (!(p.topics || []).length) body.append(emptyRow(5, "no topic routes"));
}

export async function refreshWorkers() {
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
    tr.append(el("td", p.pool), el("td", p.workers),
      el("td", p.in_flight + " / " + (p.max_parallel || "∞")), cell(bar));
    pools.append(tr);
  }
  if (w.pools.length === 0) pools.append(emptyRow(4, "no live workers"));
  const workers = $("workers").tBodies[0];
  clear(workers);
  for (const x of w.workers) {
    const tr = el("tr");
    tr.dataset.worker = x.id;
    const name = el("a", x.id);
    name.title = "jobs of this worker";
    name.addEventListener("click", () => {
      setHash({ ...Object.fromEntries(FILTER_KEYS.map(k => [k, ""])), worker: x.id });
      $("jobs-panel").scrollIntoView();
    });
    const seen = el("td", ago(x.last_seen));
    if (x.heartbeat_interval_ms) seen.title = "heartbeat every " + x.heartbeat_interval_ms + " ms";
    if (x.heartbeat_too_slow) {
      seen.append(" · beats too seldom");
      seen.title += ": over a third of the node's worker TTL; one lost heartbeat gets it evicted";
    }
    tr.append(cell(name), el("td", x.unrouted ? x.pool + " (no topic routes here)" : x.pool), el("td", x.in_flight),
      el("td", x.active_jobs), el("td", x.max_parallel || "∞"), el("td", x.cpu_load ? x.cpu_load.toFixed(0) + "%" : ""),
      seen);
    workers.append(tr);
  }
}

export async function refreshDLQ(refresh) {
  const d = await api("/v1/dlq?limit=50");
  const body = $("dlq").tBodies[0];
  clear(body);
  for (const e of d.entries) {
    const tr = el("tr");
    tr.dataset.entry = e.id;
    const acts = el("td");
    if (e.job_id) acts.append(actionButton("retry", () => api("/v1/dlq/" + e.id + "/retry", { method: "POST", body: {} }), refresh));
    acts.append(actionButton("delete", () => api("/v1/dlq/" + e.id, { method: "DELETE" }), refresh));
    const reason = e.reason + (e.last_reason ? " (" + e.last_reason + ")" : "");
    tr.append(el("td", e.id), el("td", fmtTime(e.at)), cell(e.job_id ? jobLink(e.job_id) : ""), el("td", e.tenant || ""),
      el("td", reason), el("td", e.message || ""), cell(e.retried_as ? jobLink(e.retried_as) : ""), acts);
    body.append(tr);
  }
  if (d.entries.length === 0) body.append(emptyRow(8, "empty"));
}
