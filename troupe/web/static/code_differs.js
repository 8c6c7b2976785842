// What a later run of a comparison ran that the first did not: the server compares the
// two fingerprints (GET /api/runs/{first}/fingerprint?against={later}: "this" is the
// first, "other" the later run) and this draws its answer: each file a command ran (by
// its sha256), each git tree (commit, branch, dirty, and both uncommitted diffs to read),
// each folder pack (version, digest), then the rest of the environment.

import { api, el } from "./util.js";

const ORDER = ["code.", "packs."];

// [{run, found: element}] for each run after the first.
export async function codeDifferences(runs) {
  const [first, ...later] = runs;
  return Promise.all(later.map(async (run) => ({ run, found: await differing(first, run) })));
}

async function differing(first, run) {
  const notYet = [first, run].find((r) => !r.execution_facts);
  if (notYet) return el("p", { class: "muted" }, `Not recorded: run ${notYet.id.slice(0, 8)} has not started.`);
  let reply;
  try {
    reply = await api("GET", `/api/runs/${first.id}/fingerprint?against=${run.id}`);
  } catch (error) {
    return el("p", { class: "muted" }, `Not compared: ${error.message}`);
  }
  const keys = Object.keys(reply.against.differs).filter((key) => !/\.(diff_sha256|diff_bytes|diff_cut)$/.test(key));
  if (!keys.length) return el("p", { class: "muted" }, "The same code, packs and environment.");
  const rank = (key) => { const at = ORDER.findIndex((p) => key.startsWith(p)); return at < 0 ? ORDER.length : at; };
  keys.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  return el("ul", { class: "differs-list" }, ...keys.map((key) => item(key, reply.against.differs[key])));
}

function item(key, { this: before, other: after }) {
  if (key.endsWith(".diff")) {  // a tree's uncommitted changes: both, to be read
    return el("li", { "data-key": key }, el("details", {},
      el("summary", {}, `${place(key)}: uncommitted changes differ`),
      ...[["the first run", before], ["this run", after]].map(([whose, text]) => el("div", {},
        el("div", { class: "muted" }, `In ${whose}:`),
        text ? el("pre", { class: "diff", tabindex: "0" }, text) : el("p", { class: "muted" }, "none")))));
  }
  return el("li", { "data-key": key }, `${place(key)}: ${shown(before)} → ${shown(after)}`);
}

// "code.train.files.train.py.sha256" -> "train: file train.py sha256"; packs and the rest as named.
function place(key) {
  const code = /^code\.([^.]+)\.(files|repos)\.(.+)\.([^.]+)$/.exec(key);
  if (code) return `${code[1]}: ${code[2] === "files" ? "file" : "git tree"} ${code[3]}${code[4] === "diff" ? "" : ` ${code[4]}`}`;
  const pack = /^packs\.(.+)\.([^.]+)$/.exec(key);
  if (pack) return `pack ${pack[1]} ${pack[2]}`;
  return key;
}

function shown(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "string" && /^[0-9a-f]{32,}$/.test(value)) return value.slice(0, 12);
  return typeof value === "string" ? value : JSON.stringify(value);
}
