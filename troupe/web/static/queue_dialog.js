// The editor's "Queue on..." dialog: which device, server or worker (and card), a memory
// budget for a card shared by memory, and what the queue it would join says before it
// submits. It is given what it needs of the editor: the server's info, the workers, the
// graph, and what to do once the run is queued.

import { api, el, openDialog } from "./util.js";

let info = null;
let listWorkers = async () => [];

function queueKey(device, target) {
  const resolved = device === "auto" ? (info.devices.find((d) => d !== "cpu") || "cpu") : device;
  if (target === "") return resolved;
  if (target === "any" || target === "one-shot") return `${target}/${device === "auto" || device === "cuda" ? "auto" : device}`;
  return `${target}/${device}`;
}

// What the dialog says of the queue it would submit to; a failed read says so there,
// never an uncaught rejection.
async function explain(form) {
  try {
    await explainQueue(form);
  } catch (error) {
    form.querySelector("#queue-explain").textContent = `Could not read the queue: ${error.message}`;
  }
}

async function explainQueue(form) {
  const device = form.elements.device.value;
  const target = form.elements.target ? form.elements.target.value : "";
  const key = queueKey(device, target);
  const { queues } = await api("GET", "/api/queues");
  const queue = queues.find((q) => q.queue_key === key);
  const running = queue ? queue.running : 0;
  const queued = queue ? queue.queued : 0;
  const limit = queue ? queue.limit : null;
  let text;
  if (target === "any") {
    text = `The run waits on ${key} with ${queued} others and starts on the first worker that has ${device} free.`;
  } else if (target === "one-shot") {
    text = `The run waits on ${key} with ${queued} others for a one-shot agent (a batch job's), which takes it and `
      + "exits; it waits only so long (TROUPE_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S).";
  } else {
    // The server's own verdict, by the rules it admits runs by (slots, seed gate, a device
    // it shares with a worker on the same machine, the worker's device).
    const verdict = await api("GET", `/api/queue-prediction?queue_key=${encodeURIComponent(key)}`);
    const slots = `Queue ${key}: ${running}${limit !== null ? ` of ${limit}` : ""} slots busy, ${queued} waiting.`;
    text = verdict.starts ? `${slots} The run starts at once.`
      : `${slots} The run would not start at once: it ${verdict.reason.message}.`;
  }
  if (target && target !== "any" && target !== "one-shot") text += ` It executes on worker ${target}, in a process of its own.`;
  const worker = target && target !== "any" ? (await listWorkers()).find((w) => w.name === target) : null;
  const onCard = device === "auto" && worker && worker.cards && worker.cards.length ? worker.cards[0].device : device;
  const card = worker ? (worker.cards || []).find((c) => c.device === onCard && c.sharing === "memory") : null;
  if (card) {
    text = `${target} ${onCard} is shared by memory: ${((card.promised_mib) / 1024).toFixed(1)} of `
      + `${((card.total_mib - card.reserved_mib) / 1024).toFixed(1)} GiB promised. The run needs a budget; without `
      + "room it is refused at once unless it waits.";
  }
  const budgetRow = form.querySelector("#budget-row");
  if (budgetRow) budgetRow.hidden = !target;
  cardChoices(form, worker);
  form.querySelector("#queue-explain").textContent = text;
}

// A named worker's cards, each with its free memory (and what is promised on a card
// shared by memory): picking one sends the run to that card.
function cardChoices(form, worker) {
  const row = form.querySelector("#card-row");
  if (!row) return;
  const cards = worker && worker.cards ? worker.cards : [];
  row.hidden = cards.length === 0;
  const select = form.elements.card;
  const keep = select.value;
  const gib = (mib) => (mib / 1024).toFixed(1);
  select.replaceChildren(el("option", { value: "" }, "whichever the device above names"), ...cards.map((c) => el("option",
    { value: c.device }, `${c.device}: ${c.name}, ${gib(c.free_mib)} of ${gib(c.total_mib)} GiB free`
    + (c.sharing === "memory" ? `, shared by memory (${gib(c.promised_mib)} GiB promised)` : ""))));
  if (cards.some((c) => c.device === keep)) select.value = keep;
}

export async function queueDialog({ info: serverInfo, listWorkers: workersOf, graph, queued }) {
  info = serverInfo;
  listWorkers = workersOf;
  const workers = info.capabilities.workers ? await listWorkers() : [];
  const devices = ["cpu", "auto", ...info.devices.filter((d) => d !== "cpu")];
  openDialog("Queue on…", (form) => {
    form.append(el("p", { class: "muted" }, `Submits "${graph.name}" to a queue. Queued runs wait their turn; `
      + "the editor cache never applies to them."),
    el("label", {}, "Device"), el("select", { name: "device" }, ...devices.map((d) => el("option", { value: d }, d))));
    if (workers.length) {
      form.append(el("label", {}, "Target"), el("select", { name: "target" }, el("option", { value: "" }, "this server"),
        el("option", { value: "any" }, "any worker"),
        el("option", { value: "one-shot" }, "one-shot pool (batch jobs)"),
        ...workers.map((w) => el("option", { value: w.name }, `${w.name} (${w.state})`))));
    }
    if (workers.length) {
      form.append(el("div", { id: "card-row", hidden: true }, el("label", {}, "Card"), el("select", { name: "card" })));
    }
    if (workers.length) {
      // A budget matters on a worker's card shared by memory; the estimate is only a start.
      const estimateButton = el("button", { type: "button", "data-estimate": "", onclick: async () => {
        const device = form.elements.device.value;
        let reply;
        try {
          reply = await api("POST", "/api/estimates", { graph, devices: [device] });
        } catch (error) {
          form.querySelector("#budget-note").textContent = `No estimate: ${error.message}`;
          return;
        }
        form.elements.memory_gib.value = String(Math.ceil((reply.budget_mib / 1024) * 1000) / 1000);
        form.querySelector("#budget-note").textContent = `Filled with an estimate, not a measurement: the graph's `
          + `params need about ${reply.budget_mib} MiB, and the server adds ${reply.parts.cuda_context_mib} MiB `
          + "for the CUDA context. Leave it empty after one run and the measured peak plus 20% is used instead.";
      } }, "Estimate");
      form.append(el("div", { class: "budget", id: "budget-row", hidden: true },
        el("label", {}, "Memory budget (GiB, for a card shared by memory)"),
        el("div", { class: "row" }, el("input", { name: "memory_gib", type: "number", min: 0, step: "any",
          placeholder: "the last measured peak + 20%" }), estimateButton),
        el("label", {}, el("input", { name: "wait", type: "checkbox" }), " wait for room if the card is busy"),
        el("p", { class: "muted", id: "budget-note" })));
    }
    form.append(el("label", {}, el("input", { name: "record_outputs", type: "checkbox" }),
      " keep node outputs, for the inspector (on a worker they stay there, read while it is connected)"));
    form.append(el("p", { class: "explain", id: "queue-explain" }, "…"));
    form.addEventListener("change", () => explain(form));
    explain(form);
  }, {
    submitLabel: "Queue",
    submit: async (form) => {
      const target = form.elements.target ? form.elements.target.value : "";
      const card = form.elements.card && !form.querySelector("#card-row").hidden ? form.elements.card.value : "";
      const options = { device: card || form.elements.device.value };
      if (target) options.target = target === "one-shot" ? { pool: "one-shot" } : { worker: target };
      if (card) options.target.devices = [card];
      if (target && form.elements.memory_gib.value) options.target.memory_gib = Number(form.elements.memory_gib.value);
      if (target && form.elements.wait.checked) options.target.wait = true;
      if (form.elements.record_outputs.checked) options.record_outputs = true;
      const reply = await api("POST", "/api/runs", { graph, name: graph.name, options });
      queued(reply, Boolean(options.record_outputs));
    },
  });
}
