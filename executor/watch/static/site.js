// The published site (python -m executor publish): the same pages, routed by the URL's hash (#/experiment/F,
// #/step/R) and reading the JSON files the publisher wrote under data/ instead of the API. Nothing here runs
// in the live dashboard, where `SITE` is false.
"use strict";

const SITE = document.documentElement.dataset.site === "static";
const SITE_STATUS_ORDER = ["FAILED", "CORRUPT", "DEP_FAILED", "RUNNING", "WAITING", "NEVER_RAN", "SUCCESS"];

// The page's path and query: from the address in the dashboard, from the hash on the site.
function route() {
  if (!SITE) return { path: location.pathname, search: location.search };
  const hash = location.hash.slice(1) || "/";
  const mark = hash.indexOf("?");
  return mark < 0 ? { path: hash, search: "" } : { path: hash.slice(0, mark), search: hash.slice(mark) };
}

function pageHref(path) {
  return SITE ? `#${path}` : path;
}

function siteFile(path) {
  return `data/${path.split("/").map(encodeURIComponent).join("/")}`;
}

const FROM_DISK = "this site's pages read its JSON files, which browsers refuse to a page opened from disk (file://): "
  + "serve the folder, e.g. python -m http.server 8000 --bind 127.0.0.1 --directory <this folder>, then open http://127.0.0.1:8000/";
let SITE_FRESH = null, SITE_FRESH_AT = 0;

async function siteJson(file) {
  if (location.protocol === "file:") throw new Error(FROM_DISK);
  const response = await fetch(siteFile(file), { cache: "no-cache" });
  if (!response.ok) throw new Error(`${file}: not published (${response.status})`);
  const body = await response.json();
  if (body && body.error && body.status) throw new Error(body.error);
  return body;
}

// data/site.json (publish.py): when the site last changed and, while a publisher watches, its heartbeat.
// Read at most once a poll, before any page's data, so a page never shows a step live that nobody watches.
async function siteFreshness() {
  if (Date.now() - SITE_FRESH_AT < 2000) return SITE_FRESH;
  SITE_FRESH_AT = Date.now();
  try { SITE_FRESH = await siteJson("site.json"); } catch (error) { SITE_FRESH = null; }
  const element = document.getElementById("published");
  if (element && SITE_FRESH) {
    const stale = siteStale();
    element.hidden = false;
    element.className = stale ? "published stale" : "published";
    element.dataset.stale = String(stale);
    element.textContent = `published ${fmtAgo(SITE_FRESH.published_at)}` + (SITE_FRESH.heartbeat
      ? (stale ? ` · publisher last seen ${fmtAgo(SITE_FRESH.heartbeat)}: running steps are shown stale` : ` · publisher seen ${fmtAgo(SITE_FRESH.heartbeat)}`) : "");
  }
  return SITE_FRESH;
}

// Whether the publisher has missed 3 heartbeats: what the site says of a RUNNING step is then out of date.
function siteStale() {
  const fresh = SITE_FRESH;
  if (!SITE || !fresh || !fresh.interval_s || !fresh.heartbeat) return false;
  return Date.now() - Date.parse(fresh.heartbeat) > 3 * fresh.interval_s * 1000;
}

// A row's duration: the site leaves it out while a step has not finished (so the table is not rewritten every
// cycle), and the page counts it from the step's start.
function rowDuration(row) {
  if (row.duration_s !== null && row.duration_s !== undefined) return row.duration_s;
  return row.started && !row.finished && row.status === "RUNNING" ? Math.max(0, (Date.now() - Date.parse(row.started)) / 1000) : null;
}

// The step table's filters, sort and pages, done here on the whole table the site holds.
function siteSteps(page, params) {
  let rows = page.rows;
  const statuses = (params.status || "").split(",").filter(Boolean);
  if (statuses.length) rows = rows.filter((row) => statuses.includes(row.status));
  if (params.prefix) rows = rows.filter((row) => row.name.startsWith(params.prefix));
  if (params.name) {
    const regex = params.name.match(/^\/(.*)\/$/);
    const pattern = regex ? new RegExp(regex[1], "i") : null;
    const needle = params.name.toLowerCase();
    rows = rows.filter((row) => (pattern ? pattern.test(row.name) : row.name.toLowerCase().includes(needle)));
  }
  const keys = { name: (row) => row.name, status: (row) => SITE_STATUS_ORDER.indexOf(row.status), started: (row) => row.started || "",
    duration: (row) => rowDuration(row) ?? -1, attempts: (row) => row.attempts || 0 };
  if (keys[params.sort]) {
    const key = keys[params.sort];
    rows = rows.slice().sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  }
  if (params.desc) rows = rows.slice().reverse();
  const offset = Number(params.offset || 0), limit = Number(params.limit || 50);
  return { ...page, rows: rows.slice(offset, offset + limit), matched: rows.length, offset };
}

// What api(path, params) reads on the site: one published file per answer.
async function siteApi(path, params) {
  const step = params.path;
  await siteFreshness();
  switch (path) {
    case "/api/experiments": return siteJson("experiments.json");
    case "/api/experiment": return siteJson(`experiment/${params.file}/summary.json`);
    case "/api/experiment/graph": return siteJson(`experiment/${params.file}/graph.json`);
    case "/api/experiment/incidents": return siteJson(`experiment/${params.file}/incidents.json`);
    case "/api/experiment/steps": return siteSteps(await siteJson(`experiment/${params.file}/steps.json`), params);
    case "/api/step/log": return { exists: false, text: "", published: false };
    case "/api/step/files":
      if (params.dir) throw new Error("only a step's top folder is published");
      return siteJson(`step/${step}/files.json`);
    case "/api/step/preview": throw new Error("file contents are not published");
    case "/api/step/metrics": return siteJson(`step/${step}/metrics.json`).catch(() => ({ exists: false, keys: [], rows: 0 }));
    default: {
      const name = path.slice("/api/".length).replace(/^step\/?/, "") || "step";
      return siteJson(`step/${step}/${name}.json`);
    }
  }
}

if (SITE) window.addEventListener("hashchange", () => location.reload());
