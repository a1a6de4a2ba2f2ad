// Metric curves with uPlot (vendored). The server chooses every point (executor/watch/metrics_view.py and
// run_view.py: lines of a step merged, each key its own joined series, extremes and alert steps kept), so this
// file only draws: the metrics grid (every key, found with a search box; x is the step or another key read at
// the same step), the axis ticks, and the markers (alerts, NaN / inf points) both grid and run view put on charts.
"use strict";

const PLOT_COLOURS = ["#2f6fdf", "#d64545", "#1f9d55", "#c98a0c", "#8b5cf6", "#0e9aa7", "#e07b39", "#5b6472"];
const MAX_GRID_CHARTS = 24;
const MARKER_COLOURS = { alert: "#e07b39", nonfinite: "#d64545" };

// Tick labels that stay legible, distinct and exact at any scale: 1.5e-4 rather than "0.0001" four times, and
// 5.0, 7.5, 10.0 rather than 5, 8, 10: every tick of an axis gets the fewest digits that write each of them
// exactly (to a millionth of the step between them), the same count for all (at most 4 after an exponent's
// point, 8 after a decimal one: what the axis has room for).
function tickLabels(_, ticks) {
  const finite = ticks.filter((tick) => tick !== null && Number.isFinite(tick));
  const span = Math.max(0, ...finite.map(Math.abs));
  const increment = finite.length > 1 ? Math.abs(finite[1] - finite[0]) : span;
  const exact = (write) => finite.every((tick) => Math.abs(Number(write(tick)) - tick) <= (increment || span || 1) * 1e-6);
  const scientific = span >= 1e5 || span < 1e-3;
  let digits = scientific ? 1 : 0;
  const write = (tick) => (scientific ? tick.toExponential(digits) : tick.toFixed(digits));
  while (digits < (scientific ? 4 : 8) && !exact(write)) digits += 1;  // longer labels would not fit the axis
  return ticks.map((tick) => (tick === null || !Number.isFinite(tick) ? "" : tick === 0 ? "0" : write(tick)));
}

// A draw hook marking steps on a chart: an alert as a dashed orange line, a NaN / inf point as a red line with
// its name at the top (it has no y to be drawn at).
function markerHook(markers) {
  return (chart) => {
    if (!markers || !markers.length) return;
    const ctx = chart.ctx, top = chart.bbox.top, bottom = chart.bbox.top + chart.bbox.height;
    ctx.save();
    ctx.font = `${10 * devicePixelRatio}px system-ui, sans-serif`;
    for (const marker of markers) {
      const left = chart.valToPos(marker.step, "x", true);
      if (!Number.isFinite(left) || left < chart.bbox.left || left > chart.bbox.left + chart.bbox.width) continue;
      ctx.strokeStyle = ctx.fillStyle = MARKER_COLOURS[marker.kind] || "#5b6472";
      ctx.lineWidth = (marker.kind === "nonfinite" ? 2 : 1.5) * devicePixelRatio;
      ctx.setLineDash(marker.kind === "alert" ? [4 * devicePixelRatio, 3 * devicePixelRatio] : []);
      ctx.beginPath();
      ctx.moveTo(left, top);
      ctx.lineTo(left, bottom);
      ctx.stroke();
      ctx.fillText(marker.label, left + 3 * devicePixelRatio, top + (marker.kind === "nonfinite" ? 11 : 22) * devicePixelRatio);
    }
    ctx.restore();
  };
}

// The markers as data attributes too, so a test (or a screen reader) can find them.
function markersAttribute(markers) {
  return JSON.stringify((markers || []).map((marker) => [marker.kind, marker.step, marker.label]));
}

// `values` (by step, sorted) read at `steps`, linearly between its drawn points (null outside them).
function readAt(series, steps) {
  let index = 0;
  return steps.map((step) => {
    while (index + 1 < series.x.length && series.x[index + 1] < step) index += 1;
    const x0 = series.x[index], x1 = series.x[index + 1];
    if (x0 === step) return series.y[index];
    if (x1 === step) return series.y[index + 1];
    if (x0 === undefined || x1 === undefined || step < x0 || step > x1) return null;
    return series.y[index] + ((step - x0) / (x1 - x0)) * (series.y[index + 1] - series.y[index]);
  });
}

class MetricsView {
  constructor(container) {
    this.container = container;
    this.charts = [];
    this.options = { x: null, logX: false, logY: false, search: "" };
    this.data = null;
    this.plots = h("div", { class: "plots" });
    this.count = h("span", { class: "muted", "data-testid": "metric-count" });
  }

  update(metrics) {
    const changed = !this.data || metrics.rows !== this.data.rows || metrics.steps !== this.data.steps;
    this.data = metrics;
    if (changed) this.render();
  }

  render() {
    const metrics = this.data;
    if (!metrics.exists || !metrics.rows) {
      this.destroyCharts();
      this.container.replaceChildren(h("div", { class: "empty" }, "No metrics.jsonl rows yet."));
      return;
    }
    const x = this.xKey();
    const controls = h("div", { class: "toolbar" },
      h("input", { type: "search", placeholder: `search ${metrics.keys.length} keys`, value: this.options.search,
        "data-testid": "metric-search", oninput: (event) => { this.options.search = event.target.value; this.drawPlots(); } }),
      h("label", {}, "x axis ", h("select", { "data-testid": "metric-x", onchange: (event) => { this.options.x = event.target.value; this.drawPlots(); } },
        [metrics.x, ...metrics.keys].map((key) => h("option", { value: key, selected: key === x }, key)))),
      h("label", {}, h("input", { type: "checkbox", checked: this.options.logX,
        onchange: (event) => { this.options.logX = event.target.checked; this.drawPlots(); } }), " log x"),
      h("label", {}, h("input", { type: "checkbox", checked: this.options.logY,
        onchange: (event) => { this.options.logY = event.target.checked; this.drawPlots(); } }), " log y"),
      h("span", { class: "muted" }, `${fmtNum(metrics.rows)} lines, ${fmtNum(metrics.steps)} ${metrics.x}s`
        + (metrics.thinned ? ` (long series: each of ${metrics.buckets} buckets keeps its min and max, and every alert)` : "")),
      this.count);
    this.container.replaceChildren(controls, this.plots, this.table(metrics));
    this.drawPlots();
  }

  xKey() {
    const metrics = this.data;
    return this.options.x && (this.options.x === metrics.x || metrics.keys.includes(this.options.x)) ? this.options.x : metrics.x;
  }

  destroyCharts() {
    for (const chart of this.charts) chart.destroy();
    this.charts = [];
  }

  drawPlots() {
    const metrics = this.data, x = this.xKey();
    this.destroyCharts();
    const needle = this.options.search.trim().toLowerCase();
    const matching = metrics.keys.filter((key) => key !== x && key.toLowerCase().includes(needle));
    const shown = matching.slice(0, MAX_GRID_CHARTS);
    this.count.textContent = `${matching.length} of ${metrics.keys.length} keys` + (matching.length > shown.length ? `, the first ${shown.length} drawn: type to narrow` : "");
    this.plots.replaceChildren();
    shown.forEach((key, number) => this.chart(key, x, number));
  }

  chart(key, x, number) {
    const series = this.data.series[key];
    const xs = x === this.data.x ? series.x : readAt(this.data.series[x], series.x);
    const order = xs.map((_, index) => index).filter((index) => xs[index] !== null).sort((a, b) => xs[a] - xs[b]);
    const markers = x === this.data.x ? [...series.nonfinite.map(([step, value]) => ({ step, kind: "nonfinite", label: value })),
      ...series.alerts.map(([step, rule]) => ({ step, kind: "alert", label: rule }))] : [];
    const bad = series.nonfinite.length ? h("span", { class: "warn-inline", "data-testid": "nonfinite" }, ` ${series.nonfinite.length} non-finite (last: ${series.nonfinite[series.nonfinite.length - 1][1]} at step ${series.nonfinite[series.nonfinite.length - 1][0]})`) : "";
    const box = h("div", { class: "plot", "data-metric": key, "data-markers": markersAttribute(markers), "data-points": order.length }, h("h3", {}, key, bad));
    this.plots.append(box);  // in the grid first, so that its width is the grid column's
    const width = Math.max(320, Math.floor(box.getBoundingClientRect().width) || 420);
    this.charts.push(new uPlot({
      width, height: 220,
      scales: { x: { time: false, distr: this.options.logX ? 3 : 1 }, y: { distr: this.options.logY ? 3 : 1 } },
      axes: [{ label: x, size: 36 }, { size: 64, values: tickLabels }],
      legend: { show: true },
      series: [{ label: x }, { label: key, stroke: PLOT_COLOURS[number % PLOT_COLOURS.length], width: 1.6, spanGaps: true,
        points: { show: order.length < 60 } }],
      hooks: { draw: [markerHook(markers)] },
    }, [order.map((index) => xs[index]), order.map((index) => series.y[index])], box));
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
