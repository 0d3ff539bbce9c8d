// Sortable tables. Client-side sorting for small tables (state in the URL under `urlKey`),
// server-side for the decision audit (the page passes `onSort`).
import { h } from "./dom.js";
import { params, setParams } from "./state.js";

/** "-ratio" -> {key: "ratio", dir: "desc"} */
export function parseSort(value, fallback) {
  const v = value || fallback || "";
  if (!v) return { key: null, dir: "asc" };
  return v.startsWith("-") ? { key: v.slice(1), dir: "desc" } : { key: v, dir: "asc" };
}

function compare(a, b) {
  const na = a === null || a === undefined || (typeof a === "number" && Number.isNaN(a));
  const nb = b === null || b === undefined || (typeof b === "number" && Number.isNaN(b));
  if (na && nb) return 0;
  if (na) return 1; // missing values last either way
  if (nb) return -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "boolean" && typeof b === "boolean") return Number(a) - Number(b);
  return String(a).localeCompare(String(b), "en", { numeric: true });
}

/**
 * columns: [{key, label, num (right-aligned), value(row) (sort value), render(row) (node or
 * text), sortable (default true), title, cls(row), colClass (th and td)}]
 * opts: {rows, urlKey, defaultSort ("-ts"), sort ({key, dir}: server-side current),
 * onSort(key, dir) (server-side), onRowClick(row), rowKey(row), selected, empty, caption,
 * rowClass(row), dataset(row)}
 */
export function table(columns, opts) {
  const { rows, urlKey = null, defaultSort = null, onSort = null, onRowClick = null,
    rowKey = null, selected = null, empty = "Nothing to show.", rowClass = null, dataset = null,
    testid = null, cls = null } = opts;
  const sort = opts.sort || parseSort(urlKey ? params()[urlKey] : null, defaultSort);
  let sorted = rows;
  if (!onSort && sort.key) {
    const col = columns.find((c) => c.key === sort.key);
    if (col) {
      const val = col.value || ((r) => r[col.key]);
      sorted = rows
        .map((r, i) => [r, i])
        .sort((x, y) => {
          const c = compare(val(x[0]), val(y[0]));
          const missing = val(x[0]) == null || val(y[0]) == null;
          return (missing ? c : sort.dir === "desc" ? -c : c) || x[1] - y[1];
        })
        .map((x) => x[0]);
    }
  }
  const clickSort = (col) => {
    const dir = sort.key === col.key ? (sort.dir === "asc" ? "desc" : "asc") : col.num ? "desc" : "asc";
    if (onSort) onSort(col.key, dir);
    else if (urlKey) setParams({ [urlKey]: dir === "desc" ? `-${col.key}` : col.key }, { replace: false });
  };
  const head = h(
    "tr",
    null,
    columns.map((col) => {
      const sortable = col.sortable !== false && (onSort || urlKey);
      const active = sort.key === col.key;
      return h(
        "th",
        {
          class: [col.num ? "num" : "", sortable ? "sortable" : "", active ? "sorted" : "", col.colClass || ""],
          scope: "col",
          title: col.title || null,
          "aria-sort": active ? (sort.dir === "asc" ? "ascending" : "descending") : sortable ? "none" : null,
          dataset: { key: col.key },
        },
        sortable
          ? h("button", { type: "button", class: "th-btn", onclick: () => clickSort(col) }, col.label, h("span", { class: "sort-ind", "aria-hidden": "true" }, active ? (sort.dir === "asc" ? "▲" : "▼") : "↕"))
          : col.label,
      );
    }),
  );
  const body = h("tbody");
  if (!sorted.length) {
    body.append(h("tr", { class: "empty-row" }, h("td", { colspan: columns.length }, empty)));
  }
  for (const row of sorted) {
    const key = rowKey ? String(rowKey(row)) : null;
    const tr = h(
      "tr",
      {
        class: [onRowClick ? "clickable" : "", selected !== null && key === String(selected) ? "selected" : "", rowClass ? rowClass(row) : ""],
        tabindex: onRowClick ? "0" : null,
        dataset: { ...(key !== null ? { key } : {}), ...(dataset ? dataset(row) : {}) },
        onclick: onRowClick ? (e) => {
          if (e.target.closest("a, button, input, label")) return;
          onRowClick(row);
        } : null,
        onkeydown: onRowClick ? (e) => {
          if (e.key === "Enter" || e.key === " ") {
            e.preventDefault();
            onRowClick(row);
          }
        } : null,
      },
      columns.map((col) => {
        const content = col.render ? col.render(row) : row[col.key];
        return h("td", { class: [col.num ? "num" : "", col.colClass || "", col.cls ? col.cls(row) : ""], dataset: { col: col.key } }, content === null || content === undefined ? "–" : content);
      }),
    );
    body.append(tr);
  }
  return h("div", { class: "table-wrap", dataset: testid ? { table: testid } : null }, h("table", { class: ["data", cls || ""] }, h("thead", null, head), body));
}
