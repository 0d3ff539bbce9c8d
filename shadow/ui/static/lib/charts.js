// Charts: uPlot wrappers with the UI's palette, axis labels with units and legends.
import uPlot from "/static/vendor/uPlot.esm.js";
import * as fmt from "./format.js";
import { h } from "./dom.js";

export { uPlot };

// One colour per policy, the same on every page.
export const POLICY_COLORS = {
  observed: "#8b95a5",
  jsq: "#3f4f66",
  "jsq-pool": "#64748b",
  rr: "#a16207",
  random: "#9333ea",
  p2c: "#0e7490",
  ltl: "#be185d",
  "vllm-dplb": "#65a30d",
  "vllm-dplb-legacy": "#84cc16",
  "ascend-proxy": "#b45309",
  "br0-bypass": "#60a5fa",
  br0: "#2563eb",
  "brh-survival": "#ea580c",
  "brh-exactmatch": "#059669",
  "brh-oracle": "#16a34a",
  "bf-io-h0": "#c026d3",
  "bf-io": "#a21caf",
  aa: "#b6bfcc",
};
const EXTRA = ["#7c3aed", "#db2777", "#0891b2", "#ca8a04", "#4d7c0f", "#9f1239"];

const NAMES = {
  observed: "Observed",
  jsq: "JSQ",
  "jsq-pool": "JSQ (pool)",
  rr: "Round-Robin",
  random: "Random",
  p2c: "Power-of-2",
  ltl: "LTL",
  "vllm-dplb": "vLLM DPLB",
  "vllm-dplb-legacy": "vLLM DPLB (4w + r)",
  "ascend-proxy": "Ascend proxy",
  "br0-bypass": "BR-0 bypass",
  br0: "BR-0",
  "brh-survival": "BR-H survival",
  "brh-exactmatch": "BR-H exact-match",
  "brh-oracle": "BR-H oracle",
  "bf-io-h0": "BF-IO H=0",
  "bf-io": "BF-IO",
  aa: "A/A noise",
};

function hash(s) {
  let x = 0;
  for (const c of String(s)) x = (x * 31 + c.charCodeAt(0)) >>> 0;
  return x;
}

export function policyColor(policy) {
  return POLICY_COLORS[policy] || EXTRA[hash(policy) % EXTRA.length];
}

/** Display name: "BR-0", "JSQ replay" (the incumbent replayed), "Observed (JSQ)". */
export function policyLabel(policy, incumbent) {
  const base = NAMES[policy] || String(policy);
  if (policy === "observed" && incumbent) return `Observed (${NAMES[incumbent] || incumbent})`;
  if (incumbent && policy === incumbent) return `${base} replay`;
  return base;
}

const WORKER_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

/** A colour per worker index, the same worker the same colour in every chart. */
export function workerColor(i, n) {
  if (n <= WORKER_PALETTE.length) return WORKER_PALETTE[i % WORKER_PALETTE.length];
  const hue = Math.round((i * 360) / n + 200) % 360;
  const light = i % 2 ? 42 : 55;
  return `hsl(${hue} 65% ${light}%)`;
}

const AXIS = { stroke: "#5b6474", grid: { stroke: "#edf0f4", width: 1 }, ticks: { stroke: "#dfe3ea", width: 1, size: 4 }, font: "11px system-ui, sans-serif", labelFont: "600 11px system-ui, sans-serif" };

function timeValues(u, splits, axisIdx, space, incr) {
  // Sub-second ticks (a burst of events) carry milliseconds so labels never repeat.
  return splits.map((v) => (incr < 1 ? `${fmt.time(v)}.${String(Math.round((v % 1) * 1000)).padStart(3, "0")}` : fmt.time(v)));
}
// Tick steps of the time axis, in seconds.
const TIME_INCRS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
// Tick steps of an axis that counts things.
const COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 1e5, 2e5, 5e5, 1e6];

/** Ranges that keep a shared y scale exact across small multiples. */
export function fixedRange(lo, hi) {
  return () => [lo, hi];
}

/**
 * A set of charts belonging to one page (destroyed together when the page unmounts).
 *
 * chart(el, {data: [x, ...ys], series: [{label, color, width, dash, value, points, fill,
 * bars}], xLabel, yLabel, time, yRange: [lo, hi] | fn, height, yFmt, legend, sync,
 * markers: [x...], highlight: [x0, x1], drag: "zoom" | "select" | false, onSelect, onClick})
 */
export class Charts {
  constructor() {
    this.items = [];
  }

  chart(el, opts) {
    const {
      data, series, xLabel, yLabel, time = true, height = 220, yFmt = (v) => fmt.num(v, 0),
      legend = true, sync = null, markers = [], highlight = null, drag = "zoom",
      onSelect = null, onClick = null, yRange = null, xRange = null, xFmt = null, ySoft0 = true,
      yCount = false,
    } = opts;
    el.classList.add("chart");
    el.replaceChildren();
    const width = Math.max(240, el.clientWidth || el.parentElement?.clientWidth || 600);
    const hooks = { draw: [], setSelect: [] };
    const uSeries = [
      { label: xLabel, value: (u, v) => (v == null ? fmt.DASH : time ? fmt.dateTime(v) : (xFmt || ((x) => fmt.num(x, 1)))(v)) },
      ...series.map((s) => ({
        label: s.label,
        stroke: s.color,
        width: s.width ?? 1.5,
        dash: s.dash,
        fill: s.fill,
        show: s.show ?? true,
        spanGaps: s.spanGaps ?? false,
        paths: s.bars ? uPlot.paths.bars({ size: [0.85, 40], align: 0 }) : s.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
        points: s.points ?? { show: false },
        value: s.value || ((u, v) => (v == null ? fmt.DASH : yFmt(v))),
        scale: s.scale || "y",
      })),
    ];
    if (markers.length || highlight) {
      hooks.draw.push((u) => {
        const { ctx, bbox } = u;
        ctx.save();
        if (highlight) {
          const x0 = u.valToPos(highlight[0], "x", true);
          const x1 = u.valToPos(highlight[1], "x", true);
          ctx.fillStyle = "rgba(37, 99, 235, 0.09)";
          ctx.fillRect(Math.max(bbox.left, x0), bbox.top, Math.min(bbox.left + bbox.width, x1) - Math.max(bbox.left, x0), bbox.height);
          ctx.strokeStyle = "rgba(37, 99, 235, 0.55)";
          ctx.lineWidth = 1;
          ctx.strokeRect(Math.max(bbox.left, x0), bbox.top, Math.min(bbox.left + bbox.width, x1) - Math.max(bbox.left, x0), bbox.height);
        }
        ctx.strokeStyle = "rgba(91, 100, 116, 0.45)";
        ctx.setLineDash([3, 3]);
        ctx.lineWidth = 1;
        for (const m of markers) {
          const x = Math.round(u.valToPos(m, "x", true)) + 0.5;
          if (x < bbox.left || x > bbox.left + bbox.width) continue;
          ctx.beginPath();
          ctx.moveTo(x, bbox.top);
          ctx.lineTo(x, bbox.top + bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      });
    }
    if (onSelect) {
      hooks.setSelect.push((u) => {
        if (u.select.width > 3) {
          const a = u.posToVal(u.select.left, "x");
          const b = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
          onSelect(a, b);
        }
      });
    }
    const scales = { x: { time } };
    if (xRange) scales.x.range = typeof xRange === "function" ? xRange : () => xRange;
    scales.y = {};
    if (yRange) scales.y.range = typeof yRange === "function" ? yRange : () => yRange;
    else if (ySoft0) scales.y.range = (u, lo, hi) => softZero(lo, hi);
    const options = {
      width,
      height,
      series: uSeries,
      scales,
      legend: { show: legend, live: true },
      cursor: {
        sync: sync ? { key: sync, setSeries: false } : undefined,
        drag: drag === "select" ? { x: true, y: false, setScale: false } : drag === "zoom" ? { x: true, y: false, setScale: true } : { x: false, y: false },
        points: { size: 6 },
        focus: { prox: 16 },
      },
      focus: { alpha: 0.35 },
      axes: [
        { ...AXIS, label: xLabel, labelSize: 18, values: time ? timeValues : (u, s) => s.map((v) => (xFmt || ((x) => fmt.num(x, 0)))(v)), space: 70, ...(time ? { incrs: TIME_INCRS } : {}) },
        { ...AXIS, label: yLabel, labelSize: 18, size: 56, values: (u, s) => s.map((v) => yFmt(v)), ...(yCount ? { incrs: COUNT_INCRS } : {}) },
      ],
      hooks,
    };
    const u = new uPlot(options, data, el);
    if (onClick) {
      u.over.addEventListener("click", () => {
        if (u.select.width > 3) return;
        const idx = u.cursor.idx;
        if (idx !== null && idx !== undefined) onClick(idx, u.data[0][idx]);
      });
    }
    el.dataset.series = String(series.length);
    el.dataset.points = String(data[1] ? data[1].length : 0);
    const ro = new ResizeObserver(() => {
      const w = Math.max(240, Math.floor(el.clientWidth));
      if (Math.abs(w - u.width) > 2) u.setSize({ width: w, height });
    });
    ro.observe(el);
    this.items.push({ u, ro });
    return u;
  }

  destroy() {
    for (const { u, ro } of this.items) {
      ro.disconnect();
      u.destroy();
    }
    this.items = [];
  }
}

function softZero(lo, hi) {
  if (lo == null || hi == null) return [0, 1];
  const low = Math.min(0, lo);
  const high = hi <= low ? low + 1 : hi * 1.05;
  return [low, high];
}

/** A compact HTML legend (for small multiples that share one). */
export function legendRow(items, { onToggle = null } = {}) {
  return h(
    "div",
    { class: "legend-row", role: "list" },
    items.map((it, i) =>
      h(
        onToggle ? "button" : "span",
        {
          class: ["legend-item", it.off ? "off" : ""],
          role: "listitem",
          type: onToggle ? "button" : null,
          title: onToggle ? "Show/hide in every chart" : null,
          onclick: onToggle ? (e) => onToggle(i, e.currentTarget) : null,
        },
        h("span", { class: "swatch", style: { background: it.color } }),
        it.label,
      ),
    ),
  );
}

/** A chart container with its title and an optional note. */
export function chartBox(title, { note = null, cls = "" } = {}) {
  const el = h("div", { class: "chart-host" });
  const box = h("section", { class: ["card", "chart-card", cls] }, h("header", { class: "card-head" }, h("h3", null, title), note ? h("span", { class: "muted small" }, note) : null), el);
  return { box, el };
}
