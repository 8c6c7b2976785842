// The Runs panel: every run the server holds, live, with Stop, Watch, CSV and Delete,
// and the details of one run (facts, artifacts, a chart per metric series, its events).

import { chart } from "./chart.js";
import { api, confirmDialog, copyButton, el, seconds, showMessage, time } from "./util.js";

const FILTERS = [["All", ""], ["Running", "running"], ["Queued", "queued"], ["Succeeded", "succeeded"],
  ["Failed", "failed"], ["Cancelled", "cancelled"], ["Interrupted", "interrupted"]];
export const ACTIVE = new Set(["queued", "running", "disconnected"]);
let filter = "";
let openRun = null;
let watch = null; // {source, lines}: a Watch replays the whole log from seq 1

function duration(row) {
  if (!row.started_at) return "";
  const end = row.finished_at ? Date.parse(row.finished_at) : Date.now();
  return seconds((end - Date.parse(row.started_at)) / 1000);
}

async function act(label, run) {
  try {
    showMessage("");
    await run();
    await refreshRuns();
  } catch (error) {
    showMessage(`${label} failed: ${error.message}`);
  }
}

function actions(row) {
  const cell = el("td", { class: "actions" });
  const quiet = (handler) => (event) => { event.stopPropagation(); handler(); };
  if (ACTIVE.has(row.status)) {
    cell.append(el("button", { class: "acts", onclick: quiet(() => act("Stop", () => api("POST", `/api/runs/${row.id}/cancel`))) }, "Stop"));
  }
  cell.append(el("button", { onclick: quiet(() => watchRun(row.id)) }, "Watch"));
  cell.append(el("a", { href: `/api/runs/${row.id}/metrics?format=csv`, onclick: (e) => e.stopPropagation() }, "CSV"));
  if (!ACTIVE.has(row.status)) {
    cell.append(el("button", {
      class: "acts", onclick: quiet(() => confirmDialog(`Delete run ${row.name || row.id}?`,
        "Its metrics, events and recorded outputs are removed from the database. Checkpoint files stay on disk. "
        + "This cannot be undone.", "Delete", async () => {
          await api("DELETE", `/api/runs/${row.id}`);
          if (openRun === row.id) closeDetails();
          await refreshRuns();
        })),
    }, "Delete"));
  }
  return cell;
}

function renderRow(row) {
  const status = el("td", {}, el("span", { class: `status ${row.status}` }, row.status));
  const device = el("td", { title: row.queue_key }, row.queue_key);
  if (row.queue_position !== null) device.append(el("span", { class: "position" }, `#${row.queue_position} in queue`));
  if (row.queue_reason) {
    // Which limit a queued run waits on, in words, with its code for a script or a search.
    status.append(el("div", { class: "reason", "data-code": row.queue_reason.code, title: row.queue_reason.code },
      row.queue_reason.message));
  }
  const loss = row.final_loss === null ? "" : row.final_loss.toPrecision(4);
  return el("tr", { "data-run": row.id, class: row.id === openRun ? "selected" : null, onclick: () => openDetails(row.id) },
    el("td", { title: row.id }, row.name || row.id.slice(0, 8)), status, device,
    el("td", {}, time(row.started_at)), el("td", {}, duration(row)), el("td", {}, loss), actions(row));
}

// The list shows the newest PAGE runs, and PAGE more each time "Show more" is pressed:
// every run the server holds can be reached, page by page (the API's cursor).
const PAGE = 200;
let shown = PAGE;

async function listRuns() {
  const runs = [];
  let cursor = null;
  do {
    const params = new URLSearchParams({ limit: String(Math.min(500, shown - runs.length)) });
    if (filter) params.set("status", filter);
    if (cursor) params.set("cursor", cursor);
    const page = await api("GET", `/api/runs?${params}`);
    runs.push(...page.runs);
    cursor = page.next_cursor;
  } while (cursor && runs.length < shown);
  return { runs, more: cursor !== null };
}

export async function refreshRuns() {
  const [list, running, queues] = await Promise.all([
    listRuns(), api("GET", "/api/runs?status=running&limit=500"), api("GET", "/api/queues")]);
  document.getElementById("rows").replaceChildren(...list.runs.map(renderRow));
  document.getElementById("empty").hidden = list.runs.length > 0;
  const more = document.getElementById("more");
  more.hidden = !list.more;
  more.onclick = async () => { shown += PAGE; await refreshRuns(); };
  // Active: the runs the server started; a run still waiting for anything is queued.
  const busy = running.runs.length;
  const queued = queues.queues.reduce((sum, q) => sum + q.queued, 0);
  const notice = document.getElementById("notice");
  notice.hidden = busy === 0 && queued === 0;
  notice.textContent = `${busy} run${busy === 1 ? "" : "s"} active` + (queued ? `, ${queued} queued` : "");
  if (openRun) await renderDetails();
}

export async function openDetails(runId) {
  stopWatch();
  openRun = runId;
  document.getElementById("details-log-title").replaceChildren("Events ", el("span", { class: "muted" }, "(the last 200)"));
  await renderDetails();
  for (const row of document.querySelectorAll("#rows tr")) row.classList.toggle("selected", row.dataset.run === runId);
}

function closeDetails() {
  stopWatch();
  openRun = null;
  document.getElementById("details").hidden = true;
}

function stopWatch() {
  if (watch) watch.source.close();
  watch = null;
}

function eventLine(e) {
  return `${String(e.seq).padStart(4)}  ${e.type.padEnd(14)} ${e.node_id || ""}  ${JSON.stringify(e.payload)}`;
}

// Watch: the run's whole log, replayed from its first event, then live.
async function watchRun(runId) {
  await openDetails(runId);
  const log = document.getElementById("details-events");
  document.getElementById("details-log-title").replaceChildren("Log ", el("span", { class: "muted" }, "(replayed from the start, live)"));
  log.textContent = "";
  const printed = document.getElementById("details-console");
  printed.textContent = "";
  const source = new EventSource(`/api/runs/${runId}/stream?after=0`);
  watch = { source, lines: [] };
  source.addEventListener("run_event", (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "console") {  // followed live, as `troupe logs --console -f` prints it
      printed.textContent += event.payload.text;
      printed.scrollTop = printed.scrollHeight;
    }
    watch.lines.push(eventLine(event));
    log.textContent = watch.lines.join("\n");
    log.scrollTop = log.scrollHeight;
    if (event.type === "run_finished") source.close();
  });
}

async function renderDetails() {
  const runId = openRun;
  const [run, page, metrics, printedSoFar] = await Promise.all([api("GET", `/api/runs/${runId}`),
    api("GET", `/api/runs/${runId}/events?tail=200`), api("GET", `/api/runs/${runId}/metrics`),
    api("GET", `/api/runs/${runId}/console`)]);
  if (runId !== openRun) return;
  document.getElementById("details").hidden = false;
  document.getElementById("details-title").textContent = `${run.name || run.id} — ${run.status}`;
  const facts = [["Run ID", run.id], ["Queue", run.queue_key], ["Device", run.device],
    ["Worker", run.worker || "this server"], ["Lane", run.lane]];
  // 002: the seed and determinism appear only when the run was given them.
  if (run.seed !== null && run.seed !== undefined) facts.push(["Seed", run.seed]);
  if (run.deterministic) facts.push(["Deterministic", "yes"]);
  if (run.memory_budget_mib) {
    facts.push(["Memory budget", `${run.memory_budget_mib} MiB (${run.memory_budget_source === "measured"
      ? "the graph's last measured peak + 20%" : "declared"})`]);
  }
  if (run.peak_memory_mib !== null && run.peak_memory_mib !== undefined) {
    facts.push(["Peak memory", `${run.peak_memory_mib} MiB${run.peak_memory_exact ? ""
      : " (the server's process, shared by its runs: not exact)"}${run.out_of_memory ? ", ran out of memory" : ""}`]);
  }
  if (run.execution_facts) {
    const fp = run.execution_facts.fingerprint;
    facts.push(["Environment", `${run.execution_facts.fingerprint_digest} (taken by ${run.execution_facts.fingerprint_source
      === "run_process" ? "the run's own process" : "this server's process"}): troupe ${fp.troupe.version}, `
      + `${fp.python}, torch ${fp.torch.version || "not installed"}`]);
  }
  if (run.rerun_of) facts.push(["Made again from", run.rerun_of]);
  if (run.resumed_from) facts.push(["Resumes", `${run.resumed_from.run_id} from epoch ${run.resumed_from.epoch}`]);
  if (run.reruns && run.reruns.length) facts.push(["Made again as", run.reruns.join(", ")]);
  if (run.resume_point) facts.push(["Can be resumed", `from epoch ${run.resume_point.epoch}, ${run.resume_point.until}`]);
  facts.push(["Error", run.error || ""]);
  if (run.error_detail) facts.push(["Error detail", run.error_detail]);
  document.getElementById("details-facts").replaceChildren(
    ...facts.flatMap(([key, value]) => [el("dt", {}, key), el("dd", {}, String(value))]));
  document.getElementById("details-again").replaceChildren(...ACTIVE.has(run.status) ? [] : [
    el("button", { class: "acts", onclick: () => again(run.id, false) }, "Run again"),
    ...run.resume_point ? [el("button", { class: "acts", onclick: () => again(run.id, true) },
      `Resume from epoch ${run.resume_point.epoch}`)] : []]);
  document.getElementById("details-artifacts").replaceChildren(...run.artifacts.length ? [el("h3", {}, "Artifacts"),
    ...run.artifacts.map((a) => el("div", { class: `artifact ${a.state || "stored"}`, "data-state": a.state || "stored" },
      el("span", { class: "muted" }, a.kind),
      el("code", { title: a.sha256 ? `sha256 ${a.sha256}` : a.path }, a.path),
      a.backend ? el("span", { class: "muted" }, `${a.backend}${a.label ? ` ${a.label}` : ""}, ${sizeText(a.size)}`) : "",
      a.state === "pending" ? el("span", { class: "state" }, "pending: on its worker, on its way") : "",
      a.state === "failed" ? el("span", { class: "state failed", title: a.reason || "" }, `failed: ${a.reason || ""}`) : "",
      a.id !== undefined && (a.state || "stored") === "stored"
        ? el("a", { href: `/api/runs/${runId}/artifacts/${a.id}`, download: "" }, "Download") : "",
      copyButton(a.path)))] : []);
  document.getElementById("details-csv").href = `/api/runs/${runId}/metrics?format=csv`;
  const series = Object.entries(metrics.series);
  document.getElementById("details-charts").replaceChildren(...series.length
    ? series.map(([name, points]) => chart(name, points)) : [el("p", { class: "muted" }, "No metrics recorded.")]);
  if (!watch) {
    document.getElementById("details-events").textContent = page.events.map(eventLine).join("\n");
    document.getElementById("details-console").textContent = printedSoFar.text || "Nothing printed.";
  }
}

async function again(runId, resume) {
  await act(resume ? "Resume" : "Run again", async () => {
    const made = await api("POST", `/api/runs/${runId}/rerun`, resume ? { resume: true } : {});
    showMessage(`Queued ${made.run_id}${resume ? " (resumed)" : ""}`);
  });
}

function sizeText(bytes) {
  if (bytes === null || bytes === undefined) return "size unknown";
  const units = ["B", "KB", "MB", "GB"];
  let value = bytes, unit = 0;
  while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit += 1; }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

export function renderChips() {
  document.getElementById("chips").replaceChildren(...FILTERS.map(([label, value]) => el("button", {
    class: `chip${value === filter ? " active" : ""}`, "data-filter": value || "all",
    onclick: () => { filter = value; shown = PAGE; renderChips(); refreshRuns().catch((e) => showMessage(e.message)); },
  }, label)));
}
