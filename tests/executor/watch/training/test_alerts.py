"""Alert rules over a run's metrics (watch/training/alerts.py): quiet on healthy runs, once per episode on faults.

The healthy figures are the tiny demo's own (`make demo`'s six train steps, their metrics lines cut to the
keys the rules read: tests/data/alerts/tiny_demo_metrics.jsonl.gz) and tests/support/publish_dag.py's synthetic run.
Faults are injected into those lines. The webhook is a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import gzip
import json
import math
import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import wait_until
from paths import DATA
from publish_dag import STALL_GATES, START_TIME, StalledRunConfig, build_publish_prefix, metrics_line, stalled_run

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.store.events import read_status
from executor.watch.site.publish import SitePublisher
from executor.watch.training.alerts import AlertConfigError, AlertRules, evaluate, read_alerts, record_alerts

DEMO_METRICS = DATA / "alerts" / "tiny_demo_metrics.jsonl.gz"


def healthy(steps: int = 120) -> list[dict[str, Any]]:
    return [metrics_line(step) for step in range(steps)]


def fired(records: list[dict[str, Any]], **options: Any) -> list[tuple[str, int]]:
    now = options.pop("now", START_TIME + 2.0 * len(records))
    return [(alert.rule, alert.step) for alert in evaluate(records, AlertRules(**options), now=now)]


def test_the_tiny_demos_runs_fire_nothing() -> None:
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with gzip.open(DEMO_METRICS, "rt") as handle:
        for line in handle:
            record = json.loads(line)
            runs[record.pop("run")].append(record)
    assert len(runs) == 6
    for name, records in runs.items():
        last = max(record["time"] for record in records)
        assert evaluate(records, AlertRules(), now=last + 60, running=True) == [], name
    assert fired(healthy()) == []


def test_an_injected_nan_fires_once_per_episode() -> None:
    records = healthy()
    for step in (40, 41, 42, 90):
        records[step]["train/loss"] = math.nan
    assert fired(records) == [("nonfinite_loss", 40), ("nonfinite_loss", 90)]


def test_an_injected_loss_spike_fires_once() -> None:
    records = healthy()
    for step in (70, 71):
        records[step]["train/loss"] *= 3
    assert fired(records) == [("loss_spike", 70)]


def test_a_gradient_spike_a_throughput_drop_and_expert_imbalance_fire() -> None:
    records = healthy()
    records[50]["grad/norm/total"] = 40.0
    for step in range(80, 90):
        records[step]["throughput/tokens_per_second"] = 20.0
    for step in range(100, 110):
        records[step]["router/dropped_fraction"] = 0.6
    assert fired(records) == [
        ("grad_spike", 50),
        ("throughput_drop", 82),
        ("expert_imbalance", 102),
    ]  # median of 5: the 3rd bad reading


def test_a_stalled_run_fires_once_while_its_lease_is_live(tmp_path: Path) -> None:
    records = healthy(60)
    last = records[-1]["time"]
    rules = AlertRules(stall_after_s=600)
    assert evaluate(records, rules, now=last + 300, running=True) == []
    stall = evaluate(records, rules, now=last + 900, running=True)
    assert [(alert.rule, alert.step) for alert in stall] == [("stalled", 59)]
    assert evaluate(records, rules, now=last + 900, running=False) == []  # a finished or dead run is not stalled
    assert len(record_alerts(str(tmp_path), stall)) == 1
    later = evaluate(records, rules, now=last + 5000, running=True)  # the same stall, an hour on
    assert record_alerts(str(tmp_path), later) == []
    assert [line["rule"] for line in read_alerts(str(tmp_path))] == ["stalled"]


def test_leaving_the_prediction_band_fires() -> None:
    records = healthy()
    for step in (40, 80, 119):
        records[step]["eval/macro_loss"] = float(records[step]["train/loss"]) + (1.0 if step == 80 else 0.0)
    curve = [
        {"step": step, "loss": 8.0 * (step + 10) ** -0.3, "low": 0.0, "high": 8.0 * (step + 10) ** -0.3 + 0.1}
        for step in range(0, 130, 10)
    ]
    alerts = evaluate(records, AlertRules(), now=START_TIME, curve=curve)
    assert [(alert.rule, alert.step) for alert in alerts] == [("prediction_band", 80)]


def test_thresholds_come_from_the_steps_config() -> None:
    assert AlertRules.from_config({"loss_spike_z": 3, "stall_after_s": 60}).stall_after_s == 60
    with pytest.raises(AlertConfigError, match=r"unknown alert thresholds.*loss_spike"):
        AlertRules.from_config({"loss_spike": 3}, "step train/x")
    with pytest.raises(AlertConfigError, match="must be a number"):
        AlertRules.from_config({"window": "fifty"})


class Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts"
    finally:
        server.shutdown()
        server.server_close()


def test_the_webhook_receives_each_alert_once(tmp_path: Path, webhook: str) -> None:
    paths = build_publish_prefix(tmp_path / "prefix")
    publisher = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site"), webhook_url=webhook)
    assert publisher.cycle().new_alerts == 2
    assert publisher.cycle().new_alerts == 0
    [posted] = Hook.received
    assert posted["run"] == paths["faulty"]
    assert [(alert["rule"], alert["step"]) for alert in posted["alerts"]] == [
        ("nonfinite_loss", 30),
        ("loss_spike", 60),
    ]
    assert posted["alerts"][0]["value"] == "nan"
    assert posted["text"].startswith(f"2 alert(s) on {paths['faulty']}:")  # what Slack and Discord show
    assert "- loss_spike at step 60: train/loss spiked" in posted["text"]
    assert [line["rule"] for line in read_alerts(str(tmp_path / "prefix" / paths["faulty"]))] == [
        "nonfinite_loss",
        "loss_spike",
    ]


def test_a_stalled_running_step_fires_once_through_the_publisher(tmp_path: Path, fast_leases) -> None:  # type: ignore[no-untyped-def]
    gate = "publisher-stall"
    STALL_GATES[gate] = threading.Event()
    step = ExecutorStep(
        name="train/stalled",
        fn=stalled_run,
        config=StalledRunConfig(output_path=THIS_OUTPUT_PATH, gate=versioned(gate)),
    )
    executor = Executor(str(tmp_path / "prefix"))
    runner = threading.Thread(target=executor.run, args=([step],), kwargs={"caller": "experiments/stall.py"})
    runner.start()
    try:
        wait_until(
            lambda: (
                step in executor.output_paths
                and read_status(executor.output_paths[step]) == "RUNNING"
                and Path(executor.output_paths[step], "metrics.jsonl").exists()
            ),
            "the step to run",
        )
        clock = {"now": START_TIME + 2.0 * 19 + 60}  # one minute after its last line: not stalled yet
        publisher = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site"), clock=lambda: clock["now"])
        assert publisher.cycle().new_alerts == 0
        clock["now"] += 3600  # an hour of silence with the lease live
        assert publisher.cycle().new_alerts == 1
        clock["now"] += 3600
        assert publisher.cycle().new_alerts == 0  # the same stall: once per episode
        [alert] = read_alerts(executor.output_paths[step])
        assert (alert["rule"], alert["step"]) == ("stalled", 19)
    finally:
        STALL_GATES[gate].set()
        runner.join(timeout=120)
