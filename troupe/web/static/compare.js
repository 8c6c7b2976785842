// Compare (#/compare/ID,ID,...): two to eight runs, their metrics overlaid on one chart
// per series (a colour per run, a legend with their names), a table of their params and
// final metrics where a row whose values differ stands out, and what each later run ran
// that the first did not (files, git trees and their uncommitted diffs, packs, the
// environment), as the server's fingerprint comparison says.

import { COLOURS, ChartSet, chartControls } from "./charts.js";
import { secretParams } from "./editor.js";
import { api, el, visiting } from "./util.js";
import { codeDifferences } from "./code_differs.js";

let charts = null;

export function closeCompare() {
  if (charts) charts.destroy();
  charts = null;
}

function label(run) {
  return run.name ? `${run.name} (${run.id.slice(0, 6)})` : run.id.slice(0, 8);
}

// Every node param of a run, as "node.param" -> value.
function params(run) {
  const found = new Map();
  for (const node of run.graph.nodes || []) {
    const secret = secretParams(node);
    for (const [key, value] of Object.entries(node.params || {})) {
      found.set(`${node.id}.${key}`, secret.has(key) ? "•••• (a secret)" : JSON.stringify(value));
    }
  }
  return found;
}

function lastValue(points) {
  const last = points[points.length - 1];
  if (!last) return "";
  return last.value === null ? last.non_finite : String(+last.value.toPrecision(5));
}

// ``here``: the visit that asked for it (util.js): reads that land after the address
// moved on draw nothing.
export async function openCompare(ids, view, here) {
  closeCompare();
  const runs = await Promise.all(ids.map((id) => api("GET", `/api/runs/${id}`)));
  const metrics = await Promise.all(ids.map((id) => api("GET", `/api/runs/${id}/metrics`)));
  const code = await codeDifferences(runs);
  // The objective's chart first: a sweep's own objective, else a validation loss, else a loss.
  const sweep = runs.every((run) => run.sweep_id && run.sweep_id === runs[0].sweep_id)
    ? await api("GET", `/api/sweeps/${runs[0].sweep_id}`).catch(() => null) : null;
  if (!visiting(here)) return;
  const objective = sweep && sweep.objective ? sweep.objective.metric : "val_loss";
  const rank = (name) => (name === objective ? 0 : name.includes("loss") ? 1 : 2);
  const names = [...new Set(metrics.flatMap((m) => Object.keys(m.series)))].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  const chartBox = el("div", { class: "charts" });
  charts = new ChartSet(chartBox);
  const bySeries = new Map(names.map((name) => [name, runs.map((run, i) => ({
    label: label(run), points: metrics[i].series[name] || [] }))]));

  const byRun = runs.map(params);
  const keys = [...new Set(byRun.flatMap((m) => [...m.keys()]))].sort();
  const row = (key, values) => {
    const differs = new Set(values).size > 1;
    return el("tr", { class: differs ? "differs" : null, "data-key": key },
      el("th", { scope: "row" }, key), ...values.map((v) => el("td", {}, v)));
  };
  const table = el("table", { class: "runs compare" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), ...runs.map((run, i) => el("th", {},
      el("span", { class: "swatch", style: `background:${COLOURS[i % COLOURS.length]}` }),
      el("a", { href: `#/runs/${run.id}` }, label(run)))))),
    el("tbody", {},
      row("status", runs.map((r) => r.status)), row("seed", runs.map((r) => (r.seed === null ? "" : String(r.seed)))),
      ...keys.map((key) => row(key, byRun.map((m) => m.get(key) ?? "—"))),
      ...names.map((name) => row(`final ${name}`, metrics.map((m) => lastValue(m.series[name] || []))))));
  view.replaceChildren(el("nav", { class: "crumbs" }, el("a", { href: "#/runs" }, "← Runs")),
    el("h1", {}, `Comparing ${runs.length} runs`),
    el("section", { class: "card" }, el("h2", {}, "Metrics"), chartControls(charts.settings, (what) => (what === "reset" ? charts.resetZoom() : charts.redraw())),
      names.length ? "" : el("p", { class: "muted" }, "None of them recorded metrics."), chartBox),
    el("section", { class: "card" }, el("h2", {}, "Params and final metrics"),
      el("p", { class: "muted" }, "Rows whose values differ are marked."), table),
    el("section", { class: "card", id: "compare-code" }, el("h2", {}, "Code and environment"), ...code.map(({ run, found }, i) =>
      el("div", { class: "code-differs", "data-run": run.id },
        el("h3", {}, el("span", { class: "swatch", style: `background:${COLOURS[(i + 1) % COLOURS.length]}` }),
          `${label(run)}, against ${label(runs[0])}`), found))));
  charts.show(bySeries);
}
