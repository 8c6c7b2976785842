// The objective against a sweep's or a study's params: a scatter per param, and parallel
// coordinates across all of them. Split from charts.js (the series charts) to keep each
// file small; both take the same tick format and tooltip.

import uPlot from "./vendor/uplot/uPlot.esm.js";
import { COLOURS, padded, readable, tooltipPlugin } from "./charts.js";
import { el, svg } from "./util.js";

// The objective against one param (a sweep's or a study's page): a point per variant (or
// per repeat), nothing joined. Several variants with one value of the param get x values
// a hair apart, as uPlot wants them ascending; a param spanning a decade or more (a
// learning rate) is drawn on a log x; a param of words (an MLP's "64,32") as categories
// along x. Hover names the point's values; a click on it opens its run.
export function scatterChart(param, metric, points) {
  const figure = el("figure", { class: "chart scatter", "data-param": param });
  const plotBox = el("div", { class: "plot" });
  figure.append(el("figcaption", {}, `${metric} against ${param}`), plotBox);
  const categorical = points.some((p) => typeof p.x !== "number");
  const categories = categorical ? [...new Set(points.map((p) => String(p.x)))].sort() : [];
  const at = (p) => (categorical ? categories.indexOf(String(p.x)) : p.x);
  const sorted = points.filter((p) => Number.isFinite(at(p)) && p.y !== null).sort((a, b) => at(a) - at(b));
  const xs = [];
  for (const p of sorted) {
    const previous = xs[xs.length - 1];
    const x = at(p);
    xs.push(previous !== undefined && x <= previous ? previous + Math.abs(previous) * 1e-9 + 1e-12 : x);
  }
  const positive = !categorical && sorted.length > 1 && sorted[0].x > 0;
  const logX = positive && sorted[sorted.length - 1].x / sorted[0].x >= 10;
  figure.dataset.points = String(sorted.length);
  let plot = null;
  const draw = () => {
    if (plot) plot.destroy();
    plot = new uPlot({
      width: Math.max(plotBox.clientWidth || 320, 200), height: 260,
      plugins: [tooltipPlugin(param)],
      legend: { show: false },
      scales: { x: { time: false, ...(logX ? { distr: 3 } : { range: (u, min, max) => padded(min, max) }) },
        y: { range: (u, min, max) => padded(min, max) } },
      axes: [{ label: param, ...(categorical ? { splits: () => categories.map((_, i) => i),
        values: (u, splits) => splits.map((v) => categories[Math.round(v)] ?? "") } : { values: (u, s) => s.map(readable) }) },
      { size: 64, values: (u, splits) => splits.map(readable) }],
      series: [{ label: param }, { label: metric, stroke: COLOURS[0], paths: () => null, points: { show: true, size: 8, fill: COLOURS[0] } }],
      hooks: { ready: [(u) => u.over.addEventListener("click", () => {
        const run = sorted[u.cursor.idx]?.run_id;
        if (run) location.hash = `#/runs/${run}`;
      })] },
    }, [xs, sorted.map((p) => p.y)], plotBox);
  };
  const observer = new ResizeObserver(() => { if (plotBox.isConnected && plotBox.clientWidth) draw(); });
  observer.observe(plotBox);
  return figure;
}

// Parallel coordinates: an axis per swept param and one for the objective, a line per
// variant across them, the best one drawn strong. Hover names the variant; a click
// opens its run. Every word is written outside the band the lines cross: each axis's top
// value above it, its bottom value and its name below it, a name too long for the room
// between two axes cut with an ellipsis (the whole in its tooltip).
const PW = 760, PH = 260, PAD_X = 64, TOP = 34, BOTTOM = PH - 50;
const CHAR = 7;  // about what a character of the 12 px labels takes, in viewBox units

function fitted(text, room) {
  const most = Math.max(3, Math.floor(room / CHAR));
  return text.length <= most ? text : `${text.slice(0, most - 1)}…`;
}

function axisScale(values) {
  if (values.some((x) => typeof x !== "number")) {
    const words = [...new Set(values.map(String))].sort();
    return { ticks: words, at: (x) => (words.length > 1 ? words.indexOf(String(x)) / (words.length - 1) : 0.5) };
  }
  const lo = Math.min(...values), hi = Math.max(...values);
  return { ticks: [readable(lo), readable(hi)], at: (x) => (hi > lo ? (x - lo) / (hi - lo) : 0.5) };
}

export function parallelChart(keys, metric, variants, best) {
  const axes = [...keys, metric];
  const value = (v, key) => (key === metric ? v.objective_value : v.params[key]);
  const scale = axes.map((key) => axisScale(variants.map((v) => value(v, key)).filter((x) => x !== null && x !== undefined)));
  const xOf = (i) => (axes.length === 1 ? PW / 2 : PAD_X + (i * (PW - 2 * PAD_X)) / (axes.length - 1));
  const yOf = (t) => BOTTOM - t * (BOTTOM - TOP);
  const room = Math.min(2 * PAD_X, axes.length > 1 ? (PW - 2 * PAD_X) / (axes.length - 1) : PW) - 8;
  const word = (x, y, cls, text) => {
    const shown = fitted(text, room);
    return svg("text", { x, y, "text-anchor": "middle", class: cls }, shown, ...(shown === text ? [] : [svg("title", {}, text)]));
  };
  const shapes = [];
  axes.forEach((key, i) => {
    const ticks = scale[i].ticks;
    shapes.push(svg("line", { x1: xOf(i), x2: xOf(i), y1: yOf(0), y2: yOf(1), class: "axis" }),
      word(xOf(i), TOP - 9, "tick", String(ticks[ticks.length - 1] ?? "")),
      word(xOf(i), BOTTOM + 17, "tick", String(ticks[0] ?? "")),
      word(xOf(i), BOTTOM + 36, "axis-label", key));
  });
  for (const v of variants) {
    if (v.objective_value === null || v.objective_value === undefined) continue;
    const points = axes.map((key, i) => `${xOf(i)},${yOf(scale[i].at(value(v, key)))}`).join(" ");
    const name = keys.map((k) => `${k}=${v.params[k]}`).join(" ") + ` ${metric}=${readable(v.objective_value)}`;
    shapes.push(svg("polyline", { points, class: `variant${v.run_id === best ? " best" : ""}`, "data-run": v.run_id,
      onclick: () => { location.hash = `#/runs/${v.run_id}`; } }, svg("title", {}, name)));
  }
  return el("figure", { class: "chart parallel", "data-variants": String(variants.length) },
    el("figcaption", {}, `Every variant across its params and ${metric}`),
    svg("svg", { viewBox: `0 0 ${PW} ${PH}`, role: "img", "aria-label": `parallel coordinates of ${metric}` }, ...shapes));
}
