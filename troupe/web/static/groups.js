// The Runs list grouped by a key (GET /api/runs?group_by=KEY&metric=SERIES): a row per
// value with how many runs have it and the series' mean, min, max and standard deviation
// over their newest values; and a chart of each group's curve of the series, its mean at
// each step with a band from the lowest to the highest run (bands.js). A group's row
// narrows the list to its runs (KEY = VALUE in the filter box).

import { bandChart } from "./bands.js";
import { readable } from "./charts.js";
import { api, el } from "./util.js";

const CHART_GROUPS = 8;  // the groups drawn, the first the server lists
const RUNS_PER_GROUP = 20;  // each group's newest runs drawn
const ENDED = new Set(["succeeded", "failed", "cancelled", "interrupted"]);
const pointsOf = new Map();  // "run|series" -> points, once the run ended (they no longer change)
let drawn = { key: null, chart: null };

// A value as the where grammar writes it: a number or a boolean as it is, text quoted.
export function literal(value) {
  if (typeof value === "number" || typeof value === "boolean") return String(value);
  return `'${String(value).replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
}

// The reply's groups as {value, label, runs, mean, min, max, std} (stats null without a
// metric); ``label``: a submitter's, sweep's or study's name where the value is its id.
function groupsOf(reply) {
  return (reply.groups || []).map((g) => {
    const stats = g.metric || {};
    return { value: g.value, label: g.label ?? null, runs: g.runs,
      mean: stats.mean ?? null, min: stats.min ?? null, max: stats.max ?? null, std: stats.std ?? null };
  });
}

function shown(value) {
  if (value === null || value === undefined) return "(none)";
  return typeof value === "string" ? value : JSON.stringify(value);
}

const named = (g) => (g.label ? g.label : shown(g.value));

const number = (v) => (v === null || v === undefined ? "" : readable(v));

// ``filters``: the list's own (status, q, where) as URLSearchParams; ``narrow(cond)``
// adds a group's condition to the filter box. Throws the API's error (a where refused).
export async function showGroups(box, { key, metric, filters, where, narrow, current }) {
  const params = new URLSearchParams(filters);
  params.set("group_by", key);
  if (metric) params.set("metric", metric);
  const groups = groupsOf(await api("GET", `/api/runs?${params}`));
  if (!current()) return;
  const head = [key, "Runs", ...(metric ? [`mean ${metric}`, "min", "max", "sd"] : [])];
  const table = el("table", { class: "runs groups" }, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...groups.map((g) => el("tr", { "data-group-value": shown(g.value),
      title: g.value === null || g.value === undefined ? "" : `Only these runs: ${key} = ${literal(g.value)}`,
      onclick: () => { if (g.value !== null && g.value !== undefined) narrow(`${key} = ${literal(g.value)}`); } },
    el("td", {}, g.value === null || g.value === undefined ? shown(g.value)
      : el("button", { type: "button", class: "group-open", onclick: (e) => { e.stopPropagation(); narrow(`${key} = ${literal(g.value)}`); } },
        named(g))), el("td", {}, String(g.runs)),
    ...(metric ? [el("td", {}, number(g.mean)), el("td", {}, number(g.min)), el("td", {}, number(g.max)), el("td", {}, number(g.std))] : [])))));
  const chartBox = el("div", { class: "charts group-curves" });
  box.replaceChildren(el("div", { class: "scroll" }, table),
    groups.length ? "" : el("p", { class: "muted" }, "No run matches."), chartBox);
  if (metric) await curves(chartBox, { key, metric, where, filters, groups, current });
}

// Each group's newest runs and their points of the series, read once a run has ended.
async function curves(box, { key, metric, where, filters, groups, current }) {
  const drawnGroups = groups.filter((g) => g.value !== null && g.value !== undefined).slice(0, CHART_GROUPS);
  const members = await Promise.all(drawnGroups.map(async (g) => {
    const params = new URLSearchParams(filters);
    const cond = `${key} = ${literal(g.value)}`;
    params.set("where", where ? `(${where}) and ${cond}` : cond);
    params.set("limit", String(RUNS_PER_GROUP));
    const { runs } = await api("GET", `/api/runs?${params}`);
    return Promise.all(runs.map(async (run) => {
      const at = `${run.id}|${metric}`;
      if (pointsOf.has(at)) return pointsOf.get(at);
      const { series } = await api("GET", `/api/runs/${run.id}/metrics`).catch(() => ({ series: {} }));
      const points = series[metric] || [];
      if (ENDED.has(run.status)) pointsOf.set(at, points);
      return points;
    }));
  }));
  if (!current() || !box.isConnected) return;
  const lines = drawnGroups.map((g, i) => ({ label: `${key}=${named(g)}`, runs: members[i].filter((p) => p.length) }));
  const seen = `${key}|${metric}|${JSON.stringify(lines.map((l) => [l.label, l.runs.map((r) => r.length)]))}`;
  if (seen !== drawn.key || !drawn.chart) {
    if (drawn.chart) drawn.chart.destroy();
    const more = groups.length > drawnGroups.length ? `; the first ${CHART_GROUPS} groups` : "";
    drawn = { key: seen, chart: bandChart(metric, lines.filter((l) => l.runs.length),
      `${metric} by ${key}: each group's mean, the band from its lowest to its highest run (its newest ${RUNS_PER_GROUP} runs${more})`) };
  }
  box.replaceChildren(drawn.chart.element);
  requestAnimationFrame(() => drawn.chart && drawn.chart.resize());
}
