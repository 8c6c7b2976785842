// The graph canvas (SVG): draws nodes with their ports and the edges between them, and
// turns pointer input into edits: drag a node, drag from an output to an input to connect
// (type-checked), click to select, Delete to remove, drag the background to pan, scroll to zoom.
// It owns only the view; the graph itself belongs to the editor, reached through `hooks`.

import { svg } from "./util.js";

export const NODE_WIDTH = 180;
const HEAD = 22;
const ROW = 18;

export function compatible(from, to) {
  return from === to || from === "any" || to === "any";
}

export function nodeHeight(spec) {
  const rows = Math.max(spec ? spec.inputs.length : 0, spec ? spec.outputs.length : 0, 1);
  return HEAD + rows * ROW + 22; // the last row: its state, and its key params at the right
}

// The params a node was given (never a secret's value), short enough for its card.
function keyParams(node, spec) {
  const secret = new Set((spec ? spec.params : []).filter((p) => p.type === "secret").map((p) => p.name));
  const text = Object.entries(node.params || {}).filter(([name]) => !secret.has(name))
    .map(([name, value]) => `${name}=${typeof value === "string" ? value : JSON.stringify(value)}`).join("  ");
  return text.length > 20 ? `${text.slice(0, 19)}…` : text;
}

// A port's handle is "in:NODE:PORT" or "out:NODE:PORT". A node id may hold a colon
// (load:1); a port's name never does: the node is everything between the first and the last.
function portParts(handle) {
  return [handle.slice(handle.indexOf(":") + 1, handle.lastIndexOf(":")), handle.slice(handle.lastIndexOf(":") + 1)];
}

function portY(index) {
  return HEAD + 12 + index * ROW;
}

function edgePath(x1, y1, x2, y2) {
  const bend = Math.max(40, Math.abs(x2 - x1) / 2);
  return `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`;
}

export class Canvas {
  constructor(root, hooks) {
    this.root = root;
    this.hooks = hooks; // graph(), spec(type), select(sel), connect(edge), remove(sel), refuse(text), rendered()
    this.viewport = root.querySelector("#viewport");
    this.view = { x: 20, y: 20, k: 1 };
    this.selection = null; // {node: id} | {edge: index}
    this.states = {}; // node id -> {state, label}
    this._drag = null;
    root.addEventListener("pointerdown", (e) => this._down(e));
    window.addEventListener("pointermove", (e) => this._move(e));
    window.addEventListener("pointerup", (e) => this._up(e));
    root.addEventListener("wheel", (e) => this._zoom(e), { passive: false });
    root.addEventListener("keydown", (e) => {
      if ((e.key === "Delete" || e.key === "Backspace") && this.selection) {
        e.preventDefault();
        this.hooks.remove(this.selection);
      }
    });
  }

  toGraph(event) {
    const box = this.root.getBoundingClientRect();
    return { x: (event.clientX - box.left - this.view.x) / this.view.k, y: (event.clientY - box.top - this.view.y) / this.view.k };
  }

  topLeft() {
    return { x: -this.view.x / this.view.k, y: -this.view.y / this.view.k };
  }

  _portPoint(node, side, port) {
    const spec = this.hooks.spec(node.type);
    const ports = spec ? (side === "in" ? spec.inputs : spec.outputs) : [];
    const index = Math.max(0, ports.findIndex((p) => p.name === port));
    const { x, y } = node.position;
    return { x: side === "in" ? x : x + NODE_WIDTH, y: y + portY(index) };
  }

  render() {
    const graph = this.hooks.graph();
    this.viewport.setAttribute("transform", `translate(${this.view.x},${this.view.y}) scale(${this.view.k})`);
    const byId = Object.fromEntries(graph.nodes.map((n) => [n.id, n]));
    const edges = graph.edges.map((edge, index) => {
      const source = byId[edge.source];
      const target = byId[edge.target];
      if (!source || !target) return null;
      const a = this._portPoint(source, "out", edge.source_port);
      const b = this._portPoint(target, "in", edge.target_port);
      const selected = this.selection && this.selection.edge === index;
      return svg("path", { class: `edge${selected ? " selected" : ""}`, d: edgePath(a.x, a.y, b.x, b.y),
        "data-edge": `${edge.source}.${edge.source_port}->${edge.target}.${edge.target_port}`, "data-index": index });
    }).filter(Boolean);
    this.root.querySelector("#edges").replaceChildren(...edges);
    this.root.querySelector("#nodes").replaceChildren(...graph.nodes.map((node) => this._node(node)));
    if (this.hooks.rendered) this.hooks.rendered();
  }

  _node(node) {
    const spec = this.hooks.spec(node.type);
    const state = this.states[node.id];
    const selected = this.selection && this.selection.node === node.id;
    const height = nodeHeight(spec);
    const group = svg("g", { class: `node${selected ? " selected" : ""}${state ? ` ${state.state}` : ""}`,
      transform: `translate(${node.position.x},${node.position.y})`, "data-node": node.id });
    group.append(svg("rect", { class: "body", width: NODE_WIDTH, height }),
      svg("rect", { class: "head", x: 1, y: 1, width: NODE_WIDTH - 2, height: HEAD - 1, "data-grip": node.id }),
      svg("text", { class: "title", x: 8, y: 15, "data-grip": node.id }, `${node.id} · ${node.type.split(".").pop()}`));
    (spec ? spec.inputs : []).forEach((port, i) => {
      group.append(svg("circle", { class: "port", cx: 0, cy: portY(i), r: 5, "data-port": `in:${node.id}:${port.name}`,
        "data-type": port.type }), svg("text", { x: 9, y: portY(i) + 4 }, `${port.name}${port.required ? "" : "?"}`));
    });
    (spec ? spec.outputs : []).forEach((port, i) => {
      group.append(svg("circle", { class: "port", cx: NODE_WIDTH, cy: portY(i), r: 5, "data-port": `out:${node.id}:${port.name}`,
        "data-type": port.type }), svg("text", { x: NODE_WIDTH - 9, y: portY(i) + 4, "text-anchor": "end" }, port.name));
    });
    const label = state ? state.label : spec ? "" : "unknown type";
    group.append(svg("text", { class: "params", x: NODE_WIDTH - 8, y: height - 7, "text-anchor": "end", "data-params": node.id },
      keyParams(node, spec)),
      svg("text", { class: "state", x: 8, y: height - 7, "data-state": node.id }, label));
    return group;
  }

  // A node's key params on its card, after the inspector changed one.
  refreshParams(node) {
    for (const text of this.root.querySelectorAll("text.params")) {
      if (text.dataset.params === node.id) text.textContent = keyParams(node, this.hooks.spec(node.type));
    }
  }

  // Every node in view: the graph's bounds, scaled and centred; a small graph is not blown
  // up past 1.25 (its cards would outgrow the window's text).
  fit() {
    const nodes = this.hooks.graph().nodes.filter((n) => n.position);
    if (!nodes.length) return;
    const box = this.root.getBoundingClientRect();
    const left = Math.min(...nodes.map((n) => n.position.x));
    const top = Math.min(...nodes.map((n) => n.position.y));
    const right = Math.max(...nodes.map((n) => n.position.x + NODE_WIDTH));
    const bottom = Math.max(...nodes.map((n) => n.position.y + nodeHeight(this.hooks.spec(n.type))));
    const k = Math.min(1.25, Math.max(0.3, Math.min(box.width / (right - left + 40), box.height / (bottom - top + 40))));
    this.view = { k, x: (box.width - (right - left) * k) / 2 - left * k, y: (box.height - (bottom - top) * k) / 2 - top * k };
    this.render();
  }

  _down(event) {
    this.root.focus();
    const target = event.target;
    const port = target.dataset ? target.dataset.port : undefined;
    if (port && port.startsWith("out:")) {
      const [node, name] = portParts(port);
      this._drag = { kind: "connect", node, port: name, type: target.dataset.type };
      event.preventDefault();
      return;
    }
    const grip = target.dataset ? target.dataset.grip : undefined;
    const nodeGroup = target.closest ? target.closest("[data-node]") : null;
    if (grip || nodeGroup) {
      const id = grip || nodeGroup.dataset.node;
      const node = this.hooks.graph().nodes.find((n) => n.id === id);
      const at = this.toGraph(event);
      this._drag = { kind: "node", node, dx: at.x - node.position.x, dy: at.y - node.position.y };
      this.hooks.select({ node: id });
      event.preventDefault();
      return;
    }
    if (target.dataset && target.dataset.index !== undefined) {
      this.hooks.select({ edge: Number(target.dataset.index) });
      return;
    }
    this.hooks.select(null);
    this._drag = { kind: "pan", x: event.clientX, y: event.clientY, view: { ...this.view } };
  }

  _move(event) {
    const drag = this._drag;
    if (!drag) return;
    if (drag.kind === "pan") {
      this.view.x = drag.view.x + event.clientX - drag.x;
      this.view.y = drag.view.y + event.clientY - drag.y;
      this.viewport.setAttribute("transform", `translate(${this.view.x},${this.view.y}) scale(${this.view.k})`);
    } else if (drag.kind === "node") {
      const at = this.toGraph(event);
      drag.node.position = { x: Math.round(at.x - drag.dx), y: Math.round(at.y - drag.dy) };
      this.render();
    } else if (drag.kind === "connect") {
      const node = this.hooks.graph().nodes.find((n) => n.id === drag.node);
      const a = this._portPoint(node, "out", drag.port);
      const b = this.toGraph(event);
      this.root.querySelector("#draft-edge").setAttribute("d", edgePath(a.x, a.y, b.x, b.y));
    }
  }

  _up(event) {
    const drag = this._drag;
    this._drag = null;
    if (!drag) return;
    if (drag.kind !== "connect") return;
    this.root.querySelector("#draft-edge").setAttribute("d", "");
    const hit = document.elementFromPoint(event.clientX, event.clientY);
    const port = hit && hit.dataset ? hit.dataset.port : undefined;
    if (!port || !port.startsWith("in:")) return;
    const [node, name] = portParts(port);
    if (node === drag.node) {
      this.hooks.refuse("a node cannot feed itself");
      return;
    }
    if (!compatible(drag.type, hit.dataset.type)) {
      hit.classList.add("refused");
      setTimeout(() => hit.classList.remove("refused"), 1500);
      this.hooks.refuse(`types differ: ${drag.node}.${drag.port} gives ${drag.type}, ${node}.${name} takes ${hit.dataset.type}`);
      return;
    }
    this.hooks.connect({ source: drag.node, source_port: drag.port, target: node, target_port: name });
  }

  _zoom(event) {
    event.preventDefault();
    const before = this.toGraph(event);
    const k = Math.min(1.25, Math.max(0.3, this.view.k * (event.deltaY < 0 ? 1.1 : 1 / 1.1)));
    const box = this.root.getBoundingClientRect();
    this.view = { k, x: event.clientX - box.left - before.x * k, y: event.clientY - box.top - before.y * k };
    this.render();
  }
}
