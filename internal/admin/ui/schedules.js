// Schedules (cron and interval) with pause, resume and delete, and the
// delayed jobs not yet submitted, soonest first, with their run-at and a
// cancel (GET /v1/schedules, GET /v1/schedules/delayed).

import { $, el, clear, api, optional, ui, status, emptyRow, cell, jobLink, fmtWhen, badge, actionButton } from "./api.js";

// until says how long until t ("in 5m", "due").
function until(t) {
  const s = (new Date(t).getTime() - Date.now()) / 1000;
  if (!isFinite(s)) return "";
  if (s <= 0) return "due";
  if (s < 60) return "in " + Math.ceil(s) + "s";
  if (s < 3600) return "in " + Math.round(s / 60) + "m";
  if (s < 172800) return "in " + Math.round(s / 3600) + "h";
  return "in " + Math.round(s / 86400) + "d";
}

export async function refreshSchedules(refresh) {
  const body = $("schedules").tBodies[0];
  const l = await optional("/v1/schedules");
  clear(body);
  if (!l) { body.append(emptyRow(8, "this node serves no schedules")); return; }
  for (const s of l.schedules || []) {
    const tr = el("tr");
    tr.dataset.schedule = s.id;
    tr.dataset.paused = String(!!s.paused);
    const path = "/v1/schedules/" + encodeURIComponent(s.id);
    const when = s.cron ? s.cron + (s.timezone ? " (" + s.timezone + ")" : "") : "every " + s.every;
    const name = cell(el("span", s.id));
    if (s.paused) name.append(" ", el("span", "paused", "badge paused"));
    const next = s.next_tick ? fmtWhen(s.next_tick) + " · " + until(s.next_tick) : (s.paused ? "paused" : "none");
    const last = s.last ? cell(jobLink(s.last.job_id), el("span", " " + fmtWhen(s.last.fired_at), "muted")) : el("td", "never");
    const missed = s.missed === "catch_up" ? "catch up " + s.catch_up : "skip";
    const acts = el("td");
    acts.append(s.paused ?
      actionButton("Resume", () => api(path + "/resume", { method: "POST", body: {} }), refresh) :
      actionButton("Pause", () => api(path + "/pause", { method: "POST", body: {} }), refresh));
    acts.append(" ", actionButton("Delete", () => api(path, { method: "DELETE" }), refresh, "danger"));
    const nextCell = el("td", next);
    nextCell.className = "next";
    tr.append(name, el("td", when), el("td", s.topic), el("td", s.tenant || ""), nextCell, last, el("td", missed), acts);
    body.append(tr);
  }
  if (!(l.schedules || []).length) body.append(emptyRow(8, "no schedules"));
}

export async function refreshDelayed(refresh) {
  const body = $("delayed").tBodies[0];
  const l = await optional("/v1/schedules/delayed?limit=50");
  clear(body);
  if (!l) { body.append(emptyRow(6, "this node serves no delayed jobs")); return; }
  for (const d of l.delayed || []) {
    const tr = el("tr");
    tr.dataset.job = d.job_id;
    const acts = el("td");
    acts.append(actionButton("Cancel", () => api("/v1/jobs/" + encodeURIComponent(d.job_id) + "/cancel",
      { method: "POST", body: { reason: "cancelled from the dashboard before its time" } }), refresh, "danger"));
    const at = el("td", fmtWhen(d.due) + " · " + until(d.due));
    at.className = "run-at";
    tr.append(cell(jobLink(d.job_id), " ", badge("SCHEDULED")), at, el("td", d.topic), el("td", d.tenant || ""),
      el("td", fmtWhen(d.submitted)), acts);
    body.append(tr);
  }
  if (!(l.delayed || []).length) body.append(emptyRow(6, "no delayed jobs"));
}
