// Replays: runs stored by `shadow replay`, two or more side by side.
import { h, replace } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { Charts, chartBox, policyColor, policyLabel, uPlot } from "../lib/charts.js";
import { card, emptyState, loading, pageHeader, refreshButton, setReady, showError } from "../lib/components.js";
import { listParam, onlySortChanged, params, setParams } from "../lib/state.js";
import { table } from "../lib/table.js";

const ORDER = ["random", "rr", "jsq", "jsq-pool", "p2c", "ltl", "ascend-proxy", "vllm-dplb", "vllm-dplb-legacy", "br0-bypass", "br0", "brh-survival", "brh-exactmatch", "brh-oracle", "bf-io-h0", "bf-io"];
const rank = (p) => (ORDER.indexOf(p) === -1 ? 99 : ORDER.indexOf(p));

/** A value with its ratio to the run's JSQ beneath, coloured by the better direction. */
function vs(value, ratio, better) {
  const shown = fmt.ratio(ratio);
  const tone = !fmt.isNum(ratio) || shown === "1.000" ? "" : (better === "lower") === ratio < 1 ? "good-text" : "bad-text";
  return h("span", { class: "vr" }, h("span", { class: "vr-value" }, value), fmt.isNum(ratio) ? h("span", { class: ["vr-ratio", tone] }, `× ${shown}`) : null);
}

function runLabel(run) {
  return `#${run.id} ${run.trace}`;
}

export default {
  name: "replays",
  mount(ctx) {
    const charts = new Charts();
    let seq = 0;
    let last = null;
    const cache = new Map();
    const listHost = h("div");
    const cmpHost = h("div", { class: "replay-compare" });
    replace(ctx.root, pageHeader("Replays", "Counterfactual runs stored by `shadow replay`: pick two or more to compare them.", refreshButton(() => {
      last = null;
      cache.clear();
      self.update(params()).catch(showError);
    })), card("Stored runs", listHost, { note: "tick runs to compare; the selection is in the address, so the link can be shared" }), cmpHost);

    async function getRun(id) {
      if (!cache.has(id)) cache.set(id, api.get(`/v1/replays/${encodeURIComponent(id)}`, { points: 600 }).catch((e) => {
        cache.delete(id);
        throw e;
      }));
      return cache.get(id);
    }

    function drawList(runs, selected) {
      const toggle = (id, on) => {
        const next = new Set(selected);
        if (on) next.add(id);
        else next.delete(id);
        setParams({ runs: [...next].sort((a, b) => Number(a) - Number(b)).join(",") || null });
      };
      replace(listHost, table(
        [
          { key: "pick", label: "", sortable: false, render: (r) => h("input", { type: "checkbox", "aria-label": `Compare run ${r.id}`, checked: selected.has(String(r.id)), dataset: { run: r.id }, onchange: (e) => toggle(String(r.id), e.target.checked) }) },
          { key: "id", label: "#", num: true },
          { key: "created_at", label: "Created", render: (r) => fmt.isoDateTime(r.created_at) },
          { key: "trace", label: "Trace", render: (r) => h("span", { class: "mono" }, r.trace) },
          { key: "workers", label: "Workers", num: true },
          { key: "batch", label: "Batch", num: true },
          { key: "requests", label: "Requests", num: true, render: (r) => fmt.int(r.requests) },
          { key: "seed", label: "Seed", num: true },
          { key: "policies", label: "Policies", value: (r) => (r.policies || []).length, render: (r) => h("span", { class: "policy-list" }, [...(r.policies || [])].sort((a, b) => rank(a.policy) - rank(b.policy)).map((s) => h("span", { class: "tag", style: { "--chip": policyColor(s.policy) } }, policyLabel(s.policy)))) },
          { key: "best", label: "Lowest imbalance", value: (r) => bestOf(r)?.policy ?? null, render: (r) => {
            const b = bestOf(r);
            return b ? h("span", null, h("span", { class: "swatch", style: { background: policyColor(b.policy) } }), `${policyLabel(b.policy)} (${fmt.int(b.imbalance_mean)} tok)`) : "–";
          } },
        ],
        { rows: runs, urlKey: "s_replays", defaultSort: "-id", rowKey: (r) => r.id, rowClass: (r) => (selected.has(String(r.id)) ? "selected" : ""), onRowClick: (r) => toggle(String(r.id), !selected.has(String(r.id))), empty: "No replay runs stored yet. Run `shadow replay synthetic:small --db <this database>` (with the service stopped), then reload.", testid: "replays" },
      ));
    }

    function bestOf(run) {
      const rows = (run.policies || []).filter((s) => fmt.isNum(s.imbalance_mean));
      return rows.length ? rows.reduce((a, b) => (b.imbalance_mean < a.imbalance_mean ? b : a)) : null;
    }

    function drawCompare(p, runs) {
      charts.destroy();
      if (!runs.length) {
        replace(cmpHost, card(null, emptyState("Select two or more runs to compare.", "Tick the runs above; each one gets its imbalance-over-time chart and a column in the table.")));
        return () => {};
      }
      // Rows: policy x run, with the ratio against the run's JSQ (the paper's baseline;
      // the pooled JSQ of runs that have no worker-queue JSQ).
      const rows = [];
      for (const run of runs) {
        const sums = run.summaries || run.policies || [];
        const base = sums.find((s) => s.policy === "jsq") || sums.find((s) => s.policy === "jsq-pool");
        for (const s of sums) {
          rows.push({
            ...s,
            run: run.id,
            runLabel: runLabel(run),
            r_imb: base && fmt.isNum(base.imbalance_mean) && base.imbalance_mean ? s.imbalance_mean / base.imbalance_mean : null,
            r_thr: base && fmt.isNum(base.throughput_tok_s) && base.throughput_tok_s ? s.throughput_tok_s / base.throughput_tok_s : null,
            r_tpot: base && fmt.isNum(base.tpot_p95_ms) && base.tpot_p95_ms ? s.tpot_p95_ms / base.tpot_p95_ms : null,
          });
        }
      }
      const tableHost = h("div");
      const drawTable = () => replace(tableHost, table(
        [
          { key: "policy", label: "Policy", value: (r) => `${rank(r.policy).toString().padStart(2, "0")}${r.policy}`, render: (r) => h("span", { class: "policy-cell" }, h("span", { class: "swatch", style: { background: policyColor(r.policy) } }), policyLabel(r.policy)) },
          { key: "run", label: "Run", render: (r) => h("span", { class: "mono", title: r.runLabel }, `#${r.run}`) },
          { key: "imbalance_mean", label: "Imbalance (tok)", num: true, render: (r) => vs(fmt.int(r.imbalance_mean), r.r_imb, "lower") },
          { key: "throughput_tok_s", label: "Throughput (tok/s)", num: true, render: (r) => vs(fmt.num(r.throughput_tok_s, 1), r.r_thr, "higher") },
          { key: "tpot_p95_ms", label: "TPOT P95 (ms)", num: true, render: (r) => vs(fmt.ms(r.tpot_p95_ms), r.r_tpot, "lower") },
          { key: "gap_mean", label: "Gap (tok)", num: true, render: (r) => fmt.int(r.gap_mean) },
          { key: "idle_frac", label: "Idle", num: true, render: (r) => fmt.pct(r.idle_frac) },
          { key: "pool_wait_p95_ms", label: "Pool wait P95 (ms)", num: true, render: (r) => fmt.ms(r.pool_wait_p95_ms) },
          { key: "steps", label: "Steps", num: true, render: (r) => fmt.int(r.steps) },
        ],
        { rows, urlKey: "s_rcmp", defaultSort: "policy", rowKey: (r) => `${r.run}:${r.policy}`, empty: "These runs stored no per-policy summaries.", testid: "replay-compare" },
      ));
      drawTable();
      // One chart per run, same y scale, one series per policy.
      let ymax = 0;
      for (const run of runs) for (const s of Object.values(run.series || {})) for (const v of s.imbalance || []) if (v != null && v > ymax) ymax = v;
      const boxes = runs.map((run) => ({ run, ...chartBox(`Imbalance over time · ${runLabel(run)}`, { note: `${run.workers} workers × ${run.batch} slots · ${fmt.int(run.requests)} requests · seed ${run.seed ?? "–"}` }) }));
      replace(
        cmpHost,
        card(`Per policy, per run (${runs.length} run${runs.length > 1 ? "s" : ""})`, tableHost, { note: `under each value: the ratio to the same run's JSQ${runs.length < 2 ? " · select another run to compare side by side" : ""}` }),
        h("div", { class: runs.length > 1 ? "grid-2" : "" }, boxes.map((b) => b.box)),
      );
      for (const b of boxes) {
        const pols = Object.keys(b.run.series || {}).sort((x, y) => rank(x) - rank(y));
        if (!pols.length) {
          replace(b.el, emptyState("This run stored no time series."));
          continue;
        }
        const joined = pols.length > 1 ? uPlot.join(pols.map((pol) => [b.run.series[pol].t_ms.map((t) => t / 1000), b.run.series[pol].imbalance])) : [b.run.series[pols[0]].t_ms.map((t) => t / 1000), b.run.series[pols[0]].imbalance];
        charts.chart(b.el, {
          data: joined,
          time: false,
          height: 240,
          xLabel: "simulated time (s)",
          xFmt: (v) => fmt.num(v, 0),
          yLabel: "imbalance (tokens)",
          yFmt: fmt.tokens,
          yRange: [0, Math.max(1, ymax * 1.05)],
          sync: "replays",
          series: pols.map((pol) => ({ label: policyLabel(pol), color: policyColor(pol), width: pol.startsWith("br") ? 1.75 : 1.25, spanGaps: true, value: (u, v) => (v == null ? "–" : `${fmt.int(v)} tok`) })),
        });
        b.el.dataset.run = b.run.id;
      }
      return drawTable;
    }

    const self = {
      async update(p) {
        if (last && onlySortChanged(last.p, p)) {
          last.p = p;
          last.redraw.forEach((f) => f());
          setReady("replays");
          return;
        }
        const my = ++seq;
        delete document.body.dataset.ready;
        let runs;
        try {
          const page = await api.get("/v1/replays", { limit: 200 });
          runs = Array.isArray(page) ? page : page.items;
        } catch (error) {
          if (my !== seq) return;
          showError(error);
          replace(listHost, emptyState("Could not load the replay runs.", "See the error above."));
          setReady("replays");
          return;
        }
        if (my !== seq) return;
        const selected = new Set(listParam(p, "runs"));
        drawList(runs, selected);
        const redraw = [() => drawList(runs, selected)];
        if (selected.size) replace(cmpHost, loading("Loading the runs…"));
        try {
          const chosen = await Promise.all([...selected].sort((a, b) => Number(a) - Number(b)).map(getRun));
          if (my !== seq) return;
          redraw.push(drawCompare(p, chosen));
        } catch (error) {
          if (my !== seq) return;
          showError(error);
          charts.destroy();
          replace(cmpHost, card(null, emptyState("Could not load a selected run.", "It may have been removed; untick it above.")));
        }
        last = { p, redraw };
        setReady("replays");
      },
      destroy() {
        seq++;
        charts.destroy();
      },
    };
    return self;
  },
};
