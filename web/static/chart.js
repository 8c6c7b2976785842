// A small line chart of one metric series (SVG, no library): value against step. A point
// the API marks non-finite (value null, non_finite "nan" / "inf" / "-inf") is drawn as a
// red line at its step: where the run diverged.

import { el, svg } from "./util.js";

const W = 300;
const H = 110;
const PAD = { left: 40, right: 8, top: 8, bottom: 18 };

function label(value) {
  const magnitude = Math.abs(value);
  return magnitude !== 0 && (magnitude >= 1e4 || magnitude < 1e-3) ? value.toExponential(1) : String(+value.toPrecision(3));
}

export function chart(name, all) {
  const points = all.filter((p) => p.value !== null);
  const broken = all.filter((p) => p.value === null && p.non_finite);
  if (!points.length) points.push({ step: all[0].step, value: 0 });
  const steps = all.map((p) => p.step);
  const values = points.map((p) => p.value);
  const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
  let [y0, y1] = [Math.min(...values), Math.max(...values)];
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const x = (step) => PAD.left + (x1 === x0 ? 0.5 : (step - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const y = (value) => PAD.top + (1 - (value - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  const path = points.map((p, i) => `${i ? "L" : "M"}${x(p.step).toFixed(1)},${y(p.value).toFixed(1)}`).join(" ");
  const last = all[all.length - 1];
  const lastLabel = last.value === null ? last.non_finite : label(last.value);
  const figure = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img",
    "aria-label": `${name}: ${all.length} points, last ${lastLabel}` },
  svg("line", { class: "axis", x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }),
  svg("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }),
  svg("text", { x: 2, y: PAD.top + 8 }, label(y1)),
  svg("text", { x: 2, y: H - PAD.bottom }, label(y0)),
  svg("text", { x: PAD.left, y: H - 4 }, `step ${x0}`),
  svg("text", { x: W - PAD.right - 40, y: H - 4 }, `step ${x1}`),
  svg("path", { class: "line", d: points.length === 1 ? `${path} h1` : path }),
  ...points.length === 1 ? [svg("circle", { cx: x(points[0].step), cy: y(points[0].value), r: 3, fill: "#3a6ea5" })] : [],
  ...broken.map((p) => svg("line", { class: "diverged", x1: x(p.step), y1: PAD.top, x2: x(p.step), y2: H - PAD.bottom,
    stroke: "#b3261e", "data-step": p.step })));
  const caption = [`${name} `, el("span", { class: "muted" }, `last ${lastLabel}`)];
  if (broken.length) {
    caption.push(" ", el("span", { class: "diverged" }, `${broken[0].non_finite} at step ${broken[0].step}`));
  }
  return el("figure", { class: "chart", "data-series": name }, el("figcaption", {}, ...caption), figure);
}
