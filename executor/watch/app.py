"""The dashboard's routes: HTML page shells, static assets and the read-only JSON API.

`DashboardApp.handle(path, query)` maps a GET request to a `Response`; it knows nothing of HTTP
sockets (see server.py), so tests and the benchmark can call it directly. Pages are static shells
drawn by the package's JavaScript from the API, which they poll while steps run:

    /                               experiments under the prefix, newest first
    /experiment/<file>              DAG graph + step table of one experiment file
    /step/<relative output path>    one step: history, config, explain, files, log, metrics

    /api/experiments                         [summary with counts]
    /api/experiment?file=F                   summary, counts, shard progress of running steps
    /api/experiment/graph?file=F             nodes + edges (grouped beyond 300 steps)
    /api/experiment/steps?file=F&status=FAILED,RUNNING&name=tok&sort=duration&desc=1&offset=0&limit=50
    /api/step?path=R[&experiment=F]          everything on the step page
    /api/step/live?path=R                    status history and progress (polled)
    /api/step/files?path=R[&dir=D]           a folder of the step's outputs
    /api/step/preview?path=R&file=F          first rows / bytes of one file
    /api/step/log?path=R                     the tail of logs/step.log
    /api/step/metrics?path=R[&file=metrics.jsonl]
    /api/step/views?path=R                   which of the views below the step's outputs call for
    /api/step/run?path=R                     run view: loss with the predicted curve, norms, load, throughput
    /api/step/ladder?path=R[&experiment=F]   ladder view: rungs, fit, prediction, achieved loss downstream
    /api/step/composition?path=R             composition view: topic x quality cells, weights per phase

Experiment files are looked up by name in the index, never opened by a path from the request;
step and file paths go through `safety.resolve_under`, so nothing outside the prefix is readable.

A RUNNING run that has gone quiet is *stalled* on every answer that shows it (the step's live answer, its row,
its experiment's count and the list's), by the rule the publisher's alerts apply (training/live_stalls.py), so
the dashboard says so with no publisher running; the publisher turns this off and puts its own in.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import math
import mimetypes
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.store import storage
from executor.store.events import read_many_events
from executor.store.experiments import Experiment
from executor.store.layout import INFO_FILE, LOG_FILE, METRICS_FILE
from executor.store.step_rows import StepState
from executor.watch import files
from executor.watch.experiment_index import ExperimentIndex
from executor.watch.experiment_view import SORT_KEYS, StepQuery, experiment_summary, graph, shard_totals, steps_page
from executor.watch.incidents import code_now, experiment_incidents
from executor.watch.metrics_view import metrics_grid
from executor.watch.safety import UnsafePathError, check_relative, resolve_under
from executor.watch.step_cache import StatusCache, json_or_none
from executor.watch.step_view import StepNotFoundError, live_state, step_detail
from executor.watch.training.alerts import read_alerts
from executor.watch.training.composition_view import composition_view
from executor.watch.training.ladder_view import ladder_view
from executor.watch.training.live_stalls import LiveStalls
from executor.watch.training.panels import PanelError, available
from executor.watch.training.run_view import run_view

logger = logging.getLogger(__name__)

MAX_RUNNING_FOR_TOTALS = 2000


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def json_response(value: Any, status: int = 200) -> Response:
    try:
        body = json.dumps(value, default=str, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN or inf in a config or stats file: JSON has no such numbers
        body = json.dumps(_finite(value), default=str, separators=(",", ":"))
    return Response(status, body.encode(), headers={"Cache-Control": "no-store"})


def load_static() -> dict[str, bytes]:
    """Every file the package ships under static/, by relative path (the only files ever served as assets)."""
    assets: dict[str, bytes] = {}
    root = importlib.resources.files("executor.watch") / "static"

    def walk(folder: Any, relative: str) -> None:
        for entry in folder.iterdir():
            name = f"{relative}{entry.name}"
            if entry.is_dir():
                walk(entry, name + "/")
            else:
                assets[name] = entry.read_bytes()

    walk(root, "")
    return assets


def read_infos(output_paths: list[str]) -> list[dict[str, Any] | None]:
    """Many steps' `.executor_info`s, read in parallel (None for one missing or unreadable)."""
    return [json_or_none(blob) for blob in storage.read_many(storage.join(path, INFO_FILE) for path in output_paths)]


def _param(query: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = query.get(name, default)
    if value is None:
        raise HTTPError(400, f"missing query parameter {name!r}")
    return value


def _int_param(query: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(query.get(name, default))
    except ValueError as error:
        raise HTTPError(400, f"{name} must be an integer") from error


class DashboardApp:
    def __init__(
        self, prefix: str, *, live_ttl_s: float = 1.0, finished_ttl_s: float = 300.0, stalls: LiveStalls | None = None
    ):
        self.prefix = storage.make_absolute(prefix)
        self.stalls = stalls
        """Which RUNNING runs are stalled (module docstring); None: none is said to be (the publisher's own)."""
        self.cache = StatusCache(live_ttl_s=live_ttl_s, finished_ttl_s=finished_ttl_s)
        self.experiments = ExperimentIndex(self.prefix, list_ttl_s=min(2.0, max(live_ttl_s, 0.1)))
        self.assets = load_static()
        self._resume_lines: dict[str, list[dict[str, Any]]] = {}
        """The steps and times of finished restarted steps' metrics lines (their resumes, on the experiment's
        timeline): a finished step's lines do not change."""
        self.routes: dict[str, Callable[[Mapping[str, str]], Response]] = {
            "/api/experiments": self.api_experiments,
            "/api/experiment": self.api_experiment,
            "/api/experiment/graph": self.api_graph,
            "/api/experiment/steps": self.api_steps,
            "/api/experiment/incidents": self.api_experiment_incidents,
            "/api/step": self.api_step,
            "/api/step/live": self.api_step_live,
            "/api/step/files": self.api_step_files,
            "/api/step/preview": self.api_step_preview,
            "/api/step/log": self.api_step_log,
            "/api/step/metrics": self.api_step_metrics,
            "/api/step/views": self.api_step_views,
            "/api/step/run": self.api_step_run,
            "/api/step/ladder": self.api_step_ladder,
            "/api/step/composition": self.api_step_composition,
        }

    def handle(self, path: str, query: Mapping[str, str]) -> Response:
        """Answer one GET. `path` is already percent-decoded; `query` holds single values."""
        try:
            if path in self.routes:
                return self.routes[path](query)
            return self.page_or_asset(path)
        except HTTPError as error:
            return json_response({"error": str(error)}, error.status)
        except PanelError as error:  # a step's file is not what its view needs: say which, not a traceback
            return json_response({"error": str(error)}, 422)
        except (UnsafePathError, ValueError, IsADirectoryError, NotADirectoryError) as error:
            return json_response({"error": str(error)}, 400)
        except (FileNotFoundError, StepNotFoundError) as error:
            return json_response({"error": str(error)}, 404)

    def page_or_asset(self, path: str) -> Response:
        if path == "/" or path.startswith(("/experiment/", "/step/")):
            if path != "/":
                check_relative(path.split("/", 2)[2])
            return Response(200, self.assets["page.html"], "text/html; charset=utf-8", {"Cache-Control": "no-cache"})
        if path.startswith("/static/") and path[len("/static/") :] in self.assets:
            name = path[len("/static/") :]
            content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
            if content_type.startswith("text/") or content_type.endswith("javascript"):
                content_type += "; charset=utf-8"
            return Response(200, self.assets[name], content_type, {"Cache-Control": "public, max-age=300"})
        raise HTTPError(404, f"no page at {path!r}")

    # --- experiments -----------------------------------------------------------------------

    def _experiment(self, query: Mapping[str, str]) -> Experiment:
        file = _param(query, "file")
        experiment = self.experiments.get(file)
        if experiment is None:
            raise HTTPError(404, f"no experiment file {file!r} under {self.prefix}/experiments")
        return experiment

    def stall_of(self, output_path: str, status: str | None, started: str | None) -> dict[str, Any] | None:
        """The step's stall now, if it is RUNNING (since `started`) and stalled (training/live_stalls.py)."""
        if self.stalls is None or status != "RUNNING":
            return None
        return self.stalls.stalled(output_path, started)

    def _summary(self, experiment: Experiment, states: Sequence[StepState]) -> dict[str, Any]:
        """The experiment's summary, with how many of its runs are stalled."""
        pairs = zip(experiment.output_paths, states, strict=True)
        stalled = sum(self.stall_of(path, state.status, state.started) is not None for path, state in pairs)
        return {**experiment_summary(experiment, states), "stalled": stalled}

    def api_experiments(self, _query: Mapping[str, str]) -> Response:
        summaries = []
        for experiment in self.experiments.all():
            summaries.append(self._summary(experiment, self.cache.states(experiment.output_paths)))
        return json_response({"prefix": self.prefix, "experiments": summaries})

    def api_experiment(self, query: Mapping[str, str]) -> Response:
        experiment = self._experiment(query)
        states = self.cache.states(experiment.output_paths)
        running = [
            (step, state) for step, state in zip(experiment.steps, states, strict=True) if state.status == "RUNNING"
        ][:MAX_RUNNING_FOR_TOTALS]
        extras = self.cache.extras([step.output_path for step, _ in running], [state for _, state in running])
        return json_response(
            {"prefix": self.prefix, **self._summary(experiment, states), "running_shards": shard_totals(extras)}
        )

    def api_experiment_incidents(self, query: Mapping[str, str]) -> Response:
        experiment = self._experiment(query)
        states = self.cache.states(experiment.output_paths)
        finished = {path for path, state in zip(experiment.output_paths, states, strict=True)
                    if state.status in ("SUCCESS", "FAILED")}  # fmt: skip

        def lines_of(paths: list[str]) -> list[list[dict[str, Any]]]:
            found = []
            for path in paths:
                lines = self._resume_lines.get(path)
                if lines is None:
                    records = files.metrics_records(storage.join(path, METRICS_FILE)) or []
                    lines = [{"step": line.get("step"), "time": line.get("time")} for line in records]
                    if path in finished:
                        self._resume_lines[path] = lines
                found.append(lines)
            return found

        return json_response(experiment_incidents(experiment, states, read_many_events, read_infos, lines_of))

    def api_graph(self, query: Mapping[str, str]) -> Response:
        experiment = self._experiment(query)
        return json_response(graph(experiment, self.cache.states(experiment.output_paths)))

    def api_steps(self, query: Mapping[str, str]) -> Response:
        experiment = self._experiment(query)
        sort = query.get("sort", "order")
        if sort not in SORT_KEYS:
            raise HTTPError(400, f"sort must be one of {', '.join(SORT_KEYS)}")
        statuses = frozenset(status for status in query.get("status", "").split(",") if status)
        step_query = StepQuery(
            statuses=statuses,
            name=query.get("name", ""),
            name_prefix=query.get("prefix", ""),
            sort=sort,
            descending=query.get("desc", "0") in ("1", "true"),
            offset=_int_param(query, "offset", 0),
            limit=_int_param(query, "limit", 50),
        )
        page = steps_page(experiment, self.cache, step_query)
        for row in page["rows"]:
            output_path = experiment.by_relative[row["path"]].output_path
            row["stalled"] = None if row["holder_lost"] else self.stall_of(output_path, row["status"], row["started"])
        return json_response(page)

    # --- one step ----------------------------------------------------------------------------

    def _step_path(self, query: Mapping[str, str], *sub: str) -> str:
        relative = _param(query, "path")
        for part in sub:
            check_relative(part)
        return resolve_under(self.prefix, "/".join((relative, *sub)))

    def _step_experiment(self, query: Mapping[str, str]) -> tuple[str, Experiment | None]:
        """The step's relative path and its experiment: the one named, else the newest holding the step."""
        relative = "/".join(check_relative(_param(query, "path")))
        experiment = self.experiments.get(query["experiment"]) if query.get("experiment") else None
        return relative, experiment or self.experiments.containing(relative)

    def _with_stall(self, output_path: str, live: dict[str, Any]) -> dict[str, Any]:
        """A step's live answer with its stall (None unless RUNNING with a live holder, and stalled)."""
        lost = live.get("holder_lost")
        live["stalled"] = None if lost else self.stall_of(output_path, live["status"], live.get("started"))
        return live

    def api_step(self, query: Mapping[str, str]) -> Response:
        relative, experiment = self._step_experiment(query)
        output_path = self._step_path(query)
        detail = step_detail(self.prefix, relative, output_path, experiment)
        self._with_stall(output_path, detail["live"])
        return json_response(detail)

    def api_step_live(self, query: Mapping[str, str]) -> Response:
        """404, as `/api/step` answers, for a path that holds no step (no status and no `.executor_info`)."""
        output_path = self._step_path(query)
        live = live_state(output_path)
        if (
            not live["events"]
            and live["status"] != "CORRUPT"
            and not storage.exists(storage.join(output_path, INFO_FILE))
        ):
            raise StepNotFoundError(
                f"{_param(query, 'path')!r} is not a step output under {self.prefix} (no {INFO_FILE})"
            )
        return json_response(self._with_stall(output_path, live))

    def api_step_files(self, query: Mapping[str, str]) -> Response:
        folder = query.get("dir", "")
        return json_response(files.list_folder(self._step_path(query, folder) if folder else self._step_path(query)))

    def api_step_preview(self, query: Mapping[str, str]) -> Response:
        return json_response(files.preview(self._step_path(query, _param(query, "file"))))

    def api_step_log(self, query: Mapping[str, str]) -> Response:
        return json_response(files.log_tail(self._step_path(query, LOG_FILE)))

    def api_step_metrics(self, query: Mapping[str, str]) -> Response:
        records = files.metrics_records(self._step_path(query, query.get("file", METRICS_FILE)))
        return json_response(metrics_grid(records, read_alerts(self._step_path(query))))

    def api_step_views(self, query: Mapping[str, str]) -> Response:
        return json_response({"views": available(self._step_path(query))})

    def api_step_run(self, query: Mapping[str, str]) -> Response:
        relative, experiment = self._step_experiment(query)
        return json_response(run_view(self.prefix, self._step_path(query), now=code_now(experiment, relative)))

    def api_step_ladder(self, query: Mapping[str, str]) -> Response:
        relative, experiment = self._step_experiment(query)
        return json_response(ladder_view(self.prefix, self._step_path(query), relative, experiment))

    def api_step_composition(self, query: Mapping[str, str]) -> Response:
        return json_response(composition_view(self.prefix, self._step_path(query)))
