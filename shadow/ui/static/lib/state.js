// View state lives in the URL query string: every view is a shareable link, back works.
import { qs } from "./dom.js";

const listeners = new Set();

export function params() {
  return Object.fromEntries(new URLSearchParams(location.search));
}

export function onChange(fn) {
  listeners.add(fn);
}

function emit() {
  for (const fn of listeners) fn();
}

/** Go to `path` with exactly `next` as the query (push a history entry unless replace). */
export function navigate(path, next, { replace = false } = {}) {
  const url = path + qs(next);
  if (url === location.pathname + location.search) return;
  history[replace ? "replaceState" : "pushState"](null, "", url);
  emit();
}

/**
 * Merge `patch` into the current query (null/""/false delete a key) and render.
 * Changing a filter should reset pagination: pass {offset: null} in the same patch.
 */
export function setParams(patch, { replace = false } = {}) {
  const next = { ...params(), ...patch };
  for (const [k, v] of Object.entries(next)) if (v === null || v === undefined || v === "" || v === false) delete next[k];
  navigate(location.pathname, next, { replace });
}

export function numParam(p, key, fallback = null) {
  if (p[key] === undefined || p[key] === "") return fallback;
  const v = Number(p[key]);
  return Number.isFinite(v) ? v : fallback;
}

export function listParam(p, key) {
  return p[key] ? p[key].split(",").filter(Boolean) : [];
}

/**
 * True when two queries differ only in client-side state: table sorts (keys `s_*`) and
 * the keys in `also` (e.g. series hidden in a legend); nothing to fetch again.
 */
export function onlySortChanged(a, b, also = []) {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  let changed = false;
  for (const k of keys) {
    if (a[k] === b[k]) continue;
    if (!k.startsWith("s_") && !also.includes(k)) return false;
    changed = true;
  }
  return changed;
}

window.addEventListener("popstate", emit);
