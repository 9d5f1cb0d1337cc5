// One job: its record, what it waits for, its payloads, every attempt,
// its timeline and mailbox trace, and the actions a job in its state takes.

import { $, el, clear, api, ui, status, emptyRow, badge, jobLink, cell, fmtTime, fmtWhen, fmtDuration,
  fmtBytes, setHash, TERMINAL, RETRYABLE } from "./api.js";

export async function refreshJob() {
  const panel = $("job-panel");
  if (!ui.job) { panel.hidden = true; return; }
  panel.hidden = false;
  let j;
  try {
    j = await api("/v1/jobs/" + encodeURIComponent(ui.job));
  } catch (e) {
    $("job-id").textContent = ui.job;
    $("job-state").textContent = e.status === 404 ? "not found" : e.message;
    $("job-state").className = "badge";
    panel.dataset.state = "";
    for (const id of ["job-meta", "timeline", "job-input", "job-result"]) clear($(id));
    clear($("trace").tBodies[0]); clear($("attempts").tBodies[0]);
    $("job-wait").hidden = true;
    return;
  }
  panel.dataset.jobId = j.id;
  panel.dataset.state = j.state;
  $("job-id").textContent = j.id;
  const b = $("job-state");
  b.textContent = j.state;
  b.className = "badge st-" + j.state;
  renderMeta(j);
  renderWait(j);
  renderActions(j);
  renderAttempts(j);
  renderTimeline(j);
  await Promise.all([refreshData(j), refreshTrace(j)]);
}

function renderMeta(j) {
  const meta = $("job-meta");
  clear(meta);
  const add = (k, v) => {
    if (v === undefined || v === "" || v === null) return;
    const d = el("div");
    d.append(el("b", k), typeof v === "object" ? v : document.createTextNode(String(v)));
    meta.append(d);
  };
  add("topic", j.topic); add("tenant", j.tenant); add("reason", j.reason); add("worker", j.worker);
  add("subject", j.subject); add("attempts", j.attempts); add("trace id", j.trace_id); add("owner", j.owner);
  add("created", fmtWhen(j.created)); add("updated", fmtWhen(j.updated));
  if (j.error_code || j.error_message) add("error", (j.error_code || "") + ": " + (j.error_message || ""));
  if (j.retry_of) add("retry of", jobLink(j.retry_of));
  const retried = [].concat(j.retried_as || [], j.retries || []).filter((x, i, a) => x && a.indexOf(x) === i);
  if (retried.length) {
    const span = el("span");
    retried.forEach((id, i) => { if (i) span.append(", "); span.append(jobLink(id)); });
    add("retried as", span);
  }
  if (j.dlq_entry) add("DLQ entry", j.dlq_entry);
  const labels = requestLabels(j);
  if (labels) add("labels", labels);
  const wf = requestField(j, "workflow_id");
  if (wf) {
    const a = el("a", wf);
    a.addEventListener("click", () => setHash({ saga: wf }));
    add("workflow", a);
  }
  for (const d of j.decisions || []) {
    add(d.kind, [d.decision, d.by && "by " + d.by, d.reason, d.rule_id && "rule " + d.rule_id].filter(Boolean).join(" · "));
  }
}

function requestField(j, k) { return j.request && typeof j.request === "object" ? j.request[k] : undefined; }

function requestLabels(j) {
  const l = requestField(j, "labels") || {};
  return Object.entries(l).filter(([k]) => !k.startsWith("approval_")).map(([k, v]) => k + "=" + v).join(" ");
}

// renderWait says what a job that has not run yet waits for: a job in a
// capacity grace has no record (and so no trace) yet, only its wait.
function renderWait(j) {
  const box = $("job-wait");
  clear(box);
  const waiting = ["PENDING", "SCHEDULED", "APPROVAL_REQUIRED"].includes(j.state);
  box.hidden = !waiting;
  if (!waiting) return;
  const why = {
    pool_paused: "its pool is paused: it is dispatched, in order, when the pool is resumed",
    pool_overloaded: "every worker of its pool is at its limit",
    delayed: "its time (troupe.run_at / troupe.run_after)",
    no_workers: "no live worker is in its pool",
  }[j.reason] || (j.state === "APPROVAL_REQUIRED" ? "a person's approval" : j.reason || "its turn");
  box.append(el("b", "Waiting: "), document.createTextNode(why));
  const since = (j.history && j.history.length) ? j.history[j.history.length - 1].at : j.created;
  const bits = [];
  if (j.queue_position !== undefined && j.queue_position !== null) bits.push(j.queue_position + " jobs before it");
  if (since) bits.push("since " + fmtWhen(since));
  if (j.run_at) bits.push("delayed: submitted at " + fmtWhen(j.run_at) + ", no record until then; a cancel removes it");
  else if (j.unwritten) bits.push("held in the memory of node " + (j.node || "?") + ", no record written yet");
  if (bits.length) box.append(el("span", " · " + bits.join(" · "), "muted"));
  box.dataset.reason = j.reason || "";
}

function renderActions(j) {
  for (const b of $("job-actions").querySelectorAll("button")) {
    const a = b.dataset.action;
    if (a === "cancel") b.hidden = TERMINAL.includes(j.state);
    else if (a === "retry") b.hidden = !RETRYABLE.includes(j.state) || j.unwritten;
    else b.hidden = j.state !== "APPROVAL_REQUIRED";
  }
}

function renderAttempts(j) {
  const body = $("attempts").tBodies[0];
  clear(body);
  const atts = j.attempt_list || [];
  for (const a of atts) {
    const tr = el("tr");
    tr.dataset.attempt = a.n;
    tr.dataset.state = a.state || "";
    const took = a.dispatched_at && a.ended_at ? new Date(a.ended_at) - new Date(a.dispatched_at) : NaN;
    tr.append(el("td", a.n), el("td", a.worker || ""), el("td", fmtTime(a.dispatched_at)), el("td", fmtTime(a.ended_at)),
      el("td", fmtDuration(took)), cell(a.state ? badge(a.state) : "", a.reason ? " " + a.reason : ""),
      el("td", a.error || "", a.error ? "error wrap" : ""));
    body.append(tr);
  }
  if (!atts.length) body.append(emptyRow(7, j.unwritten || !j.attempts ? "not dispatched yet" : "no attempt recorded"));
}

function renderTimeline(j) {
  const tl = $("timeline");
  clear(tl);
  const hist = j.history || [];
  const t0 = hist.length ? new Date(hist[0].at).getTime() : 0;
  for (const h of hist) {
    const li = el("li", null, "st-" + h.to);
    li.dataset.state = h.to;
    const off = new Date(h.at).getTime() - t0;
    li.append(el("span", "+" + off + " ms", "offset"), el("span", (h.from || "·") + " → "),
      el("span", h.to, "st-" + h.to), el("span", "  " + h.reason + " · " + h.node + " · " + fmtTime(h.at), "muted"));
    tl.append(li);
  }
  if (!hist.length) tl.append(el("li", j.unwritten ? "no transition yet: the job waits before its record is written" : "no history", "muted"));
}

// --- payloads: GET /v1/jobs/{id}/data -------------------------------------

async function refreshData(j) {
  const inBox = $("job-input"), outBox = $("job-result");
  let d;
  try {
    d = await api("/v1/jobs/" + encodeURIComponent(j.id) + "/data");
  } catch (e) {
    const why = e.status === 404 || e.status === 405 ? "this node does not serve job data" : e.message;
    renderDatum(inBox, null, why);
    renderDatum(outBox, null, why);
    return;
  }
  renderDatum(inBox, d.input, "no input pointer");
  renderDatum(outBox, d.result, TERMINAL.includes(j.state) ? "no result" : "none yet");
}

function renderDatum(box, d, none) {
  clear(box);
  box.dataset.present = d ? "true" : "false";
  if (!d) { box.append(el("div", none, "muted")); return; }
  const facts = [d.content_type, fmtBytes(d.size)];
  if (d.truncated) facts.push("truncated");
  if (d.redacted) facts.push("redacted by the output policy");
  if (d.encoding) facts.push(d.encoding);
  const head = el("div", null, "datum-head");
  head.append(el("code", d.pointer || ""), el("span", " " + facts.filter(Boolean).join(" · "), "muted"));
  box.append(head);
  if (d.note) box.append(el("div", d.note, "muted"));
  if (d.held === false) {
    if (!d.note) box.append(el("div", "not held by Troupe: shown as a pointer, not read", "muted"));
    return;
  }
  let text = d.body;
  if (text !== null && text !== undefined && typeof text !== "string") text = JSON.stringify(text, null, 2);
  const pre = el("pre", text === undefined || text === null ? "" : text, "body");
  box.append(pre);
}

// --- mailbox trace ----------------------------------------------------------

async function refreshTrace(j) {
  const body = $("trace").tBodies[0];
  const note = $("trace-note");
  if (j.unwritten) {
    // Nothing is traced before the record exists; the wait is shown above.
    clear(body);
    note.textContent = "(none yet: the job has not reached a job actor)";
    return;
  }
  let t;
  try {
    t = await api("/v1/jobs/" + encodeURIComponent(j.id) + "/trace");
  } catch (e) {
    clear(body);
    note.textContent = e.status === 404 ? "(no trace for this job)" : "(" + e.message + ")";
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

// --- actions ------------------------------------------------------------------

async function jobAction(action, refresh) {
  if (!ui.job) return;
  const id = ui.job;
  try {
    const r = await api("/v1/jobs/" + encodeURIComponent(id) + "/" + action, { method: "POST", body: {} });
    if (action === "retry" && r && r.job_id) {
      status("retried " + id + " as " + r.job_id);
      setHash({ job: r.job_id });
      return;
    }
    status(action + " sent for " + id);
  } catch (e) {
    status(action + ": " + e.message, true);
  }
  refresh();
}

export function initJob(refresh) {
  for (const b of $("job-actions").querySelectorAll("button")) {
    b.addEventListener("click", () => jobAction(b.dataset.action, refresh));
  }
  $("job-close").addEventListener("click", ev => { ev.preventDefault(); setHash({ job: "" }); });
}
