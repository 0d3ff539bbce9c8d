// Sweeps: the grids stored by `shadow sweep`, and for one of them two heatmaps side by side
// (throughput and TPOT P95 by default) over two chosen parameters, the others held at a
// value or averaged. Every choice is in the URL.
import { h, replace, svgEl } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { policyColor, policyLabel } from "../lib/charts.js";
import { card, emptyState, loading, pageHeader, refreshButton, setReady, showError } from "../lib/components.js";
import { onlySortChanged, params, setParams } from "../lib/state.js";
import { table } from "../lib/table.js";

// The metrics a heatmap may show (stored per cell, see docs/UI.md): how to read each one.
// `scale` multiplies the stored value for display (idle_frac is a fraction, shown in %).
const METRICS = {
  throughput_tok_s: { label: "Throughput", unit: "tok/s", better: "higher", digits: 1 },
  tpot_p95_ms: { label: "TPOT P95", unit: "ms", better: "lower", digits: 1 },
  tpot_p50_ms: { label: "TPOT P50", unit: "ms", better: "lower", digits: 1 },
  tpot_p99_ms: { label: "TPOT P99", unit: "ms", better: "lower", digits: 1 },
  imbalance_mean: { label: "Imbalance (mean)", unit: "tokens", better: "lower", digits: 0 },
  gap_mean: { label: "Gap (mean)", unit: "tokens", better: "lower", digits: 0 },
  idle_frac: { label: "Idle", unit: "%", better: "lower", digits: 1, scale: 100 },
  pool_wait_p95_ms: { label: "Pool wait P95", unit: "ms", better: "lower", digits: 1 },
  makespan_s: { label: "Makespan", unit: "s", better: "lower", digits: 1 },
};
const PANELS = [
  { key: "left", fallback: "throughput_tok_s" },
  { key: "right", fallback: "tpot_p95_ms" },
];

// What each cell parameter means (shadow/sweep/grid.py), for axis titles and pickers.
const PARAM_HELP = {
  policy: "routing policy",
  horizon: "BR-H horizon H (steps)",
  alpha: "BR-H fill reward",
  beta: "BR-H overflow weight",
  gamma: "BR-H discount",
  s_greedy: "free slots above which Stage 1 is greedy",
  r_max: "Stage 2 candidates",
  workers: "decode workers G",
  batch: "slots per worker B",
  load: "arrival load (1.0 = fleet capacity)",
  step_a: "step model: ms per KV token",
  step_b: "step model: fixed ms per step",
  seed: "preset and policy seed",
};
// URL key of a parameter held at one value: `at_horizon=40` (absent: averaged over it).
const HOLD = "at_";

// Sequential scale, light to dark; darker is better for every metric.
const RAMP = ["#eaf1fe", "#d3e2fc", "#b5cdf9", "#8fb2f3", "#6893ea", "#4677dc", "#2f5fc6", "#2249a3", "#1a377c", "#142a5e"];
const rgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
const RAMP_RGB = RAMP.map(rgb);

/** The ramp's colour at t in [0, 1]. */
function rampColor(t) {
  const x = Math.max(0, Math.min(1, t)) * (RAMP_RGB.length - 1);
  const i = Math.min(RAMP_RGB.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [RAMP_RGB[i], RAMP_RGB[i + 1]];
  return `rgb(${a.map((v, k) => Math.round(v + (b[k] - v) * f)).join(", ")})`;
}

function metricMeta(metric) {
  return METRICS[metric] || { label: metric, unit: "", better: "lower", digits: 2 };
}

/** A parameter value as written on the command line: 20, 0.86, 0.00012, brh-oracle. */
function paramText(v) {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(6)));
  return v === null || v === undefined ? fmt.DASH : String(v);
}

/** Digits enough to tell the values apart (at least the metric's own). */
function digitsFor(values, meta) {
  const scale = meta.scale || 1;
  const xs = values.filter(fmt.isNum).map((v) => v * scale);
  if (xs.length < 2) return meta.digits;
  const span = Math.max(...xs) - Math.min(...xs);
  if (!(span > 0)) return meta.digits;
  return Math.max(meta.digits, Math.min(3, 2 - Math.floor(Math.log10(span))));
}

function valueText(v, meta, digits) {
  return fmt.isNum(v) ? fmt.num(v * (meta.scale || 1), digits) : fmt.DASH;
}

function sweepAxes(sweep) {
  return (sweep.varied || []).filter((n) => n !== "policy");
}

function defaultPolicy(policies) {
  return policies.find((p) => p === "brh-oracle") || policies.find((p) => p.startsWith("brh")) || policies[0] || null;
}

/** The page's choices from the URL, with defaults for what it leaves out or got wrong. */
function choices(p, sweep) {
  const axes = sweepAxes(sweep);
  let x = axes.includes(p.x) ? p.x : axes.includes("beta") ? "beta" : axes[0] || null;
  let y = axes.includes(p.y) && p.y !== x ? p.y : null;
  if (!y) y = (axes.includes("gamma") && x !== "gamma" ? "gamma" : axes.find((n) => n !== x)) || null;
  const policies = (sweep.values?.policy || []).map(String);
  const policy = policies.includes(p.policy) ? p.policy : defaultPolicy(policies);
  const holds = {};
  for (const name of axes) {
    if (name === x || name === y) continue;
    const raw = p[HOLD + name];
    const known = (sweep.values?.[name] || []).map(paramText);
    holds[name] = raw !== undefined && known.includes(raw) ? raw : null;
  }
  const metrics = PANELS.map((panel) => (METRICS[p[panel.key]] ? p[panel.key] : panel.fallback));
  return { axes, x, y, policies, policy, holds, metrics };
}

// ---- the heatmap --------------------------------------------------------------------------

/**
 * An SVG heatmap `width` px wide of `hm` (`GET /v1/sweeps/{sweep}/heatmap`): one rect per
 * cell (data-x, data-y, data-value), x values left to right, y values bottom to top, the
 * value printed in each cell, the best cell outlined.
 */
function heatmapSvg(width, hm, meta, best, digits) {
  const xs = hm.x.values;
  const ys = hm.y.values;
  const nx = Math.max(1, xs.length);
  const ny = Math.max(1, ys.length);
  const yTicks = ys.map(paramText);
  const tickW = Math.max(24, ...yTicks.map((t) => t.length * 7));
  const m = { left: 26 + tickW + 10, right: 6, top: 6, bottom: 50 };
  const plotW = Math.max(60, width - m.left - m.right);
  const cw = plotW / nx;
  const ch = Math.max(30, Math.min(78, cw * 0.48));
  const plotH = ch * ny;
  const height = m.top + plotH + m.bottom;
  const gap = 3;
  const texts = hm.z.flat().map((v) => valueText(v, meta, digits));
  const longest = Math.max(4, ...texts.map((t) => t.length));
  const size = Math.max(9, Math.min(16, ch * 0.3, (cw - 10) / (longest * 0.62)));
  const svg = svgEl("svg", { class: "hm-svg", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${meta.label} (${meta.unit}) by ${hm.x.name} and ${hm.y.name}` });
  const values = hm.z.flat().filter(fmt.isNum);
  const lo = values.length ? Math.min(...values) : 0;
  const hi = values.length ? Math.max(...values) : 1;
  const tone = (v) => {
    const norm = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    return 0.08 + 0.92 * (meta.better === "higher" ? norm : 1 - norm);
  };
  const cells = svgEl("g", { class: "hm-cells" });
  let bestBox = null;
  ys.forEach((yv, j) => {
    const top = m.top + (ny - 1 - j) * ch;
    xs.forEach((xv, i) => {
      const v = hm.z[j]?.[i];
      const left = m.left + i * cw;
      const empty = !fmt.isNum(v);
      const where = `${hm.x.name} = ${paramText(xv)}, ${hm.y.name} = ${paramText(yv)}`;
      const t = empty ? 0 : tone(v);
      const isBest = !empty && best && best.i === i && best.j === j;
      const rect = svgEl(
        "rect",
        {
          class: ["hm-cell", empty ? "hm-empty" : "", isBest ? "hm-cell-best" : ""].filter(Boolean).join(" "),
          x: (left + gap / 2).toFixed(1),
          y: (top + gap / 2).toFixed(1),
          width: Math.max(1, cw - gap).toFixed(1),
          height: Math.max(1, ch - gap).toFixed(1),
          rx: "4",
          fill: empty ? null : rampColor(t),
        },
        svgEl("title", null, empty ? `${where}: no cell` : `${where}: ${valueText(v, meta, Math.max(digits, 3))} ${meta.unit}${isBest ? " (best)" : ""}`),
      );
      rect.dataset.x = paramText(xv);
      rect.dataset.y = paramText(yv);
      rect.dataset.i = String(i);
      rect.dataset.j = String(j);
      if (empty) rect.dataset.empty = "true";
      else rect.dataset.value = String(v);
      if (isBest) rect.dataset.best = "true";
      const label = svgEl("text", { class: ["hm-value", empty ? "empty" : t > 0.5 ? "on-dark" : ""].filter(Boolean).join(" "), x: (left + cw / 2).toFixed(1), y: (top + ch / 2).toFixed(1), "text-anchor": "middle" }, empty ? "no cell" : valueText(v, meta, digits));
      label.style.fontSize = `${(empty ? Math.min(size, 12) : size).toFixed(1)}px`;
      cells.append(rect, label);
      if (isBest) bestBox = { left, top };
    });
  });
  svg.append(cells);
  if (bestBox) {
    const { left, top } = bestBox;
    const tag = svgEl("g", { class: "hm-best-mark" },
      svgEl("rect", { class: "hm-best", x: (left + gap / 2 + 1).toFixed(1), y: (top + gap / 2 + 1).toFixed(1), width: Math.max(1, cw - gap - 2).toFixed(1), height: Math.max(1, ch - gap - 2).toFixed(1), rx: "4" }),
    );
    if (ch >= 40 && cw >= 70) {
      tag.append(
        svgEl("rect", { class: "hm-best-badge", x: (left + gap / 2 + 1).toFixed(1), y: (top + gap / 2 + 1).toFixed(1), width: "38", height: "15", rx: "3" }),
        svgEl("text", { class: "hm-best-text", x: (left + gap / 2 + 20).toFixed(1), y: (top + gap / 2 + 9).toFixed(1), "text-anchor": "middle" }, "BEST"),
      );
    }
    svg.append(tag);
  }
  // Axes: tick labels under each column and beside each row, titles with the names.
  const axis = svgEl("g", { class: "hm-axes" });
  xs.forEach((xv, i) => axis.append(svgEl("text", { class: "hm-tick", x: (m.left + (i + 0.5) * cw).toFixed(1), y: (m.top + plotH + 15).toFixed(1), "text-anchor": "middle" }, paramText(xv))));
  ys.forEach((yv, j) => axis.append(svgEl("text", { class: "hm-tick hm-tick-y", x: (m.left - 8).toFixed(1), y: (m.top + (ny - 1 - j + 0.5) * ch).toFixed(1), "text-anchor": "end" }, paramText(yv))));
  const xTitle = svgEl("text", { class: "hm-axis-title", x: (m.left + plotW / 2).toFixed(1), y: (height - 10).toFixed(1), "text-anchor": "middle" }, hm.x.name, svgEl("tspan", { class: "hm-axis-help" }, PARAM_HELP[hm.x.name] ? `  ·  ${PARAM_HELP[hm.x.name]}` : ""));
  const cy = m.top + plotH / 2;
  const yTitle = svgEl("text", { class: "hm-axis-title", x: "13", y: cy.toFixed(1), "text-anchor": "middle", transform: `rotate(-90 13 ${cy.toFixed(1)})` }, hm.y.name, plotH >= 150 && PARAM_HELP[hm.y.name] ? svgEl("tspan", { class: "hm-axis-help" }, `  ·  ${PARAM_HELP[hm.y.name]}`) : null);
  axis.append(xTitle, yTitle);
  svg.append(axis);
  return svg;
}

/** The colour legend: the ramp from the lowest to the highest value, with the unit. */
function legend(hm, meta, digits) {
  const values = hm.z.flat().filter(fmt.isNum);
  if (!values.length) return null;
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  const stops = RAMP.map((_, k) => rampColor(0.08 + (0.92 * k) / (RAMP.length - 1)));
  if (meta.better !== "higher") stops.reverse();
  const mid = (lo + hi) / 2;
  return h(
    "div",
    { class: "hm-legend" },
    h("span", { class: "hm-legend-unit" }, `${meta.label} (${meta.unit})`),
    h(
      "div",
      { class: "hm-legend-scale" },
      h("div", { class: "hm-legend-bar", style: { background: `linear-gradient(to right, ${stops.join(", ")})` } }),
      h("div", { class: "hm-legend-ticks" }, h("span", null, valueText(lo, meta, digits)), hi > lo ? h("span", null, valueText(mid, meta, digits)) : null, h("span", null, valueText(hi, meta, digits))),
    ),
    h("span", { class: "hm-legend-note" }, `darker is better (${meta.better})`),
  );
}

/** The key of the marks that are not colours: the best cell's outline, an empty cell. */
function markKey() {
  return h(
    "span",
    { class: "hm-key" },
    h("span", { class: "hm-key-item" }, h("span", { class: "hm-key-outline" }), "best"),
    h("span", { class: "hm-key-item" }, h("span", { class: "hm-key-empty" }), "no cell"),
  );
}

/** The best cell: {i, j, value} (highest or lowest as the metric prefers), or null when
 * no cell has a value or every cell has the same one (nothing to single out). */
function bestCell(hm, meta) {
  const values = hm.z.flat().filter(fmt.isNum);
  if (!values.length || Math.min(...values) === Math.max(...values)) return null;
  let best = null;
  hm.z.forEach((row, j) =>
    row.forEach((v, i) => {
      if (!fmt.isNum(v)) return;
      if (!best || (meta.better === "higher" ? v > best.value : v < best.value)) best = { i, j, value: v };
    }),
  );
  return best;
}

/** A heatmap card drawn at its container's width (and redrawn when that changes). */
function heatmapCard(hm, metric, { onMetric, panel }) {
  const meta = metricMeta(metric);
  const host = h("div", { class: "heatmap" });
  const points = hm.z.flat().filter(fmt.isNum).length;
  host.dataset.series = "1";
  host.dataset.points = String(points);
  host.dataset.metric = metric;
  host.dataset.panel = panel;
  const best = bestCell(hm, meta);
  const digits = digitsFor(hm.z.flat(), meta);
  const select = h(
    "select",
    { "aria-label": `Metric of the ${panel} heatmap`, dataset: { metricPicker: panel }, onchange: (e) => onMetric(e.target.value) },
    Object.entries(METRICS).map(([key, m]) => h("option", { value: key, selected: key === metric }, `${m.label} (${m.unit})`)),
  );
  const bestLine = h(
    "div",
    { class: "hm-foot" },
    best
      ? h("span", { class: "hm-best-line" }, h("span", { class: "muted" }, "Best: "), h("strong", null, `${valueText(best.value, meta, digits)} ${meta.unit}`), ` at ${hm.x.name} = ${paramText(hm.x.values[best.i])}, ${hm.y.name} = ${paramText(hm.y.values[best.j])}`)
      : h("span", { class: "hm-best-line muted" }, points ? `Every cell has the same value (${valueText(hm.z.flat().find(fmt.isNum), meta, digits)} ${meta.unit}): these parameters do not change it here.` : "No cell of this selection has a value."),
    markKey(),
  );
  const box = card(`${meta.label} (${meta.unit})`, h("div", null, host, legend(hm, meta, digits), bestLine), {
    cls: "heatmap-card",
    note: `${meta.better} is better`,
    actions: h("label", { class: "field" }, h("span", null, "Metric"), select),
  });
  let drawn = 0;
  const draw = () => {
    const width = Math.floor(host.clientWidth || host.parentElement?.clientWidth || 560);
    if (Math.abs(width - drawn) <= 2) return;
    drawn = width;
    replace(host, points || hm.z.length ? heatmapSvg(width, hm, meta, best, digits) : emptyState("No cells."));
  };
  const ro = new ResizeObserver(draw);
  return { box, draw, observe: () => ro.observe(host), destroy: () => ro.disconnect() };
}

// ---- the page -----------------------------------------------------------------------------

export default {
  name: "sweeps",
  mount(ctx) {
    let seq = 0;
    let last = null;
    let sweepsCache = null;
    let drawn = [];
    const listHost = h("div");
    const controls = h("div", { class: "toolbar sweep-controls" });
    const maps = h("div", { class: "sweep-maps" });
    replace(
      ctx.root,
      pageHeader("Sweeps", "Parameter grids stored by `shadow sweep`: two metrics over two chosen parameters, the others held or averaged.", refreshButton(() => {
        last = null;
        sweepsCache = null;
        self.update(params()).catch(showError);
      })),
      card("Stored sweeps", listHost, { note: "click a sweep to draw its heatmaps; every choice is in the address, so the link can be shared" }),
      controls,
      maps,
    );

    const clearMaps = () => {
      drawn.forEach((d) => d.destroy());
      drawn = [];
    };

    function drawList(items, current) {
      const select = (name) => {
        const reset = { sweep: name, x: null, y: null, policy: null };
        for (const key of Object.keys(params())) if (key.startsWith(HOLD)) reset[key] = null;
        setParams(reset);
      };
      replace(listHost, table(
        [
          { key: "name", label: "Sweep", render: (s) => h("span", { class: "mono nowrap" }, s.name) },
          { key: "trace", label: "Trace", render: (s) => h("span", { class: "mono" }, s.trace) },
          { key: "varied", label: "Varied parameters", value: (s) => sweepAxes(s).join(","), render: (s) => {
            const axes = sweepAxes(s);
            return axes.length ? h("span", { class: "param-list" }, axes.map((n) => h("span", { class: "param-tag", title: PARAM_HELP[n] || null }, h("strong", null, n), " ", (s.values?.[n] || []).map(paramText).join(" · ")))) : h("span", { class: "muted" }, "none");
          } },
          { key: "policies", label: "Policies", value: (s) => (s.values?.policy || []).length, render: (s) => h("span", { class: "policy-list" }, (s.values?.policy || []).map((pol) => h("span", { class: "tag", style: { "--chip": policyColor(pol) } }, policyLabel(pol)))) },
          { key: "cells", label: "Cells", num: true, render: (s) => fmt.int(s.cells) },
          { key: "updated_at", label: "Updated", render: (s) => h("span", { class: "nowrap" }, fmt.isoDateTime(s.updated_at)) },
        ],
        {
          rows: items,
          urlKey: "s_sweeps",
          rowKey: (s) => s.name,
          selected: current ? current.name : null,
          onRowClick: (s) => select(s.name),
          dataset: (s) => ({ sweep: s.name }),
          empty: "No sweeps in this database yet.",
          testid: "sweeps",
        },
      ));
    }

    function drawControls(sweep, c) {
      const picker = (label, key, value, options, attrs = {}) =>
        h("label", { class: "field" }, h("span", null, label), h(
          "select",
          { "aria-label": label, dataset: { picker: key }, onchange: (e) => attrs.onchange(e.target.value), disabled: options.length < 2 && !attrs.always },
          options.map((o) => h("option", { value: o.value, selected: o.value === value, title: o.title || null }, o.label)),
        ));
      const axisOptions = c.axes.map((n) => ({ value: n, label: n, title: PARAM_HELP[n] || null }));
      // Picking the other axis's parameter swaps the two.
      const setAxis = (which, name) => {
        const other = which === "x" ? "y" : "x";
        const patch = { [which]: name };
        if (name === c[other]) patch[other] = c[which];
        setParams(patch);
      };
      const holds = Object.entries(c.holds).map(([name, value]) =>
        picker(name, HOLD + name, value ?? "", [{ value: "", label: "average" }, ...(sweep.values?.[name] || []).map((v) => ({ value: paramText(v), label: paramText(v) }))], { always: true, onchange: (v) => setParams({ [HOLD + name]: v || null }) }),
      );
      replace(
        controls,
        h(
          "div",
          { class: "toolbar-row" },
          h("span", { class: "sweep-name mono", title: sweep.trace }, sweep.name),
          picker("x", "x", c.x, axisOptions, { onchange: (v) => setAxis("x", v) }),
          h("button", { type: "button", class: "btn icon-swap", title: "Swap the axes", "aria-label": "Swap the axes", dataset: { swap: "" }, onclick: () => setParams({ x: c.y, y: c.x }) }, "⇄"),
          picker("y", "y", c.y, axisOptions, { onchange: (v) => setAxis("y", v) }),
          picker("Policy", "policy", c.policy, c.policies.map((pol) => ({ value: pol, label: policyLabel(pol) })), { onchange: (v) => setParams({ policy: v }) }),
          holds.length ? h("span", { class: "toolbar-sep", "aria-hidden": "true" }) : null,
          holds.length ? h("div", { class: "seg hold-group" }, h("span", { class: "muted small", title: "Parameters not on an axis: held at one value, or averaged over" }, "Hold"), holds) : null,
        ),
      );
    }

    const self = {
      async update(p) {
        if (last && onlySortChanged(last.p, p)) {
          last.p = p;
          last.redraw();
          setReady("sweeps");
          return;
        }
        const my = ++seq;
        delete document.body.dataset.ready;
        let items;
        try {
          if (!sweepsCache) sweepsCache = (await api.get("/v1/sweeps")).items || [];
          items = sweepsCache;
        } catch (error) {
          if (my !== seq) return;
          sweepsCache = null;
          showError(error);
          replace(listHost, emptyState("Could not load the sweeps.", "See the error above."));
          replace(controls);
          controls.hidden = true;
          clearMaps();
          replace(maps);
          setReady("sweeps");
          return;
        }
        if (my !== seq) return;
        const sweep = items.find((s) => s.name === p.sweep) || (p.sweep ? null : items[0]) || null;
        drawList(items, sweep);
        last = { p, redraw: () => drawList(items, sweep) };
        clearMaps();
        if (!items.length) {
          controls.hidden = true;
          replace(maps, card(null, emptyState(
            "Run a sweep to see its heatmaps here.",
            h("span", null, "Run one into this service's database while the service is stopped (DuckDB allows one writer process), then start ", h("code", null, "shadow serve"), " on it again:", h("code", { class: "cmd" }, "shadow sweep synthetic:small --param beta=20,43 --param gamma=0.8,0.9 --param policy=brh-oracle --db <this database>")),
          )));
          setReady("sweeps");
          return;
        }
        if (!sweep) {
          controls.hidden = true;
          replace(maps, card(null, emptyState(`No sweep named “${p.sweep}”.`, "Pick one of the stored sweeps above.")));
          setReady("sweeps");
          return;
        }
        const c = choices(p, sweep);
        controls.hidden = false;
        drawControls(sweep, c);
        if (!c.x || !c.y) {
          replace(maps, card(null, emptyState(
            `${sweep.name} varies ${c.axes.length ? `only ${c.axes[0]}` : "no parameter"}; a heatmap needs two.`,
            "Sweep two parameters at once, e.g. `--param beta=20,43 --param gamma=0.8,0.9`.",
          )));
          setReady("sweeps");
          return;
        }
        replace(maps, loading("Loading the heatmaps…"));
        const query = { x: c.x, y: c.y };
        if (c.policy) query.policy = c.policy;
        for (const [name, value] of Object.entries(c.holds)) if (value !== null) query[name] = value;
        let answers;
        try {
          const path = `/v1/sweeps/${encodeURIComponent(sweep.name)}/heatmap`;
          answers = await Promise.all(c.metrics.map((metric) => api.get(path, { ...query, metric })));
        } catch (error) {
          if (my !== seq) return;
          showError(error);
          replace(maps, card(null, emptyState("Could not load the heatmaps.", "See the error above.")));
          setReady("sweeps");
          return;
        }
        if (my !== seq) return;
        const averaged = Object.entries(c.holds).filter(([, v]) => v === null).map(([n]) => n);
        const seeds = (sweep.values?.seed || []).length;
        const over = [...averaged, ...(seeds > 1 && !averaged.includes("seed") && !(c.x === "seed" || c.y === "seed") ? [`${seeds} seeds`] : [])];
        const held = Object.entries(c.holds).filter(([, v]) => v !== null).map(([n, v]) => `${n} = ${v}`);
        const context = [
          c.policy ? policyLabel(c.policy) : null,
          `${fmt.int(answers[0].cells)} of ${fmt.int(sweep.cells)} cells`,
          held.length ? `held at ${held.join(", ")}` : null,
          over.length ? `averaged over ${over.join(", ")}` : null,
        ].filter(Boolean).join(" · ");
        drawn = answers.map((hm, k) => heatmapCard(hm, c.metrics[k], { panel: PANELS[k].key, onMetric: (m) => setParams({ [PANELS[k].key]: m === PANELS[k].fallback ? null : m }) }));
        replace(maps, h("div", { class: "range-line muted small sweep-context" }, context), h("div", { class: "grid-2 heatmaps" }, drawn.map((d) => d.box)));
        drawn.forEach((d) => {
          d.draw();
          d.observe();
        });
        setReady("sweeps");
      },
      destroy() {
        seq++;
        clearMaps();
      },
    };
    return self;
  },
};
