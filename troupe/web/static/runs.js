// The Runs panel: every run the server holds, newest first and live, a sweep's or a
// study's runs folded into one row that opens; filter chips, a search box (name, id,
// tags, note), tags on each row and the param and metric columns a person picked; Stop,
// Watch (into the editor's execution log), CSV and Delete; tick two to eight runs to
// compare them; a filter box (a where expression, where_box.js) and Group by (groups.js).
// What narrows or folds the list is in its address (#/runs?status=...&where=...), so a
// reload or a shared link keeps it. A run opens as its own page (#/runs/ID, runpage.js).

import { columnCells, columnHeaders, columnId, columnValue, columnsDialog, pickedColumns } from "./columns.js";
import { follow } from "./execlog.js";
import { showGroups } from "./groups.js";
import { api, age, confirmDialog, duration, el, mayChange, progressText, showMessage } from "./util.js";
import { initWhereBox, knownKeys, loadKeys, showWhere, whereError } from "./where_box.js";

const FILTERS = [["All", ""], ["Running", "running"], ["Queued", "queued"], ["Succeeded", "succeeded"],
  ["Failed", "failed"], ["Cancelled", "cancelled"], ["Interrupted", "interrupted"]];
export const ACTIVE = new Set(["queued", "running", "disconnected"]);
const MAX_COMPARE = 8;
let filter = "";
let search = "";
let where = "";  // a where expression, as typed (the server reads it)
let groupBy = "";  // a key: the list folded into a row per value
let groupMetric = "";  // the series each group's row sums up
const opened = new Set(); // "sweep:ID" / "study:ID": the groups shown open
const picked = new Set(); // run ids ticked for Compare
let loaded = []; // the run rows listed, whose params and series the Columns dialog offers

export async function act(label, run) {
  try {
    showMessage("");
    await run();
    await refreshRuns();
  } catch (error) {
    showMessage(`${label} failed: ${error.message}`);
  }
}

export function deleteRun(row, after) {
  confirmDialog(`Delete run ${row.name || row.id}?`,
    "Its metrics, events and recorded outputs are removed from the database. Checkpoint files stay on disk. "
    + "This cannot be undone.", "Delete", async () => {
      await api("DELETE", `/api/runs/${row.id}`);
      picked.delete(row.id);
      await (after || refreshRuns)();
    });
}

function actions(row) {
  const cell = el("td", { class: "actions" });
  const quiet = (handler) => (event) => { event.stopPropagation(); handler(); };
  const mine = mayChange(row.submitted_by);  // a class session stops and deletes its own runs only
  if (ACTIVE.has(row.status) && mine) {
    cell.append(el("button", { class: "acts", onclick: quiet(() => act("Stop", () => api("POST", `/api/runs/${row.id}/cancel`))) }, "Stop"));
  }
  cell.append(el("button", { title: "Follow its events in the editor's execution log, from the first", onclick: quiet(() => {
    follow(row.id, `Watching ${row.name || row.id.slice(0, 8)}`);
    location.hash = "#/editor";
  }) }, "Watch"));
  cell.append(el("a", { href: `/api/runs/${row.id}/metrics?format=csv`, title: "Its metrics as CSV", onclick: (e) => e.stopPropagation() }, "CSV"));
  if (!ACTIVE.has(row.status) && mine) {
    cell.append(el("button", { class: "acts", onclick: quiet(() => deleteRun(row)) }, "Delete"));
  }
  return cell;
}

function statusCell(row) {
  const status = el("td", {}, el("span", { class: `status ${row.status}` }, row.status));
  if (row.queue_reason) {
    // Which limit a queued run waits on, in words, with its code for a script or a search.
    status.append(el("div", { class: "reason", "data-code": row.queue_reason.code, title: row.queue_reason.code },
      row.queue_reason.message));
  }
  return status;
}

function pickBox(row) {
  const box = el("input", { type: "checkbox", "aria-label": `compare ${row.name || row.id}`, "data-pick": row.id,
    onclick: (event) => event.stopPropagation(),
    onchange: () => {
      if (box.checked && picked.size >= MAX_COMPARE) {
        box.checked = false;
        showMessage(`Compare takes at most ${MAX_COMPARE} runs.`);
        return;
      }
      if (box.checked) picked.add(row.id); else picked.delete(row.id);
      renderCompareButton();
    } });
  box.checked = picked.has(row.id);
  return el("td", { class: "pick" }, box);
}

// Who submitted a run, by the name their session goes by now (a sweep or a study: its rows
// carry the name of the first run listed).
function byName(row) {
  return row.submitted_label || (row.submitted_by ? row.submitted_by.slice(0, 8) : "");
}

function renderRow(row, child = false) {
  const where = el("td", { title: row.queue_key }, row.queue_key);
  if (row.queue_position !== null) where.append(el("span", { class: "position" }, `#${row.queue_position} in queue`));
  const value = row.final_loss === null ? (row.final_loss_non_finite || "") : row.final_loss.toPrecision(4);
  const loss = value && ACTIVE.has(row.status) ? `${value} (last)` : value;  // a run going on has no final loss yet
  const progress = el("td", { class: "progress" });
  const p = row.progress;
  if (p && p.epochs) {
    progress.append(el("span", { class: "progress-bar", role: "img", "aria-label": `${Math.round((p.epoch / p.epochs) * 100)}% done` },
      el("span", { style: `width:${Math.min(100, (p.epoch / p.epochs) * 100)}%` })), progressText(row));
  }
  const name = el("td", { title: row.id }, el("a", { href: `#/runs/${row.id}`, onclick: (e) => e.stopPropagation() },
    row.name || row.id.slice(0, 8)), ...(row.tags || []).map((tag) => el("span", { class: "tag" }, tag)));
  return el("tr", { "data-run": row.id, class: child ? "child" : null, onclick: () => { location.hash = `#/runs/${row.id}`; } },
    pickBox(row), name, statusCell(row), where, el("td", { class: "by", title: row.submitted_by || "" }, byName(row)),
    el("td", { title: row.started_at || "" }, age(row.started_at)),
    el("td", {}, duration(row)), progress, el("td", {}, loss), ...columnCells(row), actions(row));
}

function groupRow(group) {
  const key = `${group.kind}:${group.id}`;
  const counts = Object.entries(group.counts).map(([status, n]) => `${n} ${status}`).join(", ");
  const best = group.best ? `best ${group.best.metric} ${+group.best.value.toPrecision(4)}` : "";
  const open = opened.has(key);
  // The row opens on a click anywhere; its button carries the state for a keyboard and a
  // screen reader (a table row may not say it is expanded).
  return el("tr", { class: `group${open ? " open" : ""}`, "data-group": key, onclick: () => toggle(key) },
  el("td", { class: "pick" }, el("button", { class: "toggle", type: "button", "aria-expanded": String(open),
    "aria-label": `${open ? "Hide" : "Show"} the runs of ${group.kind} ${group.name || group.id.slice(0, 8)}`,
    onclick: (e) => { e.stopPropagation(); toggle(key); } }, open ? "▾" : "▸")),
  el("td", {}, el("a", { href: `#/${group.kind === "sweep" ? "sweeps" : "studies"}/${group.id}`, onclick: (e) => e.stopPropagation() },
    `${group.kind} ${group.name || group.id.slice(0, 8)}`)),
  el("td", { colspan: 7 + pickedColumns().length }, `${group.runs} run${group.runs === 1 ? "" : "s"}: ${counts}`
    + (best ? ` · ${best}` : "")), el("td", {}));
}

function toggle(key) {
  if (opened.has(key)) opened.delete(key); else opened.add(key);
  refreshRuns().catch((e) => showMessage(e.message));
}

function renderCompareButton() {
  const button = document.getElementById("compare-runs");
  button.hidden = picked.size < 2;
  button.textContent = `Compare ${picked.size} runs`;
}

// The list shows the newest PAGE rows, and PAGE more each time "Show more" is pressed:
// every run the server holds can be reached, page by page (the API's cursor).
const PAGE = 200;
let shown = PAGE;

function query(extra) {
  const params = new URLSearchParams(extra);
  if (filter) params.set("status", filter);
  if (search) params.set("q", search);
  if (where) params.set("where", where);
  return params;
}

// The list's state as its address says it: #/runs?status=failed&q=...&where=...&group_by=KEY&metric=SERIES.
function listAddress() {
  const params = query({});
  if (groupBy) params.set("group_by", groupBy);
  if (groupBy && groupMetric) params.set("metric", groupMetric);
  const said = params.toString().replace(/\+/g, "%20");
  return `#/runs${said ? `?${said}` : ""}`;
}

function keepAddress() {
  if (/^#\/runs(\?|$)/.test(location.hash) && location.hash !== listAddress()) history.replaceState(null, "", listAddress());
}

// #/runs with a query sets the list's state (a reload, a shared link); #/runs alone (the
// tab, ← Runs) keeps what the list had and writes it back into the address.
export function listFromAddress(said) {
  const params = new URLSearchParams(said);
  if ([...params.keys()].length) {
    filter = params.get("status") || "";
    search = params.get("q") || "";
    where = params.get("where") || "";
    groupBy = params.get("group_by") || "";
    groupMetric = params.get("metric") || "";
    shown = PAGE;
  }
  document.getElementById("run-search").value = search;
  showWhere(where);
  renderChips();
  renderGroupBy();
}

// A where the server refused (malformed, an unknown key): said by the box, the list empty.
function refused(error) {
  const whose = (error.error || {}).pointer;
  if (!where || error.status !== 400 || !String(error.code || "").startsWith("where_") || whose === "?group_by") throw error;
  whereError(error, where);
  return { rows: [], more: false, refused: true };
}

async function listRows() {
  const rows = [];
  let cursor = null;
  do {
    const params = query({ grouped: "true", values: "true", limit: String(Math.min(500, shown - rows.length)) });
    if (cursor) params.set("cursor", cursor);
    const page = await api("GET", `/api/runs?${params}`);
    rows.push(...page.runs);
    cursor = page.next_cursor;
  } while (cursor && rows.length < shown);
  return { rows, more: cursor !== null };
}

// A group's runs; a sweep's each named by the values that tell its variants apart
// (a.value=2), not by the sweep's one name nine times over.
async function groupMembers(group) {
  const column = group.kind === "sweep" ? "sweep_id" : "study_id";
  const [runs, sweep] = await Promise.all([api("GET", `/api/runs?${query({ [column]: group.id, limit: "500", values: "true" })}`),
    group.kind === "sweep" ? api("GET", `/api/sweeps/${group.id}`).catch(() => null) : null]);
  if (!sweep) return runs.runs;
  const byRun = new Map(sweep.variants.map((v) => [v.run_id, Object.entries(v.params).map(([k, x]) => `${k}=${x}`).join(" ")]));
  return runs.runs.map((run) => (byRun.has(run.id) ? { ...run, name: byRun.get(run.id) } : run));
}

// The list's order: newest first, or by a column its header was clicked on (again:
// the other way). Rows without the value go last either way.
let sortBy = null; // {column, descending}
const SORT_KEYS = {
  name: (r) => (r.name || r.id || "").toLowerCase(), status: (r) => r.status || r.kind, queue_key: (r) => r.queue_key,
  started_at: (r) => r.started_at, final_loss: (r) => r.final_loss, by: (r) => byName(r).toLowerCase() || null,
  duration: (r) => (r.started_at ? (Date.parse(r.finished_at || new Date().toISOString()) - Date.parse(r.started_at)) : null),
  progress: (r) => (r.progress && r.progress.epochs ? r.progress.epoch / r.progress.epochs : null),
};

function sorted(rows) {
  if (!sortBy) return rows;
  const column = pickedColumns().find((c) => columnId(c) === sortBy.column);
  const key = SORT_KEYS[sortBy.column] || (column ? (r) => columnValue(r, column) : () => null);
  const sign = sortBy.descending ? -1 : 1;
  return [...rows].sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === null || x === undefined) return y === null || y === undefined ? 0 : 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : x > y ? 1 : 0) * sign;
  });
}

// Sorted by the By column, the list is grouped by person: a heading row before each
// person's runs, with how many of them are listed.
function byPerson(rendered, rows) {
  if (!sortBy || sortBy.column !== "by") return rendered;
  const out = [];
  let last;
  rendered.forEach((tr) => {
    const row = tr.dataset.group ? null : rows.find((r) => r.id === tr.dataset.run);
    if (!row && !tr.dataset.group) { out.push(tr); return; }  // a run of an open sweep or study
    const whose = (r) => (r.kind ? "sweeps and studies" : byName(r) || "unknown");
    const who = row ? whose(row) : "sweeps and studies";
    if (who !== last) {
      const count = rows.filter((r) => whose(r) === who).length;
      out.push(el("tr", { class: "person", "data-person": who },
        el("td", { colspan: 10 + pickedColumns().length }, `${who} · ${count} ${row ? "run" : "group"}${count === 1 ? "" : "s"}`)));
      last = who;
    }
    out.push(tr);
  });
  return out;
}

let refreshes = 0;  // the newest refresh draws: an older answer that lands later (a search typed meanwhile) does not

export async function refreshRuns() {
  const mine = ++refreshes;
  keepAddress();
  loadKeys().then(renderGroupBy);
  const grouped = document.getElementById("run-groups");
  grouped.hidden = !groupBy;
  document.getElementById("run-list").hidden = Boolean(groupBy);
  const [unsorted, running, queues] = await Promise.all([
    groupBy ? showGroups(grouped, { key: groupBy, metric: groupMetric, filters: query({}), where, narrow,
      current: () => mine === refreshes }).then(() => ({ rows: [], more: false }), refused) : listRows().catch(refused),
    api("GET", "/api/runs?status=running&limit=500"), api("GET", "/api/queues")]);
  if (mine === refreshes && !unsorted.refused) whereError(null);
  const list = { ...unsorted, rows: sorted(unsorted.rows) };
  const openGroups = list.rows.filter((r) => r.kind && opened.has(`${r.kind}:${r.id}`));
  const members = new Map(await Promise.all(openGroups.map(async (g) => [`${g.kind}:${g.id}`, await groupMembers(g)])));
  if (mine !== refreshes) return;
  loaded = [...list.rows.filter((r) => !r.kind), ...[...members.values()].flat()];
  document.getElementById("rows").replaceChildren(...byPerson(list.rows.flatMap((row) => {
    if (!row.kind) return [renderRow(row)];
    const key = `${row.kind}:${row.id}`;
    return [groupRow(row), ...sorted(members.get(key) || []).map((member) => renderRow(member, true))];
  }), list.rows));
  const narrowed = Boolean(search || filter || where);
  document.getElementById("empty").hidden = list.rows.length > 0 || narrowed;
  document.getElementById("no-match").hidden = list.rows.length > 0 || !narrowed;
  const more = document.getElementById("more");
  more.hidden = !list.more;
  more.onclick = async () => { shown += PAGE; await refreshRuns(); };
  renderCompareButton();
  // Active: the runs the server started; a run still waiting for anything is queued.
  const busy = running.runs.length;
  const queued = queues.queues.reduce((sum, q) => sum + q.queued, 0);
  const notice = document.getElementById("notice");
  notice.hidden = busy === 0 && queued === 0;
  notice.textContent = `${busy} run${busy === 1 ? "" : "s"} active` + (queued ? `, ${queued} queued` : "");
}

export function renderChips() {
  document.getElementById("chips").replaceChildren(...FILTERS.map(([label, value]) => el("button", {
    class: `chip${value === filter ? " active" : ""}`, "data-filter": value || "all",
    onclick: () => { filter = value; shown = PAGE; renderChips(); refreshRuns().catch((e) => showMessage(e.message)); },
  }, label)));
}

// A where typed into the box (Enter): the list narrows to it.
function applyWhere(text) {
  if (text === where) return;
  where = text;
  shown = PAGE;
  refreshRuns().catch((e) => showMessage(e.message));
}

// A group's row: the filter box takes its condition, the list unfolds to those runs.
function narrow(cond) {
  groupBy = "";
  renderGroupBy();
  const text = where ? `(${where}) and ${cond}` : cond;
  document.getElementById("run-where").value = text;
  applyWhere(text);
}

// Group by offers the keys that exist but a series (fixed ones first, as the server
// lists them), and once grouped the series to sum up.
function fillSelect(select, values, chosen, none) {
  const all = [...new Set([...values, ...(chosen ? [chosen] : [])])];
  const have = [...select.options].slice(1).map((o) => o.value);
  if (have.join("\n") !== all.join("\n")) {
    select.replaceChildren(el("option", { value: "" }, none), ...all.map((v) => el("option", { value: v }, v)));
  }
  select.value = chosen;
}

function renderGroupBy() {
  const keys = knownKeys();
  const series = (k) => ["metric", "best"].includes(k.kind);
  fillSelect(document.getElementById("group-by"), keys.filter((k) => !series(k)).map((k) => k.key), groupBy, "nothing");
  fillSelect(document.getElementById("group-metric"), keys.filter((k) => k.kind === "metric")
    .map((k) => k.key.replace(/^metric\./, "").replace(/^`(.*)`$/, "$1")), groupMetric, "none");
  document.getElementById("group-metric-box").hidden = !groupBy;
}

export function initRunList() {
  initWhereBox(applyWhere);
  const again = () => { shown = PAGE; renderGroupBy(); refreshRuns().catch((e) => showMessage(e.message)); };
  document.getElementById("group-by").addEventListener("change", (e) => { groupBy = e.target.value; again(); });
  document.getElementById("group-metric").addEventListener("change", (e) => { groupMetric = e.target.value; again(); });
  let pending = null;
  document.getElementById("run-search").addEventListener("input", (event) => {
    clearTimeout(pending);
    pending = setTimeout(() => {
      search = event.target.value.trim();
      shown = PAGE;
      refreshRuns().catch((e) => showMessage(e.message));
    }, 250);
  });
  document.getElementById("compare-runs").addEventListener("click", () => {
    location.hash = `#/compare/${[...picked].join(",")}`;
  });
  for (const th of document.querySelectorAll("#runs th[data-sort]")) sortable(th);
  document.getElementById("pick-columns").addEventListener("click", () => columnsDialog(loaded, () => {
    renderPickedHeaders();
    refreshRuns().catch((e) => showMessage(e.message));
  }));
  renderPickedHeaders();
  renderChips();
}

// The list keeps room for its own columns (--runs-base) and the picked ones: past the
// window's width it scrolls sideways in its box rather than cut a header.

function renderPickedHeaders() {
  for (const old of document.querySelectorAll("#runs th.picked")) old.remove();
  const headers = columnHeaders(sortable);
  document.querySelector("#runs th.row-actions").before(...headers);
  const extra = headers.reduce((sum, th) => sum + parseFloat(th.style.width), 0);
  document.querySelector("#runs table.runs").style.minWidth = `calc(var(--runs-base) + ${extra}px)`;
}

// A header sorts the list by a click (again: the other way) or Enter, and widens by its edge.
function sortable(th) {
  th.tabIndex = 0;
  th.setAttribute("aria-sort", sortBy && sortBy.column === th.dataset.sort ? (sortBy.descending ? "descending" : "ascending") : "none");
  const sortHere = () => {
    sortBy = sortBy && sortBy.column === th.dataset.sort ? { column: th.dataset.sort, descending: !sortBy.descending }
      : { column: th.dataset.sort, descending: false };
    for (const other of document.querySelectorAll("#runs th[data-sort]")) other.setAttribute("aria-sort", "none");
    th.setAttribute("aria-sort", sortBy.descending ? "descending" : "ascending");
    refreshRuns().catch((e) => showMessage(e.message));
  };
  th.addEventListener("click", sortHere);
  th.addEventListener("keydown", (e) => { if (e.key === "Enter") sortHere(); });
  resizable(th);
}

// A column's width, dragged by its header's right edge and kept in this browser.
function resizable(th) {
  const key = `troupe.runs.width.${th.dataset.sort}`;
  const saved = Number(localStorage.getItem(key));
  if (saved) th.style.width = `${saved}px`;
  const grip = el("span", { class: "grip", "aria-hidden": "true", onclick: (e) => e.stopPropagation() });
  grip.addEventListener("pointerdown", (down) => {
    down.preventDefault();
    down.stopPropagation();
    const start = th.getBoundingClientRect().width;
    const move = (e) => { th.style.width = `${Math.max(60, start + e.clientX - down.clientX)}px`; };
    const up = () => {
      document.removeEventListener("pointermove", move);
      localStorage.setItem(key, String(Math.round(th.getBoundingClientRect().width)));
    };
    document.addEventListener("pointermove", move);
    document.addEventListener("pointerup", up, { once: true });
  });
  th.append(grip);
}
