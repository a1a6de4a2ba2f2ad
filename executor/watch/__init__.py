"""watch/: what people see of a prefix: the live dashboard, the training views and alert rules, the public site.

May import store/, dag/, shards/, run/ (and errors, retry); only cli/ imports it. Its rooms: this folder holds
the generic views (any step of any DAG), `training/` the views and alert rules that know the training steps' files
and metric names, `site/` the static public site built from both.

A live, read-only web dashboard of every experiment and step under a prefix.

    python -m executor dashboard --prefix outputs            # http://127.0.0.1:8765/
    python -m executor dashboard --prefix gs://bucket/runs --port 9000

It reads only what the executor writes (experiment files, `.executor_info`, `.executor_status`,
`.executor_progress`, `stats.json`, `metrics.jsonl`, `logs/step.log`, the step's outputs) through
the same fsspec layer as the executor, so a local folder, `gs://` and `s3://` all work, and it
never writes. Modules, by concern:

    safety.py            every request path stays inside the prefix
    experiment_index.py  experiment files, parsed once per change
    step_cache.py        batched, cached reads of step state / progress / stats (finished steps cached)
    experiment_view.py   an experiment page: counts, the filtered/sorted/paginated step table, the (grouped) DAG graph
    step_view.py         one step: history, config with versioned fields, explain diff, drift, rerun command
    files.py             file listings, previews (JSONL / JSON / Parquet / text), log tail, metrics lines
    metrics_view.py      the metrics grid: every key a joined series of its own
    series.py            which points a long series draws: each bucket's min and max, every alert, NaN listed
    incidents.py         a run's and an experiment's incident timeline, and goodput
    app.py               routes -> JSON / page shells / packaged static assets (no HTTP here)
    server.py            stdlib ThreadingHTTPServer: GET/HEAD only, loopback by default, strict CSP
    training/            the views a step's training outputs call for (run, ladder, composition) and the
                         alert rules (training/__init__.py lists them)
    site/                the static public site: its files, metrics lines, alerts, changes, and what it may
                         show (site/__init__.py lists them)

The browser side is plain JavaScript in static/ (panels.js and composition.js draw the views), with
two vendored libraries (no CDN): dagre lays the DAG out left to right and uPlot draws metric curves.
Pages poll the API every two seconds while anything runs, so they update without a reload.
"""
