// The Sweeps panel: each sweep, a selected one's variants ranked best first, and the
// "New sweep" dialog, built from the param schemas of the graph in the editor.

import { catalogType, currentGraph } from "./editor.js";
import { seriesChart } from "./charts.js";
import { parallelChart, scatterChart } from "./param_charts.js";
import { api, el, openDialog, time } from "./util.js";

let openSweep = null;

// #/sweeps/ID: that sweep with the whole width; #/sweeps (null): the list.
export async function showSweep(sweepId) {
  openSweep = sweepId;
  await refreshSweeps();
}

export async function refreshSweeps() {
  const { sweeps } = await api("GET", "/api/sweeps");
  document.getElementById("sweep-rows").replaceChildren(...sweeps.map((s) => el("tr", {
    "data-sweep": s.id, class: s.id === openSweep ? "selected" : null,
    onclick: () => { location.hash = `#/sweeps/${s.id}`; },
  }, el("td", {}, s.name || s.id.slice(0, 8)), el("td", {}, el("span", { class: `status ${s.state}` }, s.state)),
  el("td", {}, String(s.total)), el("td", {}, time(s.created_at)))));
  document.getElementById("sweeps-empty").hidden = sweeps.length > 0;
  document.querySelector("#sweeps .split").classList.toggle("one-open", Boolean(openSweep));
  document.getElementById("sweep").hidden = !openSweep;
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
  document.getElementById("ranking-rows").replaceChildren(...sweep.variants.map((v) => el("tr", {
    "data-run": v.run_id, onclick: () => { location.hash = `#/runs/${v.run_id}`; } },
    el("td", {}, v.rank === null ? "" : String(v.rank)), el("td", {}, el("span", { class: `status ${v.status}` }, v.status)),
    el("td", {}, v.objective_value === null ? "" : v.objective_value.toPrecision(4)),
    ...keys.map((k) => el("td", {}, String(v.params[k]))))));
  // The objective against each param (words too), every variant across them all, and the
  // variants' curves of the objective overlaid, the best one first and named so.
  const best = sweep.variants.find((v) => v.rank === 1)?.run_id;
  document.getElementById("sweep-charts").replaceChildren(...keys.map((key) => scatterChart(key, sweep.objective.metric,
    sweep.variants.map((v) => ({ x: v.params[key], y: v.objective_value, run_id: v.run_id })))),
  ...(keys.length ? [parallelChart(keys, sweep.objective.metric, sweep.variants, best)] : []),
  ...(await curves(sweep, best)));
}

const CURVES = 20;  // the variants whose curves are drawn: the best ranked first

async function curves(sweep, best) {
  const metric = sweep.objective.metric;
  const shown = [...sweep.variants].filter((v) => v.run_exists !== false)
    .sort((a, b) => (a.rank ?? Infinity) - (b.rank ?? Infinity)).slice(0, CURVES);
  const series = await Promise.all(shown.map((v) => api("GET", `/api/runs/${v.run_id}/metrics`).catch(() => ({ series: {} }))));
  const lines = shown.map((v, i) => ({
    label: `${v.run_id === best ? "best: " : ""}${Object.entries(v.params).map(([k, x]) => `${k}=${x}`).join(" ")}`,
    points: series[i].series[metric] || [] })).filter((line) => line.points.length);
  if (!lines.length) return [];
  const chart = seriesChart(metric, lines, { x: "step", log: false, smooth: 0 });
  chart.element.classList.add("curves");
  requestAnimationFrame(() => chart.resize());
  return [chart.element];
}

// Params a sweep can vary: numbers, selects and booleans of the editor's nodes (never secrets).
function sweepable(graph) {
  const found = [];
  for (const node of graph.nodes) {
    for (const param of catalogType(node.type)?.params || []) {
      if (["int", "float", "select", "bool", "string"].includes(param.type)) found.push({ node, param });
    }
  }
  return found;
}

// A string param's values may hold commas (an MLP's "64,32"): its values are split at ";".
const separator = (param) => (param.type === "string" ? ";" : ",");

function defaultValues(node, param) {
  if (param.type === "select") return param.options.join(", ");
  if (param.type === "bool") return "true, false";
  if (param.type === "string") return String(node.params[param.name] ?? param.default ?? "");
  const current = node.params[param.name] ?? param.default ?? (param.min ?? 1);
  return param.type === "int" ? `${current}, ${Number(current) + 1}` : `${current}, ${Number(current) * 2}`;
}

function parseValue(text, type) {
  if (type === "int" || type === "float") {
    const number = Number(text);
    if (text === "" || Number.isNaN(number)) throw new Error(`${JSON.stringify(text)} is not a number`);
    return number;
  }
  if (type === "bool") return text === "true";
  return text;
}

// A swept param: its values, comma separated, or (a number) a range: min, max, how many,
// spaced evenly or on a log scale, as the API's range takes them.
function paramRow(choices, index) {
  const select = el("select", { "data-field": "param" }, ...choices.map(({ node, param }, i) => el("option",
    { value: String(i), selected: i === index }, `${node.id}.${param.name} (${param.type})`)));
  const values = el("input", { "data-field": "values", size: 30, "aria-label": "values, comma separated" });
  const kind = el("select", { "data-field": "kind", "aria-label": "values or a range" },
    el("option", { value: "values" }, "values"), el("option", { value: "range" }, "a range"));
  const number = (field, label, extra = {}) => el("div", {}, el("label", {}, label),
    el("input", { "data-field": field, type: "number", step: "any", size: 7, ...extra }));
  const range = el("div", { class: "row", "data-range": "" }, number("min", "Min"), number("max", "Max"),
    number("count", "How many", { min: 1, step: 1, value: 4 }),
    el("div", {}, el("label", {}, el("input", { "data-field": "log", type: "checkbox" }), " log scale")));
  const valuesBox = el("div", {}, el("label", {}, "Values (comma separated)"), values);
  const show = () => {
    const { param } = choices[Number(select.value)];
    const numeric = ["int", "float"].includes(param.type);
    kind.hidden = !numeric;
    if (!numeric) kind.value = "values";
    range.hidden = kind.value !== "range";
    valuesBox.hidden = kind.value === "range";
  };
  const fill = () => {
    const { node, param } = choices[Number(select.value)];
    values.value = defaultValues(node, param);
    const current = Number(node.params[param.name] ?? param.default ?? param.min ?? 1);
    // A range a log scale can take as it is: above zero, a decade each side of the value.
    const low = param.min > 0 ? param.min : current > 0 ? current / 10 : 0.001;
    range.querySelector("[data-field=min]").value = String(+low.toPrecision(3));
    range.querySelector("[data-field=max]").value = String(param.max ?? (current > 0 ? current * 10 : 1));
    valuesBox.querySelector("label").textContent = param.type === "string" ? "Values (separated by ;)" : "Values (comma separated)";
    show();
  };
  select.addEventListener("change", fill);
  kind.addEventListener("change", show);
  fill();
  const row = el("div", { class: "row sweep-param" }, el("div", {}, el("label", {}, "Param"), select),
    el("div", {}, el("label", {}, "Kind"), kind), valuesBox, range,
    el("button", { type: "button", onclick: () => {
      const form = row.closest("form"); // the preview listens there: told after the row is gone
      row.remove();
      form?.dispatchEvent(new Event("input"));
    } }, "Remove"));
  return row;
}

function paramSpec(row, choices) {
  const { node, param } = choices[Number(row.querySelector("[data-field=param]").value)];
  const field = (name) => row.querySelector(`[data-field=${name}]`);
  if (field("kind").value === "range") {
    const spec = { min: Number(field("min").value), max: Number(field("max").value), count: Number(field("count").value) };
    if (field("log").checked) spec.scale = "log";
    return { node_id: node.id, param: param.name, range: spec };
  }
  const values = field("values").value.split(separator(param)).map((v) => v.trim()).filter((v) => v !== "");
  return { node_id: node.id, param: param.name, values: values.map((v) => parseValue(v, param.type)) };
}

// How many runs the sweep queues, as the form stands: every combination, or the samples.
function preview(form, paramsBox, choices) {
  const out = form.querySelector("#sweep-preview");
  try {
    const specs = [...paramsBox.querySelectorAll(".sweep-param")].map((row) => paramSpec(row, choices));
    const runs = form.elements.method.value === "random" ? Number(form.elements.samples.value)
      : specs.reduce((n, spec) => n * (spec.range ? spec.range.count : spec.values.length), 1);
    out.textContent = specs.length ? `It queues ${runs} run${runs === 1 ? "" : "s"}.` : "Add a param.";
  } catch (error) {
    out.textContent = error.message;
  }
}

export function newSweepDialog() {
  const graph = currentGraph();
  const choices = sweepable(graph);
  let paramsBox;
  openDialog("New sweep", (form) => {
    if (!choices.length) {
      form.append(el("p", { class: "explain" }, "The graph in the editor has no param a sweep can vary "
        + "(numbers, selects or booleans). Load an example or add nodes first."));
      return;
    }
    paramsBox = el("div", {}, paramRow(choices, 0));
    form.append(
      el("p", { class: "muted" }, `Variants of "${graph.name || "graph"}" as it is in the editor, each a queued run.`),
      el("div", { class: "row" }, el("div", {}, el("label", {}, "Name"), el("input", { name: "name", value: `${graph.name || "graph"} sweep` })),
        el("div", {}, el("label", {}, "Method"), el("select", { name: "method" }, el("option", { value: "grid" }, "grid: every combination"),
          el("option", { value: "random" }, "random: draw samples"))),
        el("div", {}, el("label", {}, "Samples (random)"), el("input", { name: "samples", type: "number", min: 1, value: 4, size: 4 }))),
      paramsBox,
      el("button", { type: "button", onclick: () => { paramsBox.append(paramRow(choices, 0)); preview(form, paramsBox, choices); } },
        "Add a param"),
      el("div", { class: "row" }, el("div", {}, el("label", {}, "Objective metric"), el("input", { name: "metric", value: "val_loss" })),
        el("div", {}, el("label", {}, "Direction"), el("select", { name: "direction" }, el("option", { value: "minimize" }, "minimize"),
          el("option", { value: "maximize" }, "maximize")))),
      el("p", { class: "explain" }, "Each combination becomes one run on the queue of the graph's device; the ranking "
        + "orders them by the objective's last value as they finish. Limits (variants, params, values) are the server's; "
        + "a sweep over them is refused whole, never cut."),
      el("p", { id: "sweep-preview", class: "preview", "aria-live": "polite" }));
    form.addEventListener("input", () => preview(form, paramsBox, choices));
    form.addEventListener("change", () => preview(form, paramsBox, choices));
    preview(form, paramsBox, choices);
  }, {
    submitLabel: "Queue the sweep",
    submit: choices.length ? async (form) => {
      const params = [...paramsBox.querySelectorAll(".sweep-param")].map((row) => paramSpec(row, choices));
      if (!params.length) throw new Error("add at least one param");
      const method = form.elements.method.value;
      const body = {
        base_graph: graph, name: form.elements.name.value || undefined,
        sweep_spec: { method, params, ...(method === "random" ? { samples: Number(form.elements.samples.value) } : {}) },
        objective: { metric: form.elements.metric.value, direction: form.elements.direction.value },
      };
      const reply = await api("POST", "/api/sweeps", body);
      location.hash = `#/sweeps/${reply.sweep_id}`;
    } : null,
  });
}
