// The composition view (executor/watch/training/composition_view.py): a topic x quality grid shaded by tokens or by a
// phase's weight, and a sortable table of the cells (top terms, docs, tokens, weight per phase, expected epochs)
// whose rows open to the cell's sample snippets. A grid cell's click opens its row. A train step's view is a table
// of what the run ate per mixture phase (tokens and share of each component, from its data/tokens metrics).
"use strict";

class CompositionPanel {
  constructor() {
    this.element = h("div", { "data-testid": "composition-view" });
    this.heat = "tokens";
    this.chosen = false;  // once the user picks a shading, a refresh keeps it
    this.sort = { key: "tokens", descending: true };
    this.open = new Set();
    this.signature = null;
  }

  async refresh(path) {
    const data = await api("/api/step/composition", { path });
    const signature = JSON.stringify(data);
    if (signature === this.signature) return;
    this.signature = signature;
    this.data = data;
    if (data.phases.length && this.heat === "tokens" && !this.chosen) this.heat = "weight0";
    this.render();
  }

  showError(error) {
    this.signature = null;
    this.element.replaceChildren(h("div", { class: "error", "data-testid": "view-error" }, String(error.message || error)));
  }

  heatValue(cell) {
    return this.heat === "tokens" ? cell.tokens : (cell.weights || [])[Number(this.heat.slice(6))] || 0;
  }

  heatText(value) {
    return this.heat === "tokens" ? fmtNum(value) : value.toFixed(3);
  }

  render() {
    const data = this.data;
    if (!data.cells.length && data.eaten) {
      this.element.replaceChildren(this.eatenTable());
      return;
    }
    const options = [h("option", { value: "tokens", selected: this.heat === "tokens" }, "tokens")].concat(data.phases.map((phase, index) =>
      h("option", { value: `weight${index}`, selected: this.heat === `weight${index}` }, `weight, phase ${index + 1} (${Math.round(phase.fraction * 100)}% of tokens)`)));
    this.element.replaceChildren(
      h("div", { class: "meta" }, h("span", {}, "cells ", h("b", {}, data.cells.length)),
        h("span", {}, "topics × buckets ", h("b", {}, `${data.topics} × ${data.quality_buckets}`)),
        h("span", {}, "docs ", h("b", {}, fmtNum(data.docs))), h("span", {}, "tokens ", h("b", {}, fmtNum(data.tokens))),
        data.phases.length ? h("span", {}, "phases ", h("b", {}, data.phases.map((phase) => `${Math.round(phase.fraction * 100)}%`).join(" → "))) : "",
        data.max_epochs ? h("span", {}, "epoch cap ", h("b", {}, data.max_epochs)) : "",
        data.composition && data.weights ? h("span", {}, "cells from ", h("a", { href: stepHref(data.composition) }, data.composition)) : ""),
      h("div", { class: "toolbar" }, h("label", {}, "shade by ", h("select", { "data-testid": "heat", onchange: (event) => {
        this.heat = event.target.value; this.chosen = true; this.render(); } }, options))),
      this.grid(), this.table(), data.eaten ? this.eatenTable() : "");
  }

  eatenTable() {
    return servedTable(this.data.eaten);
  }

  grid() {
    const data = this.data;
    const byPosition = new Map(data.cells.map((cell) => [`${cell.topic}/${cell.bucket}`, cell]));
    const top = Math.max(1e-12, ...data.cells.map((cell) => this.heatValue(cell)));
    const topics = [...Array(data.topics).keys()], buckets = [...Array(data.quality_buckets).keys()];
    const rows = topics.map((topic) => {
      const first = data.cells.find((cell) => cell.topic === topic);
      return h("tr", {}, h("th", { class: "topic", title: first ? first.top_terms.join(", ") : "" },
        `topic ${topic}`, h("span", { class: "muted" }, first ? ` ${first.top_terms.slice(0, 3).join(" · ")}` : "")),
        buckets.map((bucket) => {
          const cell = byPosition.get(`${topic}/${bucket}`);
          if (!cell) return h("td", { class: "heat empty-cell" }, "");
          const value = this.heatValue(cell), share = value / top;
          return h("td", { class: "heat", "data-cell": cell.name, "data-value": value, title: `${cell.name}: ${fmtNum(cell.docs)} docs, ${fmtNum(cell.tokens)} tokens`,
            style: `background: rgba(59, 91, 219, ${(0.08 + 0.85 * share).toFixed(3)}); color: ${share > 0.55 ? "#fff" : "#1f2430"}`,
            onclick: () => this.reveal(cell.name) }, this.heatText(value));
        }));
    });
    return h("div", { class: "scroll" }, h("table", { class: "heatmap", "data-testid": "composition-grid" },
      h("thead", {}, h("tr", {}, h("th", {}, "topic \\ quality"), buckets.map((bucket) => h("th", {}, `q${bucket}${bucket === 0 ? " (lowest)" : ""}`)))),
      h("tbody", {}, rows)));
  }

  columns() {
    const columns = [["name", "cell"], ["top_terms", "top terms"], ["bucket", "quality"], ["docs", "docs"], ["tokens", "tokens"], ["share", "share"]];
    this.data.phases.forEach((_, index) => columns.push([`weight${index}`, `weight p${index + 1}`]));
    if (this.data.phases.length) columns.push(["expected_epochs", "epochs"]);
    return columns;
  }

  value(cell, key) {
    if (key.startsWith("weight")) return (cell.weights || [])[Number(key.slice(6))];
    if (key === "top_terms") return cell.top_terms.join(" ");
    return cell[key];
  }

  table() {
    const columns = this.columns(), { key, descending } = this.sort;
    const cells = this.data.cells.slice().sort((a, b) => {
      const left = this.value(a, key), right = this.value(b, key);
      const order = typeof left === "string" || typeof right === "string" ? String(left).localeCompare(String(right)) : (left ?? -Infinity) - (right ?? -Infinity);
      return descending ? -order : order;
    });
    const head = h("tr", {}, columns.map(([name, title]) => h("th", { class: `sortable${name === key ? (descending ? " sorted desc" : " sorted") : ""}`, "data-sort": name,
      onclick: () => { this.sort = { key: name, descending: name === key ? !descending : name !== "name" }; this.render(); } }, title)));
    const body = cells.flatMap((cell) => {
      const row = h("tr", { class: "clickable", "data-cell": cell.name, onclick: () => { this.toggle(cell.name); } }, columns.map(([name]) => {
        const value = this.value(cell, name);
        if (name === "top_terms") return h("td", { class: "muted" }, cell.top_terms.slice(0, 5).join(", "));
        if (name === "name") return h("td", { class: "mono" }, cell.name, cell.capped && cell.capped.length ? h("span", { class: "tag plain", title: "the epoch cap bound this cell" }, "capped") : "");
        if (name === "share" || name.startsWith("weight")) return h("td", { class: "num", "data-col": name, "data-value": value ?? "" }, value === undefined || value === null ? "" : value.toFixed(4));
        if (name === "expected_epochs") return h("td", { class: "num", "data-col": name, "data-value": value ?? "" }, value === undefined || value === null ? "" : value.toFixed(2));
        return h("td", { class: name === "bucket" ? "" : "num", "data-col": name, "data-value": value ?? "" }, name === "bucket" ? `q${value}` : fmtNum(value));
      }));
      if (!this.open.has(cell.name)) return [row];
      const samples = cell.samples.length ? h("ol", {}, cell.samples.map((sample) => h("li", {}, h("pre", { class: "light" }, sample))))
        : h("div", { class: "empty" }, "No documents in this cell.");
      return [row, h("tr", { class: "samples", "data-samples": cell.name }, h("td", { colspan: columns.length },
        h("div", { class: "muted" }, `top terms: ${cell.top_terms.join(", ")}`), samples))];
    });
    return h("div", { class: "scroll" }, h("table", { "data-testid": "composition-table" }, h("thead", {}, head), h("tbody", {}, body)));
  }

  toggle(name) {
    if (this.open.has(name)) this.open.delete(name); else this.open.add(name);
    this.render();
  }

  reveal(name) {
    this.open.add(name);
    this.render();
    this.element.querySelector(`tr[data-cell="${CSS.escape(name)}"]`)?.scrollIntoView({ block: "center" });
  }
}

// Per mixture phase and component: the planned share, the share served and its tokens (executor/watch/training/served_mixture.py);
// a component served more than 20% off its plan over a long enough phase is flagged. The run view points here (one table, not two).
function servedTable(eaten) {
  const drifted = new Set((eaten.drifted || []).map((found) => `${found.phase}/${found.component}`));
  const head = h("tr", {}, h("th", {}, "component"), eaten.phases.map((phase, index) =>
    h("th", { class: "num" }, `phase ${index + 1}: steps ${phase.start_step}-${phase.end_step}`)));
  const rows = eaten.components.map((name) => h("tr", { "data-component": name }, h("td", { class: "mono" }, name),
    eaten.phases.map((phase, index) => {
      const tokens = phase.tokens[name] || 0, planned = (phase.planned || {})[name] || 0, served = (phase.served || {})[name] || 0;
      const off = drifted.has(`${index}/${name}`);
      return h("td", { class: off ? "num warn-inline" : "num", "data-value": tokens, "data-planned": planned, "data-served": served,
        "data-drifted": String(off) }, `planned ${(100 * planned).toFixed(1)}% · served ${(100 * served).toFixed(1)}% · `, fmtNum(tokens));
    })));
  return h("div", {}, h("div", { class: "meta" }, h("span", {}, "served by step ", h("b", {}, eaten.step)),
      h("span", { class: "muted" }, "planned share, share served and tokens of each component, from the run's data/tokens metrics"
        + (eaten.block_size ? ` (mixture blocks of ${eaten.block_size} sequences)` : "")),
      (eaten.drifted || []).length ? h("span", { class: "warn-inline", "data-testid": "mixture-drift" }, `${eaten.drifted.length} component(s) served more than 20% off plan`) : ""),
    h("div", { class: "scroll" }, h("table", { "data-testid": "eaten-table" }, h("thead", {}, head), h("tbody", {}, rows))));
}
