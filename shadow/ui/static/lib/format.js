// Number and time formatting, one place, so every page agrees.

export const DASH = "–";

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

const pad = (n) => String(n).padStart(2, "0");

/** Local wall-clock time HH:MM:SS of a Unix time in seconds. */
export function time(ts) {
  if (!isNum(ts)) return DASH;
  const d = new Date(ts * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Local date and time YYYY-MM-DD HH:MM:SS. */
export function dateTime(ts) {
  if (!isNum(ts)) return DASH;
  const d = new Date(ts * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time(ts)}`;
}

/** The value of a <input type=datetime-local step=1> for a Unix time, and back. */
export function toLocalInput(ts) {
  if (!isNum(ts)) return "";
  return dateTime(ts).replace(" ", "T");
}
export function fromLocalInput(value) {
  if (!value) return null;
  const ms = new Date(value).getTime();
  return Number.isFinite(ms) ? ms / 1000 : null;
}

/** A naive-UTC ISO string (replay runs' created_at) as a local date-time. */
export function isoDateTime(iso) {
  if (!iso) return DASH;
  const s = /[zZ]|[+-]\d\d:?\d\d$/.test(iso) ? iso : `${iso}Z`;
  const ms = Date.parse(s);
  return Number.isFinite(ms) ? dateTime(ms / 1000) : String(iso);
}

export function ms(v) {
  return isNum(v) ? v.toFixed(1) : DASH;
}
export function ms3(v) {
  return isNum(v) ? (Math.abs(v) < 1 ? v.toFixed(3) : v.toFixed(1)) : DASH;
}
export function ratio(v) {
  return isNum(v) ? v.toFixed(3) : DASH;
}
export function ci(lo, hi) {
  return isNum(lo) && isNum(hi) ? `[${lo.toFixed(3)}, ${hi.toFixed(3)}]` : DASH;
}
export function int(v) {
  return isNum(v) ? Math.round(v).toLocaleString("en-US") : DASH;
}
export function num(v, digits = 1) {
  return isNum(v) ? v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits }) : DASH;
}
/** Compact token counts for axes and bars: 950, 12.3k, 1.2M. */
export function tokens(v) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(a >= 1e7 ? 0 : 1)}M`;
  if (a >= 1e4) return `${(v / 1e3).toFixed(0)}k`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return String(Math.round(v));
}
export function seconds(v) {
  if (!isNum(v)) return DASH;
  if (v < 1) return `${(v * 1000).toFixed(0)} ms`;
  if (v < 120) return `${v.toFixed(1)} s`;
  if (v < 7200) return `${(v / 60).toFixed(1)} min`;
  return `${(v / 3600).toFixed(1)} h`;
}
export function pct(v) {
  return isNum(v) ? `${(v * 100).toFixed(1)}%` : DASH;
}
/** "2.5 s ago" relative to `now` (seconds). */
export function ago(ts, now) {
  if (!isNum(ts) || !isNum(now)) return DASH;
  const d = Math.max(0, now - ts);
  return `${seconds(d)} ago`;
}

export { isNum };
