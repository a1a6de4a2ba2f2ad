// The published site's run view and metrics, built in the page from the run's published lines
// (executor/dashboard/site_metrics.py): sealed segments and open chunks listed by metrics/index.json. A page
// keeps what it fetched, so each poll fetches the index and the chunks it has not seen, and a new line never
// makes the publisher rewrite a view. What is built here is what the dashboard's /api/step/run and
// /api/step/metrics answer (panels.py run_view, files.py metrics), so the panels draw it unchanged.
"use strict";

const SITE_LINES = new Map();  // step path -> { epoch, files: Map(name -> records), pending }

async function siteText(file) {
  const response = await fetch(siteFile(file), { cache: "no-cache" });
  if (!response.ok) throw new Error(`${file}: not published (${response.status})`);
  return response.text();
}

function parseLines(text) {
  const records = [];
  for (const line of text.split("\n")) {
    if (!line) continue;
    try {
      const record = JSON.parse(line);
      if (record && typeof record === "object" && !Array.isArray(record)) records.push(record);
    } catch (error) { /* a line that is not JSON is left out, as the publisher leaves it out */ }
  }
  return records;
}

function lineFiles(index) {
  const names = [];
  for (let number = 0; number < index.segments; number += 1) names.push(`s${index.epoch}-${String(number).padStart(5, "0")}.jsonl`);
  for (let number = index.first_chunk; number < index.next_chunk; number += 1) names.push(`c${index.epoch}-${String(number).padStart(8, "0")}.jsonl`);
  return names;
}

// The step's published lines in order, and their index (null when the step has no metrics); a chunk folded
// into a segment between reading the index and the chunk is found by reading the index again, once.
async function siteLines(step, retried) {
  let index;
  try { index = await siteJson(`step/${step}/metrics/index.json`); } catch (error) { return { index: null, records: [] }; }
  let cache = SITE_LINES.get(step);
  if (!cache || cache.epoch !== index.epoch) {
    cache = { epoch: index.epoch, files: new Map() };
    SITE_LINES.set(step, cache);
  }
  const names = lineFiles(index);
  try {
    await Promise.all(names.filter((name) => !cache.files.has(name)).map(async (name) => {
      cache.files.set(name, parseLines(await siteText(`step/${step}/metrics/${name}`)));
    }));
  } catch (error) {
    if (retried) throw error;
    return siteLines(step, true);
  }
  const wanted = new Set(names);
  for (const name of [...cache.files.keys()]) if (!wanted.has(name)) cache.files.delete(name);
  return { index, records: names.flatMap((name) => cache.files.get(name)) };
}

function finiteNumber(value) {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function rowsByStep(records) {
  const rows = new Map();
  for (const record of records) {
    if (!Number.isInteger(record.step)) continue;
    rows.set(record.step, Object.assign(rows.get(record.step) || {}, record));
  }
  return new Map([...rows.entries()].sort((a, b) => a[0] - b[0]));
}

function seriesOf(rows, key) {
  const points = new Map();
  for (const [step, row] of rows) {
    const value = finiteNumber(row[key]);
    if (value !== null) points.set(step, value);
  }
  return points;
}

function evalComponents(rows) {
  const keys = new Set();
  for (const row of rows.values()) for (const key of Object.keys(row)) keys.add(key);
  return [...keys].filter((key) => key.startsWith("eval/") && key.endsWith("/loss") && key.split("/").length === 3)
    .map((key) => key.slice(5, -5)).sort();
}

function macroEval(row, components) {
  const macro = finiteNumber(row["eval/macro_loss"]);
  if (macro !== null) return macro;
  const losses = components.map((component) => finiteNumber(row[`eval/${component}/loss`]));
  if (components.length && losses.every((loss) => loss !== null)) return losses.reduce((a, b) => a + b, 0) / losses.length;
  return components.length ? null : finiteNumber(row["eval/loss"]);
}

// Series ({label, kind, points: Map(x -> y)}) aligned on one sorted x axis, as panels.py's chart().
function alignedChart(id, title, series) {
  const xs = [...new Set(series.flatMap((entry) => [...entry.points.keys()]))].sort((a, b) => a - b);
  return { id, title, x: xs, x_label: "step",
    series: series.map((entry) => ({ label: entry.label, kind: entry.kind, values: xs.map((x) => (entry.points.has(x) ? entry.points.get(x) : null)) })) };
}

function lossChart(layout, train, evals, evalLabel, run) {
  const series = [{ label: layout.train, kind: "line", points: train }, { label: evalLabel, kind: "points", points: evals }];
  if (run.parent.length) series.push({ label: `parent ${layout.train}`, kind: "line", points: new Map(run.parent) });
  const bands = [["predicted", "dashed", "loss"], ["predicted low", "band_low", "low"], ["predicted high", "band_high", "high"]];
  for (const [label, kind, key] of run.curve.length ? bands : []) {
    series.push({ label, kind, points: new Map(run.curve.map((point) => [point.step, point[key]])) });
  }
  return alignedChart("loss", "loss", series);
}

// /api/step/run on the site: run.json's fixed parts, the charts from the lines (panels.py run_view).
async function siteRunView(step) {
  const [run, { records }] = await Promise.all([siteJson(`step/${step}/run.json`), siteLines(step)]);
  const layout = run.layout;
  const rows = rowsByStep(records);
  const train = seriesOf(rows, layout.train);
  if (!train.size) throw new Error(`the run's metrics have no ${layout.train} rows (yet): no run to show`);
  const steps = [...rows.keys()];
  const stride = Math.max(1, Math.ceil(rows.size / layout.max_points));
  const kept = new Set(steps.filter((_, index) => index % stride === 0).concat([steps[steps.length - 1]]));
  const thinned = new Map([...rows].filter(([stepNumber]) => kept.has(stepNumber)));
  const components = evalComponents(rows);
  const evals = new Map();
  for (const [stepNumber, row] of rows) {
    const loss = macroEval(row, components);
    if (loss !== null) evals.set(stepNumber, loss);
  }
  const trainKept = new Map([...train].filter(([stepNumber]) => kept.has(stepNumber)));
  const charts = [lossChart(layout, trainKept, evals, components.length ? "eval (macro)" : "eval/loss", run)];
  for (const [id, title, keys] of layout.charts) {
    const series = keys.map((key) => ({ label: key, kind: "line", points: seriesOf(thinned, key) }));
    if (series.some((entry) => entry.points.size)) charts.push(alignedChart(id, title, series));
  }
  const perDomain = components.map((component) => ({ label: component, kind: "points", points: seriesOf(rows, `eval/${component}/loss`) }));
  if (perDomain.length) charts.push(alignedChart("eval_domains", "eval loss per domain", perDomain));
  const lastStep = Math.max(...train.keys());
  const lastEval = evals.size ? evals.get(Math.max(...evals.keys())) : null;
  return { steps: rows.size, last_step: lastStep, last_train_loss: train.get(lastStep), last_eval: lastEval, components,
    prediction: run.prediction, prediction_error: run.prediction_error, thinned: stride > 1, alerts: run.alerts,
    lineage: run.lineage, charts };
}

// /api/step/metrics on the site: every numeric column of the lines, thinned (files.py metrics).
async function siteMetrics(step) {
  const { index, records } = await siteLines(step);
  if (!index) return { exists: false, keys: [], rows: 0 };
  const numeric = new Set(), text = new Set();
  for (const record of records) {
    for (const [key, value] of Object.entries(record)) {
      if (finiteNumber(value) !== null) numeric.add(key);
      else if (typeof value === "string" && !["nan", "inf", "-inf"].includes(value)) text.add(key);  // not a number the publisher spelled out
    }
  }
  const keys = [...numeric].sort(), textKeys = [...text].sort().slice(0, 3);
  const stride = Math.max(1, Math.ceil(records.length / index.max_points));
  const kept = records.filter((_, number) => number % stride === 0);
  if (records.length && kept[kept.length - 1] !== records[records.length - 1]) kept.push(records[records.length - 1]);
  return { exists: true, rows: records.length, keys, x: numeric.has("step") ? "step" : null,
    columns: Object.fromEntries(keys.map((key) => [key, kept.map((record) => finiteNumber(record[key]))])),
    labels: Object.fromEntries(textKeys.map((key) => [key, kept.map((record) => record[key] ?? null)])),
    last: records.slice(-index.last_rows), thinned: stride > 1 };
}
