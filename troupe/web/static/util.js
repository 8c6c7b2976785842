// What every panel shares: the HTTP API, element builders, the message line and the dialog.

// "in": this browser is logged in (an HttpOnly cookie the page cannot read); "out": the
// page is read-only; "used": it was opened with a login link that is used up or unknown;
// "link": it was opened with a login link, which the page now spends.
export const login = document.querySelector('meta[name="troupe-login"]').content;
// The kind of session the cookie opened: "teacher" (everything), "class" (runs, sweeps,
// studies; not workers or links), "read" (a projector or a guest), or "" (none).
export const session = document.querySelector('meta[name="troupe-session"]')?.content || "";
// What this browser's session is called in the teacher's "who is connected" (a class's
// student: a generated guest name until they give their own).
export const sessionName = document.querySelector('meta[name="troupe-name"]')?.content || "";
// This browser's session id, as a run's, a sweep's or a study's submitted_by says it.
export const me = document.querySelector('meta[name="troupe-me"]')?.content || "";
// Whether this session may stop, delete or label what ``owner`` submitted: a teacher
// anything, a class session its own only (the server refuses the rest: not_your_run).
export function mayChange(owner) {
  return session === "teacher" || (session === "class" && Boolean(me) && owner === me);
}
// Sent with every mutation beside the cookie: a cross-site form cannot send a header.
export const MUTATION_HEADERS = { "X-Troupe-Request": "1" };

// Each change of the address is a visit: a view whose reads land after the next visit
// began (a slow link, a quick Back) draws nothing over what that visit shows.
let visits = 0;
export function visit() {
  return ++visits;
}
export function visiting(which) {
  return which === visits;
}

export class ApiError extends Error {
  constructor(status, error) {
    super(error ? `${error.code}: ${error.message}` : `HTTP ${status}`);
    this.status = status;
    this.code = error ? error.code : null;
    this.error = error || {};  // the whole error: a where's offset and expected, a pointer
  }
}

export async function api(method, path, body, extra = {}) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") Object.assign(headers, MUTATION_HEADERS);
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body), ...extra,
  });
  const data = await response.json();
  if (response.status === 401) sessionEnded();
  if (!response.ok) throw new ApiError(response.status, data.error);
  return data;
}

// A page logged in that the server no longer knows (its session revoked, logged out in
// another tab, expired) reloads, once, and comes back as what it is now: the login wall
// on a shared server, the read-only page on loopback. Never twice within a minute: a
// server that still says "in" at the reload must not make a loop of it.
export function sessionEnded() {
  if (login !== "in") return;
  const last = Number(sessionStorage.getItem("troupe.ended") || 0);
  if (Date.now() - last < 60_000) return;
  sessionStorage.setItem("troupe.ended", String(Date.now()));
  location.reload();
}

// A file for runs to read (multipart: the browser sets the boundary).
export async function uploadFile(file) {
  const form = new FormData();
  form.append("file", file, file.name);
  const response = await fetch("/api/files", { method: "POST", headers: { Accept: "application/json", ...MUTATION_HEADERS },
    body: form });
  const data = await response.json();
  if (response.status === 401) sessionEnded();
  if (!response.ok) throw new ApiError(response.status, data.error);
  return data;
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

export function showMessage(text, ok = false) {
  const message = document.getElementById("message");
  message.textContent = text;
  message.classList.toggle("ok", ok);
  message.hidden = !text;
}

export function time(stamp) {
  return stamp ? new Date(stamp).toLocaleTimeString() : "";
}

// "3 min ago", "yesterday 14:02": how long ago, in the words a list wants.
export function age(stamp) {
  if (!stamp) return "";
  const s = (Date.now() - Date.parse(stamp)) / 1000;
  if (s < 60) return `${Math.max(0, Math.round(s))} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

// The date and time, and how long ago: what a run page shows of a moment.
export function when(stamp) {
  if (!stamp) return "";
  const at = new Date(stamp);
  return `${at.toLocaleDateString(undefined, { month: "short", day: "numeric" })} ${at.toLocaleTimeString()} (${age(stamp)})`;
}

export function duration(row) {
  if (!row.started_at) return "";
  const end = row.finished_at ? Date.parse(row.finished_at) : Date.now();
  return seconds((end - Date.parse(row.started_at)) / 1000);
}

export function sizeText(bytes) {
  if (bytes === null || bytes === undefined) return "size unknown";
  const units = ["B", "KB", "MB", "GB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit += 1; }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

// A training's place and time left, from the run row's progress (epoch ends' times).
export function progressText(row) {
  const p = row.progress;
  if (!p || !p.epochs) return "";
  let text = `epoch ${p.epoch}/${p.epochs}`;
  if (row.status === "running" && p.first_at && p.at && p.epoch > p.first_epoch) {
    const perEpoch = (Date.parse(p.at) - Date.parse(p.first_at)) / 1000 / (p.epoch - p.first_epoch);
    const left = Math.max(0, perEpoch * (p.epochs - p.epoch) - (Date.now() - Date.parse(p.at)) / 1000);
    text += `, about ${seconds(left)} left`;
  }
  return text;
}

export function seconds(value) {
  if (value === null || value === undefined) return "";
  return value < 60 ? `${value.toFixed(1)} s` : `${Math.floor(value / 60)} min ${Math.round(value % 60)} s`;
}

export function copyButton(text) {
  return el("button", {
    type: "button", title: "Copy to the clipboard",
    onclick: async (event) => {
      event.stopPropagation();
      const button = event.currentTarget;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch {
        button.textContent = "Select and copy";
      }
    },
  }, "Copy");
}

// One <dialog> serves every form: `build(form)` fills it, `submit(form)` runs on the
// primary button and may throw to keep the dialog open with the error shown.
export function openDialog(title, build, { submitLabel = "OK", submit = null, cancelLabel = "Cancel" } = {}) {
  const dialog = document.getElementById("dialog");
  // A fresh form each time: listeners a former dialog added must not hear this one.
  const form = document.getElementById("dialog-form").cloneNode(false);
  document.getElementById("dialog-form").replaceWith(form);
  const error = el("p", { class: "message", hidden: true });
  form.replaceChildren(el("h2", {}, title));
  build(form);
  const buttons = el("menu", {});
  if (cancelLabel) buttons.append(el("button", { type: "button", value: "cancel", onclick: () => dialog.close() }, cancelLabel));
  if (submit) {
    buttons.append(el("button", {
      type: "button", class: "primary", "data-action": "submit",
      onclick: async (event) => {
        const button = event.currentTarget;
        button.disabled = true;
        try {
          error.hidden = true;
          if ((await submit(form)) !== false) dialog.close();
        } catch (failure) {
          error.textContent = failure.message;
          error.hidden = false;
        } finally {
          button.disabled = false;
        }
      },
    }, submitLabel));
  }
  form.append(error, buttons);
  dialog.showModal();
  return dialog;
}

export function confirmDialog(title, explanation, label, action) {
  return openDialog(title, (form) => form.append(el("p", { class: "explain" }, explanation)),
    { submitLabel: label, submit: action });
}

// Why a study halted and why a variant is unranked, in words (the codes stay in the API).
const REASONS = {
  budget_max_runs: "it started as many runs as its budget allows (max_runs)",
  budget_active_seconds: "its active time ran out (max_active_seconds)",
  over_budget: "a repeat ran past max_run_seconds and was stopped",
  repeat_failed: "a repeat failed or was cancelled",
  running: "its repeats are still running",
  incomplete: "only some repeats ran before the study stopped",
  not_run: "none of its repeats ran before the study stopped",
  no_objective: "a repeat succeeded without recording the objective",
};

export function reasonText(code) {
  return REASONS[code] || (code || "").replace(/_/g, " ");
}

// A param whose value is JSON (a command's argv or vars): shown and edited as JSON, kept
// as the value it reads as; text that is not JSON is marked and not kept.
export function jsonInput(attrs, value, set) {
  return el("input", { ...attrs, type: "text", autocomplete: "off", "data-json": "",
    value: value === undefined ? "" : JSON.stringify(value),
    onchange: (e) => {
      try {
        set(e.target.value === "" ? "" : JSON.parse(e.target.value));
        e.target.setCustomValidity("");
      } catch {
        e.target.setCustomValidity("not JSON");
        e.target.reportValidity();
      }
    } });
}

// An event as one readable line: time, kind, node, and what it says.
export function eventText(e) {
  const p = e.payload || {};
  let says;
  if (e.type === "metric") says = `${p.name} = ${p.value === null ? p.non_finite : +Number(p.value).toPrecision(6)}, step ${p.step}`;
  else if (e.type === "log" || e.type === "warning") says = p.message || JSON.stringify(p);
  else if (e.type === "run_finished") says = `${p.status}${p.reason ? ` (${p.reason})` : ""}${p.error ? `: ${p.error}` : ""}`;
  else if (e.type === "node_failed") says = p.error || "";
  else if (e.type === "artifact" || e.type === "artifact_pending") says = `${p.kind} ${p.path}`;
  else if (e.type === "params") says = [...Object.entries(p.params || {}), ...Object.entries(p.tags || {})].map(([k, v]) => `${k}=${v}`).join(" ");
  else {
    says = Object.entries(p).filter(([, v]) => v === null || ["string", "number", "boolean"].includes(typeof v))
      .map(([k, v]) => `${k}=${v}`).join(" ");
  }
  const at = e.ts ? new Date(e.ts).toLocaleTimeString() : "";
  return `${at}  ${e.type.padEnd(15)} ${(e.node_id || "").padEnd(10)} ${says}`.slice(0, 400);
}
