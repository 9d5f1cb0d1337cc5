// Charts: inline SVG drawn here, from GET /v1/stats (throughput) and GET
// /v1/series (queue depth, dispatch latency, failure rate). No library.

import { $, clear, ui, optional } from "./api.js";

const NS = "http://www.w3.org/2000/svg";
const PAD = 6;
export const SERIES_WINDOW = "15m";

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtValue(v, unit) {
  const n = v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(v === 0 ? 0 : 2);
  return n + (unit ? " " + unit : "");
}

// lineChart draws series of {t (ms), v (number or null)} into svg: one
// <path> each, a null breaking the line. max: the y axis's top at least.
export function lineChart(svg, series, { unit = "", max = 1, empty = "no data yet" } = {}) {
  clear(svg);
  // Drawn in the element's own pixels, so text is not stretched.
  const W = svg.clientWidth || 300, H = svg.clientHeight || 140;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const pts = series.flatMap(s => s.values.filter(p => p.v !== null && isFinite(p.v)));
  const top = Math.max(max, ...pts.map(p => p.v)) * 1.08;
  for (const f of [0.25, 0.5, 0.75]) {
    svg.append(svgEl("line", { x1: 0, x2: W, y1: H * f, y2: H * f, class: "grid" }));
  }
  if (!pts.length) {
    svg.append(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, empty));
    svg.dataset.points = "0";
    return;
  }
  const t0 = Math.min(...pts.map(p => p.t)), t1 = Math.max(...pts.map(p => p.t));
  const span = Math.max(1, t1 - t0);
  const x = t => (t1 === t0 ? W - 4 : 4 + ((t - t0) / span) * (W - 8));
  const y = v => H - PAD - (v / top) * (H - 2 * PAD);
  for (const s of series) {
    let d = "", run = 0;
    const dots = [];
    s.values.forEach((p, i) => {
      if (p.v === null || !isFinite(p.v)) { run = 0; return; }
      const xy = x(p.t).toFixed(1) + "," + y(p.v).toFixed(1);
      d += run ? "L" + xy : "M" + xy;
      run++;
      const next = s.values[i + 1];
      // A point alone (the first sample, or between gaps) gets a dot.
      if (run === 1 && (!next || next.v === null || !isFinite(next.v))) dots.push([x(p.t), y(p.v)]);
    });
    if (d) svg.append(svgEl("path", { d, class: s.cls, "data-series": s.name }));
    for (const [cx, cy] of dots) svg.append(svgEl("circle", { cx, cy, r: 3, class: s.cls + " dot" }));
  }
  svg.append(svgEl("text", { x: 4, y: 12 }, fmtValue(top / 1.08, unit)));
  const span_s = Math.round(span / 1000);
  if (span_s > 0) svg.append(svgEl("text", { x: W - 4, y: H - 4, "text-anchor": "end" },
    "last " + (span_s < 120 ? span_s + " s" : Math.round(span_s / 60) + " min")));
  svg.dataset.points = String(pts.length);
}

// drawThroughput charts the rates between the server's counter samples.
export function drawThroughput(history) {
  const samples = (history || []).map(h => ({ t: new Date(h.at).getTime(), received: h.received, completed: h.completed }));
  const completed = [], received = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i];
    const dt = (b.t - a.t) / 1000;
    if (dt <= 0) continue;
    completed.push({ t: b.t, v: Math.max(0, (b.completed - a.completed) / dt) });
    received.push({ t: b.t, v: Math.max(0, (b.received - a.received) / dt) });
  }
  lineChart($("chart"), [{ name: "received", cls: "received", values: received },
    { name: "completed", cls: "completed", values: completed }], { unit: "/s" });
  const last = completed.length - 1;
  $("rates").textContent = last >= 0 ?
    `· now ${completed[last].v.toFixed(1)} / ${received[last].v.toFixed(1)}` : "";
}

// refreshSeries draws the three charts of GET /v1/series.
export async function refreshSeries() {
  const panel = $("series-panel");
  if (!ui.statsAllowed) { panel.hidden = true; return; }
  const s = await optional("/v1/series?window=" + SERIES_WINDOW);
  panel.hidden = false;
  $("series-note").textContent = s ? `(last ${SERIES_WINDOW}, ${s.step_s} s steps)` : "(this node serves no /v1/series)";
  const points = (s && s.points) || [];
  const at = p => p.t * 1000;
  const num = v => (v === undefined || v === null ? null : Number(v));
  lineChart($("chart-depth"), [
    { name: "waiting", cls: "waiting", values: points.map(p => ({ t: at(p), v: num(p.waiting) })) },
    { name: "running", cls: "running", values: points.map(p => ({ t: at(p), v: num(p.running) })) },
  ], { unit: "jobs" });
  // A step with no dispatch has no latency: a gap, not a zero.
  const lat = k => points.map(p => ({ t: at(p), v: num(p[k]) > 0 ? num(p[k]) : null }));
  lineChart($("chart-latency"), [
    { name: "p95", cls: "p95", values: lat("dispatch_p95_ms") },
    { name: "p50", cls: "p50", values: lat("dispatch_p50_ms") },
  ], { unit: "ms", empty: "no dispatches in the window" });
  const rate = points.map(p => {
    const done = (p.succeeded || 0) + (p.failed || 0);
    return { t: at(p), v: done ? (100 * (p.failed || 0)) / done : null };
  });
  lineChart($("chart-failures"), [{ name: "failed", cls: "failed", values: rate }],
    { unit: "%", max: 10, empty: "no jobs ended in the window" });
  const last = points[points.length - 1];
  $("series-now").textContent = last ?
    `now: ${last.waiting || 0} waiting, ${last.running || 0} running` +
    (last.dispatch_p95_ms ? `, dispatch p95 ${Math.round(last.dispatch_p95_ms)} ms` : "") : "";
}
