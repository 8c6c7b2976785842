// Who is connected (the teacher's panel): every session a login link opened, its kind and
// when it was last seen, with Revoke; and a class link for thirty browsers at once.

import { api, copyButton, el, openDialog, showMessage } from "./util.js";

const KINDS = { teacher: "teacher", class: "class (runs, sweeps, studies)", read: "read only" };

function when(value) {
  return value ? new Date(value).toLocaleString() : "";
}

const LIMITS = { max_running: "running", max_waiting: "waiting", max_memory_mib: "MiB",
  max_submits_per_minute: "submitted a minute" };

function limits(quotas) {
  const said = Object.entries(quotas || {}).map(([name, value]) => `${value} ${LIMITS[name] || name}`);
  return said.length ? el("span", { class: "muted", "data-quotas": "" }, ` · at most ${said.join(", ")}`) : "";
}

export async function refreshPeople() {
  const { sessions } = await api("GET", "/api/sessions");
  const live = sessions.filter((s) => !s.revoked);
  document.getElementById("session-rows").replaceChildren(...live.map((s) => el("tr", { "data-session": s.id },
    el("td", {}, s.label || s.id), el("td", {}, KINDS[s.kind] || s.kind, limits(s.quotas)), el("td", {}, when(s.created_at)),
    el("td", {}, when(s.last_seen_at)),
    el("td", { class: "actions" }, el("button", { class: "danger", onclick: async () => {
      try { // revoking this browser's own session logs it out (the next read reloads the page)
        await api("DELETE", `/api/sessions/${s.id}`);
        await refreshPeople();
      } catch (error) {
        showMessage(error.message);
      }
    } }, "Revoke")))));
  document.getElementById("people-empty").hidden = live.length > 0;
}

export function classLinkDialog() {
  openDialog("New class link", (form) => {
    form.append(
      el("p", { class: "muted" }, "One link for a whole class: each browser that opens it gets a session of its own, "
        + "listed here and revocable. Everyone in the class sees every run of this server."),
      el("div", { class: "row" },
        el("div", {}, el("label", {}, "Uses (browsers)"), el("input", { name: "uses", type: "number", min: 1, value: 30, size: 4 })),
        el("div", {}, el("label", {}, "Valid for (hours)"), el("input", { name: "hours", type: "number", min: 0.01, step: "any", value: 2, size: 5 })),
        el("div", {}, el("label", {}, el("input", { name: "read_only", type: "checkbox" }), " read only (a projector, a guest)"))),
      el("p", { class: "muted" }, "Limits for each student's session (empty: the server's default, often none). "
        + "Past a limit a submission is refused at once; runs over the running limit wait their turn."),
      el("div", { class: "row" },
        el("div", {}, el("label", {}, "Running at once"), el("input", { name: "max_running", type: "number", min: 1, size: 4 })),
        el("div", {}, el("label", {}, "Waiting at once"), el("input", { name: "max_waiting", type: "number", min: 0, size: 4 })),
        el("div", {}, el("label", {}, "GPU memory budget (GiB)"), el("input", { name: "max_memory_gib", type: "number", min: 0.001, step: "any", size: 5 })),
        el("div", {}, el("label", {}, "Submitted a minute"), el("input", { name: "max_submits_per_minute", type: "number", min: 0, size: 4 }))),
      el("div", { id: "class-link" }));
  }, {
    submitLabel: "Make the link",
    submit: async (form) => {
      const body = { uses: Number(form.elements.uses.value), expires_s: Number(form.elements.hours.value) * 3600,
        read_only: form.elements.read_only.checked };
      for (const name of ["max_running", "max_waiting", "max_memory_gib", "max_submits_per_minute"]) {
        const value = form.elements[name].value;
        if (value !== "" && !body.read_only) body[name] = Number(value);
      }
      const reply = await api("POST", "/api/login-links", body);
      form.querySelector("#class-link").replaceChildren(el("label", {}, "Hand this out:"),
        el("code", { class: "command", "data-login-link": "" }, reply.login_url), copyButton(reply.login_url));
      form.querySelector('[data-action="submit"]').hidden = true;
      return false;
    },
    cancelLabel: "Close",
  });
}
