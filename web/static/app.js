// The page: asks /api/info which capabilities exist, shows only those panels, and keeps
// them live from /api/stream. Each panel lives in a module of its own.

import { initEditor } from "./editor.js";
import { refreshRuns, renderChips } from "./runs.js";
import { refreshStudies } from "./studies.js";
import { newSweepDialog, refreshSweeps } from "./sweeps.js";
import { api, el, login, showMessage } from "./util.js";
import { addWorkerDialog, knownWorkers, refreshWorkers } from "./workers.js";

const PANELS = { sweeps: refreshSweeps, studies: refreshStudies, workers: refreshWorkers };
let current = "runs";

function report(error) {
  showMessage(error.message);
}

function refreshVisible() {
  refreshRuns().catch(report);
  if (PANELS[current]) PANELS[current]().catch(report);
}

let pending = null;
function soon() {
  // Many changes arrive together (a queue moving): one refresh for the burst.
  if (pending) return;
  pending = setTimeout(() => {
    pending = null;
    refreshVisible();
  }, 100);
}

function showTab(name) {
  current = name;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== name;
  if (PANELS[name]) PANELS[name]().catch(report);
}

// A page that is not logged in can look but not change anything, and says how to log in.
function loginBanner() {
  if (login === "in") return;
  const why = login === "used" ? "That login link was already used, or is not one this server made. " : "";
  document.body.prepend(el("div", { class: "login-banner", role: "status" }, `Read-only. ${why}To run, queue `
    + "or change anything, open the login link that ", el("code", {}, "troupe start"), " printed, or run ",
    el("code", {}, "troupe open"), " on the server's machine."));
}

async function start() {
  loginBanner();
  const info = await api("GET", "/api/info");
  document.getElementById("server").textContent = `v${info.version} · ${info.devices.join(", ")}`;
  // Only the panels whose API this server has: no request goes to a route that is not there.
  for (const name of Object.keys(PANELS)) {
    document.querySelector(`.tab[data-tab="${name}"]`).hidden = !info.capabilities[name];
  }
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
  document.getElementById("new-sweep").addEventListener("click", newSweepDialog);
  document.getElementById("add-worker").addEventListener("click", addWorkerDialog);
  document.getElementById("notice").addEventListener("click", (event) => {
    event.preventDefault();
    showTab("runs");
  });
  const workers = async () => {
    await refreshWorkers();
    return knownWorkers;
  };
  await initEditor(info, workers);
  renderChips();
  await refreshRuns();
  const stream = new EventSource("/api/stream");
  // "hello" comes once the subscription is in place (again after a reconnect): what
  // changed before it is caught by this refresh, what changes after it by "run" events.
  stream.addEventListener("hello", soon);
  stream.addEventListener("run", soon);
  stream.addEventListener("reset", soon);
  setInterval(() => {
    // Durations tick while runs execute; workers and studies have no stream of their own.
    if (document.querySelector(".status.running") || ["workers", "studies"].includes(current)) soon();
  }, 1000);
}

start().catch(report);
