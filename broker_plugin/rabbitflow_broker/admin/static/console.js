// rabbitflow gateway console: polls the admin API every second and renders it.
// No framework, no network access beyond the gateway's own admin API.
"use strict";

const REFRESH_MS = 1000;
const numberFormat = new Intl.NumberFormat("en-US");
let editing = null; // {vhost, name} of the queue whose thresholds are being edited

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const num = (value) => el("td", { class: "num" }, numberFormat.format(value ?? 0));
// A store quota of 0 is switched off.
const quota = (value) => (value ? num(value) : el("td", { class: "num muted" }, "off"));

function queuePath(vhost, name) {
  return `/api/queues/${encodeURIComponent(vhost)}/${encodeURIComponent(name)}`;
}

async function api(method, path, body) {
  const options = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (body !== undefined || method !== "GET") {
    // The API refuses a change without a JSON body type (a forged form post cannot set it).
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body === undefined ? {} : body);
  }
  const response = await fetch(path, options);
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error((data && data.error) || `${method} ${path}: HTTP ${response.status}`);
  }
  return data;
}

function renderQueues(queues) {
  const body = document.querySelector("#queues tbody");
  const rows = queues.map((q) => {
    const state = el("span", { class: `state ${q.flowStopped ? "on" : "off"}` }, q.flowStopped ? "ON" : "OFF");
    state.title = q.flowStopped ? "overfull: producers are held" : "producers flow freely";
    const actions = el(
      "td",
      { class: "actions" },
      el("button", { "data-action": "edit", title: "Edit thresholds" }, "Edit"),
      el("button", { "data-action": "stop", class: "danger", title: "Stop this queue's producers" }, "Stop"),
      el("button", { "data-action": "start", title: "Start this queue's producers" }, "Start"),
    );
    return el(
      "tr",
      { "data-vhost": q.vhost, "data-queue": q.name },
      el("td", {}, q.vhost),
      el("td", { class: "name" }, q.name),
      num(q.messages),
      num(q.bytes),
      num(q.flowStopCount),
      num(q.flowResumeCount),
      num(q.flowStopSize),
      num(q.flowResumeSize),
      el("td", { class: "flow" }, state),
      el("td", { class: "num stops" }, numberFormat.format(q.flowStoppedCount)),
      num((q.blockedChannels || []).length),
      actions,
    );
  });
  body.replaceChildren(...rows);
  document.getElementById("no-queues").hidden = queues.length > 0;
}

function renderChannels(channels) {
  const blocked = channels.filter((c) => c.flowStopped);
  const rows = blocked.map((c) =>
    el(
      "tr",
      { "data-connection": c.connection, "data-channel": c.channel },
      el("td", {}, c.connection),
      el("td", {}, c.channel),
      el("td", {}, c.user ?? ""),
      el("td", {}, c.remote ?? ""),
      el("td", {}, c.vhost ?? ""),
      el("td", { class: "wrap" }, (c.blockedOn || []).join(", ")),
      num(c.heldConfirms),
    ),
  );
  document.querySelector("#channels tbody").replaceChildren(...rows);
  document.getElementById("no-channels").hidden = blocked.length > 0;
}

function renderStore(store) {
  const rows = store.vhosts.map((s) => {
    const state = el("span", { class: `state ${s.overfull ? "on" : "off"}` }, s.overfull ? "OVERFULL" : "OK");
    return el(
      "tr",
      { "data-vhost": s.vhost },
      el("td", {}, s.vhost),
      num(s.size),
      quota(s.overfullSize),
      quota(s.underfullSize),
      el("td", {}, state),
      num(s.overfullCount),
    );
  });
  document.querySelector("#store tbody").replaceChildren(...rows);
  document.getElementById("no-store").hidden = store.vhosts.length > 0;
  const stops = store.stops.map((s) => {
    const scope = s.queue ? `queue ${s.queue}` : "all queues";
    const where = s.vhost ? `vhost ${s.vhost}` : "every vhost";
    return el("li", {}, `${scope} in ${where}`);
  });
  if (stops.length === 0) stops.push(el("li", { class: "empty" }, "none"));
  document.getElementById("stops").replaceChildren(...stops);
  document.getElementById("held-confirms").textContent = numberFormat.format(store.heldConfirms);
}

function setStatus(text, error = false) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("error", error);
}

async function refresh() {
  try {
    const [queues, channels, store] = await Promise.all([
      api("GET", "/api/queues"),
      api("GET", "/api/channels"),
      api("GET", "/api/store"),
    ]);
    renderQueues(queues);
    renderChannels(channels);
    renderStore(store);
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(`cannot reach the admin API: ${error.message}`, true);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

async function producers(action, scope) {
  try {
    await api("POST", `/api/producers/${action}`, scope);
    setStatus(`producers ${action === "stop" ? "stopped" : "started"}`);
  } catch (error) {
    setStatus(error.message, true);
  }
}

function startEdit(vhost, name, row) {
  editing = { vhost, name };
  document.getElementById("edit").hidden = false;
  document.getElementById("edit-name").textContent = `${name} (vhost ${vhost})`;
  const cells = row.querySelectorAll("td.num");
  const form = document.getElementById("edit-form");
  const fields = ["flowStopCount", "flowResumeCount", "flowStopSize", "flowResumeSize"];
  fields.forEach((field, index) => {
    form.elements[field].value = cells[index + 2].textContent.replace(/,/g, "");
  });
  document.getElementById("edit-message").textContent = "";
}

document.querySelector("#queues tbody").addEventListener("click", (event) => {
  const button = event.target.closest("button");
  if (!button) return;
  const row = button.closest("tr");
  const vhost = row.dataset.vhost;
  const queue = row.dataset.queue;
  const action = button.dataset.action;
  if (action === "edit") startEdit(vhost, queue, row);
  else producers(action, { vhost, queue });
});

document.getElementById("stop-all").addEventListener("click", () => producers("stop", {}));
document.getElementById("start-all").addEventListener("click", () => producers("start", {}));
document.getElementById("edit-cancel").addEventListener("click", () => {
  editing = null;
  document.getElementById("edit").hidden = true;
});

document.getElementById("edit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!editing) return;
  const form = event.target;
  const message = document.getElementById("edit-message");
  const changes = {};
  for (const field of ["flowStopCount", "flowResumeCount", "flowStopSize", "flowResumeSize"]) {
    const value = form.elements[field].value.trim();
    if (value !== "") changes[field] = Number(value);
  }
  try {
    const answer = await api("PUT", `${queuePath(editing.vhost, editing.name)}/flow`, changes);
    message.textContent = answer.warning ? `applied; ${answer.warning}` : "applied";
    message.classList.toggle("error", Boolean(answer.warning));
  } catch (error) {
    message.textContent = error.message;
    message.classList.add("error");
  }
});

refresh();
