// Compare: per-worker KV-load trajectories of the observed incumbent beside the
// counterfactual policies on the same y scale (the paper's Figure 3), imbalance, gap and
// step time over time, and the paper-style table for the selected range.
import { h, replace } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { Charts, chartBox, legendRow, policyColor, policyLabel, uPlot, workerColor } from "../lib/charts.js";
import { card, emptyState, loading, pageHeader, ratioCell, refreshButton, setReady, showError } from "../lib/components.js";
import { listParam, numParam, onlySortChanged, params, setParams } from "../lib/state.js";
import { table } from "../lib/table.js";

const ORDER = ["observed", "jsq", "jsq-pool", "rr", "random", "p2c", "ltl", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy", "br0-bypass", "br0", "brh-survival", "brh-exactmatch", "brh-oracle", "bf-io-h0", "bf-io", "aa"];

function orderPolicies(list, incumbent) {
  const rank = (p) => (p === "observed" ? -2 : p === incumbent ? -1 : ORDER.indexOf(p) === -1 ? 99 : ORDER.indexOf(p));
  return [...list].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** A metric value with its ratio to the incumbent and the 95% CI beneath. */
function withRatio(value, r, better) {
  return h("span", { class: "vr" }, h("span", { class: "vr-value" }, value), r && r.point !== null && r.point !== undefined ? ratioCell(r, better) : null);
}

export function summaryColumns(incumbent) {
  return [
    { key: "policy", label: "Policy", render: (r) => h("span", { class: "policy-cell" }, h("span", { class: "swatch", style: { background: policyColor(r.policy) } }), policyLabel(r.policy, incumbent)) },
    { key: "imbalance_mean", label: "Imbalance (tok)", num: true, render: (r) => withRatio(fmt.int(r.imbalance_mean), r.ratios?.imbalance, "lower") },
    { key: "throughput_tok_s", label: "Throughput (tok/s)", num: true, render: (r) => withRatio(fmt.num(r.throughput_tok_s, 1), r.ratios?.throughput, "higher") },
    { key: "tpot_p95_ms", label: "TPOT P95 (ms)", num: true, render: (r) => withRatio(fmt.ms(r.tpot_p95_ms), r.ratios?.tpot_p95, "lower") },
    { key: "gap_mean", label: "Gap (tok)", num: true, render: (r) => fmt.int(r.gap_mean) },
    { key: "step_ms_mean", label: "Step (ms)", num: true, render: (r) => fmt.ms(r.step_ms_mean) },
    { key: "pool_wait_p95_ms", label: "Pool wait P95 (ms)", num: true, render: (r) => fmt.ms(r.pool_wait_p95_ms) },
    { key: "steps", label: "Steps", num: true, render: (r) => fmt.int(r.steps) },
  ];
}

export default {
  name: "compare",
  mount(ctx) {
    const charts = new Charts();
    let seq = 0;
    let last = null; // {params, redrawTable}
    let windowsCache = { at: 0, items: [] };
    let hidden = new Set(); // worker indices hidden via the shared legend (`hide` in the URL)
    const readHidden = (p) => new Set(listParam(p, "hide").map(Number).filter(Number.isInteger));
    const head = pageHeader("Compare", "What the incumbent did, beside what BR-0 and BR-H would have done from the same start states.", refreshButton(() => {
      windowsCache.at = 0;
      last = null;
      self.update(params()).catch(showError);
    }));
    const toolbar = h("div", { class: "toolbar" });
    const content = h("div", { class: "compare" });
    replace(ctx.root, head, toolbar, content);

    async function windowsList(signalSeq) {
      if (Date.now() - windowsCache.at > 4000) {
        // one compact request: the windows chart needs only each policy's mean imbalance
        const all = await api.getAll(api.fleetPath(ctx.fleet, "windows"), { metrics: "imbalance_mean" }, { pageSize: 5000 });
        if (signalSeq !== seq) return null;
        windowsCache = { at: Date.now(), items: all.items };
      }
      return windowsCache.items;
    }

    function renderToolbar(p, windows, data) {
      const last = windows.length ? windows[windows.length - 1].window_index : null;
      const sel = numParam(p, "window");
      const ranged = p.since || p.until;
      const current = sel ?? (ranged ? null : data && data.windows && data.windows.length === 1 ? data.windows[0] : last);
      const pos = windows.findIndex((w) => w.window_index === current);
      const go = (w) => setParams({ window: w, since: null, until: null });
      const lastN = (n) => {
        const from = windows[Math.max(0, windows.length - n)];
        setParams({ window: null, since: from.t_start.toFixed(3), until: (windows[windows.length - 1].t_end + 0.001).toFixed(3) });
      };
      const since = numParam(p, "since");
      const until = numParam(p, "until");
      const sinceIn = h("input", { type: "datetime-local", step: "1", value: fmt.toLocalInput(since ?? data?.t_start), "aria-label": "From" });
      const untilIn = h("input", { type: "datetime-local", step: "1", value: fmt.toLocalInput(until ?? data?.t_end), "aria-label": "To" });
      const available = new Set();
      for (const w of windows.slice(-5)) for (const k of Object.keys(w.policies || {})) available.add(k);
      if (data && data.series) for (const k of Object.keys(data.series)) available.add(k);
      if (data && data.policies_available) for (const k of data.policies_available) available.add(k);
      const chosen = new Set(listParam(p, "policies").length ? listParam(p, "policies") : data && data.series ? Object.keys(data.series) : []);
      const togglePolicy = (pol) => {
        const next = new Set(chosen);
        if (next.has(pol)) next.delete(pol);
        else next.add(pol);
        setParams({ policies: orderPolicies([...next], data?.incumbent).join(",") || null });
      };
      replace(
        toolbar,
        h(
          "div",
          { class: "toolbar-row" },
          h("div", { class: "seg" },
            h("button", { type: "button", class: "btn", disabled: pos <= 0, onclick: () => go(windows[pos - 1].window_index), title: "Previous window" }, "‹"),
            h(
              "select",
              { "aria-label": "Window", class: "window-select", onchange: (e) => (e.target.value === "" ? null : go(Number(e.target.value))) },
              h("option", { value: "", selected: current === null }, ranged ? "Custom range" : "Latest window"),
              [...windows].reverse().map((w) => h("option", { value: String(w.window_index), selected: w.window_index === current }, `#${w.window_index}  ${fmt.time(w.t_start)}–${fmt.time(w.t_end)}  (${w.requests} req)`)),
            ),
            h("button", { type: "button", class: "btn", disabled: pos < 0 || pos >= windows.length - 1, onclick: () => go(windows[pos + 1].window_index), title: "Next window" }, "›"),
            h("button", { type: "button", class: ["btn", !sel && !ranged ? "on" : ""], onclick: () => setParams({ window: null, since: null, until: null }) }, "Latest"),
          ),
          h("div", { class: "seg" }, h("span", { class: "muted small" }, "Last"), [5, 20, 100].map((n) => h("button", { type: "button", class: "btn", disabled: !windows.length, onclick: () => lastN(n) }, `${n}`)), h("button", { type: "button", class: "btn", disabled: !windows.length, onclick: () => lastN(windows.length) }, "All")),
          h("form", { class: "seg range-form", onsubmit: (e) => {
            e.preventDefault();
            const a = fmt.fromLocalInput(sinceIn.value);
            const b = fmt.fromLocalInput(untilIn.value);
            setParams({ window: null, since: a === null ? null : a.toFixed(3), until: b === null ? null : (b + 1).toFixed(3) });
          } }, h("label", { class: "muted small" }, "From"), sinceIn, h("label", { class: "muted small" }, "to"), untilIn, h("button", { type: "submit", class: "btn" }, "Apply")),
        ),
        h(
          "div",
          { class: "toolbar-row" },
          h("span", { class: "muted small" }, "Policies"),
          orderPolicies([...available], data?.incumbent).map((pol) =>
            h("button", { type: "button", class: ["chip", chosen.has(pol) ? "on" : ""], "aria-pressed": chosen.has(pol) ? "true" : "false", style: { "--chip": policyColor(pol) }, dataset: { policy: pol }, onclick: () => togglePolicy(pol) }, h("span", { class: "swatch", style: { background: policyColor(pol) } }), policyLabel(pol, data?.incumbent)),
          ),
        ),
      );
    }

    function navigator(windows, data, incumbent) {
      const { box, el } = chartBox("Windows", { note: "mean imbalance per window · drag to select a range, click a point to open one window" });
      const pols = orderPolicies(Object.keys(data.series), incumbent);
      const xs = windows.map((w) => (w.t_start + w.t_end) / 2);
      return {
        box,
        draw() {
          charts.chart(el, {
            data: [xs, ...pols.map((pol) => windows.map((w) => w.policies?.[pol]?.imbalance_mean ?? null))],
            height: 150,
            xLabel: "window midpoint (local time)",
            yLabel: "imbalance (tok)",
            yFmt: fmt.tokens,
            drag: "select",
            highlight: [data.t_start, data.t_end],
            series: pols.map((pol) => ({ label: policyLabel(pol, incumbent), color: policyColor(pol), width: pol === "observed" ? 2 : 1.5, points: { show: windows.length < 200, size: 4 }, spanGaps: true })),
            onSelect: (a, b) => setParams({ window: null, since: a.toFixed(3), until: b.toFixed(3) }),
            onClick: (idx) => setParams({ window: windows[idx].window_index, since: null, until: null }),
          });
        },
      };
    }

    function render(p, windows, data) {
      charts.destroy();
      const incumbent = data.incumbent;
      const pols = orderPolicies(Object.keys(data.series || {}), incumbent);
      const workers = data.workers || [];
      const G = workers.length;
      const wins = data.windows || [];
      const sampled = data.sampled ? ` (${wins.length} of ${data.windows_in_range}, evenly sampled)` : wins.length > 1 ? ` (${wins.length})` : "";
      const rangeText = wins.length === 1 ? `Window #${wins[0]}` : wins.length ? `Windows #${wins[0]}–#${wins[wins.length - 1]}${sampled}` : "No window";
      const reqs = data.summary?.requests;

      // Shared y range over every policy and worker: the small multiples are comparable.
      let ymax = 0;
      for (const pol of pols) for (const row of data.series[pol].loads || []) for (const v of row) if (v != null && v > ymax) ymax = v;
      const yRange = [0, Math.max(1, ymax * 1.05)];
      const xRange = [data.t_start, data.t_end];

      const nav = navigator(windows, data, incumbent);
      const legend = legendRow(
        workers.map((w, i) => ({ label: `worker ${w}`, color: workerColor(i, G), off: hidden.has(i) })),
        {
          onToggle: (i) => {
            const next = new Set(hidden);
            if (next.has(i)) next.delete(i);
            else next.add(i);
            setParams({ hide: [...next].sort((a, b) => a - b).join(",") || null }, { replace: true });
          },
        },
      );
      const grid = h("div", { class: ["multiples", pols.length > 2 ? "cols-2" : ""] });
      const trajHosts = pols.map((pol) => {
        const el = h("div", { class: "chart-host", dataset: { policy: pol, chart: "trajectory" } });
        const s = data.series[pol];
        grid.append(h("section", { class: "card chart-card mini", style: { "--accent": policyColor(pol) } }, h("header", { class: "card-head" }, h("h3", null, h("span", { class: "swatch", style: { background: policyColor(pol) } }), policyLabel(pol, incumbent)), h("span", { class: "muted small" }, `${fmt.int(s.t.length)} points · mean imbalance ${fmt.int(data.summary?.rows?.find((r) => r.policy === pol)?.imbalance_mean)} tok`)), el));
        return el;
      });
      const over = ["imbalance", "gap", "step_ms"].map((key) => {
        const title = { imbalance: "Imbalance over time", gap: "Gap over time", step_ms: "Step time" }[key];
        const note = { imbalance: "bucket mean of max L − min L", gap: "bucket mean of G·max L − ΣL", step_ms: "modelled decode step per bucket" }[key];
        return { key, ...chartBox(title, { note }) };
      });
      for (const o of over) o.el.dataset.chart = o.key;
      const summaryRows = data.summary?.rows || [];
      const tableHost = h("div");
      const drawTable = () => replace(tableHost, table(summaryColumns(incumbent), { rows: summaryRows, urlKey: "s_sum", empty: "No policy metrics for this range.", rowKey: (r) => r.policy, testid: "summary" }));
      drawTable();
      const applyHidden = () => {
        legend.querySelectorAll(".legend-item").forEach((el, i) => el.classList.toggle("off", hidden.has(i)));
        for (const u of trajCharts) workers.forEach((_, g) => u.setSeries(g + 1, { show: !hidden.has(g) }));
      };
      last = { params: p, redrawTable: drawTable, applyHidden: () => applyHidden() };
      const fid = data.summary?.fidelity;
      replace(
        content,
        h("div", { class: "range-line" }, h("strong", null, rangeText), h("span", { class: "muted" }, ` · ${fmt.dateTime(data.t_start)} → ${fmt.time(data.t_end)} · ${fmt.seconds(data.t_end - data.t_start)}`), reqs != null ? h("span", { class: "muted" }, ` · ${fmt.int(reqs)} requests`) : null, h("span", { class: "muted" }, ` · ${G} workers · incumbent ${policyLabel(incumbent)}`)),
        nav.box,
        h("section", { class: "card" }, h("header", { class: "card-head" }, h("h3", null, "Per-worker KV load, same scale"), h("span", { class: "muted small" }, "each window starts from the observed state; lines can jump at the dashed window boundaries")), legend, grid),
        h("div", { class: "grid-3" }, over.map((o) => o.box)),
        card(`Paper-style table · ${rangeText}`, tableHost, { note: `under each value: the ratio to ${policyLabel(incumbent, incumbent)} [95% paired bootstrap CI over windows]` + (fid ? ` · fidelity: imbalance ${fmt.ratio(fid.imbalance)}, step ${fmt.ratio(fid.step)} (observed / replayed)` : "") }),
      );

      nav.draw();
      const trajCharts = pols.map((pol, k) => {
        const s = data.series[pol];
        return charts.chart(trajHosts[k], {
          data: [s.t, ...workers.map((_, g) => s.loads[g] || [])],
          height: 210,
          xLabel: "time (local)",
          yLabel: "KV load (tokens)",
          yFmt: fmt.tokens,
          yRange,
          xRange,
          sync: "compare",
          legend: false,
          markers: data.boundaries || [],
          series: workers.map((w, g) => ({ label: `worker ${w}`, color: workerColor(g, G), width: 1.25, show: !hidden.has(g) })),
        });
      });
      // One x axis for the over-time charts: join the policies' bucket times.
      const joined = uPlot.join(pols.map((pol) => {
        const s = data.series[pol];
        return [s.t, s.imbalance, s.gap, s.step_ms];
      }));
      const xs = joined[0];
      for (const o of over) {
        const offset = { imbalance: 1, gap: 2, step_ms: 3 }[o.key];
        const ys = pols.map((_, k) => joined[1 + k * 3 + (offset - 1)]);
        charts.chart(o.el, {
          data: [xs, ...ys],
          height: 220,
          xLabel: "time (local)",
          yLabel: o.key === "step_ms" ? "step time (ms)" : `${o.key} (tokens)`,
          yFmt: o.key === "step_ms" ? (v) => fmt.num(v, 1) : fmt.tokens,
          xRange,
          sync: "compare",
          markers: data.boundaries || [],
          ySoft0: o.key !== "step_ms",
          series: pols.map((pol) => ({ label: policyLabel(pol, incumbent), color: policyColor(pol), width: pol === "observed" ? 2 : 1.5, spanGaps: true, value: (u, v) => (v == null ? "–" : o.key === "step_ms" ? `${fmt.ms(v)} ms` : `${fmt.int(v)} tok`) })),
        });
      }
    }

    const self = {
      async update(p) {
        hidden = readHidden(p);
        if (last && onlySortChanged(last.params, p, ["hide"])) {
          const resort = Object.keys({ ...last.params, ...p }).some((k) => k.startsWith("s_") && last.params[k] !== p[k]);
          last.params = p;
          if (resort) last.redrawTable();
          last.applyHidden();
          setReady("compare");
          return;
        }
        last = null;
        const my = ++seq;
        delete document.body.dataset.ready;
        try {
          const windows = await windowsList(my);
          if (windows === null) return;
          if (!windows.length) {
            charts.destroy();
            renderToolbar(p, [], null);
            replace(content, emptyState("No windows evaluated yet.", "Windows close every window_s seconds (30 s by default) and are replayed under every policy from the observed start state; this page fills in after the first one."));
            setReady("compare");
            return;
          }
          const query = { policies: p.policies || null, points: p.points || 1200 };
          if (p.window) query.window = p.window;
          else if (p.since || p.until) {
            query.since = p.since || null;
            query.until = p.until || null;
          }
          if (!content.querySelector(".chart")) replace(content, loading("Replaying the range…"));
          const data = await api.get(api.fleetPath(ctx.fleet, "compare"), query);
          if (my !== seq) return;
          renderToolbar(p, windows, data);
          if (!data.series || !Object.keys(data.series).length) {
            charts.destroy();
            replace(content, emptyState("Nothing evaluated in this range.", "Pick another window or widen the range; windows are listed in the selector above."));
          } else {
            render(p, windows, data);
          }
          setReady("compare");
        } catch (error) {
          if (my !== seq) return;
          showError(error);
          charts.destroy();
          replace(content, emptyState("Could not load the comparison.", "The error is shown above. Check the window or range in the address bar."));
          setReady("compare");
        }
      },
      destroy() {
        seq++;
        charts.destroy();
      },
    };
    return self;
  },
};
