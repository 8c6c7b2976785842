// The editor's execution log: the events of the one run this tab follows, a line each,
// the newest KEEP lines kept. The editor's Run follows its own run here; Watch on a row
// of the Runs list follows any run (one queued from a terminal or another tab), replayed
// from its first event. Following a run lets go of the one before; neither run is touched.

import { el, eventText } from "./util.js";

const KEEP = 1000;
let following = null; // {runId, source, letGo}

function letGo() {
  if (!following) return;
  following.source.close();
  const { letGo: told } = following;
  following = null;
  if (told) told();
}

// Follows runId from its first event; onEvent sees each event, letGo is called if another
// follow takes this one's place before it ends.
export function follow(runId, label, { onEvent = null, letGo: onLetGo = null } = {}) {
  letGo();
  const box = document.getElementById("exec-log-lines");
  const lines = [];
  box.textContent = "";
  document.getElementById("exec-log-run").replaceChildren(`${label} · `,
    el("a", { href: `#/runs/${runId}` }, "open its page"));
  const source = new EventSource(`/api/runs/${runId}/stream?after=0`);
  following = { runId, source, letGo: onLetGo };
  let drawing = null;
  const draw = () => {
    drawing = null;
    box.textContent = lines.join("\n");
    box.scrollTop = box.scrollHeight;
  };
  source.addEventListener("run_event", (message) => {
    const event = JSON.parse(message.data);
    lines.push(eventText(event));
    if (lines.length > KEEP) lines.splice(0, lines.length - KEEP);
    drawing = drawing || setTimeout(draw, 100);  // a burst of events is drawn once
    if (onEvent) onEvent(event);
    if (event.type === "run_finished") {
      source.close();
      if (following && following.source === source) following = null;
    }
  });
}
