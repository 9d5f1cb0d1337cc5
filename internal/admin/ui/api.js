// Shared by the dashboard's modules: the page's state, the API call, and
// DOM helpers. Every value from the API goes through textContent, never
// innerHTML.

export const STATES = ["PENDING", "APPROVAL_REQUIRED", "SCHEDULED", "DISPATCHED", "RUNNING",
  "SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "DENIED", "OUTPUT_QUARANTINED"];
export const TERMINAL = ["SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "DENIED", "OUTPUT_QUARANTINED"];
// Terminal states a job may be retried from (a new job with the same
// request); a live job is cancelled, never retried.
export const RETRYABLE = ["FAILED", "TIMEOUT", "CANCELLED"];

// The job list's filter, as the URL fragment and GET /v1/jobs name it.
export const FILTER_KEYS = ["state", "topic", "tenant", "worker", "label", "since", "until", "q"];

export const ui = {
  key: sessionStorage.getItem("troupe.key") || "",
  filter: {},          // FILTER_KEYS → value ("label": array of "k=v")
  job: "",             // selected job id
  saga: "",            // selected workflow id
  cursor: "",          // next page of the job list
  statsAllowed: true,  // an all-tenant key: stats, series, sagas
};

export function $(id) { return document.getElementById(id); }

export function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

export function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function validDate(s) {
  if (!s) return null;
  const d = new Date(s);
  return isNaN(d) || d.getFullYear() < 2000 ? null : d;
}

export function fmtTime(s) {
  const d = validDate(s);
  if (!d) return "";
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// fmtWhen is a date and time to the second, for times that may be days old.
export function fmtWhen(s) {
  const d = validDate(s);
  if (!d) return "";
  const p = n => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function ago(s) {
  const d = (Date.now() - new Date(s).getTime()) / 1000;
  if (!isFinite(d)) return "";
  if (d < 60) return Math.max(0, Math.round(d)) + "s ago";
  if (d < 3600) return Math.round(d / 60) + "m ago";
  return Math.round(d / 3600) + "h ago";
}

export function fmtDuration(ms) {
  if (!isFinite(ms) || ms < 0) return "";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

export function fmtBytes(n) {
  if (!isFinite(n)) return "";
  if (n < 1024) return n + " B";
  if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
  return (n / (1 << 20)).toFixed(1) + " MiB";
}

export class HTTPError extends Error {
  constructor(status, body) { super((body && body.error) || ("HTTP " + status)); this.status = status; }
}

export async function api(path, opts = {}) {
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
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = { error: text.trim() }; }
  if (!res.ok) throw new HTTPError(res.status, body);
  return body;
}

// optional calls an endpoint a node of an earlier version may not serve:
// a 404 or 405 gives null, and the panel says the node lacks it.
export async function optional(path) {
  try {
    return await api(path);
  } catch (e) {
    if (e.status === 404 || e.status === 405) return null;
    throw e;
  }
}

export function status(msg, isError) {
  const s = $("status");
  s.textContent = msg;
  s.className = isError ? "error" : "muted";
}

export function emptyRow(cols, text) {
  const tr = el("tr");
  const td = el("td", text, "muted");
  td.colSpan = cols;
  tr.append(td);
  return tr;
}

export function badge(state) { return el("span", state, "badge st-" + state); }

export function jobLink(id) {
  const a = el("a", id);
  a.href = "#" + hashWith({ job: id }).toString();
  return a;
}

export function cell(...children) {
  const td = el("td");
  td.append(...children);
  return td;
}

// --- the URL fragment: the filter, the open job and workflow ------------

export function hashWith(changes) {
  const h = new URLSearchParams(location.hash.slice(1));
  for (const [k, v] of Object.entries(changes)) {
    h.delete(k);
    if (Array.isArray(v)) v.filter(Boolean).forEach(x => h.append(k, x));
    else if (v) h.set(k, v);
  }
  return h;
}

export function setHash(changes) { location.hash = hashWith(changes).toString(); }

// filterQuery turns ui.filter into GET /v1/jobs parameters (since/until as
// RFC 3339).
export function filterQuery(f = ui.filter) {
  const q = new URLSearchParams();
  for (const k of FILTER_KEYS) {
    const v = f[k];
    if (!v || (Array.isArray(v) && !v.length)) continue;
    if (k === "label") v.forEach(x => q.append("label", x));
    else if (k === "since" || k === "until") q.set(k, rfc3339(v));
    else q.set(k, v);
  }
  return q;
}

// filterBody is the filter as POST /v1/jobs/bulk takes it.
export function filterBody(f = ui.filter) {
  const out = {};
  for (const [k, v] of filterQuery(f)) {
    if (k === "label") (out.label = out.label || []).push(v);
    else out[k] = v;
  }
  return out;
}

// rfc3339 reads a datetime-local value ("2026-11-26T12:40") as local time.
export function rfc3339(v) {
  const d = new Date(v);
  return isNaN(d) ? v : d.toISOString();
}

export function filterEmpty(f = ui.filter) { return [...filterQuery(f)].length === 0; }

// actionButton is a button that runs fn once per click (disabled while it
// runs), reports the outcome on the status line and then calls refresh.
export function actionButton(label, fn, refresh, cls) {
  const b = el("button", label, cls);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await fn(); status(label + " done"); } catch (e) { status(label + ": " + e.message, true); }
    refresh();
  });
  return b;
}
