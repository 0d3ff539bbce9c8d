// Overview: per fleet the mode, the latest gate verdict, headline ratios of every shadow
// policy against the incumbent, violations, telemetry freshness, live per-worker KV load.
import { h, navLink, replace } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { Charts, chartBox, policyColor, policyLabel } from "../lib/charts.js";
import { card, emptyState, modeBadge, pageHeader, ratioTone, setReady, showError, stat, verdictBadge, workerBars } from "../lib/components.js";
import { table } from "../lib/table.js";
import { summaryColumns } from "./compare.js";

const LIVE_MS = 2000;
const SUMMARY_MS = 15000;
const LIVE_POINTS = 150;

const METRICS = [
  { key: "imbalance", label: "Imbalance", better: "lower", hint: "max L − min L, lower is better" },
  { key: "throughput", label: "Throughput", better: "higher", hint: "output tokens/s, higher is better" },
  { key: "tpot_p95", label: "TPOT P95", better: "lower", hint: "time per output token, lower is better" },
];

function headline(row, incumbent) {
  const color = policyColor(row.policy);
  return h(
    "article",
    { class: "headline", dataset: { policy: row.policy }, style: { "--accent": color } },
    h("header", { class: "headline-head" }, h("span", { class: "swatch", style: { background: color } }), h("span", { class: "headline-name" }, policyLabel(row.policy, incumbent)), h("span", { class: "muted small" }, `vs ${policyLabel(incumbent, incumbent)}`)),
    h(
      "div",
      { class: "headline-metrics" },
      METRICS.map((m) => {
        const r = row.ratios ? row.ratios[m.key] : null;
        const tone = ratioTone(r, m.better);
        return h(
          "div",
          { class: ["hm", `tone-${tone}`], title: `${m.label} ratio (${m.hint}); 95% bootstrap CI over ${r?.n ?? "?"} windows` },
          h("div", { class: "hm-label" }, m.label, h("span", { class: "hm-dir", title: m.better === "lower" ? "lower is better" : "higher is better" }, m.better === "lower" ? "↓" : "↑")),
          h("div", { class: "hm-value" }, r ? fmt.ratio(r.point) : "–"),
          h("div", { class: "hm-ci" }, r ? fmt.ci(r.ci_low, r.ci_high) : "no ratio yet"),
        );
      }),
    ),
  );
}

function summaryTable(summary) {
  return table(summaryColumns(summary.incumbent), { rows: summary.rows, urlKey: "s_ov", rowKey: (r) => r.policy, empty: "No policy metrics yet.", testid: "overview-summary" });
}

export default {
  name: "overview",
  mount(ctx) {
    const charts = new Charts();
    const state = { fleets: [], summaries: {}, live: {}, timers: [], alive: true, drawn: false, open: new Set() };
    const body = h("div", { class: "overview" });
    replace(ctx.root, pageHeader("Overview", "Every fleet at a glance: the incumbent against each shadow policy, live."), body);

    function fleetSection(f) {
      const summary = state.summaries[f.fleet];
      const inc = f.incumbent;
      const tel = f.telemetry || null;
      const staleCount = tel ? (Array.isArray(tel.stale) ? tel.stale.length : Number(tel.stale) || 0) : null;
      const gate = f.gate || null;
      const mode = f.mode || null;
      const shadowRows = summary && summary.rows ? summary.rows.filter((r) => r.policy !== "observed" && r.policy !== inc) : [];
      const ORDER = ["br0", "brh-survival", "brh-exactmatch", "brh-oracle"];
      const rank = (p) => (ORDER.includes(p) ? ORDER.indexOf(p) : p.startsWith("br") ? 5 : 9);
      const hero = shadowRows.filter((r) => r.policy !== "aa").sort((a, b) => rank(a.policy) - rank(b.policy) || a.policy.localeCompare(b.policy));
      const windows = f.windows ?? summary?.windows ?? 0;

      const stats = h(
        "div",
        { class: "stats" },
        stat("Mode", modeBadge(mode), { sub: mode ? (mode.policy ? `policy ${mode.policy}` : `incumbent ${inc}`) + (mode.frozen ? " · frozen" : "") : null }),
        stat("Latest gate", verdictBadge(gate?.verdict), { sub: gate ? `${gate.dry_run ? "dry run · " : ""}${gate.candidate} vs ${gate.baseline} · ${fmt.time(gate.ts)}` : "run one on the Gate page", title: gate?.deciding_rule || null }),
        stat("Windows", fmt.int(windows), { sub: summary && summary.requests != null ? `${fmt.int(summary.requests)} requests` : null }),
        stat("Violations", fmt.int(f.violations), { sub: `${fmt.int(f.critical_violations)} critical`, tone: f.critical_violations ? "bad" : f.violations ? "warn" : "good" }),
        stat("Telemetry", tel ? (tel.polling ? (staleCount ? `${staleCount} stale` : "fresh") : "not polled") : "–", { sub: tel && tel.polling ? `${tel.engines ?? "?"} engines · max age ${fmt.seconds(tel.max_age_s)}` : null, tone: tel && tel.polling ? (staleCount ? "bad" : "good") : null }),
        stat("Last event", fmt.time(f.last_event_ts), { sub: `${fmt.int(f.active)} active · ${fmt.int(f.pool)} in pool` }),
      );

      let ratios;
      if (!summary) ratios = h("div", { class: "muted" }, "Loading the summary…");
      else if (!windows || !summary.rows || !summary.rows.length) {
        ratios = emptyState("No windows evaluated yet.", "Windows close every window_s seconds (30 s by default); the ratios appear after the first one is replayed.");
      } else {
        ratios = h("div", null, h("div", { class: "headlines" }, hero.map((r) => headline(r, inc))), h("details", { class: "more", open: state.open.has(f.fleet), ontoggle: (e) => (e.currentTarget.open ? state.open.add(f.fleet) : state.open.delete(f.fleet)) }, h("summary", null, `All policies (${summary.rows.length} rows, ${fmt.int(summary.windows)} windows ${fmt.time(summary.t_start)}–${fmt.time(summary.t_end)})`), summaryTable(summary)));
      }

      const live = h("div", { class: "live-bars", dataset: { fleet: f.fleet } });
      const liveChart = h("div", { class: "chart-host" });
      const sec = h(
        "section",
        { class: ["fleet", f.fleet === ctx.fleet ? "current" : ""], dataset: { fleet: f.fleet } },
        h("header", { class: "fleet-head" }, h("h2", null, f.fleet), h("span", { class: "muted" }, `${fmt.int(f.workers)} workers · incumbent ${policyLabel(inc)}`), h("div", { class: "fleet-links" }, navLink("/compare", { fleet: f.fleet }, "Compare →"), navLink("/decisions", { fleet: f.fleet, disagreements_only: "true" }, "Disagreements →"), navLink("/gate", { fleet: f.fleet }, "Gate →"))),
        stats,
        card("Shadow policies vs the incumbent", ratios, { note: "ratio to the incumbent's replay over all windows, [95% paired bootstrap CI]; ↓/↑ marks the better direction; green or red only when the whole CI is on one side" }),
        h("div", { class: "grid-2" }, card("Live KV load per worker", live, { note: `refreshed every ${LIVE_MS / 1000} s`, cls: "live" }), h("section", { class: "card chart-card" }, h("header", { class: "card-head" }, h("h3", null, "Live imbalance and gap"), h("span", { class: "muted small" }, "observed windows of the last 2 min, then the live mirror")), liveChart)),
      );
      return { sec, live, liveChart };
    }

    function drawLive(f, parts) {
      const rec = state.live[f.fleet] || (state.live[f.fleet] = { t: [], imb: [], gap: [], snap: null });
      const snap = rec.snap;
      if (!snap) {
        replace(parts.live, h("div", { class: "muted" }, "Waiting for the mirror…"));
      } else if (!snap.workers.length) {
        replace(parts.live, emptyState("No workers in the mirror yet.", "Workers appear with their first `worker` event or dispatch."));
      } else {
        const cap = Math.max(...snap.workers.map((w) => w.kv_tokens || 0), 1);
        replace(
          parts.live,
          h("div", { class: "live-meta muted small" }, `mirror at ${fmt.time(snap.ts)} · imbalance ${fmt.int(snap.imbalance)} tok · gap ${fmt.int(snap.gap)} tok · pool ${fmt.int(snap.pool)}`),
          workerBars(snap.workers.map((w) => ({ worker: w.worker, value: w.kv_tokens, label: `${fmt.tokens(w.kv_tokens)} tok`, sub: `${w.active}/${w.capacity}`, tone: w.state !== "up" ? "off" : null })), { max: cap, testid: `live-${f.fleet}` }),
        );
      }
      const data = [rec.t, rec.imb, rec.gap];
      if (!parts.u) {
        if (!parts.liveChart.isConnected) return;
        parts.u = charts.chart(parts.liveChart, {
          data,
          height: 190,
          xLabel: "time (local)",
          yLabel: "tokens",
          yFmt: fmt.tokens,
          drag: false,
          series: [
            { label: "imbalance (tok)", color: "#2563eb", width: 2, points: { show: (u) => u.data[0].length < 3, size: 6 } },
            { label: "gap (tok)", color: "#94a3b8", width: 1.5, dash: [4, 3], points: { show: (u) => u.data[0].length < 3, size: 6 } },
          ],
        });
      } else {
        parts.u.setData(data);
        parts.liveChart.dataset.points = String(rec.t.length);
      }
    }

    const sections = {};
    function render() {
      if (!state.fleets.length) {
        replace(body, emptyState("No fleet has sent events yet.", "Start the demo with `shadow serve --demo`, or point the router's tap at POST /v1/events; fleets appear with their first event."));
        return;
      }
      charts.destroy();
      replace(body);
      for (const f of state.fleets) {
        const parts = fleetSection(f);
        sections[f.fleet] = parts;
        body.append(parts.sec);
      }
      for (const f of state.fleets) drawLive(f, sections[f.fleet]);
    }

    async function poll() {
      if (!state.alive) return;
      await Promise.all(
        state.fleets.map(async (f) => {
          try {
            const snap = await api.get(api.fleetPath(f.fleet, "snapshot"));
            const rec = state.live[f.fleet] || (state.live[f.fleet] = { t: [], imb: [], gap: [], snap: null });
            rec.snap = snap;
            if (snap.ts != null && (!rec.t.length || snap.ts > rec.t[rec.t.length - 1])) {
              rec.t.push(snap.ts);
              rec.imb.push(snap.imbalance);
              rec.gap.push(snap.gap);
              if (rec.t.length > LIVE_POINTS) {
                rec.t.shift();
                rec.imb.shift();
                rec.gap.shift();
              }
            }
            if (state.alive && sections[f.fleet]) drawLive(f, sections[f.fleet]);
          } catch (error) {
            showError(error);
          }
        }),
      );
    }

    // Seed the live chart with the observed trajectory of the last two minutes of windows.
    async function seed(f) {
      if (state.live[f.fleet] || !f.windows || !f.last_event_ts) return;
      const rec = (state.live[f.fleet] = { t: [], imb: [], gap: [], snap: null });
      try {
        const data = await api.get(api.fleetPath(f.fleet, "compare"), { since: (f.last_event_ts - 120).toFixed(3), policies: "observed", points: LIVE_POINTS });
        const s = data.series && data.series.observed;
        if (s && !rec.t.length) {
          rec.t.push(...s.t);
          rec.imb.push(...s.imbalance);
          rec.gap.push(...s.gap);
        }
      } catch {
        // Only a head start for the chart: live snapshots fill it either way.
      }
    }

    async function loadAll() {
      const fleets = await api.get("/v1/fleets");
      state.fleets = fleets;
      await Promise.all(fleets.map(seed));
      await Promise.all(
        fleets.map(async (f) => {
          try {
            state.summaries[f.fleet] = await api.get(api.fleetPath(f.fleet, "summary"));
          } catch (error) {
            state.summaries[f.fleet] = { rows: [], windows: 0 };
            showError(error);
          }
        }),
      );
      if (!state.alive) return;
      render();
    }

    return {
      async update() {
        if (state.drawn) {
          // Only a table sort can change in the URL here: redraw from what is loaded.
          if (state.fleets.length) render();
          setReady("overview");
          return;
        }
        state.drawn = true;
        try {
          await loadAll();
          await poll();
        } catch (error) {
          showError(error);
          replace(body, emptyState("Could not load the fleets.", "See the error above; the page retries every few seconds."));
        }
        setReady("overview");
        state.timers.push(setInterval(poll, LIVE_MS));
        state.timers.push(
          setInterval(async () => {
            try {
              await loadAll();
              await poll();
            } catch (error) {
              showError(error);
            }
          }, SUMMARY_MS),
        );
      },
      destroy() {
        state.alive = false;
        state.timers.forEach(clearInterval);
        charts.destroy();
      },
    };
  },
};
