// Decisions: the decision audit, filtered and sorted on the server, paginated; a row opens
// the frozen snapshot the incumbent saw, with every policy's choice and its F-score.
import { h, replace } from "../lib/dom.js";
import * as api from "../lib/api.js";
import * as fmt from "../lib/format.js";
import { policyColor, policyLabel } from "../lib/charts.js";
import { emptyState, loading, pageHeader, pager, pill, refreshButton, setReady, showError, workerBars } from "../lib/components.js";
import { numParam, params, setParams } from "../lib/state.js";
import { table } from "../lib/table.js";

const PAGE = 50;
const SERVER_SORT = new Set(["ts", "regret", "prompt_tokens", "latency_ms", "request_id", "policy", "incumbent_worker", "choice"]);
const DEFAULT_POLICIES = ["br0", "brh-survival"];
const FILTER_KEYS = ["disagreements_only", "policy", "worker", "min_regret", "since", "until"];

function columns(incumbent) {
  const cols = [
    { key: "ts", label: "Time", render: (r) => h("span", { class: "mono", title: fmt.dateTime(r.ts) }, fmt.time(r.ts)) },
    { key: "request_id", label: "Request", render: (r) => h("span", { class: "mono req-id" }, r.request_id) },
    { key: "prompt_tokens", colClass: "opt", label: "Prompt (tok)", num: true, render: (r) => fmt.int(r.prompt_tokens) },
    { key: "incumbent_worker", label: `${policyLabel(incumbent || "incumbent")} →`, title: "the worker the incumbent sent the request to", render: (r) => h("span", { class: "mono" }, r.incumbent_worker) },
    { key: "policy", label: "Policy", render: (r) => h("span", { class: "policy-cell" }, h("span", { class: "swatch", style: { background: policyColor(r.policy) } }), policyLabel(r.policy)) },
    { key: "choice", label: "Policy →", title: "the worker this policy would have chosen", render: (r) => h("span", { class: "mono" }, r.choice) },
    { key: "agrees", label: "Agrees", render: (r) => (r.agrees ? pill("agrees", "good") : pill("differs", "warn")) },
    { key: "f_br0_incumbent", colClass: "opt", label: "F inc.", title: "BR-0 F-score of the incumbent's choice", num: true, render: (r) => fmt.num(r.f_br0_incumbent, 0) },
    { key: "f_br0_choice", colClass: "opt", label: "F choice", title: "BR-0 F-score of this policy's choice", num: true, render: (r) => fmt.num(r.f_br0_choice, 0) },
    { key: "regret", label: "Regret", num: true, title: "BR-0 F-score regret of the incumbent's choice: f_br0_best − f_br0_incumbent", render: (r) => h("span", { class: r.regret > 0 ? "regret pos" : "regret" }, fmt.num(r.regret, 0)) },
    { key: "latency_ms", colClass: "opt", label: "Decide (ms)", num: true, render: (r) => fmt.ms3(r.latency_ms) },
  ];
  return cols.map((c) => ({ ...c, sortable: SERVER_SORT.has(c.key) }));
}

/** When the audit fell behind it audited an even sample: say so, with what it skipped. */
function sampleNote(audit) {
  if (!audit || !audit.skipped) return null;
  const seen = audit.audited + audit.skipped;
  const now = audit.stride > 1 ? `, now 1 in ${fmt.int(audit.stride)}` : ", every dispatch again now";
  return h("div", { class: "muted small", dataset: { testid: "audit-sample" } }, `A sample: the audit took ${fmt.int(audit.audited)} of ${fmt.int(seen)} dispatches since the service started (${fmt.int(audit.skipped)} skipped while it caught up${now}).`);
}

function detailView(d, close) {
  const snap = d.snapshot || {};
  const workers = snap.workers || [];
  const loads = snap.loads || [];
  const choices = d.choices || [];
  const fbr0 = Array.isArray(snap.f_br0) ? snap.f_br0 : null;
  const fbrh = Array.isArray(snap.f_brh) ? snap.f_brh : null;
  const marksFor = (w) => {
    const marks = [];
    if (String(d.incumbent_worker) === String(w)) marks.push({ text: `${policyLabel(d.incumbent_policy || "incumbent")} sent`, color: "#64748b", title: "where the incumbent sent the request" });
    for (const c of choices) if (String(c.choice) === String(w)) marks.push({ text: policyLabel(c.policy), color: policyColor(c.policy), title: `${c.policy} would have sent it here` });
    return marks;
  };
  const best0 = fbr0 ? Math.max(...fbr0.filter((v) => v != null)) : null;
  const bestH = fbrh ? Math.max(...fbrh.filter((v) => v != null)) : null;
  const regret = fmt.isNum(d.f_br0_best) && fmt.isNum(d.f_br0_incumbent) ? d.f_br0_best - d.f_br0_incumbent : null;
  const wrows = workers.map((w, i) => ({
    worker: w,
    load: loads[i],
    active: snap.active?.[i],
    capacity: snap.capacity?.[i],
    margin: snap.margins?.[i],
    f0: fbr0?.[i],
    fh: fbrh?.[i],
    by: marksFor(w),
  }));
  return h(
    "div",
    { class: "detail", dataset: { ingestId: d.ingest_id } },
    h("header", { class: "detail-head" },
      h("div", null, h("div", { class: "muted small" }, "Decision"), h("h2", { class: "mono req-id" }, d.request_id)),
      h("button", { type: "button", class: "btn icon", "aria-label": "Close", title: "Close", onclick: close }, "×"),
    ),
    h("div", { class: "kv" },
      h("div", null, h("span", { class: "muted" }, "Time "), fmt.dateTime(d.ts)),
      h("div", null, h("span", { class: "muted" }, "Prompt "), `${fmt.int(d.prompt_tokens)} tokens`),
      h("div", null, h("span", { class: "muted" }, "Ingest id "), String(d.ingest_id)),
      h("div", null, h("span", { class: "muted" }, "BR-0 regret "), regret === null ? "–" : fmt.num(regret, 0)),
    ),
    h("div", { class: "choice-chips" },
      h("div", { class: "choice-chip", style: { "--chip": "#64748b" } }, h("span", { class: "muted small" }, `${policyLabel(d.incumbent_policy || "incumbent")} (incumbent) sent to`), h("strong", { class: "mono" }, d.incumbent_worker), h("span", { class: "small" }, `F BR-0 ${fmt.num(d.f_br0_incumbent, 0)} · F BR-H ${fmt.num(d.f_brh_incumbent, 0)}`)),
      choices.map((c) => h("div", { class: ["choice-chip", c.agrees ? "agrees" : "differs"], style: { "--chip": policyColor(c.policy) }, dataset: { policy: c.policy } }, h("span", { class: "muted small" }, `${policyLabel(c.policy)} would send to`), h("strong", { class: "mono" }, c.choice), h("span", { class: "small" }, `F BR-0 ${fmt.num(c.f_br0_choice, 0)} · F BR-H ${fmt.num(c.f_brh_choice, 0)} · ${fmt.ms3(c.latency_ms)} ms`))),
    ),
    h("h3", { class: "sub" }, "KV load per worker at dispatch (tokens)"),
    workers.length
      ? workerBars(wrows.map((r) => ({ worker: r.worker, value: r.load, label: fmt.int(r.load), sub: r.active != null ? `${r.active}/${r.capacity ?? "?"}` : undefined, marks: r.by })), { testid: "decision" })
      : emptyState("This decision has no stored snapshot."),
    h("h3", { class: "sub" }, "Margins and F-scores per worker"),
    table(
      [
        { key: "worker", label: "Worker", render: (r) => h("span", { class: "mono" }, r.worker) },
        { key: "load", label: "Load (tok)", num: true, render: (r) => fmt.int(r.load) },
        { key: "margin", label: "Margin (tok)", num: true, render: (r) => fmt.int(r.margin) },
        { key: "f0", label: "F BR-0", num: true, cls: (r) => (r.f0 != null && r.f0 === best0 ? "best" : ""), render: (r) => fmt.num(r.f0, 0) },
        { key: "fh", label: "F BR-H", num: true, cls: (r) => (r.fh != null && r.fh === bestH ? "best" : ""), render: (r) => (fbrh ? fmt.num(r.fh, 0) : "not recorded") },
        { key: "by", label: "Chosen by", value: (r) => r.by.length, render: (r) => r.by.map((m) => h("span", { class: "mark", style: { "--mark": m.color } }, m.text)) },
      ],
      { rows: wrows, urlKey: "s_dw", rowKey: (r) => r.worker, empty: "No worker in this snapshot.", testid: "decision-workers", cls: "compact" },
    ),
    h("p", { class: "muted small" }, `Best F: BR-0 ${fmt.num(d.f_br0_best, 0)}, BR-H ${fmt.num(d.f_brh_best, 0)}. Bold cells are the best worker for that score. The margin is the room a worker has below the barrier-setting load.`),
  );
}

export default {
  name: "decisions",
  mount(ctx) {
    let seq = 0;
    let dseq = 0;
    let workers = null;
    let policies = new Set(DEFAULT_POLICIES);
    let lastList = null; // the list query last drawn (to skip refetching when only the detail changes)
    let lastPage = null;
    const filters = h("form", { class: "filters", onsubmit: (e) => e.preventDefault() });
    const summary = h("div", { class: "list-head" });
    const list = h("div", { class: "list" });
    const detail = h("aside", { class: "detail-pane", hidden: true, "aria-label": "Decision detail" });
    const split = h("div", { class: "split" }, h("div", { class: "split-main" }, summary, list), detail);
    replace(ctx.root, pageHeader("Decisions", "Every dispatch of the incumbent, audited against what BR-0 and BR-H would have chosen on the same snapshot.", refreshButton(() => {
      lastList = null;
      lastPage = null;
      self.update(params()).catch(showError);
    })), filters, split);

    const anchorNow = () => ctx.info?.last_event_ts || Date.now() / 1000;

    function renderFilters(p) {
      const set = (patch) => setParams({ ...patch, offset: null });
      const pol = h("select", { name: "policy", "aria-label": "Policy", onchange: (e) => set({ policy: e.target.value || null }) }, h("option", { value: "" }, "All policies"), [...new Set([...policies, ...(p.policy ? [p.policy] : [])])].sort().map((x) => h("option", { value: x, selected: x === p.policy }, policyLabel(x))));
      const wk = h("select", { name: "worker", "aria-label": "Worker", onchange: (e) => set({ worker: e.target.value || null }) }, h("option", { value: "" }, "All workers"), [...new Set([...(workers || []), ...(p.worker ? [p.worker] : [])])].map((x) => h("option", { value: x, selected: x === p.worker }, `worker ${x}`)));
      const regret = h("input", { type: "number", name: "min_regret", min: "0", step: "any", placeholder: "0", value: p.min_regret || "", "aria-label": "Minimum regret", onchange: (e) => set({ min_regret: e.target.value || null }) });
      const since = h("input", { type: "datetime-local", step: "1", name: "since", value: fmt.toLocalInput(numParam(p, "since")), "aria-label": "Since", onchange: (e) => set({ since: fmt.fromLocalInput(e.target.value)?.toFixed(3) ?? null }) });
      const until = h("input", { type: "datetime-local", step: "1", name: "until", value: fmt.toLocalInput(numParam(p, "until")), "aria-label": "Until", onchange: (e) => set({ until: fmt.fromLocalInput(e.target.value)?.toFixed(3) ?? null }) });
      const quick = (s) => set({ since: (anchorNow() - s).toFixed(3), until: null });
      replace(
        filters,
        h("label", { class: "check" }, h("input", { type: "checkbox", name: "disagreements_only", checked: p.disagreements_only === "true", onchange: (e) => set({ disagreements_only: e.target.checked ? "true" : null }) }), "Disagreements only"),
        h("label", { class: "field" }, h("span", null, "Policy"), pol),
        h("label", { class: "field" }, h("span", null, "Worker"), wk),
        h("label", { class: "field" }, h("span", null, "Regret ≥"), regret),
        h("div", { class: "seg" }, h("label", { class: "field" }, h("span", null, "From"), since), h("label", { class: "field" }, h("span", null, "to"), until)),
        h("div", { class: "seg" }, [["1 min", 60], ["5 min", 300], ["1 h", 3600]].map(([label, s]) => h("button", { type: "button", class: "btn", onclick: () => quick(s) }, `Last ${label}`))),
        h("button", { type: "button", class: "btn ghost", disabled: !FILTER_KEYS.some((k) => p[k]), onclick: () => setParams({ ...Object.fromEntries(FILTER_KEYS.map((k) => [k, null])), offset: null }) }, "Clear filters"),
      );
    }

    async function loadList(p) {
      const my = ++seq;
      const limit = Math.min(1000, numParam(p, "limit", PAGE));
      const offset = numParam(p, "offset", 0);
      const sort = p.sort && SERVER_SORT.has(p.sort) ? p.sort : "ts";
      const order = p.order === "asc" ? "asc" : "desc";
      const query = { fleet: ctx.fleet, limit, offset, sort, order, snapshot: "false" };
      for (const k of FILTER_KEYS) if (p[k]) query[k] = p[k];
      const key = JSON.stringify(query);
      if (key === lastList && lastPage) return lastPage;
      if (!list.querySelector("table")) replace(list, loading("Loading decisions…"));
      else list.classList.add("stale");
      const { fleet, ...q } = query;
      const page = await api.get(api.fleetPath(fleet, "decisions"), q);
      if (my !== seq) return null;
      list.classList.remove("stale");
      lastList = key;
      lastPage = page;
      for (const it of page.items) policies.add(it.policy);
      const anyFilter = FILTER_KEYS.some((k) => p[k]);
      replace(
        summary,
        h("div", { class: "list-count", dataset: { total: page.total } }, h("strong", null, fmt.int(page.total)), page.total === 1 ? " decision" : " decisions", anyFilter ? " match the filters" : " audited"),
        sampleNote(ctx.info?.audit),
        pager({ total: page.total, limit, offset, onPage: (o) => setParams({ offset: o || null }) }),
      );
      const empty = anyFilter ? "No decision matches these filters. Clear a filter or widen the time range." : "No decisions audited yet. Every dispatch the incumbent makes is audited within a second; start traffic or POST dispatch events to /v1/events.";
      replace(
        list,
        table(columns(ctx.info?.incumbent), {
          rows: page.items,
          sort: { key: sort, dir: order },
          onSort: (k, dir) => setParams({ sort: k, order: dir, offset: null }),
          onRowClick: (r) => setParams({ decision: String(r.ingest_id) }),
          rowKey: (r) => `${r.ingest_id}:${r.policy}`,
          selected: null,
          rowClass: (r) => (p.decision && String(r.ingest_id) === p.decision ? "selected" : r.agrees ? "" : "disagree"),
          dataset: (r) => ({ ingestId: r.ingest_id, policy: r.policy }),
          empty,
          testid: "decisions",
        }),
      );
      return page;
    }

    function markSelected(p) {
      for (const tr of list.querySelectorAll("tbody tr")) {
        const on = p.decision && tr.dataset.ingestId === p.decision;
        tr.classList.toggle("selected", Boolean(on));
      }
    }

    async function loadDetail(p) {
      const my = ++dseq;
      if (!p.decision) {
        detail.hidden = true;
        split.classList.remove("with-detail");
        replace(detail);
        return;
      }
      detail.hidden = false;
      split.classList.add("with-detail");
      if (detail.dataset.open !== p.decision) replace(detail, loading("Loading the snapshot…"));
      try {
        const d = await api.get(api.fleetPath(ctx.fleet, "decisions", p.decision));
        if (my !== dseq) return;
        detail.dataset.open = p.decision;
        replace(detail, detailView(d, () => setParams({ decision: null })));
      } catch (error) {
        if (my !== dseq) return;
        showError(error);
        delete detail.dataset.open;
        replace(detail, emptyState("Could not load this decision.", "It may belong to another fleet, or the id in the address is wrong."));
      }
    }

    const self = {
      async update(p) {
        delete document.body.dataset.ready;
        if (workers === null) {
          try {
            const snap = await api.get(api.fleetPath(ctx.fleet, "snapshot"));
            workers = snap.workers.map((w) => w.worker);
          } catch (error) {
            workers = [];
            showError(error);
          }
        }
        try {
          const [page] = await Promise.all([loadList(p), loadDetail(p)]);
          if (page === null) return; // superseded by a newer query
          renderFilters(p);
          markSelected(p);
        } catch (error) {
          showError(error);
          renderFilters(p);
          replace(list, emptyState("Could not load the decisions.", "The error is shown above; check the filters in the address bar."));
        }
        setReady("decisions");
      },
      destroy() {
        seq++;
        dseq++;
      },
    };
    return self;
  },
};
