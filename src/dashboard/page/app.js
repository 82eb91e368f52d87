// The nimbus dashboard: one page, routed by the URL's hash (#/cluster,
// #/actors, #/jobs/ID, #/actors/ID/log, ...). Every view loads from the
// JSON API and reloads on the server's `change` events. Cells are set as
// text, never as HTML.
"use strict";

const view = document.getElementById("view");
const live = document.getElementById("live");
const LISTINGS = ["actors", "tasks", "objects", "placement-groups", "jobs", "runs"];
const TITLES = {
  actors: "Actors", tasks: "Tasks", objects: "Objects",
  "placement-groups": "Placement groups", jobs: "Jobs", runs: "Training runs",
};
const SVG = "http://www.w3.org/2000/svg";
const PAGE = 100;
// Columns in the order a person reads them; any others follow.
const COLUMNS = {
  actors: ["id", "name", "class", "state", "node", "pid", "restarts", "death", "job", "incarnation", "address"],
  tasks: ["id", "name", "state", "job", "node", "worker", "attempts", "error", "submitted_ms", "ended_ms"],
  objects: ["id", "node", "size", "state", "owned", "holders"],
  "placement-groups": ["id", "job", "state", "bundles", "resources", "used"],
  jobs: ["id", "name", "state", "entrypoint", "node", "submitted", "driver_pid", "start_ms", "end_ms", "duration", "message"],
  runs: ["id", "name", "state", "job", "attempts", "reports", "checkpoints", "loss", "start_ms", "end_ms", "dir"],
};

let route = null;     // what the hash asks for
let state = {};       // the current view's state (filter, offset, log offset)
let loading = false;  // a reload is under way
let again = false;    // another reload was asked for meanwhile

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function parseRoute() {
  const parts = (location.hash.replace(/^#\/?/, "") || "cluster").split("/").map(decodeURIComponent);
  if (parts[0] === "jobs" && parts[1]) return { kind: "job", id: parts[1] };
  if (parts[0] === "runs" && parts[1]) return { kind: "run", id: parts[1] };
  if (parts[0] === "events") return { kind: "events" };
  if (parts[0] === "actors" && parts[1]) return { kind: "actor-log", id: parts[1], stderr: parts[2] === "stderr" };
  if (LISTINGS.includes(parts[0])) return { kind: "listing", name: parts[0] };
  return { kind: "cluster" };
}

function navigate() {
  route = parseRoute();
  state = { filter: "", offset: 0, logOffset: 0 };
  for (const link of document.querySelectorAll("nav a")) {
    const target = link.getAttribute("href").slice(2);
    const current = route.kind === "listing" ? route.name
      : route.kind === "job" ? "jobs" : route.kind === "run" ? "runs" : route.kind === "events" ? "events"
      : route.kind === "actor-log" ? "actors" : "cluster";
    link.classList.toggle("current", target === current);
  }
  view.replaceChildren();
  reload();
}

async function reload() {
  if (loading) { again = true; return; }
  loading = true;
  try {
    if (route.kind === "cluster") await showCluster();
    else if (route.kind === "listing") await showListing(route.name);
    else if (route.kind === "job") await showJob(route.id);
    else if (route.kind === "run") await showRun(route.id);
    else if (route.kind === "events") await showTimeline();
    else await showActorLog(route.id, route.stderr);
  } catch (e) {
    view.replaceChildren(el("p", { class: "error" }, "Cannot load this view: " + e.message));
    state.toolbar = null;
    state.log = null;
    state.logOffset = 0;
  } finally {
    loading = false;
    if (again) { again = false; reload(); }
  }
}

function bar(used, total) {
  const share = total > 0 ? Math.min(1, used / total) : 0;
  const fill = el("span");
  fill.style.width = (share * 100).toFixed(1) + "%";
  return el("span", { class: "bar" }, fill);
}

function amount(value, bytes) {
  if (!bytes) return Number.isInteger(value) ? String(value) : value.toFixed(2);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i++; }
  return (i === 0 ? value : value.toFixed(1)) + " " + units[i];
}

function usage(resources, name, bytes) {
  const total = resources.total[name] || 0;
  const used = resources.used[name] || 0;
  if (!total) return "";
  return el("span", {}, bar(used, total), amount(used, bytes) + " / " + amount(total, bytes));
}

function table(columns, rows, cell) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, ...rows.map((row) => el("tr", {}, ...columns.map((c) => el("td", {}, cell(row, c)))))));
}

async function showCluster() {
  const data = await api("/api/cluster");
  const alive = data.nodes.filter((n) => n.state === "alive").length;
  const columns = ["node", "state", "incarnation", "address", "CPU", "GPU", "memory", "object store", "objects", "spilled", "machine CPU", "machine memory", "death"];
  const nodes = table(columns, data.nodes, (node, column) => {
    const store = node.object_store;
    switch (column) {
      case "node": return node.id + (node.head ? " (head)" : "");
      case "state": return el("span", { class: "state-" + node.state }, node.state);
      case "incarnation": return node.incarnation;
      case "address": return node.address;
      case "CPU": return usage(node.resources, "CPU", false);
      case "GPU": return usage(node.resources, "GPU", false);
      case "memory": return usage(node.resources, "memory", true);
      case "object store": return store ? el("span", {}, bar(store.used, store.capacity), amount(store.used, true) + " / " + amount(store.capacity, true)) : "";
      case "objects": return store ? store.objects : "";
      case "spilled": return store ? amount(store.spilled, true) : "";
      case "machine CPU": return node.host && node.state === "alive"
        ? el("span", { class: "host-cpu" }, bar(node.host.cpu_percent, 100), node.host.cpu_percent.toFixed(0) + "%") : "";
      case "machine memory": return node.host && node.state === "alive"
        ? el("span", {}, bar(node.host.memory_used, node.host.memory_total), amount(node.host.memory_used, true) + " / " + amount(node.host.memory_total, true)) : "";
      case "death": return node.death_reason || "";
    }
  });
  const pending = data.pending.length === 0 ? el("p", { class: "muted" }, "No spawn waits for room.")
    : table(["actor", "class", "resources", "job", "waited"], data.pending, (d, c) =>
      c === "resources" ? JSON.stringify(d.resources) : c === "waited" ? (d.waited_ms / 1000).toFixed(1) + " s" : d[c]);
  const activity = await api("/api/activity");
  view.replaceChildren(
    el("h2", {}, "Cluster"),
    el("p", { id: "summary" }, `${alive} alive, ${data.nodes.length - alive} dead`),
    nodes,
    el("h3", {}, "Activity on the head node (its workers and the drivers it is home to)"),
    el("div", { class: "sparks" },
      spark(activity, "actor_calls", "actor calls/s", false),
      spark(activity, "tasks_finished", "tasks finished/s", false),
      spark(activity, "put_bytes", "put/s", true)),
    el("h3", {}, "Pending demands"),
    pending);
}

// A counter's rate between samples as a small chart, with its total.
function spark(samples, key, label, bytes) {
  const [w, h] = [260, 60];
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].time_ms - samples[i - 1].time_ms) / 1000;
    if (dt > 0) rates.push(Math.max(0, samples[i][key] - samples[i - 1][key]) / dt);
  }
  const top = Math.max(1, ...rates);
  const chart = svg("svg", { class: "spark", "data-metric": key, width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  chart.append(svg("polyline", {
    fill: "none", stroke: "#4a72e8", "stroke-width": 1.5,
    points: rates.map((r, i) => `${(i / Math.max(1, rates.length - 1)) * w},${h - 2 - (r / top) * (h - 4)}`).join(" "),
  }));
  const last = samples.length ? samples[samples.length - 1][key] : 0;
  const now = rates.length ? rates[rates.length - 1] : 0;
  return el("figure", {},
    chart,
    el("figcaption", {}, `${label}: ${amount(now, bytes)} now; total `,
      el("span", { id: "total-" + key }, bytes ? amount(last, true) : String(last))));
}

async function showListing(name) {
  const query = new URLSearchParams({ offset: state.offset, limit: PAGE, q: state.filter });
  const page = await api(`/api/${name}?${query}`);
  if (!state.toolbar) {
    const filter = el("input", { type: "search", placeholder: "filter: words in any column", value: state.filter });
    filter.addEventListener("input", () => { state.filter = filter.value; state.offset = 0; reload(); });
    state.shown = el("span", { class: "muted" });
    state.toolbar = el("div", { class: "toolbar" }, filter,
      el("button", { onclick: () => { state.offset = Math.max(0, state.offset - PAGE); reload(); } }, "◀ previous"),
      el("button", { onclick: () => { if (state.offset + PAGE < state.total) { state.offset += PAGE; reload(); } } }, "next ▶"),
      state.shown);
    state.body = el("div");
    view.replaceChildren(el("h2", {}, TITLES[name]), state.toolbar, state.body);
  }
  state.total = page.total;
  const last = Math.min(page.total, page.offset + page.rows.length);
  state.shown.textContent = page.total === 0 ? `none of ${page.unfiltered}`
    : `${page.offset + 1}–${last} of ${page.total}` + (page.total < page.unfiltered ? ` (of ${page.unfiltered})` : "");
  if (page.rows.length === 0) {
    state.body.replaceChildren(el("p", { class: "muted" }, "(none)"));
    return;
  }
  const known = COLUMNS[name] || [];
  const columns = known.concat(Object.keys(page.rows[0]).filter((c) => !known.includes(c)));
  state.body.replaceChildren(table(columns, page.rows, (row, column) => {
    const value = row[column];
    if (column === "state") return el("span", { class: "state-" + value }, value);
    if (column.endsWith("_ms")) return value ? new Date(value).toLocaleTimeString() : "";
    if (column === "size") return amount(value, true);
    if (column === "id" && name === "jobs") return el("a", { href: "#/jobs/" + encodeURIComponent(value) }, value);
    if (column === "id" && name === "runs") return el("a", { href: "#/runs/" + encodeURIComponent(value) }, value);
    if (column === "loss" && typeof value === "number") return value.toFixed(4);
    if (column === "id" && name === "actors") return el("a", { href: "#/actors/" + encodeURIComponent(value) + "/log" }, value);
    return typeof value === "object" && value !== null ? JSON.stringify(value) : value;
  }));
}

function logView(title, about) {
  if (!state.log) {
    state.about = el("dl");
    state.log = el("pre", { class: "log", id: "log" });
    view.replaceChildren(el("h2", {}, title), about, state.about, el("h3", {}, "Log"), state.log);
  }
}

function appendLog(chunk) {
  if (chunk.next < state.logOffset) return;
  const follow = state.log.scrollTop + state.log.clientHeight >= state.log.scrollHeight - 4;
  state.log.append(chunk.text);
  state.logOffset = chunk.next;
  if (follow) state.log.scrollTop = state.log.scrollHeight;
}

async function showJob(id) {
  const chunk = await api(`/api/jobs/${encodeURIComponent(id)}/log?offset=${state.logOffset}`);
  logView("Job " + id, el("p", {}, el("a", { href: "#/jobs" }, "◀ all jobs")));
  const job = chunk.about;
  state.about.replaceChildren(...["state", "name", "entrypoint", "node", "driver_pid", "duration", "message"].flatMap((key) => [
    el("dt", {}, key),
    el("dd", { id: "job-" + key }, key === "state" ? el("span", { class: "state-" + job.state }, job.state) : job[key] ?? ""),
  ]));
  appendLog(chunk);
}

async function showActorLog(id, stderr) {
  const chunk = await api(`/api/actors/${encodeURIComponent(id)}/log?offset=${state.logOffset}&stderr=${stderr}`);
  const other = stderr ? el("a", { href: `#/actors/${encodeURIComponent(id)}/log` }, "stdout")
    : el("a", { href: `#/actors/${encodeURIComponent(id)}/stderr` }, "stderr");
  logView("Actor " + id + (stderr ? " (stderr)" : ""), el("p", {}, el("a", { href: "#/actors" }, "◀ all actors"), " · ", other));
  state.about.replaceChildren(el("dt", {}, "file"), el("dd", {}, chunk.file));
  appendLog(chunk);
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

// Each metric named like *loss* (without any, as a Tune trial reporting
// an accuracy or a score, every metric): the last value reported for each
// report index (a restarted attempt reports some indices again), by index.
function lossCurves(points) {
  const curves = new Map();
  const losses = points.some((p) => Object.keys(p.metrics).some((name) => name.includes("loss")));
  for (const point of points) {
    for (const [name, value] of Object.entries(point.metrics)) {
      if ((losses && !name.includes("loss")) || !Number.isFinite(value)) continue;
      if (!curves.has(name)) curves.set(name, new Map());
      curves.get(name).set(point.index, value);
    }
  }
  return [...curves].map(([name, byIndex]) => [name, [...byIndex].sort((a, b) => a[0] - b[0])]);
}

const COLORS = ["#4a72e8", "#e8794a", "#2c9f60", "#b04ae8", "#c0362c"];

function chart(points, restarts) {
  const curves = lossCurves(points);
  const [w, h, left, bottom] = [900, 320, 60, 30];
  const all = curves.flatMap(([, c]) => c);
  if (all.length === 0) return el("p", { class: "muted" }, "No metric reported yet.");
  const xs = all.map(([i]) => i), ys = all.map(([, v]) => v);
  const [x0, x1] = [Math.min(...xs), Math.max(Math.max(...xs), Math.min(...xs) + 1)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const X = (i) => left + (i - x0) / (x1 - x0) * (w - left - 10);
  const Y = (v) => 10 + (1 - (v - y0) / (y1 - y0)) * (h - bottom - 10);
  const plot = svg("svg", { id: "loss-chart", width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  plot.append(svg("line", { x1: left, y1: h - bottom, x2: w - 10, y2: h - bottom, stroke: "#888" }));
  plot.append(svg("line", { x1: left, y1: 10, x2: left, y2: h - bottom, stroke: "#888" }));
  for (const v of [y0, (y0 + y1) / 2, y1]) {
    plot.append(svg("text", { x: left - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11 }, v.toFixed(3)));
  }
  for (const [i, anchor] of [[x0, "start"], [Math.round((x0 + x1) / 2), "middle"], [x1, "end"]]) {
    plot.append(svg("text", { x: X(i), y: h - 10, "text-anchor": anchor, "font-size": 11 }, "report " + i));
  }
  for (const at of restarts) {
    plot.append(svg("line", { class: "restart", x1: X(at), y1: 10, x2: X(at), y2: h - bottom, stroke: "#c0362c", "stroke-dasharray": "4 3" }));
  }
  curves.forEach(([name, curve], k) => {
    const color = COLORS[k % COLORS.length];
    plot.append(svg("polyline", { fill: "none", stroke: color, "stroke-width": 2, points: curve.map(([i, v]) => `${X(i)},${Y(v)}`).join(" ") }));
    for (const [i, v] of curve) {
      plot.append(svg("circle", { class: "point", "data-metric": name, cx: X(i), cy: Y(v), r: 3, fill: color },
        svg("title", {}, `${name} at report ${i}: ${v}`)));
    }
    plot.append(svg("text", { x: w - 14, y: 24 + 16 * k, "text-anchor": "end", fill: color, "font-size": 12 }, name));
  });
  return plot;
}

async function showRun(id) {
  const run = await api(`/api/runs/${encodeURIComponent(id)}`);
  // The first report of each attempt after the first marks a restart.
  const restarts = [];
  let attempt = null;
  for (const point of run.points) {
    if (attempt !== null && point.attempt !== attempt) restarts.push(point.index);
    attempt = point.attempt;
  }
  const about = el("dl", {}, ...[
    ["state", el("span", { class: "state-" + run.state }, run.state)],
    ["name", run.header.name], ["job", run.header.job], ["directory", run.header.dir],
    ["attempts", run.attempts], ["reports", run.reports],
  ].flatMap(([k, v]) => [el("dt", {}, k), el("dd", { id: "run-" + k }, v)]));
  const checkpoints = run.checkpoints.length === 0 ? el("p", { class: "muted" }, "No checkpoint yet.")
    : table(["index", "path", "metrics"], run.checkpoints, (c, column) =>
      column === "metrics" ? Object.entries(c.metrics).map(([k, v]) => `${k}=${+v.toFixed(4)}`).join(" ") : c[column]);
  const timeline = el("ul", { id: "timeline" }, ...run.timeline.map((note) =>
    el("li", { class: "note-" + note.kind }, new Date(note.time_ms).toLocaleTimeString() + " " + note.text)));
  view.replaceChildren(
    el("h2", {}, "Training run " + run.header.name),
    el("p", {}, el("a", { href: "#/runs" }, "◀ all runs")),
    about, el("h3", {}, "Metrics by report"), chart(run.points, restarts),
    el("h3", {}, "Checkpoints"), checkpoints,
    el("h3", {}, "Timeline"), timeline);
}

// The cluster's events, newest first: the timeline of faults injected
// and recoveries (a chaos run's), deaths, restarts, joins.
async function showTimeline() {
  const events = await api("/api/timeline");
  const counts = {};
  for (const e of events) counts[e.kind] = (counts[e.kind] || 0) + 1;
  const summary = Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(", ") || "no events yet";
  view.replaceChildren(
    el("h2", {}, "Events"),
    el("p", { id: "timeline-summary", class: "muted" }, summary),
    events.length === 0 ? el("p", { class: "muted" }, "(none)")
      : table(["time", "kind", "text"], events, (e, column) => column === "time"
        ? (e.time_ms ? new Date(e.time_ms).toLocaleTimeString() : "")
        : column === "kind" ? el("span", { class: "event-" + e.kind.replace(" ", "-") }, e.kind) : e.text));
}

// The page's stream of change events, open while the page is shown. A page
// left for another may be kept, frozen, in the back-forward cache: it
// closes its stream, or the six connections a browser holds per host
// over HTTP/1.1 would end up held by hidden pages and the next page would
// wait for one (seen: 60 s on the seventh load). Shown again, it reopens
// the stream and reloads its view.
let events = null;

function listen() {
  events = new EventSource("/api/events");
  events.addEventListener("open", () => { live.textContent = "live"; live.className = "on"; });
  events.addEventListener("error", () => { live.textContent = "reconnecting…"; live.className = ""; });
  events.addEventListener("change", () => reload());
}

window.addEventListener("pagehide", () => { events?.close(); events = null; });
window.addEventListener("pageshow", (shown) => { if (shown.persisted) { listen(); reload(); } });
window.addEventListener("hashchange", navigate);
navigate();
listen();
