// The single-page app: navigation, fleet selector, URL-driven routing to the seven pages.
import { h, qs, replace, svgEl } from "./lib/dom.js";
import * as api from "./lib/api.js";
import { params, navigate, onChange } from "./lib/state.js";
import { clearErrors, emptyState, loading, modeBadge, setReady, showError } from "./lib/components.js";
import overview from "./pages/overview.js";
import compare from "./pages/compare.js";
import decisions from "./pages/decisions.js";
import integrity from "./pages/integrity.js";
import gate from "./pages/gate.js";
import replays from "./pages/replays.js";
import sweeps from "./pages/sweeps.js";

const PAGES = [
  { path: "/", page: overview, label: "Overview", icon: "M2 2h5v5H2zM9 2h5v5H9zM2 9h5v5H2zM9 9h5v5H9z" },
  { path: "/compare", page: compare, label: "Compare", icon: "M2 2v12h12M4.5 11l3-4 2.5 2 4-5.5" },
  { path: "/decisions", page: decisions, label: "Decisions", icon: "M2 8h4.5M6.5 8l6-4.5M6.5 8l6 4.5M10.5 2.5h2.5v2.5M10.5 13.5h2.5V11" },
  { path: "/integrity", page: integrity, label: "Integrity", icon: "M8 1.5l5.5 2v4.2c0 3.1-2.3 5.5-5.5 6.8-3.2-1.3-5.5-3.7-5.5-6.8V3.5zM5.5 8l1.8 1.8 3.4-3.6" },
  { path: "/gate", page: gate, label: "Gate", icon: "M2.5 14V5.5L8 2l5.5 3.5V14M1.5 14h13M6 14v-4.5h4V14" },
  { path: "/replays", page: replays, label: "Replays", icon: "M13.5 8A5.5 5.5 0 1 1 11.9 4.1M13.5 1.8v3.4h-3.4" },
  { path: "/sweeps", page: sweeps, label: "Sweeps", icon: "M2 2h12v12H2zM2 6h12M2 10h12M6 2v12M10 2v12" },
];

function icon(d) {
  return svgEl("svg", { class: "nav-icon", viewBox: "0 0 16 16", width: "16", height: "16", fill: "none", stroke: "currentColor", "stroke-width": "1.5", "stroke-linecap": "round", "stroke-linejoin": "round", "aria-hidden": "true" }, svgEl("path", { d }));
}
// Pages that do not need a fleet to exist.
const FLEETLESS = new Set(["replays", "sweeps"]);

const app = {
  fleets: null,
  current: null, // {entry, fleet, instance}
};

function pageFor(pathname) {
  const path = pathname.replace(/\/+$/, "") || "/";
  return PAGES.find((p) => p.path === path) || PAGES[0];
}

function renderNav(entry, fleet) {
  const nav = document.getElementById("nav");
  replace(
    nav,
    PAGES.map((p) =>
      h(
        "li",
        null,
        h(
          "a",
          {
            href: p.path + qs({ fleet }),
            dataset: { nav: "", page: p.page.name },
            class: p === entry ? "active" : null,
            "aria-current": p === entry ? "page" : null,
          },
          icon(p.icon),
          p.label,
        ),
      ),
    ),
  );
  const select = document.getElementById("fleet-select");
  const names = (app.fleets || []).map((f) => f.fleet);
  if (fleet && !names.includes(fleet)) names.push(fleet);
  replace(select, names.length ? names.map((n) => h("option", { value: n, selected: n === fleet }, n)) : h("option", { value: "" }, "no fleet"));
  select.disabled = !names.length;
  const foot = document.getElementById("sidebar-foot");
  const info = (app.fleets || []).find((f) => f.fleet === fleet);
  replace(
    foot,
    info
      ? h("div", { class: "foot-fleet" }, h("div", { class: "foot-row" }, h("span", { class: "muted" }, "Mode"), modeBadge(info.mode)), h("div", { class: "foot-row" }, h("span", { class: "muted" }, "Incumbent"), h("span", null, info.incumbent || "–")), h("div", { class: "foot-row" }, h("span", { class: "muted" }, "Workers"), h("span", null, String(info.workers ?? "–"))))
      : null,
    h("a", { class: "foot-link", href: "/openapi.json", title: "The JSON API this UI reads (docs/UI.md)" }, "OpenAPI schema ↗"),
  );
}

async function loadFleets() {
  try {
    app.fleets = await api.get("/v1/fleets");
  } catch (error) {
    app.fleets = app.fleets || [];
    showError(error);
  }
  return app.fleets;
}

async function route() {
  const entry = pageFor(location.pathname);
  const p = params();
  if (app.fleets === null) await loadFleets();
  let fleet = p.fleet || null;
  if (!fleet && app.fleets.length) {
    fleet = app.fleets[0].fleet;
    history.replaceState(null, "", location.pathname + qs({ ...p, fleet }));
  }
  renderNav(entry, fleet);
  const cur = app.current;
  if (cur && cur.entry === entry && cur.fleet === fleet && cur.instance.update) {
    try {
      await cur.instance.update(params());
    } catch (error) {
      showError(error);
    }
    return;
  }
  if (cur) cur.instance.destroy?.();
  clearErrors();
  delete document.body.dataset.ready;
  document.body.dataset.page = entry.page.name;
  document.title = `${entry.label} · balanceroute-shadow`;
  const root = document.getElementById("page");
  replace(root, loading());
  if (!fleet && !FLEETLESS.has(entry.page.name) && entry.page.name !== "overview") {
    replace(root, emptyState("No fleet yet.", "The service has not received any event. Start it with `shadow serve --demo`, or POST the router's events to /v1/events."));
    setReady(entry.page.name);
    app.current = { entry, fleet, instance: { destroy() {} } };
    return;
  }
  const ctx = { root, fleet, fleets: app.fleets, info: (app.fleets || []).find((f) => f.fleet === fleet) || null, refreshFleets: loadFleets };
  const instance = entry.page.mount(ctx);
  app.current = { entry, fleet, instance };
  try {
    await instance.update?.(params());
  } catch (error) {
    showError(error);
  }
}

// Internal links navigate without a reload (modifier keys keep the browser's behaviour).
document.addEventListener("click", (event) => {
  const a = event.target.closest("a[data-nav]");
  if (!a || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin) return;
  event.preventDefault();
  navigate(url.pathname, Object.fromEntries(url.searchParams));
});

document.getElementById("fleet-select").addEventListener("change", (event) => {
  navigate(location.pathname, { fleet: event.target.value });
});

window.addEventListener("unhandledrejection", (event) => {
  if (event.reason && event.reason.name === "AbortError") return;
  showError(event.reason);
});

onChange(route);
// Keep the sidebar's fleet list (mode, workers) fresh.
setInterval(async () => {
  await loadFleets();
  if (app.current) renderNav(app.current.entry, app.current.fleet);
}, 10000);
route();
