// Gate: the promotion gate's runs, one report in full (per-metric table, the deciding rule),
// and a dry run on demand (the only write this UI ever makes, on a button press).
import { h, replace } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { policyLabel } from "../lib/charts.js";
import { card, emptyState, loading, pageHeader, pill, refreshButton, setReady, showError, verdictBadge, verdictTone } from "../lib/components.js";
import { onlySortChanged, params, setParams } from "../lib/state.js";
import { table } from "../lib/table.js";

const LABEL_TONE = { pass: "good", shown: "good", "within margins": "good", fail: "bad", failed: "bad", straddles: "warn", "not shown": "warn", "out of bounds": "warn", "wider than margins": "warn", "too little": "warn", missing: "info", "dry run": "none", "n/a": "none" };
const ROLE_ORDER = ["HARD", "PRIMARY", "OBJECTIVE", "GUARD", "NOISE", "EVIDENCE"];
const CANDIDATES = ["br0", "brh-survival", "brh-exactmatch", "brh-oracle", "random", "rr", "p2c", "ltl", "vllm-dplb"];

function num(v) {
  if (!fmt.isNum(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && a < 10) return v.toFixed(3);
  if (a < 1000) return v.toFixed(1);
  return fmt.int(v);
}

function metricColumns() {
  return [
    { key: "metric", label: "Metric", render: (r) => h("span", { class: "mono" }, r.metric) },
    { key: "role", label: "Role", value: (r) => ROLE_ORDER.indexOf(r.role), render: (r) => h("span", { class: ["role", `role-${String(r.role).toLowerCase()}`] }, r.role) },
    { key: "n", label: "n", num: true, render: (r) => fmt.int(r.n) },
    { key: "incumbent", label: "Incumbent", num: true, render: (r) => num(r.incumbent) },
    { key: "candidate", label: "Candidate", num: true, render: (r) => num(r.candidate) },
    { key: "ratio", label: "Ratio", num: true, render: (r) => fmt.ratio(r.ratio) },
    { key: "ci_low", label: "95% CI", num: true, render: (r) => h("span", { class: "nowrap" }, fmt.ci(r.ci_low, r.ci_high)) },
    { key: "margin", label: "Margin", render: (r) => h("span", { class: "mono margin-text" }, r.margin ?? "–") },
    { key: "label", label: "Label", render: (r) => pill(r.label ?? "–", LABEL_TONE[r.label] || "none") },
    { key: "rule", label: "Rule", render: (r) => h("span", { class: "rule-text" }, r.rule ?? "–") },
  ];
}

function reportView(report) {
  const ev = report.evidence || {};
  const tone = verdictTone(report.verdict);
  return h(
    "div",
    { class: "report", dataset: { run: report.id, verdict: report.verdict } },
    h("div", { class: ["verdict-banner", `tone-${tone}`] },
      h("div", { class: "verdict-big" }, report.verdict || "?", report.dry_run ? h("span", { class: "verdict-sub" }, "dry run") : null),
      h("div", { class: "verdict-rule" }, h("div", { class: "muted small" }, "Deciding rule"), h("p", { class: "deciding-rule" }, report.deciding_rule || "–")),
    ),
    h("div", { class: "kv" },
      h("div", null, h("span", { class: "muted" }, "Run "), `#${report.id}`, " · ", fmt.dateTime(report.ts)),
      h("div", null, h("span", { class: "muted" }, "Candidate "), policyLabel(ev.candidate || "?"), h("span", { class: "muted" }, " vs "), policyLabel(ev.baseline || "?")),
      h("div", null, h("span", { class: "muted" }, "Evidence "), `${fmt.int(ev.windows)} windows · ${fmt.int(ev.decisions)} audited dispatches`),
      h("div", null, h("span", { class: "muted" }, "Range "), ev.since || ev.until ? `${fmt.dateTime(ev.since)} → ${fmt.dateTime(ev.until)}` : "all evidence"),
      h("div", null, h("span", { class: "muted" }, "Exit code "), String(report.exit_code ?? "–")),
      report.config_hash ? h("div", { title: report.config_hash }, h("span", { class: "muted" }, "Config "), h("span", { class: "mono" }, String(report.config_hash).slice(0, 12))) : null,
    ),
  );
}

export default {
  name: "gate",
  mount(ctx) {
    let seq = 0;
    let last = null;
    let policies = null;
    const form = h("form", { class: "dry-run" });
    const runsHost = h("div");
    const reportHost = h("div");
    replace(
      ctx.root,
      pageHeader("Gate", "Should the candidate replace the incumbent? Every verdict names the rule that decided it.", refreshButton(() => {
      last = null;
      delete reportHost.dataset.run;
      self.update(params()).catch(showError);
    })),
      card("Dry run", form, { note: "runs the gate on the service's evidence now and records it as a dry run; it never changes the mode" }),
      card("Gate runs", h("div", { class: "runs-scroll" }, runsHost), { note: "newest first · click a run to open its report" }),
      reportHost,
    );

    function renderForm() {
      const baseline = ctx.info?.incumbent || "jsq-pool";
      const opts = [...new Set([...(policies || []), ...CANDIDATES])].filter((x) => x !== "observed" && x !== "aa");
      const cand = h("select", { name: "candidate", "aria-label": "Candidate" }, opts.filter((x) => x !== baseline).map((x) => h("option", { value: x, selected: x === "brh-survival" }, policyLabel(x))));
      const base = h("select", { name: "baseline", "aria-label": "Baseline" }, [...new Set([baseline, ...opts])].map((x) => h("option", { value: x, selected: x === baseline }, policyLabel(x))));
      const status = h("span", { class: "muted small", role: "status" });
      const button = h("button", { type: "submit", class: "btn primary" }, "Dry run now");
      replace(form, h("label", { class: "field" }, h("span", null, "Candidate"), cand), h("label", { class: "field" }, h("span", null, "Baseline"), base), button, status);
      form.onsubmit = async (event) => {
        event.preventDefault();
        button.disabled = true;
        status.textContent = "Running the gate…";
        try {
          const report = await api.post(api.fleetPath(ctx.fleet, "gate", "dry-run"), { candidate: cand.value, baseline: base.value });
          status.textContent = `Recorded run #${report.id}: ${report.verdict}`;
          setParams({ run: String(report.id) });
        } catch (error) {
          status.textContent = "Failed.";
          showError(error);
        } finally {
          button.disabled = false;
        }
      };
    }

    const self = {
      async update(p) {
        if (last && onlySortChanged(last.p, p)) {
          last.p = p;
          last.redraw.forEach((f) => f());
          setReady("gate");
          return;
        }
        const my = ++seq;
        delete document.body.dataset.ready;
        if (policies === null) {
          policies = [];
          try {
            const w = await api.get(api.fleetPath(ctx.fleet, "windows"), { limit: 1, offset: 0 });
            const total = w.total;
            const lastW = total > 1 ? await api.get(api.fleetPath(ctx.fleet, "windows"), { limit: 1, offset: total - 1 }) : w;
            policies = Object.keys(lastW.items[0]?.policies || {});
          } catch (error) {
            showError(error);
          }
          renderForm();
        }
        if (!runsHost.firstChild) replace(runsHost, loading());
        let runs;
        try {
          const page = await api.get(api.fleetPath(ctx.fleet, "gate", "runs"), { limit: 200 });
          runs = Array.isArray(page) ? page : page.items;
        } catch (error) {
          if (my !== seq) return;
          showError(error);
          replace(runsHost, emptyState("Could not load the gate runs.", "See the error above."));
          setReady("gate");
          return;
        }
        if (my !== seq) return;
        const selected = p.run || (runs.length ? String(runs[0].id) : null);
        const drawRuns = () => replace(runsHost, table(
          [
            { key: "id", label: "#", num: true },
            { key: "ts", label: "Time", render: (r) => h("span", { class: "mono", title: fmt.dateTime(r.ts) }, fmt.time(r.ts)) },
            { key: "candidate", label: "Candidate", render: (r) => policyLabel(r.candidate) },
            { key: "baseline", label: "Baseline", render: (r) => policyLabel(r.baseline) },
            { key: "verdict", label: "Verdict", render: (r) => verdictBadge(r.verdict, { dry: r.dry_run }) },
            { key: "exit_code", label: "Exit", num: true },
            { key: "deciding_rule", label: "Deciding rule", render: (r) => h("span", { class: "rule-cell", title: r.deciding_rule || "" }, r.deciding_rule || "–") },
          ],
          { rows: runs, urlKey: "s_runs", defaultSort: "-id", rowKey: (r) => r.id, selected, onRowClick: (r) => setParams({ run: String(r.id) }), empty: "No gate runs yet. Press “Dry run now” above, or run `shadow gate` against this database.", testid: "runs" },
        ));
        drawRuns();
        const redraw = [drawRuns];
        if (!selected) {
          replace(reportHost, card(null, emptyState("No gate report to show.", "A dry run judges the evidence collected so far (paired windows, the decision audit, invariants) without changing the mode.")));
        } else {
          try {
            if (reportHost.dataset.run !== selected) replace(reportHost, loading("Loading the report…"));
            const report = await api.get(`/v1/gate/runs/${encodeURIComponent(selected)}`);
            if (my !== seq) return;
            const rowsHost = h("div");
            const drawRows = () => replace(rowsHost, table(metricColumns(), { rows: report.rows || [], urlKey: "s_metrics", rowKey: (r) => r.metric, rowClass: (r) => (r.dry_run ? "dim" : ""), empty: "The report has no metric rows.", testid: "metrics", cls: "metrics" }));
            drawRows();
            redraw.push(drawRows);
            reportHost.dataset.run = selected;
            replace(reportHost, card(`Report #${report.id}`, h("div", null, reportView(report), rowsHost)));
          } catch (error) {
            if (my !== seq) return;
            showError(error);
            delete reportHost.dataset.run;
            replace(reportHost, card(null, emptyState(`Could not load gate run ${selected}.`, "It may have been removed; pick another run from the list.")));
          }
        }
        last = { p, redraw };
        setReady("gate");
      },
      destroy() {
        seq++;
      },
    };
    return self;
  },
};
