// The JSON API (docs/UI.md). GETs only, except `post` (the gate dry run).
import { h, qs } from "./dom.js";

const TOKEN_KEY = "shadow-token";

/** The bearer token the user gave this tab (services with tokens configured only). */
function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { authorization: `Bearer ${token}` } : {};
}

/** A 401: ask once for a token, keep it for this tab only, and reload. */
function askForToken(message) {
  const el = document.getElementById("banner");
  if (!el || el.querySelector(".token-form")) return;
  const input = h("input", { type: "password", placeholder: "bearer token", autocomplete: "off" });
  const form = h(
    "form",
    { class: "token-form" },
    h("strong", null, "This service needs a token. "),
    h("span", null, message),
    " ",
    input,
    h("button", { type: "submit" }, "Use token"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    location.reload();
  });
  el.prepend(form);
}

export class ApiError extends Error {
  constructor(status, message, path) {
    super(message);
    this.status = status;
    this.path = path;
  }
}

async function decode(response, path) {
  const type = response.headers.get("content-type") || "";
  let body = null;
  if (type.includes("json")) {
    try {
      body = await response.json();
    } catch {
      body = null;
    }
  } else {
    body = await response.text().catch(() => "");
  }
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    askForToken(body && typeof body === "object" ? String(body.detail || "") : "");
  }
  if (!response.ok) {
    let detail = body && typeof body === "object" ? body.detail : body;
    if (Array.isArray(detail)) {
      detail = detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
    } else if (detail && typeof detail === "object") {
      detail = JSON.stringify(detail);
    }
    throw new ApiError(response.status, `${response.status} ${response.statusText || ""} ${path}: ${detail || "request failed"}`.replace(/\s+/g, " "), path);
  }
  return body;
}

/** GET /v1/... with query params; throws ApiError with the server's detail as text. */
export async function get(path, params, { signal } = {}) {
  const url = path + qs(params);
  const response = await fetch(url, { signal, headers: { accept: "application/json", ...authHeaders() } });
  return decode(response, path);
}

export async function post(path, body, { signal } = {}) {
  const response = await fetch(path, {
    method: "POST",
    signal,
    headers: { "content-type": "application/json", accept: "application/json", ...authHeaders() },
    body: JSON.stringify(body),
  });
  return decode(response, path);
}

/** The path of a fleet's resource, each segment URL-encoded. */
export function fleetPath(fleet, ...rest) {
  return ["/v1/fleets", fleet, ...rest].map((s, i) => (i === 0 ? s : encodeURIComponent(String(s)))).join("/");
}

/** Every item of a paginated list (oldest-first lists such as /windows), up to `max`. */
export async function getAll(path, params, { signal, pageSize = 1000, max = 20000 } = {}) {
  const items = [];
  let offset = 0;
  for (;;) {
    const page = await get(path, { ...params, limit: pageSize, offset }, { signal });
    items.push(...page.items);
    offset += page.items.length;
    if (!page.items.length || offset >= page.total || items.length >= max) return { total: page.total, items };
  }
}
