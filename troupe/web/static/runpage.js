// A run's own page (#/runs/ID): who and where, its progress, what people added (name,
// tags, note), its metrics as charts, what it printed, its events (followed while it
// runs), its artifacts, what executed it, its params and graph, and its actions.

import { ChartSet, chartControls } from "./charts.js";
import { loadGraph, secretParams } from "./editor.js";
import { ACTIVE, act, deleteRun } from "./runs.js";
import {
  api, copyButton, duration, el, eventText, mayChange, progressText, session, showMessage, sizeText, visiting, when,
} from "./util.js";

let page = null; // {runId, source, charts, timers}

export function closeRunPage() {
  if (!page) return;
  if (page.source) page.source.close();
  if (page.observer) page.observer.disconnect();  // it would hold the closed page's Events box
  page.charts.destroy();
  clearTimeout(page.metricsTimer);
  page = null;
}

function section(id, title, ...children) {
  return el("section", { class: "card", id }, el("h2", {}, title), ...children);
}

function facts(run) {
  const rows = [["Status", el("span", { class: `status ${run.status}` }, run.status)],
    ["Where", `${run.queue_key}${run.worker ? ` on worker ${run.worker}` : " on this server"}`],
    ["Created", when(run.created_at)], ["Started", when(run.started_at)], ["Finished", when(run.finished_at)],
    ["Duration", duration(run)]];
  if (run.progress && run.progress.epochs) rows.push(["Progress", el("span", { "data-progress": "" }, progressText(run))]);
  const set = (run.options || {}).params_set;  // what --set changed from the graph's file
  if (set) rows.push(["Set", Object.entries(set).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")]);
  if (run.seed !== null && run.seed !== undefined) rows.push(["Seed", String(run.seed)]);
  if (run.deterministic) rows.push(["Deterministic", "yes"]);
  if (run.sweep_id) rows.push(["Sweep", el("a", { href: `#/sweeps/${run.sweep_id}` }, `variant ${run.sweep_variant}`)]);
  if (run.study_id) rows.push(["Study", el("a", { href: `#/studies/${run.study_id}` }, run.study_id.slice(0, 8))]);
  if (run.rerun_of) rows.push(["Made again from", el("a", { href: `#/runs/${run.rerun_of}` }, run.rerun_of.slice(0, 8))]);
  if (run.resumed_from) {
    rows.push(["Resumes", el("span", {}, el("a", { href: `#/runs/${run.resumed_from.run_id}` }, run.resumed_from.run_id.slice(0, 8)),
      ` from epoch ${run.resumed_from.epoch}`)]);
  }
  if (run.reruns && run.reruns.length) {
    rows.push(["Made again as", el("span", {}, ...run.reruns.flatMap((id) => [el("a", { href: `#/runs/${id}` }, id.slice(0, 8)), " "]))]);
  }
  if (run.resume_point) rows.push(["Can be resumed", `from epoch ${run.resume_point.epoch}, ${run.resume_point.until}`]);
  // What the script logged itself (MLflow's log_param and set_tag), beside troupe's own facts.
  for (const [label, logged] of [["Logged params", run.logged_params], ["Logged tags", run.logged_tags]]) {
    const entries = Object.entries(logged || {});
    if (entries.length) rows.push([label, el("span", { "data-logged": label }, entries.map(([k, v]) => `${k}=${v}`).join(", "))]);
  }
  if (run.memory_budget_mib) rows.push(["Memory budget", `${run.memory_budget_mib} MiB (${run.memory_budget_source})`]);
  if (run.peak_memory_mib !== null && run.peak_memory_mib !== undefined) {
    rows.push(["Peak memory", `${run.peak_memory_mib} MiB${run.peak_memory_exact ? "" : " (shared process: not exact)"}`
      + (run.out_of_memory ? ", ran out of memory" : "")]);
  }
  const list = el("dl", { class: "facts" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  return list;
}

function errorBox(run) {
  if (!run.error) return "";
  return el("div", { class: "error-box", role: "alert" }, el("strong", {}, run.error),
    run.error_detail ? el("pre", { tabindex: 0, "aria-label": "The error in full" }, run.error_detail) : "");
}

function actions(run, refresh) {
  const box = el("div", { class: "actions" });
  const mine = mayChange(run.submitted_by);  // a class session stops, deletes and labels its own runs only
  if (ACTIVE.has(run.status)) {
    if (mine) box.append(el("button", { class: "acts", onclick: () => act("Stop", () => api("POST", `/api/runs/${run.id}/cancel`)).then(refresh) }, "Stop"));
  } else {
    box.append(el("button", { class: "acts", onclick: () => again(run.id, false) }, "Run again"));
    if (run.resume_point) box.append(el("button", { class: "acts", onclick: () => again(run.id, true) }, `Resume from epoch ${run.resume_point.epoch}`));
    if (mine) box.append(el("button", { class: "acts danger", onclick: () => deleteRun(run, async () => { location.hash = "#/runs"; }) }, "Delete"));
  }
  box.append(el("a", { href: `/api/runs/${run.id}/metrics?format=csv` }, "Metrics as CSV"));
  if (session === "class" && !mine) {
    const whose = run.submitted_by && run.submitted_by !== "server" && run.submitted_label ? `${run.submitted_label}'s` : "the teacher's";
    box.append(el("p", { class: "muted", "data-not-yours": "" }, `This run is ${whose}: only they and the teacher may stop, `
      + "delete, rename, tag or note it. Run again makes a run of your own."));
  }
  return box;
}

async function again(runId, resume) {
  await act(resume ? "Resume" : "Run again", async () => {
    const made = await api("POST", `/api/runs/${runId}/rerun`, resume ? { resume: true } : {});
    location.hash = `#/runs/${made.run_id}`;
  });
}

// Name, tags and note: what a person adds to a run (PATCH), for finding it again.
function labels(run, refresh) {
  const save = async (body) => {
    try {
      await api("PATCH", `/api/runs/${run.id}`, body);
      await refresh();
    } catch (error) {
      showMessage(`Saving failed: ${error.message}`);
    }
  };
  const name = el("input", { value: run.name || "", "aria-label": "Run name", class: "acts", placeholder: "a name",
    onchange: () => save({ name: name.value.trim() || null }) });
  const tagInput = el("input", { placeholder: "add a tag", "aria-label": "Add a tag", class: "acts", size: 14,
    onkeydown: (event) => {
      if (event.key !== "Enter" || !tagInput.value.trim()) return;
      save({ tags: [...run.tags, tagInput.value.trim()] });
    } });
  const tags = el("div", { class: "tags", "data-tags": "" }, ...run.tags.map((tag) => el("span", { class: "tag" }, tag,
    el("button", { class: "acts", "aria-label": `remove tag ${tag}`, onclick: () => save({ tags: run.tags.filter((t) => t !== tag) }) }, "×"))),
  tagInput);
  const note = el("textarea", { rows: 2, "aria-label": "Note", class: "acts", placeholder: "a note" }, run.note || "");
  note.addEventListener("change", () => save({ note: note.value.trim() || null }));
  if (!mayChange(run.submitted_by)) {  // read only: what was added, no field to change it
    return el("div", { class: "labels" }, el("div", { class: "tags", "data-tags": "" },
      ...run.tags.map((tag) => el("span", { class: "tag" }, tag))), run.note ? el("p", { class: "note" }, run.note) : "");
  }
  return el("div", { class: "labels" }, el("label", {}, "Name ", name), tags, note);
}

function artifacts(run) {
  if (!run.artifacts.length) return el("p", { class: "muted" }, "No artifacts.");
  const files = artifactTable(run);
  const c = run.checkpoints;  // a run's checkpoints in one line; every file on demand
  if (!c) return files;
  const name = (ref) => ref.path.split("/").pop();
  const best = c.best ? `; best ${name(c.best)} (${c.best.series} ${Number(c.best.value).toPrecision(4)})` : "";
  return el("div", {}, el("p", { class: "checkpoints", "data-checkpoints": String(c.count) },
    `Checkpoints: ${c.count} kept, ${sizeText(c.total_size)}${c.newest ? `; newest ${name(c.newest)}` : ""}${best}`
    + `${c.removed ? `; ${c.removed} let go (keep_checkpoints)` : ""}`),
  el("details", {}, el("summary", {}, `All ${run.artifacts.length} files`), files));
}

function artifactTable(run) {
  return el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["Kind", "Path", "Where", "Size", "sha256", "State", ""]
    .map((h) => el("th", {}, h)))),
  el("tbody", {}, ...run.artifacts.map((a) => el("tr", { class: "artifact", "data-state": a.state || "stored" },
    el("td", {}, a.kind), el("td", { title: a.path }, el("code", {}, a.path)),
    el("td", {}, `${a.backend || ""}${a.label ? ` ${a.label}` : ""}`), el("td", {}, sizeText(a.size)),
      el("td", { title: a.sha256 || "" }, a.sha256 ? el("span", {}, el("code", {}, a.sha256.slice(0, 12)), copyButton(a.sha256)) : ""),
      el("td", { title: a.reason || "" }, a.state || "stored"),
      el("td", {}, (a.state || "stored") === "stored" ? el("a", { href: `/api/runs/${run.id}/artifacts/${a.id}`, download: "" }, "Download") : "")))));
}

function environment(run) {
  const facts = run.execution_facts;
  if (!facts) return el("p", { class: "muted" }, "Not recorded yet (it is taken when the run starts).");
  const fp = facts.fingerprint;
  const rows = [["Digest", facts.fingerprint_digest], ["Taken by", facts.fingerprint_source === "run_process"
    ? "the run's own process" : "this server's process"], ["troupe", `${fp.troupe.version}${fp.troupe.commit ? ` (${fp.troupe.commit})` : ""}`],
  ["Python", fp.python], ["Platform", fp.platform], ["torch", fp.torch.version || "not installed"],
  ["Packs", (fp.packs || []).map((p) => `${p.name} ${p.version}${p.source === "folder" ? ` (${(p.digest || "").slice(0, 12)})` : ""}`).join(", ")],
  ...Object.entries(fp.code || {}).flatMap(([node, code]) => code.files.map((f) => {  // the files a command ran
    const repo = code.repos.find((r) => r.name === f.repo);
    const git = repo ? ` (git ${repo.branch || "detached"} ${(repo.commit || "no commit").slice(0, 12)}${repo.dirty ? ", uncommitted changes" : ""})` : "";
    return ["Code", `${node}: ${f.name} sha256 ${(f.sha256 || "-").slice(0, 12)}${git}`];
  }))];
  return el("div", {}, el("dl", { class: "facts" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
    el("a", { href: `/api/runs/${run.id}/provenance` }, "What it read (provenance)"));
}

function graphSection(run) {
  const rows = run.graph.nodes.flatMap((node) => {
    const params = Object.entries(node.params || {});
    const secret = secretParams(node);
    return (params.length ? params : [["", ""]]).map(([key, value], i) => el("tr", {},
      el("td", {}, i ? "" : node.id), el("td", {}, i ? "" : node.type), el("td", {}, key),
      el("td", {}, !key ? "" : secret.has(key) ? "•••• (a secret)" : JSON.stringify(value))));
  });
  const open = el("button", { onclick: () => {
    try {
      loadGraph(run.graph, `run ${run.id}`);
      location.hash = "";
      showMessage(`The graph of run ${run.name || run.id.slice(0, 8)} is in the editor.`, true);
    } catch (error) {
      showMessage(error.message);
    }
  } }, "Open in editor");
  return el("div", {}, open, el("table", { class: "runs params" },
    el("thead", {}, el("tr", {}, ...["Node", "Type", "Param", "Value"].map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
}

// A resumed run reads as one training: the runs it goes on from give the steps before
// it, each run of the chain a line of its own, so the chart shows where it resumed.
async function loadMetrics() {
  const { series } = await api("GET", `/api/runs/${page.runId}/metrics${page.lineage ? "?lineage=true" : ""}`);
  page.series = series;  // a live run's new points are added to it as their events come
  const lines = (name, points) => {
    if (!page.lineage) return [{ label: name, points }];
    const byRun = new Map();
    for (const point of points) {
      if (!byRun.has(point.run_id)) byRun.set(point.run_id, []);
      byRun.get(point.run_id).push(point);
    }
    return [...byRun].map(([id, mine]) => ({ label: id === page.runId ? `${name} (this run)` : `${name} (run ${id.slice(0, 8)})`, points: mine }));
  };
  drawSeries(lines);
}

function drawSeries(lines = (name, points) => [{ label: name, points }]) {
  const bySeries = new Map(Object.entries(page.series).map(([name, points]) => [name, lines(name, points)]));
  page.charts.show(bySeries);
  page.noMetrics.hidden = bySeries.size > 0;
  page.controls.hidden = bySeries.size === 0;  // nothing to zoom, smooth or scale yet
}

function metricsSoon() {
  if (page.metricsTimer) return;
  page.metricsTimer = setTimeout(() => {
    if (!page) return;
    page.metricsTimer = null;
    loadMetrics().catch((e) => showMessage(e.message));
  }, 500);
}

// ``here``: the visit that asked for it (util.js): reads that land after the address
// moved on draw nothing.
export async function openRunPage(runId, view, here) {
  closeRunPage();
  const [run, tail, printed] = await Promise.all([api("GET", `/api/runs/${runId}`),
    api("GET", `/api/runs/${runId}/events?tail=200`), api("GET", `/api/runs/${runId}/console?nodes=true`)]);
  if (!visiting(here)) return;
  const chartBox = el("div", { class: "charts" });
  page = { runId, source: null, charts: new ChartSet(chartBox), metricsTimer: null, noMetrics: el("p", { class: "muted" }, "No metrics recorded."),
    lineage: Boolean(run.resumed_from) };
  page.controls = chartControls(page.charts.settings, (what) => (what === "reset" ? page.charts.resetZoom() : page.charts.redraw()));
  const head = el("div", { id: "run-head" });
  let shownRun = run;
  const refresh = async () => {
    if (!page || page.runId !== runId) return;
    const fresh = await api("GET", `/api/runs/${runId}`);
    shownRun = fresh;
    head.replaceChildren(...header(fresh, refresh));
  };
  head.replaceChildren(...header(run, refresh));
  const showEnd = (ended) => {
    shownRun = { ...shownRun, status: ended.status, error: ended.error ?? shownRun.error };
    head.replaceChildren(...header(shownRun, refresh));
  };
  const log = new EventLog(tail.events.filter((e) => e.type !== "console"));
  const events = log.box;
  // A box that scrolls is reached by the keyboard too (tabindex): its lines read by arrows.
  const console_ = el("pre", { class: "console", id: "run-console", tabindex: 0, "aria-label": "What the run printed" },
    printed.text || "");
  view.replaceChildren(
    el("nav", { class: "crumbs" }, el("a", { href: "#/runs" }, "← Runs")), head,
    section("run-metrics", "Metrics", page.controls, page.noMetrics, chartBox),
    section("run-printed", "Console", el("p", { class: "muted" }, printed.text || ACTIVE.has(run.status)
      ? "What the run printed, a line each, marked by its node (! for stderr)." : "It printed nothing."), console_),
    section("run-log", "Events", el("p", { class: "muted" }, ACTIVE.has(run.status) ? "The last 200, then live." : "The last 200."),
      log.filter, events),
    section("run-artifacts", "Artifacts", artifacts(run)), section("run-environment", "Environment", environment(run)),
    section("run-params", "Params and graph", graphSection(run)));
  await loadMetrics();
  if (ACTIVE.has(run.status)) follow(runId, tail.events.length ? tail.events[tail.events.length - 1].seq : 0, log, console_, refresh, showEnd);
}

function header(run, refresh) {
  return [el("h1", {}, run.name || run.id, " ", el("span", { class: `status ${run.status}` }, run.status)),
    el("p", { class: "muted" }, run.id, " ", copyButton(run.id)), errorBox(run), actions(run, refresh), labels(run, refresh), facts(run)];
}

const EVENT_LINES = 500;  // the Events box keeps the newest lines of a long run
const TEXT_MS = 250;
const CHARTS_MS = 1000;
const CONSOLE_CHARS = 200_000;  // what a live run's Console box keeps of its newest output

function shown(element) {  // on screen now
  const box = element.getBoundingClientRect();
  return box.bottom > 0 && box.top < window.innerHeight;
}

// ``work`` at most once every ``ms``, the last call never lost.
function throttled(ms, work) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; work(); }, ms);
  };
}
const FACTS_EVERY_MS = 1000;  // the run's facts (its header) are read again at most this often

// While it runs: its events as they come, its console, its charts, its header. What an
// event carries (a point, the epoch) is shown from the event; the page draws at most
// once a frame and reads the run's record at most once a second, so a training of many
// epochs a second is followed without the tab falling behind its stream.
function follow(runId, after, log, console_, refresh, showEnd) {
  const source = new EventSource(`/api/runs/${runId}/stream?after=${after}`);
  page.source = source;
  let printed = "";
  let factsAt = 0;
  let factsTimer = null;
  let epoch = null;  // the newest epoch an event said, shown with the next text update
  // Text (events, console, the epoch) at most every TEXT_MS, charts every CHARTS_MS: a
  // training of hundreds of epochs a second costs the tab a few redraws a second.
  const text = throttled(TEXT_MS, () => {
    if (!page || page.runId !== runId) return;
    if (shown(log.box)) log.render();
    if (printed) {
      // The newest CONSOLE_CHARS of what it printed (the whole is a click away, below).
      let all = console_.textContent + printed;
      if (all.length > CONSOLE_CHARS) all = all.slice(all.indexOf("\n", all.length - CONSOLE_CHARS) + 1);
      console_.textContent = all;
      printed = "";
      if (shown(console_)) console_.scrollTop = console_.scrollHeight;
    }
    if (epoch) showProgress(epoch);
  });
  const charts = throttled(CHARTS_MS, () => { if (page && page.runId === runId && page.series) drawSeries(); });
  // A box off screen is drawn when it comes into view, not at every beat.
  page.observer = new IntersectionObserver((seen) => { if (seen.some((s) => s.isIntersecting)) log.render(); });
  page.observer.observe(log.box);
  const soon = () => { text(); charts(); };
  const facts = () => {  // the header, read at most once a second, the last change never missed
    const wait = factsAt + FACTS_EVERY_MS - Date.now();
    if (factsTimer) return;
    factsTimer = setTimeout(() => {
      factsTimer = null;
      factsAt = Date.now();
      refresh().catch(() => {});
    }, Math.max(0, wait));
  };
  source.addEventListener("run_event", (message) => {
    if (!page || page.runId !== runId) {
      source.close();  // this page is no longer shown: its stream must not live on
      return;
    }
    const event = JSON.parse(message.data);
    if (event.type === "console") {
      printed += consoleLines(event);
      soon();
      return;
    }
    log.add(event);
    if (event.type === "metric") {
      const p = event.payload;
      if (page.series && !page.lineage) {
        (page.series[p.name] ||= []).push({ step: p.step, value: p.value, non_finite: p.non_finite, ts: event.ts });
      } else {
        metricsSoon();  // a chain of runs: read whole, at most twice a second
      }
      if (p.epochs) {
        epoch = p;
        facts();
      }
    }
    soon();
    if (["run_started", "run_finished", "params"].includes(event.type)) facts();
    if (event.type === "run_finished") {
      showEnd(event.payload);  // at once: the header's read may fail (a server stopping right after)
      source.close();
      metricsSoon();  // once, whole: what the stream gave is checked against what was stored
    }
  });
}

// A console event's lines, each marked with its node and stream (as ?nodes=true gives them).
function consoleLines(event) {
  const text = event.payload.text || "";
  if (!event.payload.stream) return text;
  const mark = `${event.node_id || ""} ${event.payload.stream === "stderr" ? "!" : "›"} `.trimStart();
  return text.split(/(?<=\n)/).map((line) => mark + line).join("");
}

// The Events box: the newest lines, shown by kind (a training's metric lines would bury
// its node starts, logs and warnings).
const KINDS = { all: () => true, "no metrics": (e) => e.type !== "metric", nodes: (e) => e.type.startsWith("node_") || e.type.startsWith("run_"),
  "logs and warnings": (e) => e.type === "log" || e.type === "warning", metrics: (e) => e.type === "metric" };

class EventLog {
  constructor(events) {
    this.events = events.slice(-EVENT_LINES);
    this.box = el("pre", { class: "events", id: "run-events", tabindex: 0, role: "log", "aria-label": "The run's events" });
    this.kind = "all";
    const choice = el("select", { "aria-label": "Show events of kind", onchange: () => { this.kind = choice.value; this.render(); } },
      ...Object.keys(KINDS).map((kind) => el("option", { value: kind }, kind)));
    this.filter = el("label", { class: "event-filter" }, "Show ", choice);
    this.render();
  }

  add(event) {
    this.events.push(event);
    if (this.events.length > EVENT_LINES) this.events.splice(0, this.events.length - EVENT_LINES);
  }

  render() {
    this.box.textContent = this.events.filter(KINDS[this.kind]).map(eventText).join("\n");
    this.box.scrollTop = this.box.scrollHeight;
  }
}

// The epoch an event says, in the header at once (its time left comes with the next read).
function showProgress(payload) {
  const shown = document.querySelector("#run-head [data-progress]");
  if (shown) shown.textContent = shown.textContent.replace(/^epoch \d+\/\d+/, `epoch ${payload.epoch}/${payload.epochs}`);
}
