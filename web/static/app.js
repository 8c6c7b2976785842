// The Runs panel: every run the server holds, live, with Stop, Watch, CSV and Delete.
// It talks only to the public HTTP API and its event streams.

const token = document.querySelector('meta[name="troupe-token"]').content;
const FILTERS = [["All", ""], ["Running", "running"], ["Queued", "queued"], ["Succeeded", "succeeded"],
  ["Failed", "failed"], ["Cancelled", "cancelled"], ["Interrupted", "interrupted"]];
const ACTIVE = new Set(["queued", "running", "disconnected"]);
let filter = "";
let watching = null;

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") headers["Authorization"] = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? `${data.error.code}: ${data.error.message}` : response.statusText);
  return data;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function showMessage(text) {
  const message = document.getElementById("message");
  message.textContent = text;
  message.hidden = !text;
}

function duration(row) {
  if (!row.started_at) return "";
  const end = row.finished_at ? Date.parse(row.finished_at) : Date.now();
  const seconds = (end - Date.parse(row.started_at)) / 1000;
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

function time(stamp) {
  return stamp ? new Date(stamp).toLocaleTimeString() : "";
}

async function act(label, run) {
  try {
    showMessage("");
    await run();
    await refresh();
  } catch (error) {
    showMessage(`${label} failed: ${error.message}`);
  }
}

function actions(row) {
  const cell = el("td", { class: "actions" });
  const stop = (event) => event.stopPropagation();
  if (ACTIVE.has(row.status)) {
    cell.append(el("button", { onclick: (e) => { stop(e); act("Stop", () => api("POST", `/api/runs/${row.id}/cancel`)); } }, "Stop"));
  }
  cell.append(el("button", { onclick: (e) => { stop(e); openDetails(row.id); } }, "Watch"));
  cell.append(el("a", { href: `/api/runs/${row.id}/metrics?format=csv`, onclick: stop }, "CSV"));
  if (!ACTIVE.has(row.status)) {
    cell.append(el("button", {
      onclick: (e) => {
        stop(e);
        if (confirm(`Delete run ${row.name || row.id}? Its metrics, events and recorded outputs go; checkpoint files stay on disk.`)) {
          act("Delete", () => api("DELETE", `/api/runs/${row.id}`));
        }
      },
    }, "Delete"));
  }
  return cell;
}

function renderRow(row) {
  const status = el("td", {}, el("span", { class: `status ${row.status}` }, row.status));
  const device = el("td", {}, row.queue_key);
  if (row.queue_position !== null) device.append(el("span", { class: "position" }, `#${row.queue_position} in queue`));
  const loss = row.final_loss === null ? "" : row.final_loss.toPrecision(4);
  return el("tr", { "data-run": row.id, onclick: () => openDetails(row.id) },
    el("td", { title: row.id }, row.name || row.id.slice(0, 8)), status, device,
    el("td", {}, time(row.started_at)), el("td", {}, duration(row)), el("td", {}, loss), actions(row));
}

async function refresh() {
  const query = filter ? `?status=${filter}&limit=200` : "?limit=200";
  const [list, active] = await Promise.all([api("GET", `/api/runs${query}`), api("GET", "/api/runs?limit=500")]);
  const rows = document.getElementById("rows");
  rows.replaceChildren(...list.runs.map(renderRow));
  document.getElementById("empty").hidden = list.runs.length > 0;
  const busy = active.runs.filter((r) => ACTIVE.has(r.status)).length;
  const notice = document.getElementById("notice");
  notice.hidden = busy === 0;
  notice.textContent = `${busy} run${busy === 1 ? "" : "s"} active`;
  if (watching) await renderDetails(watching);
}

async function openDetails(runId) {
  watching = runId;
  await renderDetails(runId);
}

async function renderDetails(runId) {
  const [run, page] = await Promise.all([api("GET", `/api/runs/${runId}`), api("GET", `/api/runs/${runId}/events?tail=200`)]);
  const details = document.getElementById("details");
  details.hidden = false;
  document.getElementById("details-title").textContent = `${run.name || run.id} — ${run.status}`;
  const facts = [["Run ID", run.id], ["Queue", run.queue_key], ["Seed", run.seed ?? "none"],
    ["Deterministic", String(run.deterministic)], ["Error", run.error || ""],
    ["Artifacts", run.artifacts.map((a) => a.path).join("\n")]];
  document.getElementById("details-facts").replaceChildren(
    ...facts.flatMap(([key, value]) => [el("dt", {}, key), el("dd", {}, String(value))]));
  document.getElementById("details-events").textContent = page.events
    .map((e) => `${String(e.seq).padStart(4)}  ${e.type.padEnd(14)} ${e.node_id || ""}  ${JSON.stringify(e.payload)}`)
    .join("\n");
}

function renderChips() {
  const chips = document.getElementById("chips");
  chips.replaceChildren(...FILTERS.map(([label, value]) => el("button", {
    class: `chip${value === filter ? " active" : ""}`, "data-filter": value || "all",
    onclick: () => { filter = value; renderChips(); refresh(); },
  }, label)));
}

let pending = null;
function soon() {
  // Many changes arrive together (a queue moving): one refresh for the burst.
  if (pending) return;
  pending = setTimeout(() => {
    pending = null;
    refresh().catch((e) => showMessage(e.message));
    if (!document.getElementById("sweeps").hidden) refreshSweeps().catch((e) => showMessage(e.message));
  }, 100);
}

// Sweeps: each sweep, and a selected one's variants ranked best first.
let openSweep = null;

async function refreshSweeps() {
  const { sweeps } = await api("GET", "/api/sweeps");
  document.getElementById("sweep-rows").replaceChildren(...sweeps.map((s) => el("tr", {
    "data-sweep": s.id, onclick: () => { openSweep = s.id; renderSweep(); },
  }, el("td", {}, s.name || s.id.slice(0, 8)), el("td", {}, s.state), el("td", {}, String(s.total)),
  el("td", {}, time(s.created_at)))));
  document.getElementById("sweeps-empty").hidden = sweeps.length > 0;
  if (openSweep) await renderSweep();
}

async function renderSweep() {
  const sweep = await api("GET", `/api/sweeps/${openSweep}`);
  const keys = sweep.params.map((p) => p.key);
  document.getElementById("sweep").hidden = false;
  const counts = Object.entries(sweep.counts).map(([status, n]) => `${n} ${status}`).join(", ");
  document.getElementById("sweep-title").textContent =
    `${sweep.name} — ${sweep.state} (${counts}); ${sweep.objective.direction} ${sweep.objective.metric}`;
  const warning = document.getElementById("sweep-warning");
  warning.hidden = !sweep.objective_warning;
  warning.textContent = sweep.objective_warning || "";
  document.getElementById("sweep-csv").href = `/api/sweeps/${sweep.sweep_id}?format=csv`;
  document.getElementById("ranking-head").replaceChildren(el("tr", {},
    ...["Rank", "Status", sweep.objective.metric, ...keys].map((h) => el("th", {}, h))));
  document.getElementById("ranking-rows").replaceChildren(...sweep.variants.map((v) => el("tr", {},
    el("td", {}, v.rank === null ? "" : String(v.rank)), el("td", {}, el("span", { class: `status ${v.status}` }, v.status)),
    el("td", {}, v.objective_value === null ? "" : v.objective_value.toPrecision(4)),
    ...keys.map((k) => el("td", {}, String(v.params[k]))))));
}

function showTab(name) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== name;
  if (name === "sweeps") refreshSweeps().catch((e) => showMessage(e.message));
}

async function start() {
  const info = await api("GET", "/api/info");
  document.getElementById("server").textContent = `v${info.version} · ${info.devices.join(", ")}`;
  // Only the panels whose API this server has.
  document.querySelector('.tab[data-tab="sweeps"]').hidden = !info.capabilities.sweeps;
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
  renderChips();
  await refresh();
  const stream = new EventSource("/api/stream");
  // "hello" comes once the subscription is in place (again after a reconnect): what
  // changed before it is caught by this refresh, what changes after it by "run" events.
  stream.addEventListener("hello", soon);
  stream.addEventListener("run", soon);
  stream.addEventListener("reset", soon);
  setInterval(() => { if (document.querySelector(".status.running")) soon(); }, 1000);  // durations tick
}

start().catch((error) => showMessage(error.message));
