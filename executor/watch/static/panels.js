// Views of the step page chosen by what the step's outputs hold (executor/watch/training/panels.py): the run view
// (training curves, the ladder's predicted loss overlaid), the ladder view (loss vs compute: rungs, fit,
// prediction, achieved) and the composition view (composition.js). The server aligns each chart's series on
// one x axis, so drawing is one function here.
"use strict";

const BAND_FILL = "rgba(214, 69, 69, 0.13)";
const PREDICTED = "#d64545";
const SERIES_COLOURS = ["#2f6fdf", "#c98a0c", "#1f9d55", "#8b5cf6", "#0e9aa7", "#e07b39", "#5b6472"];  // no red

function seriesOptions(series, number) {
  const predicted = series.kind.startsWith("band_") || series.kind === "dashed" || series.label === "prediction";
  const colour = predicted ? PREDICTED : series.label === "achieved" ? "#1f9d55" : SERIES_COLOURS[number % SERIES_COLOURS.length];
  const shown = series.values.filter((value) => value !== null).length;
  const base = { label: series.label, stroke: colour, width: 1.6, spanGaps: true };
  if (series.kind === "points" || shown < 2) {
    return { ...base, width: 0, paths: () => null, points: { show: true, size: 8, fill: colour, stroke: colour } };
  }
  if (series.kind === "dashed") return { ...base, dash: [7, 4], points: { show: false } };
  if (series.kind.startsWith("band_")) return { ...base, width: 1, dash: [2, 3], points: { show: false } };
  return { ...base, points: { show: shown < 60 } };
}

// A vertical bar between a band's low and high where the band is a single point (the ladder's prediction).
function errorBarHook(spec) {
  const low = spec.series.findIndex((series) => series.kind === "band_low");
  const high = spec.series.findIndex((series) => series.kind === "band_high");
  return (chart) => {
    if (low < 0 || high < 0) return;
    const ctx = chart.ctx;
    ctx.save();
    ctx.strokeStyle = PREDICTED;
    ctx.lineWidth = 2 * devicePixelRatio;
    spec.x.forEach((x, index) => {
      const bottom = spec.series[low].values[index], top = spec.series[high].values[index];
      if (bottom === null || top === null) return;
      const left = chart.valToPos(x, "x", true);
      ctx.beginPath();
      ctx.moveTo(left, chart.valToPos(bottom, "y", true));
      ctx.lineTo(left, chart.valToPos(top, "y", true));
      ctx.stroke();
    });
    ctx.restore();
  };
}

// One chart of a server-aligned spec {id, title, x, x_label, log_x, series: [{label, kind, values}]} in `box`.
function drawChart(box, spec, options) {
  const counts = Object.fromEntries(spec.series.map((series) => [series.label, series.values.filter((v) => v !== null).length]));
  box.dataset.points = JSON.stringify(counts);
  box.dataset.last = JSON.stringify(Object.fromEntries(spec.series.map((series) => {
    const index = series.values.findLastIndex((value) => value !== null);
    return [series.label, index < 0 ? null : [spec.x[index], series.values[index]]];
  })));
  box.dataset.markers = markersAttribute(spec.markers);
  const low = spec.series.findIndex((series) => series.kind === "band_low");
  const high = spec.series.findIndex((series) => series.kind === "band_high");
  const width = Math.max(320, Math.floor(box.getBoundingClientRect().width) || 420);
  return new uPlot({
    width, height: (options && options.height) || 230,
    scales: { x: { time: false, distr: spec.log_x ? 3 : 1 } },
    axes: [{ label: spec.x_label || "", size: 38, values: spec.log_x ? (_, ticks) => ticks.map((tick) => (tick === null ? "" : tick.toExponential(0))) : undefined },
      { size: 64, values: tickLabels }],
    legend: { show: true },
    series: [{ label: spec.x_label || "x" }, ...spec.series.map(seriesOptions)],
    bands: low >= 0 && high >= 0 ? [{ series: [high + 1, low + 1], fill: BAND_FILL }] : [],
    hooks: { draw: [errorBarHook(spec), markerHook(spec.markers)] },
  }, [spec.x, ...spec.series.map((series) => series.values)], box);
}

// A panel of the step page that redraws its charts when `refresh` brings new data.
class ChartPanel {
  constructor(endpoint, testid) {
    this.endpoint = endpoint;
    this.element = h("div", { "data-testid": testid });
    this.charts = [];
    this.signature = null;
  }

  async refresh(path, experiment) {
    const data = await api(this.endpoint, { path, experiment });
    const signature = JSON.stringify(data);
    if (signature === this.signature) return;
    this.signature = signature;
    for (const chart of this.charts) chart.destroy();
    this.charts = [];
    this.render(data);
  }

  showError(error) {
    this.signature = null;
    this.element.replaceChildren(h("div", { class: "error", "data-testid": "view-error" }, String(error.message || error)));
  }

  chartBoxes(specs) {
    const plots = h("div", { class: "plots" });
    const boxes = specs.map((spec) => h("div", { class: "plot", "data-chart": spec.id }, h("h3", {}, spec.title)));
    plots.append(...boxes);
    return [plots, () => specs.forEach((spec, index) => this.charts.push(drawChart(boxes[index], spec)))];
  }
}

class RunPanel extends ChartPanel {
  constructor() { super("/api/step/run", "run-view"); }

  render(data) {
    const [plots, draw] = this.chartBoxes(data.charts);
    const source = data.prediction && data.prediction.source;
    this.element.replaceChildren(
      data.seal_warning ? h("div", { class: "error headline", "data-testid": "seal-warning" }, "⚠ ", data.seal_warning) : "",
      h("div", { class: "meta" }, h("span", {}, "step ", h("b", {}, fmtNum(data.last_step))),
        h("span", {}, "train loss ", h("b", { "data-testid": "last-train-loss" }, fmtNum(data.last_train_loss))),
        data.last_eval ? evalHeader(data.last_eval, Boolean(data.seal_warning)) : "",
        data.components.length ? h("span", {}, "domains ", h("b", {}, data.components.join(", "))) : "",
        source ? h("span", {}, "predicted by ", h("a", { href: stepHref(source), "data-testid": "prediction-link" }, source)) : "",
        data.lineage ? h("span", { "data-testid": "lineage" }, "fork of ", data.lineage.parent ? h("a", { href: stepHref(data.lineage.parent) }, data.lineage.parent) : "a run outside this prefix", ` at step ${data.lineage.step}`) : ""),
      data.prediction_error ? h("div", { class: "warn", "data-testid": "prediction-error" }, data.prediction_error) : "",
      data.sealed ? sealLine(data.sealed) : "",
      ...(data.nonfinite || []).map((bad) => h("div", { class: "error", "data-testid": "nonfinite", "data-key": bad.key },
        `${bad.key} is not finite at ${fmtNum(bad.count)} step(s), from step ${fmtNum(bad.first)} to ${fmtNum(bad.last)} (last: ${bad.value}); marked in red on the charts`)),
      data.thinned ? h("div", { class: "muted" }, `long run: each series keeps the lowest and highest point of each of ${fmtNum(data.buckets)} buckets, and every alert's step`) : "",
      alertList(data.alerts || []),
      plots,
      data.incidents ? incidentTimeline(data.incidents) : "",
      data.mixture ? mixtureLine(data.mixture) : "",
      data.optimizer ? optimizerMask(data.optimizer) : "");
    draw();
  }
}

// The mixture planned against served is one table, the step's Data composition view: here, a line pointing there.
function mixtureLine(mixture) {
  const drifted = mixture.drifted || [];
  return h("div", { class: drifted.length ? "warn" : "muted", "data-testid": "run-mixture" },
    `mixture: ${mixture.phases.length} phase(s) planned against served in the Data composition view below`,
    drifted.length ? `; ${drifted.length} component(s) served more than 20% off plan` : "");
}

// The run's optimizer and its mask (optimizer_groups.json): each group's parameters, then every parameter's group.
function optimizerMask(mask) {
  const counts = Object.entries(mask.parameters).map(([group, count]) => `${group} ${fmtNum(count)}`).join(", ");
  return h("details", { "data-testid": "optimizer-mask", "data-optimizer": mask.optimizer },
    h("summary", {}, "optimizer ", h("b", {}, mask.optimizer), counts ? ` (parameters: ${counts})` : ""),
    kvTable(mask.groups));
}

// "predicted at T, before the first step at T2, digest D": the prediction the run sealed when it started.
function sealLine(seal) {
  const trusted = seal.before_first_step === true && seal.matches !== false && seal.witnessed !== false;
  const order = seal.before_first_step === null ? "" : seal.before_first_step ? ", before the first step at " : ", NOT before the first step at ";
  return h("div", { class: trusted ? "muted" : "warn", "data-testid": "sealed-prediction", "data-before": String(seal.before_first_step),
    "data-matches": String(seal.matches), "data-sha256": seal.sha256 },
    `predicted at ${seal.predicted_at || "?"}${order}${seal.first_step_at || ""}, digest `, h("span", { class: "mono" }, seal.sha256.slice(0, 16)),
    seal.matches === false ? " (prediction.json no longer has this digest: it changed after the run started)" : "",
    seal.witness ? h("span", { "data-testid": "seal-witness", "data-witnessed": String(seal.witnessed) },
      seal.witnessed ? `; witnessed by the publisher at ${seal.witness.witnessed_at} (seal.json)` : `; NOT the seal the publisher witnessed at ${seal.witness.witnessed_at} (digest ${String(seal.witness.sha256).slice(0, 16)})`) : "");
}

// The last eval point of the metric the ladder predicts, and where it sits against the band at its step.
function evalHeader(last, warned) {
  const band = last.band;
  return h("span", { "data-testid": "last-eval", "data-key": last.key, "data-value": last.value, "data-verdict": last.verdict || "" },
    `${last.key} `, h("b", {}, fmtNum(last.value)), ` at step ${fmtNum(last.step)}`,
    band && last.verdict ? h("span", { class: last.verdict === "inside" ? "muted" : "warn-inline" }, ` (${last.verdict} the band [${band.low.toFixed(4)}, ${band.high.toFixed(4)}])`) : "",
    band && warned ? h("span", { class: "warn-inline" }, " (not judged against the band: see the warning above)") : "");
}

// What happened to the run (executor/watch/incidents.py): goodput, then every incident, oldest first.
function incidentTimeline(incidents) {
  const good = incidents.goodput;
  const lost = good ? Object.entries(good.lost_s).filter(([, seconds]) => seconds > 0).map(([cause, seconds]) => `${cause} ${fmtDuration(seconds)}`) : [];
  return h("div", { "data-testid": "incidents" }, h("h3", {}, "incidents"),
    good ? h("div", { class: "meta", "data-testid": "goodput", "data-goodput": good.goodput },
      h("span", {}, "goodput ", h("b", {}, good.goodput === null ? "?" : `${(100 * good.goodput).toFixed(1)}%`), ` of ${fmtDuration(good.wall_s)}`),
      lost.length ? h("span", {}, `lost: ${lost.join(", ")}`) : "") : "",
    h("table", {}, h("tbody", {}, incidents.timeline.map((entry) => h("tr", { "data-kind": entry.kind },
      h("td", { class: "mono" }, entry.time ? new Date(entry.time).toLocaleString("sv-SE") : ""),
      h("td", {}, h("span", { class: `incident ${entry.kind}` }, entry.kind.replace("_", " "))), h("td", {}, entry.text))))));
}

// The run's alerts (executor/watch/training/alerts.py), newest first.
function alertList(alerts) {
  if (!alerts.length) return "";
  return h("div", { class: "error", "data-testid": "alerts" }, h("b", {}, `${alerts.length} alert(s)`),
    h("ul", {}, alerts.slice().reverse().map((alert) => h("li", { "data-rule": alert.rule },
      h("span", { class: "mono" }, alert.rule), ` at step ${alert.step}: ${alert.message}`))));
}

function alertBadge(count) {
  return count ? h("span", { class: "badge FAILED", "data-testid": "alert-badge" }, `${count} alert${count > 1 ? "s" : ""}`) : "";
}

function cellValue(value, digits) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

class LadderPanel extends ChartPanel {
  constructor() {
    super("/api/step/ladder", "ladder-view");
    this.axis = "tokens";  // the overlay's x axis: "tokens" or "flops", kept across refreshes
  }

  // The overlay of rungs and target against tokens or training FLOPs (each run's FLOPs per token from
  // prediction.json: executor/watch/training/ladder_view.py), with the toggle between the two.
  compareChart(data) {
    const flops = this.axis === "flops" && data.compare_flops;
    return flops ? data.compare_flops : data.compare;
  }

  axisToggle(data) {
    if (!data.compare_flops) return "";  // a site published before the FLOPs axis
    const choose = (axis) => {
      if (axis === this.axis) return;
      this.axis = axis;
      for (const chart of this.charts) chart.destroy();
      this.charts = [];
      this.render(this.data);
    };
    const button = (axis, label) => h("button", { type: "button", class: axis === this.axis ? "plain toggle on" : "plain toggle",
      "data-axis": axis, "aria-pressed": String(axis === this.axis), onclick: () => choose(axis) }, label);
    const missing = this.axis === "flops" && data.compare_flops.missing.length
      ? h("span", { class: "muted" }, ` (no FLOPs per token for ${data.compare_flops.missing.join(", ")}: left out)`) : "";
    return h("div", { class: "meta", "data-testid": "compare-axis", "data-axis": this.axis },
      h("span", {}, "overlay x axis "), button("tokens", "tokens"), button("flops", "training FLOPs"), missing);
  }

  render(data) {
    this.data = data;
    const compare = this.compareChart(data);
    const [plots, draw] = this.chartBoxes(compare && compare.series.length ? [data.chart, compare] : [data.chart]);
    plots.querySelector(`[data-chart="${compare && compare.id}"] h3`)?.after(this.axisToggle(data));
    const fit = data.fit, prediction = data.prediction, achieved = data.achieved;
    const rows = data.rungs.map((rung) => h("tr", { "data-rung": rung.name }, h("td", {}, rung.name),
      h("td", { class: "num", "data-col": "compute", "data-value": rung.compute }, rung.compute.toExponential(3)),
      h("td", { class: "num", "data-col": "final_loss", "data-value": rung.final_loss }, cellValue(rung.final_loss, 4)),
      h("td", { class: "num", "data-col": "fitted", "data-value": rung.fitted }, cellValue(rung.fitted, 4)),
      h("td", { class: "num", "data-col": "residual", "data-value": rung.residual }, (rung.residual >= 0 ? "+" : "") + cellValue(rung.residual, 4))));
    const verdict = !achieved ? "" : data.seal_warning ? "(not judged against the band: see the warning above)"
      : achieved.loss >= prediction.low && achieved.loss <= prediction.high ? "inside the band" : "outside the band";
    // The scaling step's flags (asymptote at its bound, a band of zero width) go above the figures they qualify.
    const warnings = (data.warnings || []).map((warning) => h("p", { class: "warn", "data-testid": "fit-warning" }, `warning: ${warning}`));
    this.element.replaceChildren(data.seal_warning ? h("div", { class: "error headline", "data-testid": "seal-warning" }, "⚠ ", data.seal_warning) : "",
      ...warnings,
      h("p", { class: "mono", "data-testid": "law" }, `L(C) = ${fit.asymptote.toPrecision(4)} + ${fit.A.toPrecision(4)} · C^-${fit.alpha.toPrecision(4)}`,
        fit.rms_log_residual !== null && fit.rms_log_residual !== undefined ? h("span", { class: "muted" }, `   rms log residual ${Number(fit.rms_log_residual).toPrecision(3)}`) : ""),
      h("div", { class: "grid2" }, plots, h("div", {},
        h("table", { "data-testid": "rungs" }, h("thead", {}, h("tr", {}, ["rung", "compute (FLOPs)", "final loss", "fit", "residual"].map((name) => h("th", {}, name)))), h("tbody", {}, rows)),
        h("table", { class: "kv", "data-testid": "prediction", style: "margin-top:14px" }, h("tbody", {},
          h("tr", {}, h("td", {}, `target ${data.target.name || ""}`), h("td", { class: "mono" }, prediction.compute.toExponential(3) + " FLOPs")),
          h("tr", {}, h("td", {}, "predicted loss"), h("td", { "data-value": prediction.loss }, `${cellValue(prediction.loss, 4)}  [${cellValue(prediction.low, 4)}, ${cellValue(prediction.high, 4)}]`)),
          h("tr", {}, h("td", {}, "achieved loss"), h("td", { "data-testid": "achieved", "data-value": achieved ? achieved.loss : "" },
            achieved ? [cellValue(achieved.loss, 4), " ", h("span", { class: "muted" }, verdict), " · ",
              achieved.path ? h("a", { href: stepHref(achieved.path) }, achieved.name) : achieved.name]
              : h("span", { class: "muted" }, "not yet: no evaluate step downstream has results.json"))))))));
    draw();
  }
}

// The views of one step page, in a fixed order; each is a section of its own, shown when the outputs call for it.
class StepPanels {
  constructor(path, experiment) {
    this.path = path;
    this.experiment = experiment;
    this.element = h("div", { "data-testid": "views" });
    this.panels = {};
    this.titles = { run: "Run", ladder: "Scaling ladder", composition: "Data composition" };
  }

  async refresh() {
    const { views } = await api("/api/step/views", { path: this.path });
    for (const kind of views) {
      if (this.panels[kind]) continue;
      this.panels[kind] = kind === "run" ? new RunPanel() : kind === "ladder" ? new LadderPanel() : new CompositionPanel();
      const box = section(this.titles[kind], this.panels[kind].element);
      box.dataset.view = kind;
      this.element.append(box);
    }
    await Promise.all(Object.values(this.panels).map((panel) =>
      panel.refresh(this.path, this.experiment).catch((error) => panel.showError(error))));
  }
}
