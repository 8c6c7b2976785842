// The graph editor: the graph being edited, the palette, the inspector (params form and a
// node's recorded outputs), open/save/examples, Run on the interactive lane with this
// page's editor session, and the "Queue on..." dialog (queue_dialog.js). The canvas draws;
// this module decides.

import { Canvas, NODE_WIDTH, nodeHeight } from "./canvas.js";
import { follow } from "./execlog.js";
import { queueDialog } from "./queue_dialog.js";
import { MUTATION_HEADERS, api, el, jsonInput, showMessage, uploadFile } from "./util.js";

const catalog = new Map();
// getRandomValues, not randomUUID: a classroom reaches the page over plain http on a LAN,
// where a browser offers randomUUID to secure contexts only.
const session = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
let graph = { version: 1, name: "untitled", settings: { device: "cpu" }, nodes: [], edges: [] };
let canvas = null;
let info = null;
let outputsRun = null; // the newest Run (or run queued keeping outputs) whose outputs the inspector shows
let listWorkers = async () => [];

export function currentGraph() {
  return JSON.parse(JSON.stringify(graph));
}

export function catalogType(type) {
  return catalog.get(type);
}

// The names of a node's secret params (an API key): no page shows their values.
export function secretParams(node) {
  const spec = catalog.get(node.type);
  return new Set((spec ? spec.params : []).filter((p) => p.type === "secret").map((p) => p.name));
}

function status(text, failed = false) {
  const line = document.getElementById("editor-status");
  line.textContent = text;
  line.title = text;
  line.classList.toggle("message", failed);
  line.classList.toggle("muted", !failed);
}

// Graphs without positions (files from the CLI, the examples) get layers by longest path.
function layout(doc) {
  const depth = {};
  const incoming = (id) => doc.edges.filter((e) => e.target === id).map((e) => e.source);
  const visit = (id, seen = new Set()) => {
    if (depth[id] !== undefined) return depth[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    depth[id] = Math.max(-1, ...incoming(id).map((s) => visit(s, seen))) + 1;
    return depth[id];
  };
  const rows = {};
  for (const node of doc.nodes) {
    if (node.position && Number.isFinite(node.position.x) && Number.isFinite(node.position.y)) continue;
    const layer = visit(node.id);
    rows[layer] = (rows[layer] || 0) + 1;
    node.position = { x: 20 + layer * (NODE_WIDTH + 50), y: 10 + (rows[layer] - 1) * (nodeHeight(catalog.get(node.type)) + 16) };
  }
}

export function loadGraph(doc, source) {
  if (!doc || !Array.isArray(doc.nodes)) throw new Error(`${source} is not a graph: it has no "nodes" list`);
  const copy = JSON.parse(JSON.stringify(doc));
  // Checked before the graph on the canvas is replaced: a file that cannot be drawn
  // leaves the user's graph as it was.
  copy.nodes.forEach((node, i) => {
    if (!node || typeof node !== "object" || typeof node.id !== "string" || !node.id
        || typeof node.type !== "string" || !node.type) {
      throw new Error(`${source}: node ${i} needs an "id" and a "type", each a non-empty string`);
    }
  });
  if (copy.edges !== undefined && !Array.isArray(copy.edges)) throw new Error(`${source}: "edges" is not a list`);
  copy.version = copy.version || 1;
  copy.settings = copy.settings || { device: "cpu" };
  copy.edges = copy.edges || [];
  for (const node of copy.nodes) node.params = node.params || {};
  layout(copy);
  graph = copy;
  canvas.states = {};
  canvas.selection = null;
  outputsRun = null;
  canvas.render();
  inspect();
  status(`${source}: ${graph.nodes.length} nodes`);
}

function uniqueId(type) {
  const base = type.split(".").pop().toLowerCase();
  for (let i = 1; ; i += 1) {
    const id = `${base}${i}`;
    if (!graph.nodes.some((n) => n.id === id)) return id;
  }
}

// The first place in the visible area, column by column, where a new node overlaps none.
function freeSpot(height) {
  const origin = canvas.topLeft();
  const overlaps = (x, y) => graph.nodes.some((n) => x < n.position.x + NODE_WIDTH + 20 && n.position.x < x + NODE_WIDTH + 20
    && y < n.position.y + nodeHeight(catalog.get(n.type)) + 12 && n.position.y < y + height + 12);
  for (let column = 0; column < 8; column += 1) {
    for (let row = 0; row < 8; row += 1) {
      const x = Math.round(origin.x + 20 + column * (NODE_WIDTH + 50));
      const y = Math.round(origin.y + 10 + row * 40);
      if (!overlaps(x, y)) return { x, y };
    }
  }
  return { x: Math.round(origin.x + 40), y: Math.round(origin.y + 40) };
}

function addNode(type) {
  const spec = catalog.get(type);
  const params = {};
  for (const param of spec.params) if (param.required) params[param.name] = param.type === "bool" ? false : "";
  const node = { id: uniqueId(type), type, params, position: freeSpot(nodeHeight(spec)) };
  graph.nodes.push(node);
  canvas.selection = { node: node.id };
  canvas.render();
  inspect();
  status(`added ${node.id}`);
}

function remove(selection) {
  if (selection.node) {
    graph.nodes = graph.nodes.filter((n) => n.id !== selection.node);
    graph.edges = graph.edges.filter((e) => e.source !== selection.node && e.target !== selection.node);
    status(`deleted ${selection.node}`);
  } else if (selection.edge !== undefined) {
    const [edge] = graph.edges.splice(selection.edge, 1);
    if (edge) status(`deleted the edge ${edge.source}.${edge.source_port} → ${edge.target}.${edge.target_port}`);
  }
  canvas.selection = null;
  canvas.render();
  inspect();
}

function connect(edge) {
  const before = graph.edges.length;
  graph.edges = graph.edges.filter((e) => !(e.target === edge.target && e.target_port === edge.target_port));
  graph.edges.push(edge);
  // An edge is selected by its place in the list, which this just changed.
  if (canvas.selection && canvas.selection.edge !== undefined) {
    canvas.selection = null;
    inspect();
  }
  status(`connected ${edge.source}.${edge.source_port} → ${edge.target}.${edge.target_port}`
    + (graph.edges.length === before ? " (it replaces the input's old edge)" : ""));
  canvas.render();
}

// Palette --------------------------------------------------------------------------
function renderPalette(filterText = "") {
  const needle = filterText.trim().toLowerCase();
  const groups = new Map();
  for (const spec of catalog.values()) {
    if (needle && !`${spec.type} ${spec.description}`.toLowerCase().includes(needle)) continue;
    const pack = spec.type.split(".")[0];
    if (!groups.has(pack)) groups.set(pack, []);
    groups.get(pack).push(spec);
  }
  document.getElementById("palette-groups").replaceChildren(...[...groups].map(([pack, specs]) => el("section", {},
    el("h4", {}, pack), ...specs.map((spec) => el("button", { "data-palette": spec.type, title: spec.description,
      onclick: () => addNode(spec.type) }, spec.type.split(".").slice(1).join("."))))));
}

// Inspector ------------------------------------------------------------------------
function paramInput(node, param) {
  const value = node.params[param.name];
  const set = (raw) => {
    if (raw === "" || raw === undefined) delete node.params[param.name];
    else node.params[param.name] = raw;
    canvas.refreshParams(node);
  };
  const common = { name: param.name, id: `param-${param.name}`, "data-param": param.name };
  if (param.type === "bool") {
    return el("input", { ...common, type: "checkbox", checked: Boolean(value ?? param.default),
      onchange: (e) => set(e.target.checked) });
  }
  if (param.type === "select") {
    return el("select", { ...common, onchange: (e) => set(e.target.value) },
      ...param.options.map((o) => el("option", { value: o, selected: o === (value ?? param.default) }, o)));
  }
  if (param.type === "int" || param.type === "float") {
    return el("input", { ...common, type: "number", min: param.min, max: param.max, step: param.type === "int" ? 1 : "any",
      value: value ?? "", placeholder: param.default !== undefined ? String(param.default) : "required",
      oninput: (e) => set(e.target.value === "" ? "" : Number(e.target.value)) });
  }
  if (param.type === "list" || param.type === "mapping") return jsonInput(common, value ?? param.default, set);
  const input = el("input", { ...common, type: param.type === "secret" ? "password" : "text", autocomplete: "off",
    value: value ?? "", placeholder: param.default !== undefined ? String(param.default) : "required",
    oninput: (e) => set(e.target.value) });
  if (param.name !== "path") return input;
  // A file param: a path here, label:relative on any machine that mounts the label, or
  // a file uploaded to this server (upload:<id>).
  const note = el("span", { class: "muted", "data-upload-note": "" });
  const picker = el("input", { type: "file", hidden: true, "data-upload": param.name, onchange: async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    try {
      const made = await uploadFile(file);
      input.value = made.ref;
      set(made.ref);
      note.textContent = ` uploaded ${made.name} (${made.size} bytes)`;
    } catch (error) {
      note.textContent = ` upload refused: ${error.message}`;
    }
  } });
  return el("div", { class: "file-param" }, input,
    el("button", { type: "button", class: "acts", onclick: () => picker.click() }, "Upload…"), picker, note);
}

// Each click starts a new inspection; an older one that is still waiting on the server
// must not paint over it.
let inspection = 0;

async function inspect() {
  const mine = ++inspection;
  const box = document.getElementById("inspector");
  const selection = canvas.selection;
  if (!selection || !selection.node) {
    box.replaceChildren(el("h3", {}, graph.name || "untitled"),
      el("p", { class: "muted" }, `${graph.nodes.length} nodes, ${graph.edges.length} edges. Click a node to edit its params.`),
      ...selection && selection.edge !== undefined
        ? [el("button", { class: "danger", onclick: () => remove(selection) }, "Delete edge")] : []);
    return;
  }
  const node = graph.nodes.find((n) => n.id === selection.node);
  const spec = catalog.get(node.type);
  const form = el("form", { onsubmit: (e) => e.preventDefault() });
  for (const param of spec ? spec.params : []) {
    const hint = [param.type, param.min !== undefined ? `min ${param.min}` : "", param.max !== undefined ? `max ${param.max}` : ""]
      .filter(Boolean).join(", ");
    form.append(el("label", { for: `param-${param.name}` }, `${param.name} (${hint})`), paramInput(node, param));
  }
  const outputs = el("div", { id: "node-outputs" });
  // The form is painted at once, so what is typed next goes to the node just clicked;
  // the flavor picker and the outputs, which ask the server, fill in after.
  const flavor = el("div", { class: "flavor" });
  box.replaceChildren(el("h3", {}, `${node.id}`), el("p", { class: "muted" }, `${node.type}: ${spec ? spec.description : "not in the catalog"}`),
    spec && spec.params.length ? form : el("p", { class: "muted" }, "No params."), flavor,
    el("p", {}, el("button", { class: "danger", onclick: () => remove({ node: node.id }) }, "Delete node")), outputs);
  const picker = await flavorPicker(node);
  if (mine !== inspection) return;
  flavor.replaceWith(picker);
  if (outputsRun) {
    try {
      const reply = await api("GET", `/api/runs/${outputsRun}/outputs/${encodeURIComponent(node.id)}`);
      if (mine !== inspection) return;
      outputs.replaceChildren(el("h3", {}, `Outputs (run ${outputsRun.slice(0, 8)})`),
        el("pre", {}, JSON.stringify(reply.outputs, null, 2)));
    } catch (error) {
      outputs.replaceChildren(el("p", { class: "muted" }, `No recorded outputs: ${error.message}`));
    }
  }
}

// A node's size by name: the server says what the flavor is each time a run is built.
function sizes(flavor) {
  return [flavor.cpus && `${flavor.cpus} cpus`, flavor.gpus && `${flavor.gpus} card${flavor.gpus === 1 ? "" : "s"}`,
    flavor.memory_gib && `a ${flavor.memory_gib} GiB budget`, flavor.ram && `${flavor.ram} MB ram`,
    flavor.duration_s && `about ${flavor.duration_s} s`].filter(Boolean).join(", ");
}

async function flavorPicker(node) {
  let flavors = [];
  try {
    ({ flavors } = await api("GET", "/api/flavors"));
  } catch {
    return el("p", { class: "muted" }, "Flavors are not available.");
  }
  const current = (node.resources || {}).flavor || "";
  const note = el("p", { class: "muted", id: "flavor-note" });
  const explain = (name) => {
    const flavor = flavors.find((f) => f.name === name);
    note.textContent = flavor ? `${sizes(flavor) || "no sizes"}${flavor.description ? `: ${flavor.description}` : ""}. `
      + "Read again for every run; more than a machine has is cut down to it, with a warning."
      : "No flavor: the node holds only what its own resources say.";
  };
  const select = el("select", { name: "flavor", id: "node-flavor", onchange: (event) => {
    const resources = { ...(node.resources || {}) };
    if (event.target.value) resources.flavor = event.target.value;
    else delete resources.flavor;
    if (Object.keys(resources).length) node.resources = resources;
    else delete node.resources;
    explain(event.target.value);
  } }, el("option", { value: "" }, "none"),
  ...flavors.map((f) => el("option", { value: f.name, selected: f.name === current }, f.name)));
  explain(current);
  return el("div", { class: "flavor" }, el("label", { for: "node-flavor" }, "Flavor (a named size)"), select, note);
}

// Run (interactive lane) ------------------------------------------------------------
function nodeLabel(type, payload) {
  if (type === "node_started") return { state: "running", label: "running…" };
  if (type === "node_queued") return { state: "running", label: `waiting for ${payload.cpus} cpus` };
  if (type === "node_failed") return { state: "failed", label: "failed" };
  if (payload.cached) return { state: "cached", label: "cached" };
  return { state: "done", label: `done ${payload.duration_s !== undefined ? `${payload.duration_s.toFixed(2)} s` : ""}` };
}

async function run() {
  const button = document.getElementById("run-graph");
  button.disabled = true;
  try {
    const reply = await api("POST", "/api/runs", { graph: currentGraph(), name: graph.name,
      options: { lane: "interactive", editor_session: session, record_outputs: true } });
    canvas.states = {};
    canvas.render();
    status(`running ${reply.run_id.slice(0, 8)} on ${reply.device}`);
    follow(reply.run_id, `Run ${graph.name || reply.run_id.slice(0, 8)} on ${reply.device}`, {
      onEvent: (event) => {
        if (event.node_id && event.type.startsWith("node_")) {
          canvas.states[event.node_id] = nodeLabel(event.type, event.payload);
          canvas.render();
        }
        if (event.type === "run_finished") {
          outputsRun = reply.run_id;
          button.disabled = false;
          const { status: ended, error } = event.payload;
          status(`run ${ended}${error ? `: ${error}` : ""}`, ended !== "succeeded");
          inspect();
        }
      },
      letGo: () => {  // Watch took the log: the run goes on, its page has it
        button.disabled = false;
        status(`run ${reply.run_id.slice(0, 8)} goes on; this tab no longer follows it`);
      },
    });
  } catch (error) {
    // A refusal (503: the lane is full, the seed gate is closed) is said, never waited on.
    status(`Run refused: ${error.code || error.message}`, true);
    showMessage(`Run refused: ${error.message}`);
    button.disabled = false;
  }
}

// Files and examples ---------------------------------------------------------------
function save() {
  const blob = new Blob([JSON.stringify(currentGraph(), null, 2)], { type: "application/json" });
  const link = el("a", { href: URL.createObjectURL(blob), download: `${graph.name || "graph"}.json` });
  link.click();
  URL.revokeObjectURL(link.href);
}

export async function initEditor(serverInfo, workers) {
  info = serverInfo;
  listWorkers = workers;
  const [nodes, examples] = await Promise.all([api("GET", "/api/nodes"), api("GET", "/api/examples")]);
  for (const spec of nodes.nodes) catalog.set(spec.type, spec);
  canvas = new Canvas(document.getElementById("canvas"), {
    graph: () => graph, spec: (type) => catalog.get(type),
    select: (selection) => { canvas.selection = selection; canvas.render(); inspect(); },
    connect, remove, refuse: (text) => status(`Refused: ${text}`, true),
    rendered: () => { document.getElementById("canvas-hint").hidden = graph.nodes.length > 1; },
  });
  renderPalette();
  document.getElementById("palette-search").addEventListener("input", (e) => renderPalette(e.target.value));
  const picker = document.getElementById("examples");
  picker.append(...examples.examples.map((ex) => el("option", { value: ex.name }, ex.name)));
  picker.addEventListener("change", () => {
    const example = examples.examples.find((ex) => ex.name === picker.value);
    if (example) loadGraph(example.graph, `example ${example.name}`);
    picker.value = "";
  });
  document.getElementById("open-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    try {
      loadGraph(JSON.parse(await file.text()), file.name);
    } catch (error) {
      status(`Cannot open ${file.name}: ${error.message}`, true);
    }
    event.target.value = "";
  });
  document.getElementById("save-graph").addEventListener("click", save);
  document.getElementById("tidy-graph").addEventListener("click", () => {
    for (const node of graph.nodes) delete node.position;
    layout(graph);
    canvas.fit();  // the laid-out graph, all of it in view
  });
  document.getElementById("fit-graph").addEventListener("click", () => canvas.fit());
  document.getElementById("new-graph").addEventListener("click", () => loadGraph(
    { version: 1, name: "untitled", settings: { device: "cpu" }, nodes: [], edges: [] }, "new graph"));
  document.getElementById("run-graph").addEventListener("click", run);
  document.getElementById("run-graph").hidden = !info.capabilities.interactive_lane;
  document.getElementById("queue-graph").addEventListener("click", () => queueDialog({
    info, listWorkers, graph: currentGraph(),
    queued: (reply, keptOutputs) => {
      if (keptOutputs) outputsRun = reply.run_id;  // the inspector shows this run's outputs
      status(`queued ${reply.run_id.slice(0, 8)} on ${reply.queue_key}`
        + (reply.queue_position ? `, #${reply.queue_position} in queue` : ""));  // the editor stays; the notice leads to the list
    },
  }).catch((e) => status(e.message, true)));
  // The editor session's cached outputs are dropped on the server when the page goes.
  window.addEventListener("pagehide", () => {
    fetch(`/api/editor-sessions/${session}`, { method: "DELETE", keepalive: true, headers: MUTATION_HEADERS });
  });
  const first = examples.examples.find((ex) => ex.name === "hello") || examples.examples[0];
  if (first) loadGraph(first.graph, `example ${first.name}`);
  else canvas.render();
}
