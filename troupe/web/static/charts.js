// Metric charts, drawn by uPlot (vendor/uplot, MIT; docs/decisions.md says why): one
// chart per series, one line per run. Hover shows a tooltip by the cursor with the step
// and every run's value there, and the cursor and a zoom (drag across; double-click or
// Reset zoom undoes it) are shared by every chart of the set; x is the step or the wall
// time since the run's first point; y is linear or log, its ticks numbers however small;
// smoothing is an exponential moving average, debiased as TensorBoard's, drawn over the
// faded raw line; a series of one point is shown as its value, not a chart; a point the
// API marks non-finite is drawn as a red line at its step, where the run diverged.
// Charts follow their container's width.

import uPlot from "./vendor/uplot/uPlot.esm.js";
import { el } from "./util.js";

export const COLOURS = ["#3a6ea5", "#c4572a", "#3f8f4f", "#8a4fa8", "#b38b00", "#2a8a8a", "#a83f5f", "#5f5f5f"];
const HEIGHT = 220;

function smoothed(values, weight) {
  if (!weight) return values;
  let last = 0;
  let count = 0;
  return values.map((value) => {
    if (value === null) return null;
    count += 1;
    last = last * weight + (1 - weight) * value;
    return last / (1 - weight ** count);
  });
}

// The runs' points on one shared x axis (uPlot wants one): the union of their x values,
// each run's value at them or null where it has none.
function aligned(runs, mode) {
  if (runs.length === 1) {  // one run (a run's own page, live): its points are its x order already
    const points = runs[0].points;
    const t0 = points.length ? Date.parse(points[0].ts) : 0;
    const xs = points.map((p) => (mode === "time" ? (Date.parse(p.ts) - t0) / 1000 : p.step));
    if (xs.every((x, i) => i === 0 || x > xs[i - 1])) return { xs, columns: [points] };
  }
  const keyed = runs.map((run) => {
    const t0 = run.points.length ? Date.parse(run.points[0].ts) : 0;
    return new Map(run.points.map((p) => [mode === "time" ? (Date.parse(p.ts) - t0) / 1000 : p.step, p]));
  });
  const xs = [...new Set(keyed.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  return { xs, columns: keyed.map((m) => xs.map((x) => (m.has(x) ? m.get(x) : null))) };
}

// A tick or a value as a number a person reads: 0.00012 as 1.2e-4, never "0".
export function readable(value) {
  if (value === null || value === undefined) return "";
  if (value !== 0 && Math.abs(value) < 0.001) return value.toExponential(1);
  return String(+value.toPrecision(4));
}

// The values at the cursor, by the point: the step, then each line's value.
export function tooltipPlugin(labelOfX) {
  let tip = null;
  return {
    hooks: {
      init: (u) => {
        tip = el("div", { class: "tooltip", hidden: "" });
        u.over.append(tip);
      },
      setCursor: (u) => {
        const i = u.cursor.idx;
        if (i === null || i === undefined || u.cursor.left < 0) {
          tip.hidden = true;
          return;
        }
        const rows = [el("div", { class: "row x" }, `${labelOfX} ${readable(u.data[0][i])}`)];
        u.series.forEach((s, k) => {
          if (k === 0 || !s.show || s.faded) return;
          const value = u.data[k][i];
          rows.push(el("div", { class: "row" }, el("span", { class: "swatch", style: `background:${s._stroke || s.stroke}` }),
            `${s.label} `, el("b", {}, value === null || value === undefined ? "–" : readable(value))));
        });
        tip.replaceChildren(...rows);
        tip.hidden = false;
        const right = u.cursor.left > u.over.clientWidth / 2;  // away from the edge it is near
        tip.style.left = right ? "" : `${u.cursor.left + 12}px`;
        tip.style.right = right ? `${u.over.clientWidth - u.cursor.left + 12}px` : "";
        tip.style.top = `${Math.max(0, u.cursor.top - 10)}px`;
      },
    },
  };
}

export function padded(min, max) {
  if (min === null || max === null) return [0, 1];
  if (min === max) {
    const pad = Math.abs(min) * 0.1 || 1;
    return [min - pad, max + pad];
  }
  return [min, max];
}

// Red lines where a run's series went non-finite, drawn over the plot.
function divergedPlugin(getMarks) {
  return {
    hooks: {
      draw: (u) => {
        const { ctx } = u;
        ctx.save();
        ctx.strokeStyle = "#b3261e";
        ctx.lineWidth = 2 * devicePixelRatio;
        for (const x of getMarks()) {
          const left = Math.round(u.valToPos(x, "x", true));
          ctx.beginPath();
          ctx.moveTo(left, u.bbox.top);
          ctx.lineTo(left, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      },
    },
  };
}

// A chart of one series over several runs: {element, update(runs, settings), destroy()}.
// runs: [{label, points: [{step, value, non_finite, ts}]}]; settings: {x, log, smooth}.
export function seriesChart(name, runs, settings, shared = null) {
  const figure = el("figure", { class: "chart", "data-series": name });
  const caption = el("figcaption", {});
  const plotBox = el("div", { class: "plot" });
  const single = el("div", { class: "single" });
  figure.append(caption, plotBox, single);
  let marks = [];
  let plot = null;
  let shape = "";

  function captionFor(current) {
    const parts = [`${name} `];
    if (current.length === 1) {
      const all = current[0].points;
      const last = all[all.length - 1];
      if (last) parts.push(el("span", { class: "muted" }, `last ${last.value === null ? last.non_finite : +last.value.toPrecision(4)}`));
    }
    const broken = current.flatMap((run) => run.points.filter((p) => p.value === null && p.non_finite)
      .slice(0, 1).map((p) => `${current.length > 1 ? `${run.label}: ` : ""}${p.non_finite} at step ${p.step}`));
    if (broken.length) parts.push(" ", el("span", { class: "diverged" }, broken.join(", ")));
    caption.replaceChildren(...parts);
  }

  // Every run with at most one point: its value (and across runs, bars), not an axis of
  // fractional steps around one dot.
  function oneEach(current) {
    if (!current.every((run) => run.points.length <= 1)) return false;
    if (plot) plot.destroy();
    plot = null;
    shape = "";
    const values = current.map((run) => (run.points[0] ? run.points[0].value : null));
    const top = Math.max(...values.filter((v) => v !== null).map(Math.abs), 0) || 1;
    single.replaceChildren(...current.map((run, i) => el("div", { class: "bar-row" },
      current.length > 1 ? el("span", { class: "bar-label" }, run.label) : "",
      current.length > 1 ? el("span", { class: "bar", style: `width:${(Math.abs(values[i] ?? 0) / top) * 60}%;background:${COLOURS[i % COLOURS.length]}` }) : "",
      el("b", { class: "bar-value" }, values[i] === null ? (run.points[0] ? run.points[0].non_finite : "–") : readable(values[i])))));
    figure.dataset.points = String(current.reduce((n, run) => Math.max(n, run.points.length), 0));
    figure.dataset.labels = current.map((run) => run.label).join("|");
    const broken = current.flatMap((run) => run.points.filter((p) => p.value === null && p.non_finite).map((p) => p.step));
    if (broken.length) figure.dataset.diverged = broken.join(" "); else delete figure.dataset.diverged;
    return true;
  }

  function build(current, options) {
    plotBox.hidden = false;
    single.replaceChildren();
    if (oneEach(current)) {
      plotBox.hidden = true;
      return;
    }
    figure.dataset.labels = current.map((run) => run.label).join("|");
    const { xs, columns } = aligned(current, options.x);
    marks = current.flatMap((run, i) => columns[i].flatMap((p, j) => (p && p.value === null && p.non_finite ? [xs[j]] : [])));
    if (marks.length) figure.dataset.diverged = marks.join(" "); else delete figure.dataset.diverged;
    figure.dataset.points = String(xs.length);
    const raw = columns.map((column) => column.map((p) => {
      if (!p || p.value === null) return null;
      return options.log && p.value <= 0 ? null : p.value;
    }));
    const faded = options.smooth > 0;  // the raw line stays, faded, under the smoothed one
    const data = [xs, ...(faded ? raw : []), ...raw.map((column) => smoothed(column, options.smooth))];
    const key = `${options.x}|${options.log}|${faded}|${current.map((r) => r.label).join("|")}`;
    if (plot && key === shape) {
      plot.setData(data);
      return;
    }
    if (plot) plot.destroy();
    shape = key;
    const finite = data.slice(1).flat().filter((v) => v !== null);
    const line = (run, i, fade) => ({
      label: run.label, stroke: fade ? `${COLOURS[i % COLOURS.length]}44` : COLOURS[i % COLOURS.length],
      width: fade ? 1 : 1.5, spanGaps: true, faded: fade, points: { show: (u, si, i0, i1) => !fade && i1 - i0 < 60 },
    });
    const xLabel = options.x === "time" ? "s" : "step";
    plot = new uPlot({
      width: Math.max(plotBox.clientWidth || 320, 200), height: HEIGHT,
      plugins: [divergedPlugin(() => marks), tooltipPlugin(xLabel), ...(shared ? [shared.plugin] : [])],
      legend: { show: false },
      cursor: { drag: { x: true, y: false }, ...(shared ? { sync: { key: shared.key, setSeries: false } } : {}) },
      scales: {
        x: { time: false, range: (u, min, max) => padded(min, max) },
        y: options.log ? { distr: 3 } : { range: (u, min, max) => padded(finite.length ? min : null, finite.length ? max : null) },
      },
      axes: [{ label: options.x === "time" ? "seconds since its first point" : "step" },
        { size: 64, values: (u, splits) => splits.map(readable) }],
      series: [{ label: xLabel }, ...(faded ? current.map((run, i) => line(run, i, true)) : []),
        ...current.map((run, i) => line(run, i, false))],
    }, data, plotBox);
  }

  const chart = {
    element: figure,
    update(current, options) {
      captionFor(current);
      build(current, options);
    },
    resize() {
      if (plot && plotBox.clientWidth) plot.setSize({ width: plotBox.clientWidth, height: HEIGHT });
    },
    plot: () => plot,
    destroy() {
      if (plot) plot.destroy();
      plot = null;
    },
  };
  chart.update(runs, settings);
  return chart;
}

// The controls every set of charts shares: x (step or time), y (linear or log), smoothing.
export function chartControls(settings, changed) {
  const x = el("select", { "aria-label": "x axis", onchange: () => { settings.x = x.value; changed(); } },
    el("option", { value: "step" }, "x: step"), el("option", { value: "time" }, "x: wall time"));
  x.value = settings.x;
  const log = el("input", { type: "checkbox", "aria-label": "log y", onchange: () => { settings.log = log.checked; changed(); } });
  log.checked = settings.log;
  const smooth = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: settings.smooth, "aria-label": "smoothing",
    oninput: () => { settings.smooth = Number(smooth.value); changed(); } });
  const pair = el("input", { type: "checkbox", "aria-label": "train and val in one chart",
    onchange: () => { settings.pair = pair.checked; changed("reset"); } });
  pair.checked = Boolean(settings.pair);
  const reset = el("button", { type: "button", onclick: () => changed("reset") }, "Reset zoom");
  return el("div", { class: "chart-controls" }, x, el("label", {}, log, " log y"), el("label", {}, "smoothing ", smooth),
    el("label", {}, pair, " train and val together"), reset);
}

// A set of charts in a container: one per series, kept and updated in place (a live
// run's charts grow without being rebuilt), resized with the window.
let sets = 0;

function paired(bySeries) {
  const merged = new Map();
  for (const [name, lines] of bySeries) {
    const rest = name.replace(/^(train|val)_/, "");
    const other = name.startsWith("train_") ? `val_${rest}` : name.startsWith("val_") ? `train_${rest}` : null;
    if (!other || !bySeries.has(other) || lines.length !== 1) {
      merged.set(name, lines);
      continue;
    }
    const both = merged.get(rest) || [];
    both.push({ ...lines[0], label: name });
    merged.set(rest, both);
  }
  return merged;
}

export class ChartSet {
  constructor(container) {
    this.container = container;
    this.charts = new Map();
    this.settings = { x: "step", log: false, smooth: 0 };
    // One cursor and one zoom for the set: a zoom of one chart is the zoom of all.
    const key = `charts-${(sets += 1)}`;
    let zooming = false;
    this.shared = { key, plugin: { hooks: { setScale: (u, scale) => {
      if (scale !== "x" || zooming) return;
      zooming = true;
      const { min, max } = u.scales.x;
      for (const chart of this.charts.values()) {
        const other = chart.plot();
        if (other && other !== u) other.setScale("x", { min, max });
      }
      zooming = false;
    } } } };
    this.last = null;
    this.observer = new ResizeObserver(() => { for (const chart of this.charts.values()) chart.resize(); });
    this.observer.observe(container);
  }

  // bySeries: Map(name -> [{label, points}]) in display order. With ``pair``, a run's
  // train_X and val_X are one chart, X, a line each.
  show(given) {
    this.last = given;
    const bySeries = this.settings.pair ? paired(given) : given;
    for (const [name, chart] of this.charts) {
      if (!bySeries.has(name)) {
        chart.destroy();
        chart.element.remove();
        this.charts.delete(name);
      }
    }
    for (const [name, runs] of bySeries) {
      const chart = this.charts.get(name);
      if (chart) chart.update(runs, this.settings);
      else {
        const made = seriesChart(name, runs, this.settings, this.shared);
        this.charts.set(name, made);
        this.container.append(made.element);
        made.resize();
      }
    }
  }

  redraw() {
    if (this.last) this.show(this.last);
  }

  // Every chart back to its whole range (as a double-click does for one).
  resetZoom() {
    for (const chart of this.charts.values()) chart.destroy();
    this.charts.clear();
    this.container.replaceChildren();
    this.redraw();
  }

  destroy() {
    this.observer.disconnect();
    for (const chart of this.charts.values()) chart.destroy();
    this.charts.clear();
  }
}
