// The Runs list's filter box: a `where` expression (adam.lr = 0.01 and metric.val_loss <
// 0.1), the grammar the API, the CLI and the client read. While a key is typed it offers
// the keys that exist (GET /api/runs/keys), by the keyboard (arrows, Enter or Tab,
// Escape) or a click; Enter applies the expression. A malformed one is said as the server
// says it, with the text marked where the fault is and the caret put there.

import { api, el } from "./util.js";

const SHOWN = 12;  // suggestions at once
const KEYS_FRESH_MS = 10_000;  // the keys are read again on focus after this long
const KEY_CHARS = /[A-Za-z0-9_.:/`-]/;

let keys = [];  // [{key, runs}]
let keysAt = 0;
let active = -1;
let offered = [];
let input = null;
let list = null;

// The reply as a list of {key, runs}: each key as a where names it, and how many runs
// have it where the server counts them.
function keyList(reply) {
  const rows = Array.isArray(reply) ? reply : reply.keys || [];
  return rows.map((row) => (typeof row === "string" ? { key: row, runs: null }
    : { key: row.key ?? row.name, runs: row.runs ?? row.count ?? null, kind: row.kind ?? null })).filter((row) => row.key);
}

export async function loadKeys(force = false) {
  if (!force && Date.now() - keysAt < KEYS_FRESH_MS) return keys;
  keysAt = Date.now();
  try {
    keys = keyList(await api("GET", "/api/runs/keys"));
  } catch {
    keysAt = 0;  // asked again at the next focus; the box works without suggestions
  }
  return keys;
}

export function knownKeys() {
  return keys;
}

// The key being typed at the caret, when the caret is where a key goes: at the start,
// after "(", "and" or "or" (not in a value, after an operator, a comma or "in (").
function tokenAtCaret() {
  const text = input.value;
  const end = input.selectionStart ?? text.length;
  let start = end;
  while (start > 0 && KEY_CHARS.test(text[start - 1])) start -= 1;
  const before = text.slice(0, start).trimEnd();
  const keyPlace = before === "" || (before.endsWith("(") && !/\bin\s*\($/i.test(before))
    || /(^|[\s)])(and|or)$/i.test(before);
  if (!keyPlace || (text.slice(0, start).match(/['"]/g) || []).length % 2) return null;  // inside quotes: a value
  return { start, end, typed: text.slice(start, end) };
}

function close() {
  offered = [];
  active = -1;
  list.hidden = true;
  list.replaceChildren();
  input.setAttribute("aria-expanded", "false");
  input.removeAttribute("aria-activedescendant");
}

function suggest() {
  const token = tokenAtCaret();
  if (!token || !keys.length) return close();
  const typed = token.typed.toLowerCase();
  const starts = keys.filter((k) => k.key.toLowerCase().startsWith(typed));
  const inside = typed ? keys.filter((k) => !k.key.toLowerCase().startsWith(typed) && k.key.toLowerCase().includes(typed)) : [];
  offered = [...starts, ...inside].filter((k) => k.key !== token.typed).slice(0, SHOWN);
  if (!offered.length) return close();
  active = Math.min(active, offered.length - 1);
  list.replaceChildren(...offered.map((k, i) => el("li", { role: "option", id: `where-key-${i}`, "data-key": k.key,
    "aria-selected": String(i === active), class: i === active ? "active" : null,
    onmousedown: (event) => { event.preventDefault(); take(i); } },
  k.key, k.runs === null || k.runs === undefined ? "" : el("span", { class: "muted" }, ` ${k.runs} run${k.runs === 1 ? "" : "s"}`))));
  list.hidden = false;
  input.setAttribute("aria-expanded", "true");
  if (active >= 0) input.setAttribute("aria-activedescendant", `where-key-${active}`);
  else input.removeAttribute("aria-activedescendant");
}

// The offered key in place of what was typed of it, the caret after it and a space.
function take(i) {
  const token = tokenAtCaret();
  if (!token) return close();
  const { key } = offered[i];
  const rest = input.value.slice(token.end);
  input.value = `${input.value.slice(0, token.start)}${key} ${rest.trimStart()}`;
  const caret = token.start + key.length + 1;
  input.setSelectionRange(caret, caret);
  close();
}

function move(by) {
  if (!offered.length) return;
  active = (active + by + offered.length) % offered.length;
  suggest();
}

// ``apply(text)``: the expression Enter (or emptying the box) applies.
export function initWhereBox(apply) {
  input = document.getElementById("run-where");
  list = document.getElementById("where-suggestions");
  input.addEventListener("focus", () => { loadKeys().then(() => { if (document.activeElement === input) suggest(); }); });
  input.addEventListener("input", () => {
    active = -1;
    suggest();
    if (!input.value.trim()) apply("");  // emptied (the box's own ×, or deleted): no filter
  });
  input.addEventListener("click", suggest);
  input.addEventListener("blur", close);
  input.addEventListener("keydown", (event) => {
    if (event.key === "ArrowDown") { event.preventDefault(); move(1); }
    else if (event.key === "ArrowUp") { event.preventDefault(); move(-1); }
    else if (event.key === "Escape" && offered.length) { event.preventDefault(); close(); }
    else if ((event.key === "Enter" || event.key === "Tab") && active >= 0) { event.preventDefault(); take(active); }
    else if (event.key === "Enter") { event.preventDefault(); close(); apply(input.value.trim()); }
  });
}

export function showWhere(text) {
  if (input && document.activeElement !== input) input.value = text;
}

// The server's word on a malformed expression (or an unknown key): its message, and the
// text with the fault marked. ``offset`` counts characters as Python does (code points).
export function whereError(error, text) {
  const box = document.getElementById("where-error");
  if (!error) {
    box.hidden = true;
    box.replaceChildren();
    input.removeAttribute("aria-invalid");
    return;
  }
  const detail = error.error || {};
  const chars = Array.from(text);
  const at = Math.max(0, Math.min(chars.length, Number.isInteger(detail.offset) ? detail.offset : chars.length));
  // The fault: the unknown key, else what stands at the offset up to the next space.
  let size = detail.key ? Array.from(detail.key).length : 0;
  while (!detail.key && at + size < chars.length && size < 12 && !/\s/.test(chars[at + size])) size += 1;
  const fault = chars.slice(at, at + size).join("");
  box.replaceChildren(el("span", { class: "where-message" }, detail.message || error.message),
    el("code", { class: "where-text" }, chars.slice(0, at).join(""),
      el("mark", { "data-offset": String(at), title: `offset ${at}` }, fault || "⟂"), chars.slice(at + size).join("")),
    detail.expected && detail.expected.length ? el("span", { class: "muted" }, ` expected: ${detail.expected.join(", ")}`) : "");
  box.hidden = false;
  input.setAttribute("aria-invalid", "true");
  if (document.activeElement === input) {
    const caret = chars.slice(0, at).join("").length;  // in the box's own (UTF-16) units
    input.setSelectionRange(caret, caret);
  }
}
