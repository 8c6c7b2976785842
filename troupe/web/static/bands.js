// Runs that belong together drawn as one: a group's mean at each step as a line, and a
// band from the lowest to the highest of its runs there (W&B's grouped runs). A study's
// repeats of a variant and a Group by of the Runs list are drawn this way, so a spread
// reads as a spread, not as tangled lines. Each figure keeps what it drew (its
// ``bands`` property and data-* attributes) for a script or a test to read.

import uPlot from "./vendor/uplot/uPlot.esm.js";
import { COLOURS, padded, readable, tooltipPlugin } from "./charts.js";
import { el } from "./util.js";

const HEIGHT = 240;
const WHOLE_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6];  // ticks at steps, not between

// runs: [[{step, value}]] -> steps ascending, and at each the mean, min, max and how many
// runs had a finite value there (a run that stopped early leaves the later steps).
export function fold(runs) {
  const at = new Map();
  for (const points of runs) {
    for (const p of points) {
      if (p.value === null || p.value === undefined || !Number.isFinite(p.value)) continue;
      if (!at.has(p.step)) at.set(p.step, []);
      at.get(p.step).push(p.value);
    }
  }
  const steps = [...at.keys()].sort((a, b) => a - b);
  const mean = [], min = [], max = [], count = [];
  for (const step of steps) {
    const values = at.get(step);
    mean.push(values.reduce((sum, v) => sum + v, 0) / values.length);
    min.push(Math.min(...values));
    max.push(Math.max(...values));
    count.push(values.length);
  }
  return { steps, mean, min, max, count };
}

function hexAlpha(colour, alpha) {
  return `${colour}${Math.round(alpha * 255).toString(16).padStart(2, "0")}`;
}

// One chart: groups [{label, runs: [[points]]}], a line and a band each. ``caption`` says
// what is drawn. Returns {element, resize(), destroy()}.
export function bandChart(name, groups, caption) {
  const folded = groups.map((g) => ({ label: g.label, runs: g.runs.length, ...fold(g.runs) })).filter((g) => g.steps.length);
  const figure = el("figure", { class: "chart bands", "data-series": name,
    "data-groups": folded.map((g) => g.label).join("|"), "data-runs": folded.map((g) => g.runs).join("|") });
  figure.bands = folded;
  const plotBox = el("div", { class: "plot" });
  figure.append(el("figcaption", {}, caption), plotBox);
  const legend = el("div", { class: "band-legend" }, ...folded.map((g, i) => el("span", { class: "band-key" },
    el("span", { class: "swatch", style: `background:${COLOURS[i % COLOURS.length]}` }),
    `${g.label} (${g.runs} run${g.runs === 1 ? "" : "s"})`)));
  figure.append(legend);
  if (!folded.length) {
    plotBox.append(el("p", { class: "muted" }, `No run of these recorded ${name}.`));
    return { element: figure, resize() {}, destroy() {} };
  }
  // One x axis for all: the union of the steps, each group's values there or null.
  const xs = [...new Set(folded.flatMap((g) => g.steps))].sort((a, b) => a - b);
  const column = (g, values) => {
    const byStep = new Map(g.steps.map((s, i) => [s, values[i]]));
    return xs.map((x) => (byStep.has(x) ? byStep.get(x) : null));
  };
  const data = [xs];
  const series = [{ label: "step" }];
  const bands = [];
  folded.forEach((g, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const base = data.length;
    data.push(column(g, g.max), column(g, g.min), column(g, g.mean));
    series.push({ label: `${g.label} max`, stroke: hexAlpha(colour, 0.35), width: 0.5, faded: true, spanGaps: true, points: { show: false } },
      { label: `${g.label} min`, stroke: hexAlpha(colour, 0.35), width: 0.5, faded: true, spanGaps: true, points: { show: false } },
      { label: g.label, stroke: colour, width: 2, spanGaps: true, points: { show: (u, si, i0, i1) => i1 - i0 < 40 } });
    bands.push({ series: [base, base + 1], fill: hexAlpha(colour, 0.18) });
  });
  figure.dataset.points = String(xs.length);
  let plot = null;
  const draw = () => {
    if (plot) plot.destroy();
    plot = new uPlot({
      width: Math.max(plotBox.clientWidth || 320, 200), height: HEIGHT,
      plugins: [tooltipPlugin("step")], legend: { show: false }, bands,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false, range: (u, lo, hi) => padded(lo, hi) }, y: { range: (u, lo, hi) => padded(lo, hi) } },
      axes: [{ label: "step", ...(xs.every(Number.isInteger) ? { incrs: WHOLE_STEPS } : {}) },
        { size: 64, values: (u, splits) => splits.map(readable) }],
      series,
    }, data, plotBox);
    figure.plot = plot;  // what was drawn: its series and bands, for a test to read
  };
  draw();
  const observer = new ResizeObserver(() => {
    if (plot && plotBox.isConnected && plotBox.clientWidth && plotBox.clientWidth !== plot.width) {
      plot.setSize({ width: plotBox.clientWidth, height: HEIGHT });
    }
  });
  observer.observe(plotBox);
  return {
    element: figure,
    resize() { if (plot && plotBox.clientWidth) plot.setSize({ width: plotBox.clientWidth, height: HEIGHT }); },
    destroy() { observer.disconnect(); if (plot) plot.destroy(); plot = null; },
  };
}
