// Building DOM safely: every piece of data becomes a text node or a checked attribute.
// Never innerHTML / insertAdjacentHTML / outerHTML anywhere in this UI.

const SVG_NS = "http://www.w3.org/2000/svg";

// Attributes that may carry data. Everything else (notably on* and style strings) is refused.
const SAFE_ATTRS = new Set([
  "id", "class", "title", "role", "type", "name", "for", "placeholder", "min", "max", "step",
  "colspan", "rowspan", "tabindex", "scope", "lang", "dir", "width", "height", "x", "y",
  "x1", "x2", "y1", "y2", "rx", "ry", "viewBox", "fill", "stroke", "stroke-width",
  "autocomplete", "inputmode", "size", "maxlength", "hidden", "open", "for", "list",
  "preserveAspectRatio", "transform", "d", "cx", "cy", "r", "text-anchor", "stroke-linecap",
  "stroke-linejoin",
]);
const PROPS = new Set(["value", "checked", "disabled", "selected", "multiple", "required"]);

/** An internal link target: a path on this origin (or a query/fragment), nothing else. */
export function safeHref(href) {
  const s = String(href);
  if (/^\/(?!\/)/.test(s) || s.startsWith("?") || s.startsWith("#")) return s;
  throw new Error(`refusing href ${JSON.stringify(s)}`);
}

/**
 * h("div", {class: "x", dataset: {worker: w}, onclick: fn}, "text", child, [more]) —
 * strings become text nodes; functions under on* become event listeners (never attributes).
 */
export function h(tag, attrs, ...children) {
  const svg = tag.startsWith("svg:");
  const el = svg ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) {
        if (typeof value !== "function") throw new Error(`handler ${key} must be a function`);
        el.addEventListener(key.slice(2).toLowerCase(), value);
      } else if (key === "class") {
        if (svg) el.setAttribute("class", String(value));
        else el.className = Array.isArray(value) ? value.filter(Boolean).join(" ") : String(value);
      } else if (key === "dataset") {
        for (const [k, v] of Object.entries(value)) if (v !== null && v !== undefined) el.dataset[k] = String(v);
      } else if (key === "style") {
        // CSSOM only (allowed by the CSP): {width: "10px", "--bar": "40%"}.
        for (const [k, v] of Object.entries(value)) {
          if (v === null || v === undefined) continue;
          if (k.startsWith("--")) el.style.setProperty(k, String(v));
          else el.style[k] = String(v);
        }
      } else if (key === "href") {
        el.setAttribute("href", safeHref(value));
      } else if (PROPS.has(key)) {
        el[key] = value;
      } else if (key.startsWith("aria-") || SAFE_ATTRS.has(key)) {
        el.setAttribute(key, value === true ? "" : String(value));
      } else {
        throw new Error(`attribute ${key} is not on the allow-list`);
      }
    }
  }
  append(el, children);
  return el;
}

/** Append children: strings/numbers as text, arrays flattened, null/false skipped. */
export function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false || child === true) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.append(child);
    else el.append(document.createTextNode(String(child)));
  }
  return el;
}

/** Replace all children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A query string from an object (null/undefined/"" dropped), values URL-encoded. */
export function qs(params) {
  const out = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v === null || v === undefined || v === "" || v === false) continue;
    out.set(k, Array.isArray(v) ? v.join(",") : String(v));
  }
  const s = out.toString();
  return s ? `?${s}` : "";
}

/** Internal link that the router handles without a reload. */
export function navLink(path, params, ...children) {
  return h("a", { href: path + qs(params), dataset: { nav: "" } }, ...children);
}

export function svgEl(tag, attrs, ...children) {
  return h(`svg:${tag}`, attrs, ...children);
}
