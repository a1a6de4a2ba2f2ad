"""A live, read-only web dashboard of every experiment and step under a prefix.

    python -m executor dashboard --prefix outputs            # http://127.0.0.1:8765/
    python -m executor dashboard --prefix gs://bucket/runs --port 9000

It reads only what the executor writes (experiment files, `.executor_info`, `.executor_status`,
`.executor_progress`, `stats.json`, `metrics.jsonl`, `logs/step.log`, the step's outputs) through
the same fsspec layer as the executor, so a local folder, `gs://` and `s3://` all work, and it
never writes. Modules, by concern:

    safety.py       every request path stays inside the prefix
    experiments.py  experiment files, parsed once per change
    cache.py        batched, cached reads of step status / progress / stats (finished steps cached)
    views.py        counts, the filtered/sorted/paginated step table, the (grouped) DAG graph
    step_view.py    one step: history, config with versioned fields, explain diff, drift, rerun command
    files.py        file listings, previews (JSONL / JSON / Parquet / text), log tail, metrics lines
    panels.py       views picked by a step's outputs, and the helpers they share
    run_view.py     the run view: the one place that decides what a run's charts draw (site and dashboard)
    metrics_view.py the metrics grid: every key a joined series of its own
    series.py       which points a long series draws: each bucket's min and max, every alert, NaN listed
    incidents.py    a run's and an experiment's incident timeline, and goodput
    ladder_view.py  the ladder view of prediction.json: rungs, fit, prediction, achieved loss, runs compared
    composition_view.py  the composition view: topic x quality cells, weights per phase, samples
    app.py          routes -> JSON / page shells / packaged static assets (no HTTP here)
    server.py       stdlib ThreadingHTTPServer: GET/HEAD only, loopback by default, strict CSP
    publish.py      the static public site (site_*.py: its files, metrics lines, alerts, changes;
                    redaction.py: what it may show)

The browser side is plain JavaScript in static/ (panels.js and composition.js draw the views), with
two vendored libraries (no CDN): dagre lays the DAG out left to right and uPlot draws metric curves.
Pages poll the API every two seconds while anything runs, so they update without a reload.
"""

from executor.dashboard.app import DashboardApp
from executor.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, make_server, serve, serve_in_thread

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DashboardApp", "make_server", "serve", "serve_in_thread"]
