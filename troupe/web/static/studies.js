// The Studies panel: each study's state, the budget used of each limit, its attempts and
// ranking (with the reason a variant is unranked), cancel, and resume with a raised budget.

import { bandChart } from "./bands.js";
import { scatterChart } from "./param_charts.js";
import { api, confirmDialog, el, mayChange, openDialog, reasonText, seconds, time } from "./util.js";

let openStudy = null;

// #/studies/ID: that study with the whole width; #/studies (null): the list.
export async function showStudy(studyId) {
  openStudy = studyId;
  await refreshStudies();
}
const LIMITS = [
  ["max_runs", "Runs", (s) => s.used.runs, String],
  ["max_active_seconds", "Active time", (s) => s.used.active_seconds, seconds],
  ["max_parallel_runs", "Runs at once", (s) => s.attempts.filter((a) => ["queued", "running"].includes(a.status)).length, String],
  ["max_run_seconds", "Seconds per run", null, seconds],
];

function usedSummary(study) {
  const parts = [];
  if (study.budget.max_runs !== undefined) parts.push(`${study.used.runs} of ${study.budget.max_runs} runs`);
  else parts.push(`${study.used.runs} runs`);
  if (study.budget.max_active_seconds !== undefined) {
    parts.push(`${seconds(study.used.active_seconds)} of ${seconds(study.budget.max_active_seconds)}`);
  }
  return parts.join(", ");
}

export async function refreshStudies() {
  const { studies } = await api("GET", "/api/studies");
  const full = await Promise.all(studies.map((s) => api("GET", `/api/studies/${s.id}`)));
  document.getElementById("study-rows").replaceChildren(...full.map((s) => el("tr", {
    "data-study": s.id, class: s.id === openStudy ? "selected" : null,
    onclick: () => { location.hash = `#/studies/${s.id}`; },
  }, el("td", {}, s.name), el("td", {}, el("span", { class: `status ${s.state}` }, s.state),
    s.halt_reason ? el("span", { class: "muted", title: s.halt_reason }, ` (${reasonText(s.halt_reason)})`) : null),
  el("td", {}, usedSummary(s)), el("td", {}, time(s.created_at)))));
  document.getElementById("studies-empty").hidden = studies.length > 0;
  const box = document.getElementById("study");
  const study = full.find((s) => s.id === openStudy);
  box.hidden = !study;
  document.querySelector("#studies .split").classList.toggle("one-open", Boolean(study));
  if (study) {
    renderStudy(box, study);
    box.prepend(el("a", { href: "#/studies", class: "crumb" }, "← Studies"));
  }
}

// A param's value as a person reads it: a string as it is, not in JSON's quotes.
function shown(value) {
  return typeof value === "string" ? value : value === undefined ? "" : JSON.stringify(value);
}

function renderStudy(box, study) {
  // Each limit as a bar of what was used of it, and the words.
  const budget = el("div", { class: "budget" }, ...LIMITS.flatMap(([key, label, used, format]) => {
    const limit = study.budget[key];
    const usedText = used ? format(used(study)) : "";
    const text = limit === undefined ? `${usedText} (no limit)` : used ? `${usedText} of ${format(limit)}` : format(limit);
    const share = limit && used ? Math.min(1, used(study) / limit) : null;
    return [el("span", { class: "muted" }, label), el("span", { "data-limit": key }, share === null ? "" : el("span", {
      class: `budget-bar${share >= 1 ? " spent" : ""}`, role: "img", "aria-label": `${Math.round(share * 100)}% used` },
    el("span", { style: `width:${share * 100}%` })), text)];
  }));
  const keys = [...new Set(study.variants.flatMap((v) => Object.keys(v.params)))].sort();
  const spread = (entry) => (entry.std === null || entry.std === undefined ? "" : `± ${entry.std.toPrecision(3)}`);
  const ranking = el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["Rank", "Variant",
    `${study.objective.reduce} ${study.objective.metric}`, "Spread (sd)", "Repeats", ...keys].map((h) => el("th", {}, h)))),
  el("tbody", {}, ...study.ranking.map((r) => el("tr", {}, el("td", {}, String(r.rank)), el("td", {}, r.variant),
    el("td", {}, r.objective_value === null ? "" : r.objective_value.toPrecision(4)), el("td", {}, spread(r)),
    el("td", {}, String(r.repeats)), ...keys.map((k) => el("td", {}, shown(r.params[k]))))),
  ...study.unranked.map((u) => el("tr", { "data-reason": u.reason }, el("td", {}, "–"), el("td", {}, u.variant),
    el("td", { colspan: 2, class: "muted", title: u.reason }, reasonText(u.reason)),
    el("td", {}, `${u.repeats_done} of ${study.repeats} done`), ...keys.map((k) => el("td", {}, shown(u.params[k])))))));
  const charts = el("div", { class: "charts study-charts" }, ...keys.map((key) => scatterChart(key, study.objective.metric,
    [...study.ranking, ...study.unranked].flatMap((entry) => entry.values.map((y) => ({ x: entry.params[key], y }))))));
  const attempts = el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["Variant", "Repeat", "Attempt", "Status",
    study.objective.metric].map((h) => el("th", {}, h)))),
  el("tbody", {}, ...study.attempts.map((a) => el("tr", { "data-run": a.run_id, onclick: () => { location.hash = `#/runs/${a.run_id}`; } },
    el("td", {}, a.variant), el("td", {}, String(a.repeat)),
    el("td", {}, String(a.attempt)), el("td", {}, el("span", { class: `status ${a.status}` }, a.status)),
    el("td", {}, a.objective_value === null ? "" : a.objective_value.toPrecision(4))))));
  const buttons = el("p", {});
  const mine = mayChange(study.submitted_by);  // a class session cancels and resumes its own studies only
  if (["running", "halted"].includes(study.state) && mine) {
    buttons.append(el("button", { class: "danger acts", onclick: () => confirmDialog(`Cancel study ${study.name}?`,
      "Its queued and running attempts are cancelled now and no new attempt starts. The ranking so far stays; "
      + "a cancelled study cannot be resumed.", "Cancel the study", async () => {
        await api("POST", `/api/studies/${study.id}/cancel`);
        await refreshStudies();
      }) }, "Cancel"));
  }
  if (study.state === "halted" && mine) buttons.append(" ", el("button", { class: "acts", onclick: () => resumeDialog(study) }, "Resume…"));
  box.replaceChildren(el("h2", {}, `${study.name} — ${study.state}`),
    study.halt_reason ? el("p", { class: "message", "data-halt": study.halt_reason }, `Halted: ${reasonText(study.halt_reason)}.`) : "",
    ...(study.notes || []).map((note) => el("p", { class: "explain", "data-note": note.code }, note.message)),
    buttons, el("h3", {}, "Budget"), budget, el("h3", {}, "Ranking"), ranking,
    el("p", {}, el("a", { href: `/api/studies/${study.id}?format=csv` }, "Ranking as CSV (with params and spread)")),
    keys.length ? el("h3", {}, "Objective against each param") : "", charts,
    el("h3", {}, "Each variant's repeats"), variantCurves(study),
    el("h3", {}, `Attempts (${study.attempts.length})`), attempts);
}

// Each variant's repeats as one: the objective's mean at each step, a band from the lowest
// to the highest repeat (the newest attempt of each). A finished attempt's points no
// longer change, so they are read once; the chart is drawn again only when what it
// holds changed (the panel is drawn again every second while the study is shown).
const FINISHED = new Set(["succeeded", "failed", "cancelled", "interrupted"]);
const VARIANTS_DRAWN = 8;
const seriesOf = new Map();  // run id -> its series, once its attempt finished
let drawn = { key: null, chart: null };

function variantCurves(study) {
  const box = el("div", { class: "charts study-curves" });
  if (drawn.chart && drawn.key && drawn.key.startsWith(`${study.id}|`)) box.append(drawn.chart.element);  // kept until redrawn
  const newest = new Map();
  for (const a of study.attempts) {
    const at = `${a.variant}\u0000${a.repeat}`;
    if (a.run_id && (!newest.has(at) || newest.get(at).attempt < a.attempt)) newest.set(at, a);
  }
  const order = [...study.ranking, ...study.unranked].map((v) => v.variant);
  const variants = [...new Set([...order, ...study.variants.map((v) => v.name)])].slice(0, VARIANTS_DRAWN);
  const attempts = [...newest.values()].filter((a) => variants.includes(a.variant) && a.status !== "queued");
  Promise.all(attempts.map(async (a) => {
    if (seriesOf.has(a.run_id)) return seriesOf.get(a.run_id);
    const { series } = await api("GET", `/api/runs/${a.run_id}/metrics`).catch(() => ({ series: {} }));
    if (FINISHED.has(a.status)) seriesOf.set(a.run_id, series);
    return series;
  })).then((all) => {
    if (!box.isConnected) return;  // the panel was drawn again meanwhile: the newer box draws
    const metric = study.objective.metric;
    const groups = variants.map((name) => ({ label: name,
      runs: attempts.flatMap((a, i) => (a.variant === name && all[i][metric] ? [all[i][metric]] : [])) }));
    const key = `${study.id}|${JSON.stringify(groups.map((g) => [g.label, g.runs.map((r) => r.length)]))}`;
    if (key === drawn.key && drawn.chart) {
      box.replaceChildren(drawn.chart.element);
      return;
    }
    if (drawn.chart) drawn.chart.destroy();
    const chart = bandChart(metric, groups.filter((g) => g.runs.length),
      `${metric}: each variant's mean over its repeats, the band from the lowest to the highest`);
    drawn = { key, chart };
    box.replaceChildren(chart.element);
    requestAnimationFrame(() => chart.resize());
  });
  return box;
}

function resumeDialog(study) {
  openDialog(`Resume study ${study.name}`, (form) => {
    form.append(el("p", { class: "explain" }, `It halted: ${study.halt_reason ? reasonText(study.halt_reason) : "its budget ran out"}. Resuming keeps `
      + "every attempt so far and starts new attempts for the variants and repeats still missing, under the budget below. "
      + "Raise the limit that stopped it, or it halts again at once."));
    for (const [key, label] of LIMITS) {
      const current = study.budget[key];
      form.append(el("label", {}, `${label} (${key})`),
        el("input", { name: key, type: "number", min: 0, step: "any", value: current ?? "", placeholder: "no limit" }));
    }
  }, {
    submitLabel: "Resume",
    submit: async (form) => {
      const budget = {};
      for (const [key] of LIMITS) {
        const raw = form.elements[key].value;
        if (raw !== "") budget[key] = Number(raw);
      }
      await api("POST", `/api/studies/${study.id}/resume`, { budget });
      await refreshStudies();
    },
  });
}
