// Integrity: can the evidence be trusted? Invariant violations over time and in detail,
// replay fidelity per window, telemetry staleness, the mode timeline, the audit chain.
import { h, replace } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { Charts, chartBox } from "../lib/charts.js";
import { card, emptyState, jsonText, loading, modeBadge, pageHeader, pager, pill, refreshButton, setReady, showError, stat } from "../lib/components.js";
import { numParam, onlySortChanged, params, setParams } from "../lib/state.js";
import { table } from "../lib/table.js";

const KIND_COLORS = ["#dc2626", "#f59e0b", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#2563eb", "#a16207", "#475569"];
const MODE_COLORS = { shadow: "#3b82f6", live: "#16a34a", fallback: "#f59e0b", latched: "#dc2626" };
const VPAGE = 50;

function severityPill(sev) {
  return pill(sev || "–", sev === "critical" ? "bad" : sev === "warning" ? "warn" : "none");
}

export default {
  name: "integrity",
  mount(ctx) {
    const charts = new Charts();
    let seq = 0;
    let last = null;
    const stats = h("div", { class: "stats" }, loading());
    const vChart = chartBox("Violations by kind", { note: "invariant violations per time bucket, stacked" });
    const vTable = h("div");
    const vHead = h("div", { class: "list-head" });
    const vFilters = h("div", { class: "filters inline" });
    const fChart = chartBox("Replay fidelity per window", { note: "observed ÷ replayed incumbent; 1.0 means the replay reproduces what happened" });
    vChart.el.dataset.chart = "violations";
    fChart.el.dataset.chart = "fidelity";
    const tel = h("div");
    const modeLine = h("div", { class: "mode-line" });
    const auditTable = h("div");
    const chain = h("div");
    replace(
      ctx.root,
      pageHeader("Integrity", "Whether the evidence can be trusted: invariants, replay fidelity, telemetry and the audit trail.", refreshButton(() => {
      last = null;
      self.update(params()).catch(showError);
    })),
      stats,
      vChart.box,
      card("Violations", h("div", null, vFilters, vHead, vTable)),
      fChart.box,
      card("Telemetry freshness", tel, { note: "engine /metrics scrapes, compared with the mirror" }),
      card("Mode and fallback timeline", h("div", null, modeLine, auditTable), { note: "from the hash-chained audit log" }),
      card("Audit-log chain", chain),
    );

    function drawViolationsChart(tl) {
      const kinds = tl.kinds || [];
      const t = tl.t || [];
      if (!t.length || !kinds.length || !kinds.some((k) => (tl.counts[k] || []).some((v) => v))) {
        replace(vChart.el, emptyState("No invariant violations: the mirror agrees with every event so far.", "Violations (capacity exceeded, events out of order, token accounting, state mismatches with the engines' /metrics) would be charted here by kind."));
        return;
      }
      // Stacked: series k is the sum of kinds 0..k; drawn top-down so each bar shows.
      const cum = [];
      let acc = t.map(() => 0);
      for (const k of kinds) {
        acc = acc.map((v, i) => v + ((tl.counts[k] || [])[i] || 0));
        cum.push(acc);
      }
      const order = kinds.map((_, i) => kinds.length - 1 - i);
      charts.chart(vChart.el, {
        data: [t, ...order.map((i) => cum[i])],
        height: 200,
        xLabel: "time (local)",
        yLabel: `violations per ${fmt.seconds(tl.bucket_s)}`,
        yFmt: (v) => fmt.num(v, 0),
        yCount: true,
        series: order.map((i) => ({
          label: kinds[i],
          color: KIND_COLORS[i % KIND_COLORS.length],
          fill: KIND_COLORS[i % KIND_COLORS.length],
          bars: true,
          width: 0,
          value: (u, v, si, idx) => (idx == null ? "–" : String((tl.counts[kinds[i]] || [])[idx] ?? 0)),
        })),
      });
    }

    async function drawViolations(p, kinds) {
      const limit = VPAGE;
      const offset = numParam(p, "voffset", 0);
      const page = await api.get(api.fleetPath(ctx.fleet, "violations"), { kind: p.vkind || null, severity: p.vseverity || null, limit, offset });
      const set = (patch) => setParams({ ...patch, voffset: null });
      replace(
        vFilters,
        h("label", { class: "field" }, h("span", null, "Kind"), h("select", { "aria-label": "Violation kind", onchange: (e) => set({ vkind: e.target.value || null }) }, h("option", { value: "" }, "All kinds"), [...new Set([...kinds, ...(p.vkind ? [p.vkind] : [])])].map((k) => h("option", { value: k, selected: k === p.vkind }, k)))),
        h("label", { class: "field" }, h("span", null, "Severity"), h("select", { "aria-label": "Severity", onchange: (e) => set({ vseverity: e.target.value || null }) }, h("option", { value: "" }, "All"), ["critical", "warning", "info"].map((s) => h("option", { value: s, selected: s === p.vseverity }, s)))),
      );
      replace(vHead, h("div", { class: "list-count" }, h("strong", null, fmt.int(page.total)), " violations", p.vkind || p.vseverity ? " match" : ""), pager({ total: page.total, limit, offset, onPage: (o) => setParams({ voffset: o || null }) }));
      const draw = () => replace(vTable, table(
        [
          { key: "ts", label: "Time", render: (r) => h("span", { class: "mono", title: fmt.dateTime(r.ts) }, fmt.time(r.ts)) },
          { key: "kind", label: "Kind", render: (r) => h("span", { class: "mono" }, r.kind) },
          { key: "severity", label: "Severity", render: (r) => severityPill(r.severity) },
          { key: "worker", label: "Worker", render: (r) => h("span", { class: "mono" }, r.worker ?? "–") },
          { key: "request_id", label: "Request", render: (r) => h("span", { class: "mono req-id" }, r.request_id ?? "–") },
          { key: "detail", label: "Detail", value: (r) => jsonText(r.detail), render: (r) => h("span", { class: "detail-text" }, jsonText(r.detail)) },
          { key: "ingest_id", label: "Ingest id", num: true },
        ],
        { rows: page.items, urlKey: "s_viol", defaultSort: "-ts", empty: p.vkind || p.vseverity ? "No violation matches this filter." : "No invariant violations recorded. The mirror checks every event (capacity, ordering, token accounting) as it arrives.", testid: "violations" },
      ));
      draw();
      return draw;
    }

    function drawFidelity(windows) {
      if (!windows.length) {
        replace(fChart.el, emptyState("No windows evaluated yet.", "Windows close every window_s seconds (30 s by default); fidelity is computed for each."));
        return;
      }
      const xs = windows.map((w) => w.t_start);
      charts.chart(fChart.el, {
        data: [xs, windows.map((w) => w.fidelity_imbalance), windows.map((w) => w.fidelity_step), xs.map(() => 1)],
        height: 220,
        xLabel: "window start (local time)",
        yLabel: "observed / replayed (ratio)",
        yFmt: (v) => fmt.num(v, 2),
        ySoft0: false,
        series: [
          { label: "imbalance fidelity", color: "#2563eb", width: 1.75, points: { show: windows.length < 120, size: 4 }, value: (u, v) => fmt.ratio(v) },
          { label: "step-time fidelity", color: "#ea580c", width: 1.75, points: { show: windows.length < 120, size: 4 }, value: (u, v) => fmt.ratio(v) },
          { label: "ideal (1.0)", color: "#94a3b8", width: 1, dash: [4, 4], value: () => "1.000" },
        ],
      });
    }

    function drawTelemetry(t) {
      const engines = Object.entries(t.engines || {}).map(([worker, e]) => ({ worker, ...e }));
      if (!t.polling) {
        replace(tel, emptyState("Telemetry is not polled.", "Configure the engines' /metrics targets (the demo does this itself) to compare the mirror with what each engine reports."));
        return () => {};
      }
      const errors = engines.filter((e) => e.last_error);
      const draw = () => replace(tel, errors.length ? h("ul", { class: "errors-list" }, errors.map((e) => h("li", null, h("span", { class: "mono" }, e.worker), ": ", e.last_error))) : null, table(
        [
          { key: "worker", label: "Worker", render: (r) => h("span", { class: "mono" }, r.worker) },
          { key: "stale", label: "State", render: (r) => h("span", { title: r.last_error || "" }, r.stale ? pill("stale", "bad") : pill("fresh", "good")) },
          { key: "age_s", label: "Age (s)", num: true, render: (r) => fmt.num(r.age_s, 1) },
          { key: "failures", label: "Failures", num: true, render: (r) => fmt.int(r.failures) },
          { key: "running", label: "Running", num: true, render: (r) => fmt.int(r.running) },
          { key: "mirror_active_at_sample", label: "Mirror", num: true, title: "requests the mirror held on the worker when the sample was compared", render: (r) => fmt.int(r.mirror_active_at_sample) },
          { key: "kv_usage", label: "KV used", num: true, render: (r) => fmt.pct(r.kv_usage) },
        ],
        { rows: engines, urlKey: "s_tel", defaultSort: "worker", empty: "No engine scraped yet.", testid: "telemetry" },
      ));
      draw();
      return draw;
    }

    function drawModes(entries) {
      const transitions = entries.filter((e) => e.kind === "mode_transition" || e.kind === "operator_action");
      const sorted = [...transitions].sort((a, b) => a.ts - b.ts);
      const now = Date.now() / 1000;
      if (!sorted.length) {
        replace(modeLine, h("div", { class: "mode-band" }, h("div", { class: "mode-seg", style: { flexGrow: "1", background: MODE_COLORS.shadow }, title: "shadow" }, "shadow (no transition recorded)")));
      } else {
        const t0 = sorted[0].ts;
        const segs = [];
        for (let i = 0; i < sorted.length; i++) {
          const e = sorted[i];
          const to = e.payload?.to || (i ? segs[segs.length - 1]?.mode : "shadow");
          const end = i + 1 < sorted.length ? sorted[i + 1].ts : Math.max(now, e.ts + 1);
          segs.push({ mode: to, start: e.ts, end });
        }
        const total = Math.max(1e-6, segs[segs.length - 1].end - t0);
        replace(
          modeLine,
          h("div", { class: "mode-band", role: "img", "aria-label": "mode over time" }, segs.map((s) => h("div", { class: "mode-seg", style: { flexGrow: String(Math.max(0.002, (s.end - s.start) / total)), background: MODE_COLORS[s.mode] || "#94a3b8" }, title: `${s.mode}: ${fmt.dateTime(s.start)} → ${fmt.time(s.end)}` }, (s.end - s.start) / total > 0.08 ? s.mode : ""))),
          h("div", { class: "mode-axis muted small" }, h("span", null, fmt.dateTime(t0)), h("span", null, "now")),
        );
      }
      const draw = () => replace(auditTable, table(
        [
          { key: "seq", label: "Seq", num: true },
          { key: "ts", label: "Time", render: (r) => h("span", { class: "mono", title: fmt.dateTime(r.ts) }, fmt.dateTime(r.ts)) },
          { key: "kind", label: "Kind", render: (r) => h("span", { class: "mono" }, r.kind) },
          { key: "actor", label: "Actor", render: (r) => h("span", { class: "mono" }, r.actor ?? "–") },
          { key: "change", label: "Change", value: (r) => (r.payload?.to ? `${r.payload.from}→${r.payload.to}` : ""), render: (r) => (r.payload?.to ? h("span", null, modeBadge(r.payload.from), " → ", modeBadge(r.payload.to)) : r.payload?.refused ? pill("refused", "bad") : "–") },
          { key: "reason", label: "Reason", render: (r) => h("span", { class: "detail-text" }, r.reason ?? "–") },
          { key: "payload", label: "Payload", sortable: false, render: (r) => h("span", { class: "detail-text mono small" }, jsonText(r.payload)) },
        ],
        { rows: transitions, urlKey: "s_audit", defaultSort: "-seq", empty: "No mode transition or operator action yet: the fleet has been in shadow mode since it started.", testid: "audit" },
      ));
      draw();
      return draw;
    }

    function drawChain(v) {
      replace(
        chain,
        h("div", { class: "chain" },
          v.ok ? pill("chain intact", "good") : pill("chain broken", "bad"),
          h("span", null, ` ${fmt.int(v.rows)} rows verified`),
          v.ok ? h("span", { class: "muted" }, " · every row carries the hash of the previous one") : h("span", { class: "bad-text" }, ` · first bad row ${v.first_bad_seq ?? "?"}: `, v.problem ?? "unknown problem"),
        ),
      );
    }

    const self = {
      async update(p) {
        if (last && onlySortChanged(last.p, p)) {
          last.p = p;
          last.redraw.forEach((f) => f());
          setReady("integrity");
          return;
        }
        const my = ++seq;
        delete document.body.dataset.ready;
        const safe = (promise, fallback) => promise.catch((error) => {
          showError(error);
          return fallback;
        });
        const [fleets, tl, windows, telemetry, log, verify] = await Promise.all([
          safe(api.get("/v1/fleets"), []),
          safe(api.get(api.fleetPath(ctx.fleet, "violations", "timeline"), { buckets: 60 }), { t: [], kinds: [], counts: {}, bucket_s: null }),
          safe(api.getAll(api.fleetPath(ctx.fleet, "windows"), { policies: "false" }, { pageSize: 5000 }).then((r) => r.items), []),
          safe(api.get(api.fleetPath(ctx.fleet, "telemetry")), { polling: false, engines: {} }),
          safe(api.get("/v1/audit/log", { fleet: ctx.fleet, limit: 500 }), []),
          safe(api.get("/v1/audit/verify"), null),
        ]);
        if (my !== seq) return;
        const f = fleets.find((x) => x.fleet === ctx.fleet) || {};
        const engines = Object.values(telemetry.engines || {});
        const stale = engines.filter((e) => e.stale).length;
        const fids = windows.map((w) => w.fidelity_imbalance).filter(fmt.isNum);
        const meanFid = fids.length ? fids.reduce((a, b) => a + b, 0) / fids.length : null;
        const entries = Array.isArray(log) ? log : log.items || [];
        replace(
          stats,
          stat("Audit chain", verify ? (verify.ok ? "intact" : "broken") : "–", { tone: verify ? (verify.ok ? "good" : "bad") : null, sub: verify ? `${fmt.int(verify.rows)} rows` : null }),
          stat("Violations", fmt.int(f.violations), { sub: `${fmt.int(f.critical_violations)} critical`, tone: f.critical_violations ? "bad" : f.violations ? "warn" : "good" }),
          stat("Replay fidelity", fmt.ratio(meanFid), { sub: `mean imbalance ratio over ${windows.length} windows`, tone: meanFid === null ? null : Math.abs(meanFid - 1) <= 0.1 ? "good" : "warn" }),
          stat("Telemetry", telemetry.polling ? (stale ? `${stale} stale` : "fresh") : "not polled", { sub: telemetry.polling ? `${engines.length} engines` : null, tone: telemetry.polling ? (stale ? "bad" : "good") : null }),
          stat("Mode", modeBadge(f.mode), { sub: f.mode?.since ? `since ${fmt.dateTime(f.mode.since)}` : null }),
        );
        charts.destroy();
        drawViolationsChart(tl);
        const redraw = [];
        try {
          redraw.push(await drawViolations(p, tl.kinds || []));
        } catch (error) {
          showError(error);
        }
        drawFidelity(windows);
        redraw.push(drawTelemetry(telemetry));
        redraw.push(drawModes(entries));
        if (verify) drawChain(verify);
        else replace(chain, emptyState("Could not verify the audit log.", "See the error above."));
        last = { p, redraw };
        setReady("integrity");
      },
      destroy() {
        seq++;
        charts.destroy();
      },
    };
    return self;
  },
};
