// Troupe dashboard: polls the admin API and renders it. No dependencies,
// no build step, no network beyond this server. The modules:
//   api.js       state, the API call, DOM and URL-fragment helpers
//   charts.js    the SVG charts (throughput, queue depth, latency, failures)
//   jobs.js      the job list, its filter, bulk cancel and retry
//   job.js       one job: wait, payloads, attempts, timeline, trace, actions
//   ops.js       topic routes (pause, resume), workers, the DLQ
//   workflows.js sagas: steps, compensations, rollback
//   schedules.js schedules (pause, resume, delete) and delayed jobs
//   limits.js    concurrency keys and rate-limit buckets
// The URL fragment holds what is shown (#state=FAILED&topic=job.echo&job=<id>
// &saga=<id>), so a view can be bookmarked and shared.

import { $, el, clear, api, ui, status, setHash, STATES } from "./api.js";
import { drawThroughput, refreshSeries } from "./charts.js";
import { readFilter, refreshJobs, initJobs } from "./jobs.js";
import { refreshJob, initJob } from "./job.js";
import { refreshPools, refreshWorkers, refreshDLQ } from "./ops.js";
import { refreshSagas, initSagas } from "./workflows.js";
import { refreshSchedules, refreshDelayed } from "./schedules.js";
import { refreshKeys, refreshBuckets } from "./limits.js";

const POLL_MS = 3000; // one refresh every 3 s keeps the Redis cost of stats negligible

let scrollTo = ""; // the panel to bring into view after the next refresh

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
  const job = h.get("job") || "", saga = h.get("saga") || "";
  // A job or workflow just opened is brought into view once it is drawn.
  if (job && job !== ui.job) scrollTo = "job-panel";
  else if (saga && saga !== ui.saga) scrollTo = "saga";
  ui.job = job;
  ui.saga = saga;
  readFilter(h);
}

async function refreshStats() {
  if (!ui.statsAllowed) return;
  try {
    const s = await api("/v1/stats");
    $("node").textContent = "node " + s.node;
    renderStates(s.states);
    drawThroughput(s.history);
  } catch (e) {
    if (e.status !== 403) throw e;
    // A tenant key: no cluster-wide counts, charts or workflows.
    ui.statsAllowed = false;
    $("states-panel").hidden = true;
    $("series-panel").hidden = true;
    $("sagas-panel").hidden = true;
  }
}

function renderStates(states) {
  const box = $("states");
  clear(box);
  for (const st of STATES) {
    const t = el("div", null, "tile st-" + st + (ui.filter.state === st ? " selected" : ""));
    t.dataset.state = st;
    t.dataset.count = states[st] || 0;
    t.append(el("div", states[st] || 0, "n"), el("div", st.replace(/_/g, " "), "s"));
    t.addEventListener("click", () => setHash({ state: ui.filter.state === st ? "" : st }));
    box.append(t);
  }
}

// Each panel refreshes on its own: one failing (a node without an
// endpoint, a slow call) leaves the others current.
// A refresh asked for while one runs (a click, a new fragment) runs right
// after it, so what the page shows follows the last action.
let refreshing = false, again = false;

async function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = true;
  again = false;
  try {
    const who = await api("/v1/whoami");
    $("who").textContent = "tenant " + who.tenant;
    if (!$("node").textContent) $("node").textContent = "node " + who.node;
    $("login").hidden = true;
    await refreshStats();
    const parts = [refreshJobs(), refreshJob(), refreshWorkers(), refreshPools(refresh), refreshDLQ(refresh),
      refreshSeries(), refreshSagas(), refreshSchedules(refresh), refreshDelayed(refresh),
      refreshKeys(), refreshBuckets()];
    const failed = (await Promise.allSettled(parts)).filter(r => r.status === "rejected");
    if (failed.length) status(failed[0].reason.message, true);
    else status("updated " + new Date().toLocaleTimeString([], { hour12: false }));
    document.body.dataset.loaded = "true";
    if (scrollTo && !$(scrollTo).hidden) $(scrollTo).scrollIntoView();
    scrollTo = "";
  } catch (e) {
    status(e.message, true);
  } finally {
    refreshing = false;
    if (again) refresh();
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
  $("find-saga").addEventListener("click", () => {
    const id = $("find-id").value.trim();
    if (id) setHash({ saga: id });
  });
  for (const a of document.querySelectorAll("nav a[data-go]")) {
    a.addEventListener("click", () => $(a.dataset.go).scrollIntoView({ behavior: "smooth" }));
  }
  $("login").addEventListener("submit", ev => {
    ev.preventDefault();
    ui.key = $("key").value.trim();
    sessionStorage.setItem("troupe.key", ui.key);
    $("key").value = "";
    ui.statsAllowed = true;
    for (const id of ["states-panel", "series-panel", "sagas-panel"]) $(id).hidden = false;
    refresh();
  });
  document.addEventListener("keydown", ev => {
    // Escape closes the open job and workflow (not while typing).
    if (ev.key === "Escape" && !/INPUT|SELECT|TEXTAREA/.test(document.activeElement.tagName)) setHash({ job: "", saga: "" });
  });
  initJobs(refresh);
  initJob(refresh);
  initSagas();
  refresh();
  setInterval(refresh, POLL_MS);
}

init();
