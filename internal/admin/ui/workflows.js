// Workflows: the sagas a node knows (GET /v1/sagas) and one workflow's
// steps, their compensations and its rollback (GET /v1/sagas/{id}).

import { $, el, clear, api, ui, optional, emptyRow, badge, cell, jobLink, fmtWhen, fmtTime, fmtDuration,
  setHash } from "./api.js";

const PAGE = 20;
// Each listed workflow costs the server a few Redis round trips, so the
// list is read every LIST_EVERY_MS rather than on every 3 s poll.
const LIST_EVERY_MS = 15000;
let listedAt = 0;

// pick reads a field under its JSON name or its Go field name (a report
// encoded without tags).
function pick(o, ...names) {
  if (!o) return undefined;
  for (const n of names) if (o[n] !== undefined && o[n] !== null) return o[n];
  return undefined;
}

export async function refreshSagas() {
  const panel = $("sagas-panel");
  if (!ui.statsAllowed) { panel.hidden = true; return; }
  panel.hidden = false;
  if (Date.now() - listedAt >= LIST_EVERY_MS) {
    await listSagas();
    listedAt = Date.now();
  }
  await refreshSaga();
}

async function listSagas() {
  const list = await optional("/v1/sagas?limit=" + PAGE);
  const body = $("sagas").tBodies[0];
  clear(body);
  $("sagas-note").textContent = !list ? "(this node does not list workflows; open one by id above)" :
    list.next ? `(the newest ${PAGE}; open others by id above)` : "";
  const sagas = (list && list.sagas) || [];
  for (const s of sagas) {
    const tr = el("tr");
    tr.dataset.saga = s.id;
    const a = el("a", s.id);
    a.addEventListener("click", () => setHash({ saga: s.id }));
    tr.append(cell(a), cell(s.state ? el("span", s.state, "badge st-" + s.state + " rb-" + s.state) : ""), el("td", s.steps), el("td", fmtWhen(s.updated_at)));
    body.append(tr);
  }
  if (!sagas.length) body.append(emptyRow(4, list ? "no workflows with compensations" : "—"));
}

async function refreshSaga() {
  const box = $("saga");
  if (!ui.saga) { box.hidden = true; return; }
  box.hidden = false;
  $("saga-id").textContent = ui.saga;
  let r;
  try {
    r = await api("/v1/sagas/" + encodeURIComponent(ui.saga));
  } catch (e) {
    const st = $("saga-status");
    st.textContent = e.status === 404 ? "not found" : e.message;
    st.className = "badge";
    clear($("saga-meta")); clear($("saga-steps"));
    box.dataset.status = "";
    return;
  }
  const prog = pick(r, "progress", "Progress") || {};
  const triggered = pick(r, "triggered", "Triggered");
  const rollback = pick(prog, "status", "Status") || (triggered ? "rollback due" : "no rollback");
  const st = $("saga-status");
  st.textContent = rollback;
  st.className = "badge rb-" + String(rollback).replace(/\W+/g, "_");
  box.dataset.status = rollback;
  const meta = $("saga-meta");
  clear(meta);
  const add = (k, v) => {
    if (v === undefined || v === "" || v === null) return;
    const d = el("div");
    d.append(el("b", k), String(v));
    meta.append(d);
  };
  const ns = pick(prog, "duration", "Duration");
  add("rollback by", pick(prog, "node", "Node")); add("runs", pick(prog, "runs", "Runs") || "");
  add("started", fmtWhen(pick(prog, "started_at", "StartedAt"))); add("finished", fmtWhen(pick(prog, "finished_at", "FinishedAt")));
  if (ns) add("took", fmtDuration(ns / 1e6));
  add("lock", pick(r, "lock_holder", "LockHolder"));
  renderSteps(pick(r, "steps", "Steps") || []);
}

// renderSteps lists the compensation stack newest first, the order a
// rollback runs in: each step, then what undoes it.
function renderSteps(steps) {
  const ol = $("saga-steps");
  clear(ol);
  for (const s of steps) {
    const li = el("li");
    const id = pick(s, "job_id", "JobID");
    li.dataset.step = id;
    const idx = pick(s, "index", "Index");
    const head = el("div", null, "step");
    head.append(el("span", "step " + (idx >= 0 ? idx : "?") + " ", "muted"), jobLink(id),
      el("span", " " + (pick(s, "topic", "Topic") || "") + " · done " + fmtTime(pick(s, "completed_at", "CompletedAt")), "muted"));
    const comp = el("div", null, "comp");
    const compID = pick(s, "comp_job_id", "CompJobID");
    const p = pick(s, "progress", "Progress") || {};
    const compState = pick(s, "comp_state", "CompState") || p.state;
    comp.append(el("span", "↳ compensation ", "muted"));
    if (compID) comp.append(jobLink(compID), " "); else comp.append(el("span", "none built ", "error"));
    if (compState) comp.append(badge(compState), " ");
    if (p.outcome) comp.append(el("span", p.outcome, "outcome"));
    if (p.detail) comp.append(el("span", " · " + p.detail, "muted"));
    const err = pick(s, "decode_err", "DecodeErr");
    if (err && typeof err === "string") comp.append(el("span", " · template: " + err, "error"));
    li.dataset.comp = compID || "";
    li.dataset.compState = compState || "";
    li.append(head, comp);
    ol.append(li);
  }
  if (!steps.length) ol.append(el("li", "no step recorded (steps with a compensation are recorded as they succeed)", "muted"));
}

export function initSagas() {
  $("saga-close").addEventListener("click", ev => { ev.preventDefault(); setHash({ saga: "" }); });
}
