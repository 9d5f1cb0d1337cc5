// Flow control: each concurrency key (its limit and strategy from the pools
// file, holders, lingering slots, waiters; GET /v1/concurrency-keys) and
// each rate-limit bucket (its level in Redis, limit per period, every
// node's waiting units, this node's queue; GET /v1/limits). Both need an
// all-tenant key: a tenant key sees a note instead.

import { $, el, clear, api, emptyRow, cell, jobLink } from "./api.js";

// read calls path; null where the node lacks it (404, 405), "denied" for a
// tenant key (403).
async function read(path) {
  try {
    return await api(path);
  } catch (e) {
    if (e.status === 404 || e.status === 405) return null;
    if (e.status === 403) return "denied";
    throw e;
  }
}

export async function refreshKeys() {
  const body = $("keys").tBodies[0];
  const l = await read("/v1/concurrency-keys");
  clear(body);
  if (l === "denied") { body.append(emptyRow(6, "an all-tenant key is needed to list concurrency keys")); return; }
  if (!l) { body.append(emptyRow(6, "no concurrency_keys declared in the pools file")); return; }
  for (const k of l.keys || []) {
    const tr = el("tr");
    tr.dataset.key = k.key;
    const full = k.limit > 0 && k.holders + k.lingering >= k.limit;
    tr.dataset.full = String(full);
    tr.append(el("td", k.key), el("td", k.limit > 0 ? String(k.limit) : "none", "limit"),
      el("td", k.strategy || "", "strategy"), el("td", String(k.holders), "holders"),
      el("td", String(k.lingering), "lingering"), el("td", String(k.waiters), "waiters"));
    body.append(tr);
  }
  if (!(l.keys || []).length) body.append(emptyRow(6, "no key in use"));
}

function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

// per says a period in words ("1s", "1m", "250ms").
function per(ms) {
  if (!(ms > 0)) return "?";
  for (const [n, u] of [[3600000, "h"], [60000, "m"], [1000, "s"]]) if (ms % n === 0) return ms / n + u;
  return ms + "ms";
}

export async function refreshBuckets() {
  const body = $("buckets").tBodies[0];
  const l = await read("/v1/limits?limit=5");
  clear(body);
  if (l === "denied") { body.append(emptyRow(5, "an all-tenant key is needed to list rate limits")); return; }
  if (!l) { body.append(emptyRow(5, "this node serves no rate limits")); return; }
  for (const b of l.buckets || []) {
    const tr = el("tr");
    tr.dataset.bucket = b.name;
    const level = el("td", Math.floor(b.tokens) + " / " + b.burst, "level");
    const nodes = el("td", null, "waiting");
    const waiting = b.waiting_by_node || [];
    nodes.textContent = waiting.length ?
      waiting.map(w => w.node + ": " + plural(w.units, "unit") + " (" + plural(w.jobs, "job") + ")").join(", ") : "none";
    const queue = cell(el("span", String(b.queued || 0), "queued"));
    const first = (b.waiters || [])[0];
    if (first) queue.append(el("span", " first ", "muted"), jobLink(first.job_id));
    tr.append(el("td", b.name), level, el("td", b.limit + " per " + per(b.per_ms), "rate"), nodes, queue);
    body.append(tr);
  }
  if (!(l.buckets || []).length) body.append(emptyRow(5, "no rate_limits declared in the pools file"));
}
