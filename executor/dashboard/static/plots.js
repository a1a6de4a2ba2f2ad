// Metric curves with uPlot (vendored): one small chart per numeric column of metrics.jsonl against a chosen
// x column ("step" by default; pick e.g. "flops" for a scaling law), optional log axes, and a table of the last rows.
"use strict";

const PLOT_COLOURS = ["#2f6fdf", "#d64545", "#1f9d55", "#c98a0c", "#8b5cf6", "#0e9aa7", "#e07b39", "#5b6472"];

class MetricsView {
  constructor(container) {
    this.container = container;
    this.charts = [];
    this.options = { x: null, logX: false, logY: false };
    this.data = null;
  }

  update(metrics) {
    const changed = !this.data || metrics.rows !== this.data.rows;
    this.data = metrics;
    if (changed) this.render();
  }

  render() {
    const metrics = this.data;
    for (const chart of this.charts) chart.destroy();
    this.charts = [];
    if (!metrics.exists || !metrics.rows) {
      this.container.replaceChildren(h("div", { class: "empty" }, "No metrics.jsonl rows yet."));
      return;
    }
    const x = this.options.x && metrics.keys.includes(this.options.x) ? this.options.x : (metrics.x || metrics.keys[0]);
    const controls = h("div", { class: "toolbar" },
      h("label", {}, "x axis ", h("select", { onchange: (event) => { this.options.x = event.target.value; this.render(); } },
        metrics.keys.map((key) => h("option", { value: key, selected: key === x }, key)))),
      h("label", {}, h("input", { type: "checkbox", checked: this.options.logX,
        onchange: (event) => { this.options.logX = event.target.checked; this.render(); } }), " log x"),
      h("label", {}, h("input", { type: "checkbox", checked: this.options.logY,
        onchange: (event) => { this.options.logY = event.target.checked; this.render(); } }), " log y"),
      h("span", { class: "muted" }, `${fmtNum(metrics.rows)} rows${metrics.thinned ? " (thinned for plotting)" : ""}`));
    const plots = h("div", { class: "plots" });
    this.container.replaceChildren(controls, plots, this.table(metrics));
    const xs = metrics.columns[x];
    const order = xs.map((_, index) => index).filter((index) => xs[index] !== null).sort((a, b) => xs[a] - xs[b]);
    metrics.keys.filter((key) => key !== x).slice(0, 16).forEach((key, number) => {
      const ys = metrics.columns[key];
      if (ys.every((value) => value === null)) return;
      const box = h("div", { class: "plot", "data-metric": key }, h("h3", {}, key));
      plots.append(box);
      const width = Math.max(320, Math.floor(box.getBoundingClientRect().width) || 420);
      const chart = new uPlot({
        width, height: 220,
        scales: { x: { time: false, distr: this.options.logX ? 3 : 1 }, y: { distr: this.options.logY ? 3 : 1 } },
        axes: [{ label: x, size: 36 }, { size: 56 }],
        legend: { show: true },
        series: [{ label: x }, { label: key, stroke: PLOT_COLOURS[number % PLOT_COLOURS.length], width: 1.6,
          points: { show: order.length < 60 } }],
      }, [order.map((index) => xs[index]), order.map((index) => ys[index])], box);
      this.charts.push(chart);
    });
  }

  table(metrics) {
    const rows = metrics.last || [];
    const keys = [...new Set(rows.flatMap((row) => Object.keys(row)))].slice(0, 14);
    return h("details", { class: "metrics-table" }, h("summary", {}, `last ${rows.length} rows as a table`),
      h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, keys.map((key) => h("th", {}, key)))),
        h("tbody", {}, rows.slice().reverse().map((row) => h("tr", {}, keys.map((key) => h("td", { class: "num" },
          typeof row[key] === "object" ? JSON.stringify(row[key]) : fmtNum(row[key])))))))));
  }
}
