// The page: asks /api/info which capabilities exist, shows only those panels, and keeps
// them live from /api/stream. Each panel lives in a module of its own.

import { closeCompare, openCompare } from "./compare.js";
import { initEditor } from "./editor.js";
import { classLinkDialog, refreshPeople } from "./people.js";
import { closeRunPage, openRunPage } from "./runpage.js";
import { initRunList, listFromAddress, refreshRuns } from "./runs.js";
import { refreshStudies, showStudy } from "./studies.js";
import { newSweepDialog, refreshSweeps, showSweep } from "./sweeps.js";
import { api, el, login, openDialog, session, sessionName, showMessage, visit, visiting } from "./util.js";
import { addWorkerDialog, knownWorkers, refreshWorkers } from "./workers.js";

const PANELS = { sweeps: refreshSweeps, studies: refreshStudies, workers: refreshWorkers };
let current = "runs";

let refreshFailed = false;  // the message line says a refresh failed: the next one that works clears it

function report(error) {
  showMessage(error.message);
}

function refreshVisible() {
  if (document.getElementById("view").hidden === false) return; // a run page follows its own stream
  // The message line is cleared only when every refresh of this tick worked: the list's
  // success must not wipe what a panel's failure just said.
  const refreshes = [refreshRuns(), ...(PANELS[current] ? [PANELS[current]()] : [])];
  Promise.allSettled(refreshes).then((settled) => {
    const failure = settled.find((one) => one.status === "rejected");
    if (failure) {
      refreshFailed = true;
      report(failure.reason);
    } else if (refreshFailed) {
      showMessage("");
      refreshFailed = false;
    }
  });
}

// Where the address points: #/runs/ID a run's page, #/compare/ID,ID,... runs compared,
// #/sweeps/ID and #/studies/ID their tab with that one open, #/runs, #/sweeps,
// #/studies, #/workers and #/people a panel: these results take the whole window.
// Anything else (#/editor) is the editor, its execution log under the canvas. Reload and
// a shared link keep the view; the editor's graph stays whichever is shown.
const RESULTS = new Set(["runs", "sweeps", "studies", "workers", "people"]);

function resultsOnly(on) {
  document.querySelector("main.layout").classList.toggle("results-only", on);
  const toggle = document.getElementById("results-toggle");
  toggle.textContent = on ? "Editor" : "Results";
  toggle.href = on ? "#/editor" : `#/${current}`;
}

async function route() {
  // A session that may not run anything (a projector, a guest) starts on the Runs list.
  if (!location.hash && (login !== "in" || session === "read")) history.replaceState(null, "", "#/runs");
  // The Connected panel is the teacher's (its tab is hidden to others): its address too.
  if (location.hash.startsWith("#/people") && !(session === "teacher" && login === "in")) {
    history.replaceState(null, "", "#/runs");
  }
  const here = visit();
  // #/runs?where=...: the Runs list's filters ride after a "?" (a where may hold a "/").
  const [path, said = ""] = location.hash.replace(/^#\/?/, "").split(/\?(.*)/s);
  const [kind, arg] = path.split("/");
  resultsOnly(RESULTS.has(kind) || kind === "compare");
  if (RESULTS.has(kind) && !arg && kind !== current && !["sweeps", "studies"].includes(kind)) showTab(kind);
  closeRunPage();
  closeCompare();
  const view = document.getElementById("view");
  const page = kind === "runs" && arg ? (v) => openRunPage(arg, v, here)
    : kind === "compare" && arg ? (v) => openCompare(arg.split(",").filter(Boolean).slice(0, 8), v, here) : null;
  document.querySelector("main.layout").hidden = Boolean(page);
  view.hidden = !page;
  showMessage("");
  if (page) {
    view.replaceChildren(el("p", { class: "muted" }, "Loading…"));
    try {
      await page(view);
    } catch (error) {  // a deleted run's address, an id that is none: said where the page would be
      if (!visiting(here)) return;
      view.replaceChildren(el("p", {}, el("a", { href: "#/runs" }, "← Runs")), el("p", { role: "alert" }, error.message));
      throw error;
    }
    view.focus();
    return;
  }
  view.replaceChildren();
  if (kind === "sweeps") {
    showTab("sweeps");
    await showSweep(arg || null);
  } else if (kind === "studies") {
    showTab("studies");
    await showStudy(arg || null);
  } else {
    if (kind === "runs") listFromAddress(said);
    await refreshRuns();
  }
  if (kind === "editor") window.dispatchEvent(new Event("resize"));  // the canvas takes its room back
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

// A page that is not logged in can look but not change anything, and says how to log in;
// a read-only session (a projector, a guest) says what it is. Buttons a session may not
// press are not shown: "acts" change runs, sweeps and studies, "teaches" manage workers.
function loginBanner() {
  if (login === "in" && session !== "read") return;
  const why = login === "used" ? "That login link was already used, or is not one this server made. " : "";
  const text = session === "read"
    ? ["Read-only: this session can look at every run of this server but not start or change one."]
    : [`Read-only. ${why}To run, queue or change anything, open the login link that `, el("code", {}, "troupe start"),
      " printed, or run ", el("code", {}, "troupe open"), " on the server's machine."];
  document.body.prepend(el("div", { class: "login-banner", role: "status" }, ...text));
}

// Reached over the network, the server shows nothing to a browser without a session.
function loginWall() {
  const why = login === "used" ? "That login link was already used up, has expired, or is not one this server made. " : "";
  document.querySelector("main.layout").hidden = true;
  document.querySelector("header.toolbar").hidden = true;
  const wall = document.getElementById("login-wall");
  wall.hidden = false;
  wall.replaceChildren(el("h1", {}, "troupe"), el("p", { class: "login-banner", role: "status" },
    `${why}This server is shared over the network: to see it, open the login link you were given `
    + "(it ends in ?token=…). Ask the person who runs the server for one; they make it with ",
    el("code", {}, "troupe open --uses 30 --expires 2h"), ". From a terminal: ", el("code", {}, "troupe login URL"), "."));
}

// Opened with a login link: the page, not the GET that fetched it, spends one of the
// link's uses (a chat app's preview of the link runs no script), then drops the token.
async function redeemLink() {
  const token = new URLSearchParams(location.search).get("token") || "";
  try {
    await api("POST", "/api/login", { token, browser: true });
    location.replace("/");
  } catch {
    location.replace("/?used");
  }
}

// "e" shows the editor, "r" the results, from anywhere a key is not typed into a field.
function switchView(event) {
  if (event.ctrlKey || event.metaKey || event.altKey || document.querySelector("dialog[open]")) return;
  if (event.target.closest("input, textarea, select, [contenteditable]")) return;
  const to = { e: "#/editor", r: `#/${current}` }[event.key];
  if (to && location.hash !== to) location.hash = to;
}

// A login link opened in a browser that has a session: the server sent the page on without
// the token, the link unspent; the page says so and drops the mark from the address bar.
function linkKept() {
  if (!new URLSearchParams(location.search).has("link-unspent")) return;
  history.replaceState(null, "", "/" + location.hash);
  document.body.prepend(el("div", { class: "login-banner", role: "status", id: "link-unspent" },
    "This browser is logged in already, so the login link you opened was not used: it still opens a session in "
    + "another browser. To use it here, log out first."));
}

async function start() {
  if (login === "link") return redeemLink();
  linkKept();
  const info = await api("GET", "/api/info");
  document.body.classList.add(`session-${login === "in" ? session : "none"}`);
  if (login !== "in" && info.login.reads_need_session) return loginWall();
  loginBanner();
  document.getElementById("server").textContent = `v${info.version} · ${info.devices.join(", ")}`;
  // Only the panels whose API this server has: no request goes to a route that is not there.
  for (const name of Object.keys(PANELS)) {
    document.querySelector(`.tab[data-tab="${name}"]`).hidden = !info.capabilities[name];
  }
  if (session === "teacher" && login === "in") {
    PANELS.people = refreshPeople; // who is connected: the teacher's to see
    document.querySelector('.tab[data-tab="people"]').hidden = false;
  }
  // A student (a class or a read session) names themselves for the teacher's list.
  const myName = document.getElementById("my-name");
  myName.hidden = login !== "in" || session === "teacher";
  myName.textContent = myName.title = `You: ${sessionName}`; // the title: the whole name, cut short in the toolbar
  myName.addEventListener("click", () => openDialog("Your name", (form) => form.append(
    el("label", { for: "my-name-input" }, "The name your teacher sees in who is connected"),
    el("input", { id: "my-name-input", name: "name", maxlength: 40, required: true, value: sessionName.startsWith("guest ") ? "" : sessionName })), {
    submitLabel: "Save",
    submit: async (form) => {
      const { label } = await api("PUT", "/api/sessions/me", { name: form.elements.name.value });
      myName.textContent = myName.title = `You: ${label}`;
    },
  }));
  // A browser logged in with a link ends its session on the server, not only here.
  const logOut = document.getElementById("log-out");
  logOut.hidden = login !== "in";
  logOut.addEventListener("click", async () => {
    await api("POST", "/api/logout").catch(report);
    location.replace("/");
  });
  // A tab is an address (#/runs, #/sweeps...): a link to it, a reload, Back all keep it.
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => {
      if (location.hash === `#/${tab.dataset.tab}`) showTab(tab.dataset.tab);
      else location.hash = `#/${tab.dataset.tab}`;
    });
  }
  document.getElementById("new-sweep").addEventListener("click", newSweepDialog);
  document.getElementById("add-worker").addEventListener("click", addWorkerDialog);
  document.getElementById("class-link-button").addEventListener("click", classLinkDialog);
  document.addEventListener("keydown", switchView);
  const workers = async () => {
    await refreshWorkers();
    return knownWorkers;
  };
  await initEditor(info, workers);
  initRunList();
  window.addEventListener("hashchange", () => route().catch(report));
  await route();
  follow();
  setInterval(() => {
    // Durations tick while runs execute; workers and studies have no stream of their own.
    if (document.querySelector(".status.running") || ["workers", "studies", "people"].includes(current)) soon();
  }, 1000);
}

// The server's changes, as they happen.
function follow() {
  const stream = new EventSource("/api/stream");
  // "hello" comes once the subscription is in place (again after a reconnect): what
  // changed before it is caught by this refresh, what changes after it by "run" events.
  stream.addEventListener("hello", soon);
  stream.addEventListener("run", soon);
  stream.addEventListener("reset", soon);
  // A dropped connection the browser retries by itself; a refusal (the session ended)
  // closes the stream for good: a read says which (a 401 reloads the page), else it
  // opens again.
  stream.addEventListener("error", () => {
    if (stream.readyState !== EventSource.CLOSED) return;
    api("GET", "/api/runs?limit=1").then(() => setTimeout(follow, 3000), (error) => {
      report(error);
      setTimeout(follow, 3000);
    });
  });
}

start().catch(report);
