// The job list: its filter (kept in the URL fragment), paging, and the
// bulk cancel and retry of every job the filter matches.

import { $, el, clear, api, ui, status, emptyRow, badge, jobLink, cell, fmtWhen, fmtTime,
  setHash, filterQuery, filterBody, filterEmpty, FILTER_KEYS, STATES } from "./api.js";

const PAGE = 50;
// FILL_CALLS bounds the calls one page of a narrow filter takes.
const FILL_CALLS = 4;

// paged: older pages were added with More; the poll leaves the list as it
// is until the filter changes or Search is pressed.
let paged = false;
// pendingBulk is the bulk action waiting for its confirmation.
let pendingBulk = "";
// BULK_LIMIT is the most jobs one bulk action touches (the API's bound).
const BULK_LIMIT = 1000;

// readFilter takes the filter from the fragment; a change restarts paging.
export function readFilter(h) {
  const f = {};
  for (const k of FILTER_KEYS) {
    if (k === "label") { const v = h.getAll("label"); if (v.length) f.label = v; } else if (h.get(k)) f[k] = h.get(k);
  }
  if (JSON.stringify(f) === JSON.stringify(ui.filter)) return;
  ui.filter = f;
  ui.cursor = "";
  paged = false;
  // A bulk action's result belongs to the filter it ran on.
  $("bulk-result").hidden = true;
  $("bulk-confirm").hidden = true;
  pendingBulk = "";
}

// The form shows the filter in force (not while someone types in it).
function showFilter() {
  const form = $("filter");
  if (form.contains(document.activeElement)) return;
  for (const k of FILTER_KEYS) {
    const v = ui.filter[k];
    form.elements[k].value = k === "label" ? (v || []).join(", ") : v || "";
  }
}

function formFilter() {
  const form = $("filter"), f = {};
  for (const k of FILTER_KEYS) {
    const v = form.elements[k].value.trim();
    if (!v) continue;
    f[k] = k === "label" ? v.split(",").map(s => s.trim()).filter(Boolean) : v;
  }
  return f;
}

function describe(f) {
  const parts = [];
  for (const k of FILTER_KEYS) {
    if (!f[k]) continue;
    parts.push(k === "label" ? f.label.map(l => "label " + l).join(", ") : k + " " + f[k]);
  }
  return parts.join(", ");
}

function labelText(labels) {
  return Object.entries(labels || {}).filter(([k]) => !k.startsWith("approval_"))
    .map(([k, v]) => k + "=" + v).join(" ");
}

function jobRow(j) {
  const tr = el("tr");
  tr.dataset.jobId = j.id;
  tr.dataset.state = j.state;
  const labels = labelText(j.labels);
  const lc = el("td", labels, "labels");
  lc.title = labels;
  tr.append(cell(jobLink(j.id)), cell(badge(j.state)), el("td", j.topic), el("td", j.tenant), el("td", j.worker || ""),
    el("td", j.attempts || ""), el("td", (j.reason || "") + (j.run_at ? " until " + fmtWhen(j.run_at) : "")), lc, el("td", fmtWhen(j.created)), el("td", fmtTime(j.updated)));
  return tr;
}

// fetchJobs reads a page of the filter's jobs from cursor. The API scans
// a bounded stretch of the index per call, so a narrow filter may give a
// short page with a cursor: a few more calls fill it.
async function fetchJobs(cursor) {
  const jobs = [];
  for (let calls = 0; calls < FILL_CALLS; calls++) {
    const q = filterQuery();
    q.set("limit", PAGE - jobs.length);
    if (cursor) q.set("cursor", cursor);
    const page = await api("/v1/jobs?" + q.toString());
    jobs.push(...page.jobs);
    cursor = page.next || "";
    if (!cursor || jobs.length >= PAGE) break;
  }
  return { jobs, next: cursor };
}

export async function refreshJobs() {
  showFilter();
  if (paged) return;
  const page = await fetchJobs("");
  const body = $("jobs").tBodies[0];
  clear(body);
  for (const j of page.jobs) body.append(jobRow(j));
  if (page.jobs.length === 0) {
    body.append(emptyRow(10, filterEmpty() ? "no jobs" : page.next ? "none among the newest jobs: More searches older ones" : "no job matches"));
  }
  ui.cursor = page.next;
  $("jobs-more").hidden = !ui.cursor;
  $("jobs-title").textContent = filterEmpty() ? "Recent jobs" : "Jobs: " + describe(ui.filter);
  // A job that waits has no worker: a worker filter cannot match it.
  $("jobs-note").hidden = !ui.filter.worker;
  $("jobs-panel").dataset.filter = filterQuery().toString();
  $("jobs-panel").dataset.rows = String(page.jobs.length);
}

async function moreJobs() {
  if (!ui.cursor) return;
  const page = await fetchJobs(ui.cursor);
  for (const j of page.jobs) $("jobs").tBodies[0].append(jobRow(j));
  ui.cursor = page.next;
  $("jobs-more").hidden = !ui.cursor;
  paged = true;
}

// --- bulk actions: asked, confirmed, then one request ---------------------

function askBulk(action) {
  if (filterEmpty()) {
    status("set a filter first: a bulk " + action + " applies to the jobs it matches", true);
    return;
  }
  pendingBulk = action;
  $("bulk-question").textContent = (action === "cancel" ? "Cancel" : "Retry") + " every job matching " +
    describe(ui.filter) + " (at most " + BULK_LIMIT + ")?";
  $("bulk-confirm").hidden = false;
  $("bulk-confirm").dataset.action = action;
  $("bulk-go").textContent = action === "cancel" ? "Cancel them" : "Retry them";
  $("bulk-reason").focus();
}

async function runBulk(refresh) {
  const action = pendingBulk;
  if (!action) return;
  pendingBulk = "";
  $("bulk-confirm").hidden = true;
  const out = $("bulk-result");
  const reason = $("bulk-reason").value.trim() || "bulk " + action + " from the dashboard";
  try {
    const r = await api("/v1/jobs/bulk", { method: "POST",
      body: { action, filter: filterBody(), limit: BULK_LIMIT, reason } });
    const failed = r.failed || [];
    out.textContent = `${action}: ${r.matched} matched, ${r.done} done` +
      (failed.length ? `, ${failed.length} failed (${failed.slice(0, 3).map(f => f.job_id + ": " + f.error).join("; ")})` : "") +
      (r.truncated ? ` — more than ${BULK_LIMIT} matched; run it again for the rest` : "");
    out.className = failed.length ? "error" : "muted";
    out.dataset.action = action;
    out.dataset.done = String(r.done);
    out.dataset.matched = String(r.matched);
  } catch (e) {
    out.textContent = "bulk " + action + ": " + e.message;
    out.className = "error";
  }
  out.hidden = false;
  paged = false;
  refresh();
}

export function initJobs(refresh) {
  const sel = $("filter").elements.state;
  for (const s of STATES) sel.append(new Option(s, s));
  $("filter").addEventListener("submit", ev => {
    ev.preventDefault();
    document.activeElement.blur();
    const before = location.hash;
    paged = false;
    setHash({ ...Object.fromEntries(FILTER_KEYS.map(k => [k, ""])), ...formFilter() });
    if (location.hash === before) refresh(); // the same filter: search again

  });
  $("filter-clear").addEventListener("click", () => {
    $("filter").reset();
    setHash(Object.fromEntries(FILTER_KEYS.map(k => [k, ""])));
  });
  $("jobs-more").addEventListener("click", () => moreJobs().catch(e => status(e.message, true)));
  $("bulk-cancel").addEventListener("click", () => askBulk("cancel"));
  $("bulk-retry").addEventListener("click", () => askBulk("retry"));
  $("bulk-back").addEventListener("click", () => { pendingBulk = ""; $("bulk-confirm").hidden = true; });
  $("bulk-go").addEventListener("click", () => runBulk(refresh));
}
