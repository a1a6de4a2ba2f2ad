"""`python -m executor publish --prefix P --to DEST [--watch SECONDS]`: the dashboard as a static, public site.

The site is the dashboard's own pages and scripts reading JSON files instead of the API: every file under
`data/` is the body of one API answer, made by the same `DashboardApp` the server uses, then redacted
(site_files.py). Nothing runs on the host: a folder, a GCS or S3 bucket behind a static website works.

    index.html, static/...                        the page shell (routes by #/experiment/F, #/step/R) and assets
    data/experiments.json                         /api/experiments, with each experiment's alert count
    data/site.json                                when the site last changed; watching, the heartbeat
    data/experiment/<F>/{summary,graph,steps}.json  one experiment (steps: the whole table; the page filters)
    data/experiment/<F>/incidents.json            its steps' failures, retries and takeovers (watch/incidents.py)
    data/step/<R>/{step,live,views,files}.json    one step (R: its path relative to the prefix)
    data/step/<R>/{run,ladder,composition}.json   the views its outputs call for (run: the dashboard's own
                                                  /api/step/run answer, what both pages draw: training/run_view.py)
    data/step/<R>/metrics.json                    /api/step/metrics: every key's series (metrics_view.py)
    data/step/<R>/alerts.json                     the run's alerts (executor/watch/training/alerts.py), evaluated here
    data/step/<R>/seal.json                       the publisher's witness of the run's sealed prediction, written
                                                  once, when first seen (seal_witness.py)
    data/step/<R>/metrics/index.json, s*, c*      the step's metrics lines, whole, appended (site_metrics.py)

Not published: logs, file previews, the step's outputs themselves; every JSON value written passes through
redaction.py first (secrets, host and user names, pids, URLs and paths outside the prefix: docs/watching.md,
"What is published, exactly"). A cycle makes all its files before it writes one and learns the host and user
names in every one of them first, so a name learned from one file is hidden in all; a name first learned in a
later cycle makes the publisher look at every step again, and republish the metrics lines that hold it. A
publisher's first cycle searches the metrics lines already on the site (an earlier publisher's, which may not
have known a name this one knows) for every name it knows, and sends anew those holding one; the publisher keeps
no record of names anywhere, so a restarted one always checks.

With `--watch` the publisher repeats every SECONDS. A cycle looks again only at the steps whose folders changed
since the last one, and their DAG neighbours (site_changes.py: one listing a step, no file opened when nothing
changed); a file is rewritten only when its bytes change, and a run's metrics lines go out as appended chunks,
so a cycle in which a run logged K lines writes those K lines, a few small files of a fixed size and the run's
two views (run.json, metrics.json: bounded by their buckets, series.py), however long the run (docs/benchmarks.md has
the figures). Watching, each cycle also writes `data/site.json`, the publisher's heartbeat,
from which the pages show a RUNNING step "stale" once the publisher has missed 3 cycles.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from executor.errors import StorageError
from executor.store import storage
from executor.store.experiments import Experiment, ExperimentStep
from executor.store.layout import METRICS_FILE, PREDICTION_SEAL_FILE
from executor.store.lease import holder_lost_note
from executor.watch import files
from executor.watch.app import DashboardApp, load_static
from executor.watch.incidents import code_now
from executor.watch.metrics_view import metrics_grid
from executor.watch.site.alerts import RunAlerts
from executor.watch.site.changes import ChangeTracker
from executor.watch.site.files import PublishError, SiteWriter
from executor.watch.site.metrics import MAX_CHUNKS, SEGMENT_BYTES, MetricsPublisher
from executor.watch.site.redaction import Redactor
from executor.watch.site.seal_witness import SealWitness
from executor.watch.training import alerts
from executor.watch.training.ladder_view import broken_seals
from executor.watch.training.panels import PanelError
from executor.watch.training.run_view import run_view

logger = logging.getLogger(__name__)

STEP_ROUTES = {"step": "/api/step", "live": "/api/step/live", "views": "/api/step/views", "files": "/api/step/files"}
VIEW_ROUTES = {"ladder": "/api/step/ladder", "composition": "/api/step/composition"}
ALL_ROWS = 1 << 30
FRESHNESS = "data/site.json"


@dataclass
class CycleReport:
    experiments: int
    steps: int
    files_written: int
    bytes_written: int
    new_alerts: int


class SitePublisher:
    """Publishes every experiment under `prefix` to `destination` (module docstring); `cycle()` once."""

    def __init__(
        self,
        prefix: str,
        destination: str,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        max_chunks: int = MAX_CHUNKS,
        webhook_url: str | None = None,
        clock: Callable[[], float] = time.time,
        interval_s: float | None = None,
    ):
        self.prefix = storage.make_absolute(prefix)
        if not storage.exists(self.prefix):
            raise PublishError(f"the prefix {self.prefix} does not exist: nothing to publish (check --prefix)")
        self.app = DashboardApp(self.prefix, live_ttl_s=0.0)
        # A step's status changes only with its files, which make it dirty (site_changes.py), and a cycle drops
        # its dirty steps' cached state: nothing cached need expire on a clock, so no cycle re-reads every step.
        self.app.cache.live_ttl_s = self.app.cache.finished_ttl_s = math.inf
        self.site = SiteWriter(destination)
        self.redactor = Redactor(self.prefix)
        self.metrics = MetricsPublisher(self.site, self.redactor, segment_bytes, max_chunks)
        self.alerts = RunAlerts(self.prefix, webhook_url, clock)
        self.seals = SealWitness(self.site, webhook_url, clock)
        self.changes = ChangeTracker()
        self.clock = clock
        self.interval_s = interval_s
        """Seconds between cycles when watching: each cycle then writes the heartbeat (site.json)."""
        self._published_at = (self.site.read_json(FRESHNESS) or {}).get("published_at")
        self._alert_counts: dict[str, int] = {}
        """Alerts fired so far on each run, as of its last full look."""
        self._lost_shown: set[str] = set()
        """RUNNING steps last published with their holder lost (see `_holders_lost`)."""
        self._pending: list[tuple[str, Any]] = []
        """This cycle's JSON files, written once every name in them is learned (`_write_pending`)."""
        self._pending_metrics: list[tuple[str, str]] = []
        """This cycle's steps whose metrics lines go out, (output path, site folder)."""
        self._checked: set[str] = set()
        """The names every published metrics line has been searched for (`_write_pending`): none at first."""
        self._look_at_all = True
        """Whether the next cycle looks at every step (the first, and the one after a name was learned)."""

    def _holders_lost(self, steps: dict[str, tuple[ExperimentStep, str]], dirty_steps: set[str]) -> set[str]:
        """RUNNING steps whose lease holder died since they were published: nothing in their folder changes, so
        no change mark shows it; each RUNNING step's lease is read every cycle (a few steps) until one is lost,
        then it is republished once, showing "holder lost since T" (the cached state is dropped with it)."""
        self._lost_shown -= dirty_steps
        relatives = [relative for relative in steps if relative not in dirty_steps | self._lost_shown]
        states = self.app.cache.states([steps[relative][0].output_path for relative in relatives])
        lost = {
            relative
            for relative, state in zip(relatives, states, strict=True)
            if state.status == "RUNNING" and holder_lost_note(steps[relative][0].output_path, state.started)
        }
        self._lost_shown |= lost
        return lost

    def _answer(self, route: str, **query: str) -> Any:
        response = self.app.handle(route, query)
        body = json.loads(response.body)
        if response.status != 200:
            return {"error": body.get("error", f"HTTP {response.status}"), "status": response.status}
        return body

    def _put(self, relative: str, value: Any) -> None:
        self._pending.append((relative, value))

    def _write_pending(self, whole_look: bool) -> None:
        """Write this cycle's files (module docstring): learn the names in all of them, publish the metrics lines
        (which may teach more), then redact and write the JSON files. A name learned only now may sit in files
        an earlier cycle wrote: every step is looked at again next cycle. A cycle that looks at every step (the
        first, or the one after) first sends anew the metrics lines published without a name it knows, by this
        publisher or an earlier one, and then counts the site clean of every name it knows."""
        known = set(self.redactor.whole_values)
        for _, value in self._pending:
            self.redactor.learn(value)
        if whole_look and (unchecked := self.redactor.whole_values - self._checked):
            for _, folder in self._pending_metrics:
                self.metrics.track(folder)
            self.metrics.recheck(unchecked)  # the runs whose published lines hold one go out anew just below
        learned_from_files = set(self.redactor.whole_values)
        for output_path, folder in self._pending_metrics:
            self.metrics.publish(output_path, folder)
        if late := self.redactor.whole_values - learned_from_files:  # first seen in a metrics line: the lines this
            anew = self.metrics.recheck(late)  # cycle published before it go out again at once, without it
            for output_path, folder in self._pending_metrics:
                if folder in anew:
                    self.metrics.publish(output_path, folder)
        for relative, value in self._pending:
            self.site.write_json(relative, self.redactor.value(value))
        self._pending, self._pending_metrics = [], []
        learned = self.redactor.whole_values - known
        if whole_look:
            self._checked |= self.redactor.whole_values
        elif learned:
            logger.info("learned %d name(s) to hide: looking at every step again", len(learned))
            self.changes = ChangeTracker()
        self._look_at_all = bool(learned) and not whole_look

    def cycle(self) -> CycleReport:
        """Publish what changed since the last cycle; returns what it wrote."""
        written_before, bytes_before = self.site.files_written, self.site.bytes_written
        self._pending, self._pending_metrics = [], []  # what a cycle that failed part way left
        self._put_shell()
        self.app.experiments.expire()
        experiments = self.app.experiments.all()
        dirty_steps, dirty_experiments = self.changes.dirty(experiments)
        steps = {step.relative: (step, experiment.file) for experiment in experiments for step in experiment.steps}
        lost = self._holders_lost(steps, dirty_steps)
        dirty_steps |= lost
        dirty_experiments |= {steps[relative][1] for relative in lost}
        self.app.cache.forget(steps[relative][0].output_path for relative in dirty_steps)
        new_alerts = 0
        for relative, (step, file) in steps.items():
            fired = 0
            if relative in dirty_steps:
                fired = self._publish_step(step)
            elif relative in self.alerts.running:
                was_stalled = relative in self.alerts.stalled
                fired = self.alerts.check_stall(step)
                if fired or was_stalled != (relative in self.alerts.stalled):
                    self._publish_step(step)  # its alerts, run view and stalled state, in this cycle
                    dirty_experiments.add(file)
            if fired:
                self.changes.remark(relative, step.output_path)
                new_alerts += fired
        for experiment in experiments:
            if experiment.file in dirty_experiments:
                self._publish_experiment(experiment, self._alert_count(experiment))
        if dirty_experiments:
            listing = self._answer("/api/experiments")
            counts = {experiment.file: self._alert_count(experiment) for experiment in experiments}
            stalled = {experiment.file: self._stalled_count(experiment) for experiment in experiments}
            for summary in listing.get("experiments", []):
                summary["alerts"] = counts.get(summary["file"], 0)
                summary["stalled"] = stalled.get(summary["file"], 0)
            self._put("data/experiments.json", listing)
        self._write_pending(whole_look=self._look_at_all)
        self._put_freshness(self.site.files_written > written_before)
        self.site.save_manifest()
        return CycleReport(
            len(experiments),
            len(dirty_steps),
            self.site.files_written - written_before,
            self.site.bytes_written - bytes_before,
            new_alerts,
        )

    def watch(self, seconds: float, cycles: int | None = None) -> None:
        """Publish every `seconds` until interrupted (or `cycles` times)."""
        done = 0
        while cycles is None or done < cycles:
            report = self.cycle()
            logger.info(
                "published %d experiments, %d steps to %s: %d files, %d bytes, %d new alerts",
                report.experiments,
                report.steps,
                self.site.destination,
                report.files_written,
                report.bytes_written,
                report.new_alerts,
            )
            done += 1
            if cycles is None or done < cycles:
                time.sleep(seconds)

    def _put_freshness(self, changed: bool) -> None:
        """data/site.json: when the site last changed, and (watching) the publisher's heartbeat and interval, from
        which the pages tell a RUNNING step whose publisher has stopped (3 intervals without a heartbeat)."""
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC).isoformat(timespec="seconds")
        if changed or self._published_at is None:
            self._published_at = now
        freshness = {"published_at": self._published_at, "interval_s": self.interval_s,
                     "heartbeat": now if self.interval_s else None}  # fmt: skip
        if self.interval_s or changed:  # a one-off publish promises no heartbeat: an idle cycle writes nothing
            self.site.write_json(FRESHNESS, freshness)

    def _put_shell(self) -> None:
        assets = load_static()
        page = assets["page.html"].decode()
        page = page.replace('<html lang="en">', '<html lang="en" data-site="static">')
        page = page.replace('href="/static/', 'href="static/').replace('src="/static/', 'src="static/')
        page = page.replace('href="/" class="brand"', 'href="#/" class="brand"')
        self.site.write("index.html", page.encode())
        for name, data in assets.items():
            if name != "page.html":
                self.site.write(f"static/{name}", data)

    def _alert_count(self, experiment: Experiment) -> int:
        return sum(self._alert_counts.get(step.relative, 0) for step in experiment.steps)

    def _stalled_count(self, experiment: Experiment) -> int:
        return sum(step.relative in self.alerts.stalled for step in experiment.steps)

    def _publish_experiment(self, experiment: Experiment, alert_count: int) -> None:
        folder = f"data/experiment/{experiment.file}"
        summary = self._answer("/api/experiment", file=experiment.file)
        summary["alerts"] = alert_count
        summary["stalled"] = self._stalled_count(experiment)
        self._put(f"{folder}/summary.json", summary)
        self._put(f"{folder}/graph.json", self._answer("/api/experiment/graph", file=experiment.file))
        self._put(f"{folder}/incidents.json", self._answer("/api/experiment/incidents", file=experiment.file))
        table = self._answer("/api/experiment/steps", file=experiment.file, limit=str(ALL_ROWS))
        for row in table.get("rows", []):
            row["stalled"] = self.alerts.stalled.get(str(row.get("path")))
            if row.get("finished") is None:  # the page counts an unfinished step's time from `started`, so the
                row["duration_s"] = None  # table does not change every cycle while a step runs
        self._put(f"{folder}/steps.json", table)

    def _publish_step(self, step: ExperimentStep) -> int:
        """One step's files; returns how many new alerts its run fired."""
        folder = f"data/step/{step.relative}"
        live = self._answer("/api/step/live", path=step.relative)
        if "error" in live:  # never ran: nothing stored to show
            return 0
        views = self._answer("/api/step/views", path=step.relative).get("views", [])
        fired = 0
        witness = None
        if self.changes.has(step.relative, PREDICTION_SEAL_FILE):  # witnessed at once, the first time it is seen
            witness = self.seals.witness(step, folder)
        if self.changes.has_metrics(step.relative):  # known from this cycle's listing: no read for the others
            records = files.metrics_records(storage.join(step.output_path, METRICS_FILE)) or []
            if "run" in views:  # alerts first, so this cycle's run view already lists and marks them
                fired = self.alerts.evaluate(step, running=live.get("status") == "RUNNING", records=records)
                fired_so_far = alerts.read_alerts(step.output_path)
                self._alert_counts[step.relative] = len(fired_so_far)
                self._put(f"{folder}/alerts.json", {"alerts": fired_so_far})
                self._put(f"{folder}/run.json", self._run_view(step, records, witness))
            self._put(f"{folder}/metrics.json", metrics_grid(records, alerts.read_alerts(step.output_path)))
            self._pending_metrics.append((step.output_path, folder))
        live["stalled"] = self.alerts.stalled.get(step.relative)  # the run's stall, as every page shows it
        live["has_metrics"] = self.changes.has_metrics(step.relative)
        for name, route in STEP_ROUTES.items():
            answer = live if name == "live" else self._answer(route, path=step.relative)
            if name == "step" and isinstance(answer.get("live"), dict):
                answer["live"] = live
            self._put(f"{folder}/{name}.json", answer)
        for view in views:
            if view in VIEW_ROUTES:
                answer = self._answer(VIEW_ROUTES[view], path=step.relative)
                if view == "ladder" and "sealed_by" in answer:  # held to the seals the site witnessed, too
                    self._hold_to_witnesses(answer)
                self._put(f"{folder}/{view}.json", answer)
        return fired

    def _hold_to_witnesses(self, ladder: dict[str, Any]) -> None:
        """The ladder's prediction against the digest the site witnessed each downstream run seal (its
        seal.json), beside the runs' own seals: a seal rewritten with the prediction is caught here."""
        witnessed = dict(ladder["sealed_by"])
        for run in ladder["sealed_by"]:
            held = self.site.read_json(f"data/step/{run}/seal.json")
            if isinstance(held, dict) and isinstance(held.get("sha256"), str) and held["sha256"] != witnessed[run]:
                witnessed[f"{run} (witnessed)"] = held["sha256"]
        ladder["seal_warning"] = broken_seals(ladder["prediction_sha256"], witnessed)

    def _run_view(
        self, step: ExperimentStep, records: list[dict[str, Any]], witness: dict[str, Any] | None
    ) -> dict[str, Any]:
        try:
            now = code_now(self.app.experiments.containing(step.relative), step.relative)
            return run_view(self.prefix, step.output_path, records, now, witness)
        except PanelError as error:  # as the dashboard answers it: the page shows the message
            return {"error": str(error), "status": 422}


def open_hint(destination: str) -> str:
    """How to open the published site: its pages fetch JSON files, which browsers refuse to a page opened from
    disk (file://), so a folder needs any static server."""
    if destination.startswith("gs://"):
        bucket_path = destination.removeprefix("gs://").rstrip("/")
        return (f"open https://storage.googleapis.com/{bucket_path}/index.html (objects publicly readable) "
                "or the bucket's website endpoint")  # fmt: skip
    if destination.startswith("s3://"):
        bucket, _, path = destination.removeprefix("s3://").partition("/")
        return f"open https://{bucket}.s3.amazonaws.com/{path.rstrip('/')}/index.html (objects publicly readable)"
    folder = storage.make_absolute(destination)
    return f"serve it with: python -m http.server 8000 --bind 127.0.0.1 --directory {folder}  then open http://127.0.0.1:8000/"


def publish(prefix: str, destination: str, watch_s: float | None = None, webhook_url: str | None = None) -> None:
    """The CLI's entry: one cycle, or one every `watch_s` seconds until interrupted."""
    if watch_s is not None and watch_s <= 0:
        raise PublishError(f"--watch {watch_s}: give the seconds between republishing, a positive number")
    try:
        publisher = SitePublisher(prefix, destination, webhook_url=webhook_url, interval_s=watch_s)
        if watch_s is None:
            report = publisher.cycle()
            logger.info(
                "published %d experiments, %d steps to %s (%d files, %d bytes)",
                report.experiments,
                report.steps,
                publisher.site.destination,
                report.files_written,
                report.bytes_written,
            )
        else:
            publisher.watch(watch_s)
    except KeyboardInterrupt:
        logger.info("stopped publishing %s", prefix)
    except StorageError as error:
        raise PublishError(f"publishing {prefix} to {destination} failed: {error}") from error
