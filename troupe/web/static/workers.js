// The Workers panel: each enrolled worker (state, version, devices and memory, slots,
// running runs, what it lacks when degraded), a card's sharing policy, drain, remove, and
// "Add worker", which makes an enrollment and shows the one-line join command.

import { api, confirmDialog, copyButton, el, openDialog, showMessage } from "./util.js";

export let knownWorkers = [];

const gib = (mib) => (mib / 1024).toFixed(1);

function devices(worker) {
  const parts = [worker.inventory ? `cpu ×${worker.inventory.cpus}` : "cpu"];
  for (const card of worker.cards || []) {
    parts.push(`${card.device} ${card.name} (${gib(card.free_mib)} of ${gib(card.total_mib)} GiB free)`);
  }
  return parts.join(", ");
}

// A shared card shows what its budgets promise; an exclusive one its slots.
function slots(worker) {
  const shared = new Map((worker.cards || []).filter((c) => c.sharing === "memory").map((c) => [c.device, c]));
  return worker.slots.map((s) => {
    const card = shared.get(s.device);
    if (!card) return `${s.device} ${s.running}/${s.limit}`;
    const runs = Object.keys(card.budgets).length;
    return `${s.device} shared: ${gib(card.promised_mib)} of ${gib(card.total_mib - card.reserved_mib)} GiB promised `
      + `(${runs} run${runs === 1 ? "" : "s"})`;
  }).join(", ");
}

function sharingDialog(worker, card) {
  openDialog(`Sharing of ${worker.name} ${card.device}`, (form) => {
    form.append(
      el("p", { class: "muted" }, `${card.name}, ${gib(card.total_mib)} GiB (NVML ${card.uuid}). The policy belongs to `
        + "the card: every worker that offers it follows it."),
      el("label", {}, "Admission"),
      el("select", { name: "sharing" },
        el("option", { value: "exclusive", selected: card.sharing === "exclusive" }, "exclusive: count slots"),
        el("option", { value: "memory", selected: card.sharing === "memory" }, "shared by memory budget")),
      el("label", {}, "Reserved (MiB, never promised to runs)"),
      el("input", { name: "reserved", type: "number", min: 0, step: 1, value: card.reserved_mib }),
      el("p", { class: "explain", id: "sharing-explain" }));
    const explainSharing = () => {
      const memory = form.elements.sharing.value === "memory";
      form.querySelector("#sharing-explain").textContent = memory
        ? "Runs share the card while their budgets fit: each needs a budget (target.memory_gib, or the last measured "
          + `peak of its graph + 20%) plus ${card.context_mib} MiB of CUDA context, within both the free memory and `
          + "what is not promised to running runs. A run without a budget is refused; one that does not fit now is "
          + "refused unless it asks to wait. Each run's allocator is capped at its budget, so one that exceeds it "
          + "fails alone with an out-of-memory error."
        : "One run at a time per slot, as many slots as the worker's limit for this device. Runs need no budget.";
    };
    form.addEventListener("change", explainSharing);
    explainSharing();
  }, {
    submitLabel: "Save",
    submit: async (form) => {
      await api("PUT", `/api/workers/${worker.name}/devices/${card.device}`,
        { sharing: form.elements.sharing.value, reserved_mib: Number(form.elements.reserved.value) });
      await refreshWorkers();
    },
  });
}

// The runs it executes now, each a link to its page.
function runLinks(worker) {
  if (!worker.running_runs.length) return [];
  return [el("div", { class: "worker-runs" }, `${worker.running_runs.length} running: `,
    ...worker.running_runs.flatMap((id, i) => [i ? ", " : "", el("a", { href: `#/runs/${id}`, onclick: (e) => e.stopPropagation() }, id.slice(0, 8))]))];
}

function notes(worker) {
  const parts = [];
  if (worker.one_shot) parts.push("one-shot: takes one run, then exits");
  if (worker.failed_reason) parts.push(`failed: ${worker.failed_reason}`);
  if (worker.ssh) parts.push(`over SSH to ${worker.ssh.host}: ${worker.ssh.state}`);
  if (worker.draining) parts.push("draining");
  if (worker.degraded) {
    parts.push(worker.missing_node_types.length ? `degraded, lacks ${worker.missing_node_types.join(", ")}` : "degraded");
  }
  if (worker.heard_s_ago !== null && worker.heard_s_ago !== undefined) parts.push(`heard from ${worker.heard_s_ago.toFixed(0)} s ago`);
  return parts.join("; ");
}

function actions(worker) {
  const running = worker.running_runs.length;
  const cell = el("td", { class: "actions" });
  if (worker.state === "connected") {
    for (const card of worker.cards || []) {
      cell.append(el("button", { class: "teaches", "data-share": card.device, onclick: () => sharingDialog(worker, card) },
        `${card.device} sharing…`));
    }
  }
  if (!worker.draining && worker.state === "connected") {
    cell.append(el("button", { class: "teaches", onclick: () => confirmDialog(`Drain ${worker.name}?`,
      `No new run starts on ${worker.name}; runs for it wait (or go to another worker when they target any). `
      + `The ${running} run${running === 1 ? "" : "s"} executing there finish normally.`, "Drain", async () => {
        await api("POST", `/api/workers/${worker.name}/drain`);
        await refreshWorkers();
      }) }, "Drain"));
  }
  cell.append(el("button", { class: "danger teaches", onclick: () => confirmDialog(`Remove ${worker.name}?`,
    `Its credential is revoked and its agent stops at once. The ${running} run${running === 1 ? "" : "s"} executing `
    + "there end interrupted (worker_lost). To bring the machine back, add it again with a new join command.",
    "Remove", async () => {
      await api("DELETE", `/api/workers/${worker.name}`);
      await refreshWorkers();
    }) }, "Remove"));
  return cell;
}

export async function refreshWorkers() {
  const { workers } = await api("GET", "/api/workers");
  knownWorkers = workers;
  document.getElementById("worker-rows").replaceChildren(...workers.map((w) => el("tr", { "data-worker": w.name },
    el("td", {}, w.name), el("td", {}, el("span", { class: `status ${w.state}` }, w.state)),
    el("td", {}, w.version || ""), el("td", { title: devices(w) }, devices(w)), el("td", {}, slots(w)),
    el("td", { title: notes(w) }, notes(w), ...runLinks(w)), actions(w))));
  document.getElementById("workers-empty").hidden = workers.length > 0;
}

function sshWorkerDialog() {
  openDialog("Add worker over SSH", (form) => {
    form.append(
      el("p", { class: "muted" }, "For a machine that cannot reach this server: this server opens an SSH session to it "
        + "(ssh -R), forwards a private socket there back to itself, and starts the agent through it. The key and the "
        + "known hosts are files on this server's machine; the session uses them without asking (BatchMode)."),
      el("div", { class: "row" },
        el("div", {}, el("label", {}, "Name"), el("input", { name: "name", required: true, placeholder: "far-gpu" })),
        el("div", {}, el("label", {}, "Host"), el("input", { name: "host", required: true, placeholder: "gpu.lab.example" })),
        el("div", {}, el("label", {}, "User"), el("input", { name: "user", placeholder: "(ssh's default)" })),
        el("div", {}, el("label", {}, "Port"), el("input", { name: "port", type: "number", min: 1, max: 65535, size: 5 }))),
      el("label", {}, "Identity file (optional)"), el("input", { name: "identity_file", placeholder: "~/.ssh/id_ed25519" }),
      el("label", {}, "troupe on the remote host"), el("input", { name: "remote_command", value: "troupe" }),
      el("p", { class: "explain" }, "If the session drops for a reason a retry can fix, it is opened again; if the key is "
        + "refused, the host key changed or troupe is missing there, the worker shows failed with the reason. "
        + "Remove ends the session and the agent."));
  }, {
    submitLabel: "Connect",
    submit: async (form) => {
      const value = (name) => form.elements[name].value.trim();
      const body = { name: value("name"), host: value("host"), remote_command: value("remote_command") || "troupe" };
      for (const key of ["user", "identity_file"]) if (value(key)) body[key] = value(key);
      if (value("port")) body.port = Number(value("port"));
      await api("POST", "/api/workers/ssh", body);
      await refreshWorkers();
    },
  });
}

export function addWorkerDialog() {
  openDialog("Add worker", (form) => {
    form.append(
      el("p", { class: "muted" }, "A worker is a machine (a GPU server) that runs the troupe agent. The agent dials this "
        + "server; nothing on the worker listens."),
      el("div", { class: "row" }, el("div", {}, el("label", {}, "Name (optional; else the machine's hostname)"),
        el("input", { name: "name", placeholder: "gpu-a", pattern: "[a-z0-9][a-z0-9_.\\-]{0,63}" })),
      el("div", {}, el("label", {}, "Valid for (hours)"), el("input", { name: "hours", type: "number", min: 0.01, step: "any", value: 24, size: 5 })),
      el("div", {}, el("label", {}, "Uses"), el("input", { name: "uses", type: "number", min: 1, value: 1, size: 4 }))),
      el("div", { id: "join" }),
      el("p", { class: "muted" }, "The machine cannot reach this server? ",
        el("button", { type: "button", "data-ssh": "", onclick: () => sshWorkerDialog() }, "Add it over SSH…")));
  }, {
    submitLabel: "Create join command",
    submit: async (form) => {
      const body = { ttl_s: Number(form.elements.hours.value) * 3600, uses: Number(form.elements.uses.value) };
      if (form.elements.name.value) body.name = form.elements.name.value;
      const reply = await api("POST", "/api/workers/enrollments", body);
      const expires = new Date(reply.expires_at).toLocaleString();
      form.querySelector("#join").replaceChildren(
        el("label", {}, "Run this on the worker, as the user that should execute runs:"),
        el("code", { class: "command", "data-join": "" }, reply.command), copyButton(reply.command),
        el("p", { class: "explain" }, `The token works ${reply.uses} time${reply.uses === 1 ? "" : "s"}, until ${expires}. `
          + "The agent goes on in the background and prints where its log is (add --foreground to keep it in the "
          + "terminal; troupe agent stop drains it). "
          + "The agent exchanges it for a credential of its own (kept in the agent's config directory, readable only by that "
          + "user), reports its cards and memory, and then waits for runs from this server. It reconnects by itself "
          + "after a network break; Remove revokes it."));
      form.querySelector('[data-action="submit"]').hidden = true;
      showMessage("");
      refreshWorkers();
      return false; // keep the dialog open: the command is what the user came for
    },
    cancelLabel: "Close",
  });
}
