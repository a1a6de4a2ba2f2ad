// One step's page (/step/<relative output path>): the views its outputs call for (panels.js), history, config,
// why-this-hash, metrics, log, outputs.
"use strict";

function section(title, ...children) {
  return h("div", { class: "panel", "data-section": title }, h("h2", {}, title), ...children);
}

function kvTable(entries) {
  return h("table", { class: "kv" }, h("tbody", {}, entries.filter(([, value]) => value !== null && value !== undefined && value !== "")
    .map(([key, value]) => h("tr", {}, h("td", {}, key), h("td", {}, value instanceof Node ? value : (typeof value === "object" ? JSON.stringify(value) : String(value)))))));
}

function historyTable(events) {
  return h("div", { class: "scroll" }, h("table", { "data-testid": "history" }, h("thead", {}, h("tr", {},
    ["time", "status", "attempt", "worker", "message"].map((name) => h("th", {}, name)))),
    h("tbody", {}, events.slice().reverse().map((event) => h("tr", {}, h("td", {}, timeCell(event.time)), h("td", {}, badge(event.status)),
      h("td", { class: "num" }, event.attempt), h("td", { class: "mono" }, event.worker || ""), h("td", {}, event.message || ""))))));
}

// Every attempt: its start, its end and how it ended (executor/watch/incidents.py attempt_history); a killed
// attempt ends at its lease's last heartbeat.
function attemptsTable(attempts) {
  if (!attempts || !attempts.length) return h("div", { class: "empty" }, "No attempt yet.");
  return h("table", { "data-testid": "attempts" }, h("thead", {}, h("tr", {},
    ["attempt", "started", "ended", "took", "outcome", "cause"].map((name) => h("th", {}, name)))),
    h("tbody", {}, attempts.map((attempt) => h("tr", { "data-attempt": attempt.attempt, "data-outcome": attempt.outcome },
      h("td", { class: "num" }, attempt.attempt), h("td", {}, fmtTime(attempt.started)), h("td", {}, attempt.ended ? fmtTime(attempt.ended) : ""),
      h("td", { class: "num" }, attempt.ended ? fmtDuration((Date.parse(attempt.ended) - Date.parse(attempt.started)) / 1000) : ""),
      h("td", {}, attempt.outcome), h("td", {}, attempt.cause || "")))));
}

function configTable(rows) {
  if (!rows.length) return h("div", { class: "empty" }, "No config recorded.");
  return h("table", { class: "kv", "data-testid": "config" }, h("tbody", {}, rows.map((row) => h("tr", { "data-key": row.key, "data-kind": row.kind },
    h("td", { class: "mono" }, row.key, h("span", { class: `tag ${row.kind}`, title: {
      versioned: "part of the step's version: changing it changes the hash", plain: "not hashed: changing it reruns nothing",
      dependency: "an upstream output: hashed through that step's hash" }[row.kind] }, row.kind)),
    h("td", { class: "mono" }, typeof row.value === "string" ? row.value : JSON.stringify(row.value),
      row.dependency ? h("div", { class: "muted" }, `← ${row.dependency}`) : "")))));
}

function explainPanel(explain) {
  if (!explain) return h("div", { class: "empty" }, "No version recorded.");
  const others = explain.others.length ? explain.others.map((other) => h("div", { class: "other", "data-testid": "explain-other" },
    h("div", {}, other.path ? h("a", { href: stepHref(other.path) }, other.label) : other.label, " ", badge(other.status),
      h("span", { class: "muted" }, ` written ${fmtTime(other.written)} · ${other.differences.length} difference(s)`)),
    h("ul", {}, other.differences.map((diff) => h("li", { class: `mono ${diff.added ? "diff-added" : diff.removed ? "diff-removed" : ""}` }, diff.text)))))
    : [h("div", { class: "empty" }, "No other version of this step name is stored beside it.")];
  return h("div", { "data-testid": "explain" },
    h("p", {}, "hash = sha256 of the canonical JSON of the version below = ", h("code", {}, explain.hash)),
    kvTable(explain.flat.map((row) => [row.key, h("code", {}, JSON.stringify(row.value))])),
    h("details", {}, h("summary", {}, "canonical JSON"), h("pre", { class: "light" }, explain.version_json)),
    h("h2", { style: "margin-top:14px" }, "Compared with other versions (nearest first)"), ...others);
}

class FileBrowser {
  constructor(path) {
    this.path = path;
    this.dir = "";
    this.element = h("div", { "data-testid": "files" });
    this.previewBox = h("div", {});
  }

  async open(dir) {
    this.dir = dir;
    const listing = await api("/api/step/files", { path: this.path, dir });
    const crumbs = [h("a", { href: "#", onclick: (event) => { event.preventDefault(); this.open(""); } }, "outputs")];
    let walked = "";
    for (const part of dir ? dir.split("/") : []) {
      walked = walked ? `${walked}/${part}` : part;
      const target = walked;
      crumbs.push(" / ", h("a", { href: "#", onclick: (event) => { event.preventDefault(); this.open(target); } }, part));
    }
    const rows = listing.entries.map((entry) => {
      const relative = dir ? `${dir}/${entry.name}` : entry.name;
      const open = (event) => { event.preventDefault(); entry.type === "dir" ? this.open(relative) : this.preview(relative); };
      return h("tr", { class: "clickable", "data-file": relative, onclick: open }, h("td", { class: "name mono" },
        h("a", { href: "#" }, entry.type === "dir" ? `${entry.name}/` : entry.name)), h("td", { class: "num" }, entry.type === "dir" ? "" : fmtBytes(entry.size)));
    });
    this.element.replaceChildren(h("div", { class: "muted" }, crumbs),
      h("div", { class: "scroll" }, h("table", { class: "files" }, h("tbody", {}, rows))),
      listing.truncated ? h("div", { class: "muted" }, `showing ${listing.entries.length} of ${listing.count}`) : "", this.previewBox);
  }

  async preview(file) {
    const data = await api("/api/step/preview", { path: this.path, file });
    const title = h("h2", { style: "margin-top:14px" }, `${file} · ${fmtBytes(data.size)} · ${data.kind}${data.truncated ? " (first part)" : ""}`);
    let body;
    if (data.rows) body = rowsTable(data.rows, data);
    else if (data.document !== undefined) body = h("pre", { class: "light" }, JSON.stringify(data.document, null, 2));
    else if (data.text !== undefined) body = h("pre", { class: "light" }, data.text);
    else body = h("div", { class: "empty" }, "Binary file: no preview.");
    this.previewBox.replaceChildren(title, data.note ? h("div", { class: "warn" }, data.note) : "", h("div", { class: "scroll", "data-testid": "preview" }, body));
  }
}

function rowsTable(rows, data) {
  if (!rows.length) return h("div", { class: "empty" }, "No rows.");
  const objects = rows.every((row) => row && typeof row === "object" && !Array.isArray(row));
  if (!objects) return h("pre", { class: "light" }, rows.map((row) => JSON.stringify(row)).join("\n"));
  const keys = [...new Set(rows.flatMap((row) => Object.keys(row)))].slice(0, 12);
  const cell = (value) => { const text = typeof value === "string" ? value : JSON.stringify(value); return text && text.length > 240 ? `${text.slice(0, 240)}…` : text; };
  return h("div", {}, data.schema ? h("div", { class: "muted mono" }, data.schema.join(", ")) : "",
    h("table", {}, h("thead", {}, h("tr", {}, keys.map((key) => h("th", {}, key)))),
      h("tbody", {}, rows.map((row) => h("tr", {}, keys.map((key) => h("td", { class: "mono" }, cell(row[key]))))))));
}

function gangTable(gang) {
  // A multi-host step (executor/run/gang.py): the current (or last) attempt's gang, one row per host.
  return section(`Gang: ${gang.hosts} hosts (${gang.placement}), ${gang.state}`,
    h("div", { class: "muted" }, `coordinator ${gang.coordinator || "?"}`, gang.message ? ` · ${gang.message}` : ""),
    h("table", {}, h("tr", {}, ["host", "state", "node", "pid", "last heartbeat"].map((name) => h("th", {}, name))),
      gang.members.map((member) => h("tr", { "data-state": member.state }, h("td", {}, member.rank), h("td", {}, member.state),
        h("td", { class: "mono" }, member.ip || "?"), h("td", {}, member.pid ?? "?"),
        h("td", {}, member.last_heartbeat ? fmtTime(new Date(member.last_heartbeat * 1000).toISOString()) : "")))));
}

// Whether to ask for the step's metrics: the site says which steps have them (the dashboard answers either way).
function hasMetrics(live) {
  return live.has_metrics !== false;
}

async function stepPage(main, path) {
  const experiment = new URLSearchParams(route().search).get("experiment");
  const logBox = h("pre", { class: "log", "data-testid": "log" }, "");
  const metricsBox = h("div", { "data-testid": "metrics" });
  const metricsView = new MetricsView(metricsBox);
  const panels = new StepPanels(path, experiment);
  const statusBox = h("span", { "data-testid": "step-status" }), historyBox = h("div", {}), progressBox = h("div", {});
  const attemptsBox = h("div", {});
  const gangBox = h("div", { "data-testid": "gang" }), stallBox = h("div", {});
  let lastStatus = null, lastEvents = -1;

  const refreshLog = async () => {
    const log = await api("/api/step/log", { path });
    const atBottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 8;
    logBox.textContent = log.published === false ? "(logs are not published on this site)"
      : log.exists ? (log.truncated ? "… (earlier lines cut)\n" : "") + log.text : "(no log yet: it is uploaded while the step runs)";
    if (atBottom) logBox.scrollTop = logBox.scrollHeight;
  };
  const refreshMetrics = async () => {
    const metrics = await api("/api/step/metrics", { path });
    metricsBox.closest("[data-section]").hidden = !metrics.exists;
    metricsView.update(metrics);
  };
  const showLive = (live) => {
    const stalled = live.status === "RUNNING" && live.stalled && !siteStale() ? live.stalled : null;
    statusBox.replaceChildren(badge(live.status, stalled), live.holder_lost ? h("span", { class: "warn", "data-testid": "holder-lost" }, ` ${live.holder_lost}`) : "");
    if (JSON.stringify(stalled) !== stallBox.dataset.shown) {
      stallBox.dataset.shown = JSON.stringify(stalled);
      stallBox.replaceChildren(stalled ? h("div", { class: "error", "data-testid": "stalled" }, "Stalled: ",
        countingUp(stalled.since, (seconds) => `no metrics line for ${fmtDuration(seconds)}`),
        ` since step ${fmtNum(stalled.step)} (a stall after ${fmtDuration(stalled.after_s)} without one, from this run's step time)`) : "");
    }
    if (live.events.length !== lastEvents) {
      historyBox.replaceChildren(historyTable(live.events));
      attemptsBox.replaceChildren(attemptsTable(live.attempt_history));
      lastEvents = live.events.length;
    }
    progressBox.replaceChildren(live.progress ? h("div", { class: "toolbar" }, progressBar(live.progress),
      h("span", { class: "muted" }, `${fmtNum(live.progress.shards_done || 0)} / ${fmtNum(live.progress.shards_total)} shards · `
        + `${fmtNum(live.progress.rows || 0)} rows · ${fmtBytes(live.progress.bytes || 0)}`
        + (live.progress.updated ? ` · updated ${fmtTime(live.progress.updated)}` : ""))) : "");
    gangBox.replaceChildren(live.gang ? gangTable(live.gang) : "");
    const busy = live.status === "RUNNING" || live.status === "WAITING";
    setLive(busy, busy ? "live" : "idle", stalled ? 1 : 0);
  };

  const render = async () => {
    const step = await api("/api/step", { path, experiment });
    document.title = `${step.name} · step`;
    setCrumbs([{ text: "experiments", href: pageHref("/") }, step.experiment ? { text: step.experiment, href: pageHref(`/experiment/${encodeURIComponent(step.experiment)}`) } : { text: "(no experiment)" }, { text: step.name }]);
    const failed = [...step.live.events].reverse().find((event) => event.status === "FAILED");
    const info = step.info;
    main.replaceChildren(
      h("h1", {}, step.name, " ", statusBox),
      h("div", { class: "meta" }, h("span", {}, "hash ", h("b", { class: "mono" }, info.hash || "?")),
        h("span", {}, "fn ", h("b", { class: "mono" }, info.fn || "?")),
        h("span", {}, "attempts ", h("b", {}, step.live.attempts)),
        step.live.started ? h("span", {}, (step.live.attempts > 1 ? `attempt ${step.live.attempts} started ` : "started "), h("b", {}, fmtTime(step.live.started))) : "",
        (step.live.attempt_history || []).length > 1 ? h("span", { "data-testid": "first-started" }, "first attempt started ", h("b", {}, fmtTime(step.live.attempt_history[0].started))) : "",
        step.output_bytes !== null ? h("span", {}, "outputs ", h("b", {}, fmtBytes(step.output_bytes))) : "",
        step.output_digest ? h("span", { title: "sha256 of the canonical manifest: the same bytes give the same digest" },
          "digest ", h("b", { class: "mono", "data-testid": "output-digest" }, step.output_digest)) : ""),
      info.description ? h("p", {}, info.description) : "",
      h("div", { class: "meta mono" }, step.output_path),
      step.drift ? h("div", { class: "warn", "data-testid": "drift" }, "Code drift: ", step.drift) : "",
      failed && step.live.status !== "SUCCESS" ? h("div", { class: "error", "data-testid": "failure" }, failed.message || "failed",
        failed.details?.traceback ? h("details", {}, h("summary", {}, "traceback"), h("pre", {}, failed.details.traceback)) : "") : "",
      stallBox,
      progressBox,
      gangBox,
      panels.element,
      h("div", { class: "grid2" },
        h("div", {}, section("Attempts", attemptsBox), section("Status history", historyBox), section("Rerun just this step", copyBox(step.rerun),
          h("p", { class: "muted" }, "Its dependencies are skipped when they already succeeded.")),
          section("Dependencies", step.dependencies.length ? h("ul", {}, step.dependencies.map((dep) => h("li", {},
            dep.path ? h("a", { href: stepHref(dep.path, step.experiment) }, dep.name) : dep.name,
            dep.blocking ? "" : h("span", { class: "tag plain" }, "pseudo")))) : h("div", { class: "empty" }, "None.")),
          section("Config (resolved)", configTable(step.config)),
          step.stats ? section("Stats (stats.json)", kvTable(Object.entries(step.stats).map(([key, value]) => [key, typeof value === "number" ? fmtNum(value) : value]))) : ""),
        h("div", {}, section("Why this hash", explainPanel(step.explain)),
          section("Run info", kvTable([["git commit", info.git_commit], ["user", info.user], ["host", info.host], ["worker", info.worker],
            ["code version", info.code_version], ["code fingerprint", info.code_fingerprint], ["written", info.written], ["resources", info.resources]])))),
      section("Metrics", metricsBox),
      section("Log (tail)", logBox),
      section("Outputs", files.element));
    showLive(step.live);
    lastStatus = step.live.status;
    stallBox.dataset.shown = "";
    metricsBox.closest("[data-section]").hidden = !hasMetrics(step.live);
    await Promise.all([refreshLog(), hasMetrics(step.live) ? refreshMetrics() : null, files.open(""), panels.refresh()]);
  };

  const files = new FileBrowser(path);
  await render();
  poll(async () => {
    const live = await api("/api/step/live", { path });
    if (live.status !== lastStatus) { lastStatus = live.status; lastEvents = -1; await render(); return; }
    showLive(live);
    if (live.status === "RUNNING") await Promise.all([refreshLog(), hasMetrics(live) ? refreshMetrics() : null, panels.refresh()]);
  });
}
