// The Runs list's own columns: params and metrics a person picks from what the listed
// runs carry (GET /api/runs?values=true), kept in this browser. A param column reads
// node.param, as --set names it; a logged one, params.NAME, what the run's script logged
// (MLflow's log_param); a metric column reads the series' newest value.

import { el, openDialog } from "./util.js";

const KEY = "troupe.runs.columns";
const MAX = 12;
const BAGS = { param: (r) => r.params, logged: (r) => r.logged_params, metric: (r) => r.metrics };
const label = (column) => (column.kind === "logged" ? `params.${column.name}` : column.name);

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(KEY) || "[]");
    return Array.isArray(saved) ? saved.filter((c) => Object.hasOwn(BAGS, c?.kind) && typeof c.name === "string").slice(0, MAX) : [];
  } catch {
    return []; // what another version of the page kept is not read as columns
  }
}

let chosen = load();

export function pickedColumns() {
  return chosen;
}

export function columnId(column) {
  return `${column.kind}:${column.name}`;
}

export function columnValue(row, column) {
  const bag = BAGS[column.kind](row);
  if (!bag || !(column.name in bag)) return null;
  const value = bag[column.name];
  // A logged param is text, as MLflow sends it; one that reads as a number sorts as one.
  return column.kind === "logged" && value.trim() !== "" && Number.isFinite(Number(value)) ? Number(value) : value;
}

function shown(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : String(+value.toPrecision(4));
  return String(value);
}

export function columnCells(row) {
  return chosen.map((column) => {
    const text = shown(columnValue(row, column));
    return el("td", { class: `picked ${column.kind}`, title: text }, text);
  });
}

// The header cells of the picked columns, each as wide as its name (or as a person
// dragged it) and sortable by a click as the others are.
export function columnHeaders(sortable) {
  return chosen.map((column) => {
    const th = el("th", { "data-sort": columnId(column), class: "picked", title: `${column.kind} ${column.name}`,
      style: `width:${Math.max(80, Math.ceil(label(column).length * 8.2) + 34)}px` }, label(column));
    sortable(th);
    return th;
  });
}

// The dialog: every param and series the listed runs carry, ticked if shown.
export function columnsDialog(rows, changed) {
  const names = (kind) => [...new Set(rows.flatMap((r) => Object.keys(BAGS[kind](r) || {})))].sort();
  const on = new Set(chosen.map(columnId));
  const group = (kind, title, none) => {
    const found = names(kind);
    return el("fieldset", { class: "column-picks" }, el("legend", {}, title),
      ...(found.length ? found.map((name) => el("label", { class: "pick-row" },
        el("input", { type: "checkbox", name: "column", value: `${kind}:${name}`, checked: on.has(`${kind}:${name}`) || null }),
        ` ${label({ kind, name })}`)) : [el("p", { class: "muted" }, `No listed run has ${none} yet.`)]));
  };
  openDialog("Columns", (form) => form.append(
    el("p", { class: "muted" }, `Up to ${MAX} columns, kept in this browser.`),
    group("param", "Params (node.param)", "a param"),
    group("logged", "Logged by the script (params.NAME)", "a param its script logged"),
    group("metric", "Metrics (newest value)", "a metric")), {
    submitLabel: "Show",
    submit: (form) => {
      const ticked = [...form.querySelectorAll('input[name="column"]:checked')].map((box) => {
        const at = box.value.indexOf(":");
        return { kind: box.value.slice(0, at), name: box.value.slice(at + 1) };
      });
      if (ticked.length > MAX) throw new Error(`At most ${MAX} columns; ${ticked.length} are ticked.`);
      chosen = ticked;
      localStorage.setItem(KEY, JSON.stringify(chosen));
      changed();
    },
  });
}
