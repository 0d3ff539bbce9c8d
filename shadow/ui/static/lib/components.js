// Small building blocks shared by the pages.
import { h, replace } from "./dom.js";
import * as fmt from "./format.js";
import { workerColor } from "./charts.js";

// ---- errors, loading, empty ----------------------------------------------------------

const banner = () => document.getElementById("banner");
const shown = new Map();

/** Show an API or script error in the banner (as text; repeated messages counted once). */
export function showError(error) {
  if (error && error.name === "AbortError") return;
  const el = banner();
  if (!el) return;
  const text = error instanceof Error ? error.message : String(error);
  if (shown.has(text)) {
    const item = shown.get(text);
    item.count += 1;
    item.counter.textContent = `×${item.count}`;
    return;
  }
  const counter = h("span", { class: "banner-count" });
  const line = h("div", { class: "banner-line" }, h("strong", null, "Error"), " ", h("span", { class: "banner-text" }, text), counter);
  shown.set(text, { count: 1, counter });
  if (!el.querySelector(".banner-close")) {
    el.append(h("button", { type: "button", class: "banner-close", "aria-label": "Dismiss", onclick: clearErrors }, "×"));
  }
  el.append(line);
  el.hidden = false;
}

export function clearErrors() {
  const el = banner();
  if (!el) return;
  el.replaceChildren();
  el.hidden = true;
  shown.clear();
}

export function loading(text = "Loading…") {
  return h("div", { class: "loading" }, h("span", { class: "spinner", "aria-hidden": "true" }), text);
}

export function emptyState(title, hint = null) {
  return h("div", { class: "empty" }, h("div", { class: "empty-title" }, title), hint ? h("div", { class: "empty-hint" }, hint) : null);
}

// ---- layout --------------------------------------------------------------------------

export function pageHeader(title, subtitle, ...actions) {
  return h("header", { class: "page-head" }, h("div", null, h("h1", null, title), subtitle ? h("p", { class: "subtitle" }, subtitle) : null), h("div", { class: "page-actions" }, actions));
}

/** "Refresh": reload the page's data for the same URL (nothing else changes). */
export function refreshButton(onClick) {
  return h("button", { type: "button", class: "btn", title: "Reload this view's data", onclick: onClick }, "↻ Refresh");
}

export function card(title, body, { cls = "", actions = null, note = null } = {}) {
  return h("section", { class: ["card", cls] }, title ? h("header", { class: "card-head" }, h("h3", null, title), note ? h("span", { class: "muted small" }, note) : null, actions ? h("div", { class: "card-actions" }, actions) : null) : null, body);
}

export function stat(label, value, { sub = null, tone = null, title = null } = {}) {
  return h("div", { class: ["stat", tone ? `tone-${tone}` : ""], title }, h("div", { class: "stat-label" }, label), h("div", { class: "stat-value" }, value), sub ? h("div", { class: "stat-sub" }, sub) : null);
}

// ---- badges --------------------------------------------------------------------------

const VERDICT_TONE = { PASS: "good", FAIL: "bad", MARGINAL: "warn", INCONCLUSIVE: "info", ERROR: "bad" };
const MODE_TONE = { shadow: "info", live: "good", fallback: "warn", latched: "bad" };

export function verdictBadge(verdict, { dry = false } = {}) {
  if (!verdict) return h("span", { class: "badge tone-none" }, "no gate run");
  return h("span", { class: ["badge", `tone-${VERDICT_TONE[verdict] || "none"}`], dataset: { verdict } }, verdict, dry ? h("span", { class: "badge-sub" }, " dry run") : null);
}

export function verdictTone(verdict) {
  return VERDICT_TONE[verdict] || "none";
}

export function modeBadge(mode) {
  const m = mode && typeof mode === "object" ? mode.mode : mode;
  if (!m) return h("span", { class: "badge tone-none" }, "unknown");
  return h("span", { class: ["badge", `tone-${MODE_TONE[m] || "none"}`], dataset: { mode: m } }, m);
}

export function pill(text, tone = "none") {
  return h("span", { class: ["pill", `tone-${tone}`] }, text);
}

// ---- ratios --------------------------------------------------------------------------

/** good / bad / even for a ratio against the incumbent; `better` is "lower" or "higher". */
export function ratioTone(r, better) {
  if (!r || r.point === null || r.point === undefined) return "none";
  const lo = r.ci_low;
  const hi = r.ci_high;
  const good = (v) => (better === "lower" ? v < 1 : v > 1);
  if (fmt.isNum(lo) && fmt.isNum(hi)) {
    if (good(lo) && good(hi)) return "good";
    if (!good(lo) && !good(hi) && lo !== 1 && hi !== 1) return "bad";
    return "even";
  }
  if (fmt.ratio(r.point) === "1.000") return "even";
  return good(r.point) ? "good-weak" : "bad-weak";
}

/** "0.612 [0.55, 0.68]" in a tone-coloured cell. */
export function ratioCell(r, better) {
  if (!r || r.point === null || r.point === undefined) return h("span", { class: "muted" }, "–");
  return h("span", { class: ["ratio", `tone-${ratioTone(r, better)}`], title: `n = ${r.n ?? "?"} windows; 95% CI ${fmt.ci(r.ci_low, r.ci_high)}` }, h("span", { class: "ratio-point" }, fmt.ratio(r.point)), " ", h("span", { class: "ratio-ci" }, fmt.ci(r.ci_low, r.ci_high)));
}

// ---- per-worker KV-load bars ---------------------------------------------------------

/**
 * Horizontal bars, one per worker (each `.bar` carries data-worker), scaled to `max`.
 * workers: [{worker, value, label?, sub?, marks?: [{text, color, title}], tone?}]
 */
export function workerBars(workers, { max = null, unit = "tokens", testid = null } = {}) {
  const top = Math.max(1, max ?? Math.max(0, ...workers.map((w) => w.value || 0)));
  return h(
    "div",
    { class: "wbars", role: "list", dataset: testid ? { bars: testid } : null },
    workers.map((w, i) =>
      h(
        "div",
        { class: ["wbar", w.tone ? `tone-${w.tone}` : ""], role: "listitem", dataset: { worker: w.worker }, title: `${w.worker}: ${fmt.int(w.value)} ${unit}` },
        h("div", { class: "wbar-name" }, h("span", { class: "swatch", style: { background: workerColor(i, workers.length) } }), w.worker),
        h("div", { class: "wbar-track" }, h("div", { class: "wbar-fill", style: { width: `${Math.max(0, Math.min(100, ((w.value || 0) / top) * 100)).toFixed(2)}%` } }), (w.marks || []).length ? h("div", { class: "wbar-marks" }, w.marks.map((m) => h("span", { class: "mark", style: { "--mark": m.color }, title: m.title || null }, m.text))) : null),
        h("div", { class: "wbar-value" }, w.label ?? fmt.int(w.value)),
        w.sub !== undefined ? h("div", { class: "wbar-sub" }, w.sub) : null,
      ),
    ),
  );
}

// ---- pagination ----------------------------------------------------------------------

export function pager({ total, limit, offset, onPage }) {
  const page = Math.floor(offset / limit) + 1;
  const pages = Math.max(1, Math.ceil(total / limit));
  const from = total ? offset + 1 : 0;
  const to = Math.min(total, offset + limit);
  return h(
    "div",
    { class: "pager" },
    h("span", { class: "muted" }, `${fmt.int(from)}–${fmt.int(to)} of ${fmt.int(total)}`),
    h("div", { class: "pager-btns" },
      h("button", { type: "button", class: "btn", disabled: page <= 1, onclick: () => onPage(0) }, "« First"),
      h("button", { type: "button", class: "btn", disabled: page <= 1, onclick: () => onPage(Math.max(0, offset - limit)), dataset: { pager: "prev" } }, "‹ Prev"),
      h("span", { class: "pager-page" }, `Page ${page} of ${pages}`),
      h("button", { type: "button", class: "btn", disabled: page >= pages, onclick: () => onPage(offset + limit), dataset: { pager: "next" } }, "Next ›"),
    ),
  );
}

/** The page `name` has drawn its data for the current URL (tests wait for both). */
export function setReady(name) {
  document.body.dataset.state = location.pathname + location.search;
  document.body.dataset.ready = name;
}

export function fill(el, ...children) {
  return replace(el, ...children);
}

/** Plain text of a JSON payload, for audit-log details. */
export function jsonText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}
