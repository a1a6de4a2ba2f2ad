// The experiments list (/) and one experiment's page (/experiment/<file>): graph, counts, filterable step table.
"use strict";

async function experimentsPage(main) {
  setCrumbs([{ text: "experiments" }]);
  const refresh = async () => {
    const data = await api("/api/experiments");
    document.title = `experiments · ${data.prefix}`;
    const rows = data.experiments.map((experiment) => h("tr", { class: "clickable", "data-experiment": experiment.file,
      onclick: () => { location.href = pageHref(`/experiment/${encodeURIComponent(experiment.file)}`); } },
      h("td", {}, h("a", { href: pageHref(`/experiment/${encodeURIComponent(experiment.file)}`) }, experiment.script),
        h("div", { class: "muted mono" }, experiment.file)),
      h("td", {}, experiment.description || ""),
      h("td", { class: "mono" }, (experiment.git_commit || "").slice(0, 10)),
      h("td", {}, experiment.user || ""),
      h("td", {}, timeCell(experiment.created)),
      h("td", { class: "num" }, fmtNum(experiment.steps)),
      h("td", {}, countChips(experiment.counts, { stalled: experiment.stalled }), alertBadge(experiment.alerts))));
    const running = data.experiments.some((experiment) => experiment.counts.RUNNING || experiment.counts.WAITING);
    const stalled = data.experiments.reduce((total, experiment) => total + (experiment.stalled || 0), 0);
    setLive(running, running ? "live" : "idle", stalled);
    main.replaceChildren(
      h("h1", {}, "Experiments"), h("div", { class: "meta" }, h("span", {}, "prefix ", h("b", { class: "mono" }, data.prefix))),
      h("div", { class: "panel" }, data.experiments.length ? h("table", { "data-testid": "experiments" },
        h("thead", {}, h("tr", {}, ["script", "description", "commit", "user", "started", "steps", "status"]
          .map((name) => h("th", {}, name)))), h("tbody", {}, rows))
        : h("div", { class: "empty" }, "No experiment files under this prefix yet (they appear in <prefix>/experiments when a DAG runs).")));
  };
  await refresh();
  poll(refresh);
}

class StepTable {
  constructor(file, onChange) {
    this.file = file;
    const params = new URLSearchParams(route().search);
    this.state = { statuses: new Set((params.get("status") || "").split(",").filter(Boolean)),
      name: params.get("name") || "", prefix: params.get("prefix") || "", sort: params.get("sort") || "order",
      desc: params.get("desc") === "1", offset: Number(params.get("offset") || 0), limit: 50 };
    this.onChange = onChange;
    this.element = h("div", { class: "panel" });
  }

  query() {
    const s = this.state;
    return { file: this.file, status: [...s.statuses].join(","), name: s.name, prefix: s.prefix, sort: s.sort,
      desc: s.desc ? "1" : "", offset: s.offset, limit: s.limit };
  }

  set(changes) {
    Object.assign(this.state, changes);
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(this.query())) if (value && key !== "file" && key !== "limit") params.set(key, value);
    if (!SITE) history.replaceState(null, "", `${location.pathname}${params.toString() ? "?" + params : ""}`);
    this.onChange();
  }

  toggleStatus(status) {
    const statuses = new Set(this.state.statuses);
    statuses.has(status) ? statuses.delete(status) : statuses.add(status);
    this.set({ statuses, offset: 0 });
  }

  render(page) {
    const s = this.state;
    if (!this.search) {
      // Built once, so a poll never resets what the user is typing.
      this.search = h("input", { type: "search", placeholder: "filter by name (or /regex/)", value: s.name,
        "data-testid": "name-filter" });
      let timer = null;
      this.search.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.set({ name: this.search.value, offset: 0 }), 250);
      });
      this.chips = h("span", {});
      this.body = h("div", {});
      this.element.replaceChildren(h("div", { class: "toolbar" }, this.search, this.chips), this.body);
    }
    const focused = s.prefix ? h("button", { class: "chip active", onclick: () => this.set({ prefix: "", offset: 0 }) }, `group ${s.prefix}* ✕`) : "";
    this.chips.replaceChildren(countChips(page.counts, { active: s.statuses, onToggle: (status) => this.toggleStatus(status),
      stalled: page.rows.filter((row) => row.stalled).length }), focused);
    const header = (label, key, numeric) => h("th", {
      class: [key ? "sortable" : "", s.sort === key ? "sorted" : "", s.sort === key && s.desc ? "desc" : "", numeric ? "num" : ""].join(" ").trim(),
      onclick: key ? () => this.set({ sort: key, desc: s.sort === key ? !s.desc : false }) : null }, label);
    const rows = page.rows.map((row) => h("tr", { class: "clickable", "data-step": row.name, "data-status": row.status,
      onclick: () => { location.href = stepHref(row.path, this.file); } },
      h("td", {}, h("a", { href: stepHref(row.path, this.file) }, row.name),
        row.drift ? h("span", { class: "tag versioned", title: "the code changed since this output was written" }, "code drift") : "",
        row.message && row.status !== "SUCCESS" ? h("div", { class: "muted" }, row.message.slice(0, 160)) : ""),
      h("td", {}, badge(row.status, row.stalled)), h("td", { class: "mono" }, row.hash), h("td", {}, timeCell(row.started)),
      h("td", { class: "num" }, fmtDuration(rowDuration(row))), h("td", { class: "num" }, row.attempts || ""),
      h("td", {}, progressBar(row.progress)), h("td", {}, figuresText(row.figures))));
    const last = Math.min(page.offset + page.rows.length, page.matched);
    this.body.replaceChildren(
      h("table", { "data-testid": "steps" }, h("thead", {}, h("tr", {},
        header("step", "name"), header("status", "status"), header("hash"), header("started", "started"),
        header("duration", "duration", true), header("attempts", "attempts", true), header("shards"),
        header("docs / tokens in → out"))),
        h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No step matches.")))),
      h("div", { class: "pager" },
        h("button", { class: "plain", disabled: s.offset <= 0, onclick: () => this.set({ offset: Math.max(0, s.offset - s.limit) }) }, "‹ prev"),
        h("span", { "data-testid": "pager" }, page.matched ? `${fmtNum(page.offset + 1)}–${fmtNum(last)} of ${fmtNum(page.matched)}` : "0",
          page.matched !== page.total ? ` (of ${fmtNum(page.total)} steps)` : ""),
        h("button", { class: "plain", disabled: last >= page.matched, onclick: () => this.set({ offset: s.offset + s.limit }) }, "next ›")));
  }
}

async function experimentPage(main, file) {
  setCrumbs([{ text: "experiments", href: pageHref("/") }, { text: file }]);
  const head = h("div", {}), graphBox = h("div", { class: "graph", "data-testid": "graph" });
  let table = null;
  const dag = new DagView(graphBox, (node) => {
    if (node.path) location.href = stepHref(node.path, file);
    else if (node.filter) table.set({ prefix: node.filter.name_prefix, offset: 0 });
  });
  const refreshTable = async () => table.render(await api("/api/experiment/steps", table.query()));
  table = new StepTable(file, () => refreshTable().catch((error) => showError(table.element, error)));
  const incidentsBox = h("div", { class: "panel", "data-testid": "experiment-incidents", hidden: true });
  main.replaceChildren(head, h("div", { class: "panel" }, h("h2", {}, "Graph"), graphBox, graphLegend()), incidentsBox, table.element);
  const refresh = async () => {
    const [summary, graph, incidents] = await Promise.all([api("/api/experiment", { file }), api("/api/experiment/graph", { file }),
      api("/api/experiment/incidents", { file }).catch(() => ({ timeline: [] }))]);  // a site published before it had none
    incidentsBox.hidden = !incidents.timeline.length;
    incidentsBox.replaceChildren(h("h2", {}, `Incidents (${incidents.timeline.length})`), h("table", {}, h("tbody", {},
      incidents.timeline.map((entry) => h("tr", { "data-kind": entry.kind }, h("td", { class: "mono" }, new Date(entry.time).toLocaleString("sv-SE")),
        h("td", {}, h("span", { class: `incident ${entry.kind}` }, entry.kind.replace("_", " "))), h("td", {}, h("a", { href: stepHref(entry.path, file) }, entry.step_name)),
        h("td", {}, entry.text))))));
    document.title = `${summary.script} · experiment`;
    const shards = summary.running_shards;
    head.replaceChildren(h("h1", {}, summary.script, " ", h("span", { class: "muted mono" }, file)),
      summary.description ? h("div", {}, summary.description) : "",
      h("div", { class: "meta" }, h("span", {}, "caller ", h("b", { class: "mono" }, summary.caller || "?")),
        h("span", {}, "commit ", h("b", { class: "mono" }, (summary.git_commit || "?").slice(0, 12))),
        h("span", {}, "user ", h("b", {}, summary.user || "?")), h("span", {}, "started ", h("b", {}, fmtTime(summary.created))),
        h("span", {}, "steps ", h("b", { "data-testid": "total-steps" }, fmtNum(summary.steps))),
        shards.steps ? h("span", {}, `running: ${fmtNum(shards.shards_done)} / ${fmtNum(shards.shards_total)} shards in ${shards.steps} step(s)`) : ""),
      h("div", { "data-testid": "counts" }, countChips(summary.counts, { stalled: summary.stalled }), alertBadge(summary.alerts)));
    const busy = summary.counts.RUNNING || summary.counts.WAITING;
    setLive(Boolean(busy), busy ? "live" : "idle", summary.stalled);
    dag.update(graph);
    await refreshTable();
  };
  await refresh();
  poll(refresh);
}
