// Shared helpers: building DOM safely (text only, never innerHTML with data), the API, formatting, polling.
"use strict";

const STATUSES = ["FAILED", "CORRUPT", "DEP_FAILED", "RUNNING", "WAITING", "NEVER_RAN", "SUCCESS"];
const POLL_MS = 2000;

function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") element.className = value;
    else if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(key, value === true ? "" : String(value));
  }
  appendAll(element, children);
  return element;
}

function appendAll(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

async function api(path, params) {
  if (SITE) return siteApi(path, params || {});
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") query.set(key, value);
  }
  const url = query.toString() ? `${path}?${query}` : path;
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// A step's status; a RUNNING one is "stale" when the site's publisher stopped (nobody knows it still runs) and
// "stalled" when its run has written no metrics line for its allowance (`stalled`: {since, step, after_s}, from the
// publisher's alerts on the site, executor/watch/site/alerts.py, and from the dashboard itself live,
// executor/watch/training/live_stalls.py). Every page draws a status through here, so they agree.
function badge(status, stalled) {
  const shown = status || "NEVER_RAN";
  if (shown === "RUNNING" && siteStale()) {
    return h("span", { class: "badge RUNNING stale", "data-status": shown, "data-stale": "true",
      title: "the publisher has not been seen for 3 of its intervals: this step may have stopped" }, "RUNNING · stale");
  }
  if (shown === "RUNNING" && stalled) {
    return h("span", { class: "badge RUNNING stalled", "data-status": shown, "data-stalled": "true",
      title: `no metrics line since step ${stalled.step} (${stalled.since})` }, "RUNNING · stalled");
  }
  return h("span", { class: `badge ${shown}`, "data-status": shown }, shown === "NEVER_RAN" ? "never ran" : shown);
}

function dot(status) {
  return h("span", { class: `dot ${status}` });
}

// One chip a status; RUNNING says "stale" as badge() does, and `stalled` (how many runs are) gets a chip of its own.
function countChips(counts, options) {
  const { active, onToggle, stalled } = options || {};
  const stale = siteStale();
  const chips = STATUSES.filter((status) => counts[status]).map((status) => {
    const name = status === "NEVER_RAN" ? "never ran" : status === "RUNNING" && stale ? "RUNNING · stale" : status;
    const label = [dot(status === "RUNNING" && stale ? "stale" : status), `${name} `, h("b", {}, fmtNum(counts[status]))];
    const mark = status === "RUNNING" && stale ? "true" : null;
    if (!onToggle) return h("span", { class: "chip", "data-count": status, "data-stale": mark }, label);
    const classes = `chip${active && active.has(status) ? " active" : ""}`;
    return h("button", { class: classes, "data-count": status, "data-stale": mark, onclick: () => onToggle(status) }, label);
  });
  if (stalled && !stale) chips.push(h("span", { class: "chip stalled", "data-count": "stalled" }, dot("stalled"), "stalled ", h("b", {}, fmtNum(stalled))));
  return h("div", { class: "counts" }, chips);
}

// Text that counts up from `since` (an ISO time) every second: `render(seconds)` gives it.
const COUNTING = new Set();
function countingUp(since, render) {
  const element = h("span", { "data-counting": since });
  const update = () => { element.textContent = render(Math.max(0, (Date.now() - Date.parse(since)) / 1000)); };
  update();
  COUNTING.add({ element, update });
  return element;
}
setInterval(() => {
  for (const entry of COUNTING) entry.element.isConnected ? entry.update() : COUNTING.delete(entry);
}, 1000);

function fmtNum(value) {
  if (value === null || value === undefined) return "";
  if (typeof value !== "number") return String(value);
  if (Math.abs(value) >= 1e9) return `${(value / 1e9).toFixed(2)}B`;
  if (Math.abs(value) >= 1e6) return `${(value / 1e6).toFixed(2)}M`;
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return value.toPrecision(4);
}

function fmtBytes(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KB", "MB", "GB", "TB", "PB"];
  let value = bytes, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 90) return `${seconds.toFixed(1)} s`;
  if (seconds < 5400) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  if (seconds < 172800) return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
  return `${(seconds / 86400).toFixed(1)} days`;
}

function fmtTime(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  const ago = (Date.now() - date.getTime()) / 1000;
  const stamp = date.toLocaleString("sv-SE").slice(0, 19);
  if (ago < 0 || ago > 7 * 86400) return stamp;
  return `${stamp} (${fmtDuration(ago)} ago)`.replace(/\.\d s ago/, " s ago");
}

function fmtAgo(iso) {
  if (!iso) return "";
  const ago = (Date.now() - new Date(iso).getTime()) / 1000;
  if (Number.isNaN(ago)) return String(iso);
  if (ago < 0 || ago > 30 * 86400) return new Date(iso).toLocaleString("sv-SE").slice(0, 16);
  if (ago < 60) return `${Math.round(ago)} s ago`;
  if (ago < 3600) return `${Math.round(ago / 60)} min ago`;
  if (ago < 86400) return `${(ago / 3600).toFixed(1)} h ago`;
  return `${(ago / 86400).toFixed(1)} days ago`;
}

// A compact "4 min ago" with the exact time on hover.
function timeCell(iso) {
  return h("span", { title: iso ? new Date(iso).toLocaleString("sv-SE") + " (" + iso + ")" : "" }, fmtAgo(iso));
}

function progressBar(progress) {
  if (!progress || !progress.shards_total) return "";
  const done = progress.shards_done || 0, total = progress.shards_total;
  const percent = Math.min(100, (100 * done) / total);
  const title = `${done} / ${total} shards` + (progress.rows ? `, ${fmtNum(progress.rows)} rows` : "")
    + (progress.bytes ? `, ${fmtBytes(progress.bytes)}` : "");
  return h("div", { class: `bar${done >= total ? " done" : ""}`, title, "data-progress": `${done}/${total}` },
    h("span", { style: `width:${percent.toFixed(1)}%` }), h("em", {}, `${fmtNum(done)} / ${fmtNum(total)}`));
}

function figuresText(figures) {
  if (!figures) return "";
  const parts = [];
  for (const what of ["docs", "tokens", "bytes"]) {
    const into = figures[`${what}_in`], out = figures[`${what}_out`];
    const fmt = what === "bytes" ? fmtBytes : fmtNum;
    if (into !== undefined && out !== undefined) parts.push(`${what} ${fmt(into)} → ${fmt(out)}`);
    else if (out !== undefined) parts.push(`${what} out ${fmt(out)}`);
    else if (into !== undefined) parts.push(`${what} in ${fmt(into)}`);
    else if (figures[what] !== undefined) parts.push(`${what} ${fmt(figures[what])}`);
  }
  return parts.join(" · ");
}

function setCrumbs(items) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren();
  items.forEach((item, index) => {
    if (index) nav.append(h("span", { class: "sep" }, "›"));
    nav.append(item.href ? h("a", { href: item.href }, item.text) : h("span", {}, item.text));
  });
}

// The header's live dot: "live" while steps run, unless the site's publisher went quiet ("stale", as every badge
// then says) or a run did (`stalled`: how many runs have).
function setLive(on, text, stalled) {
  const live = document.getElementById("live");
  const stale = on && siteStale();
  live.className = stale ? "live stale" : on && stalled ? "live on stalled" : on ? "live on" : "live";
  live.dataset.state = stale ? "stale" : on && stalled ? "stalled" : on ? "live" : "idle";
  live.textContent = stale ? "stale: the publisher went quiet" : on && stalled ? `live · ${stalled} stalled` : text || (on ? "live" : "");
}

// Poll `task` every POLL_MS while the tab is visible; never two calls in flight.
function poll(task) {
  let busy = false;
  const tick = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try { await task(); } catch (error) { setLive(false, `update failed: ${error.message}`); } finally { busy = false; }
  };
  return setInterval(tick, POLL_MS);
}

function showError(container, error) {
  container.replaceChildren(h("div", { class: "error" }, String(error.message || error)));
}

function stepHref(path, experiment) {
  const encoded = path.split("/").map(encodeURIComponent).join("/");
  return pageHref(`/step/${encoded}` + (experiment ? `?experiment=${encodeURIComponent(experiment)}` : ""));
}

function copyBox(text) {
  const pre = h("pre", { class: "light mono" }, text);
  const button = h("button", { class: "plain", onclick: () => {
    navigator.clipboard?.writeText(text).then(() => { button.textContent = "copied"; }, () => {});
  } }, "copy");
  return h("div", { class: "copy" }, pre, button);
}
