"""The dashboard's JSON API and its security, over real HTTP, on a prefix written by a real DAG run."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paths import REPO
from publish_dag import running_step
from test_dashboard_dag import build_prefix, dag_steps

from executor import Executor
from executor.cli.commands import build_parser
from executor.store.layout import METRICS_FILE
from executor.watch import files
from executor.watch.app import DashboardApp
from executor.watch.safety import UnsafePathError, resolve_under
from executor.watch.server import DEFAULT_HOST, make_server, serve_in_thread
from executor.watch.site.alerts import RunAlerts
from executor.watch.training.alerts import read_alerts
from executor.watch.training.live_stalls import LiveStalls


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dashboard-api")
    build_prefix(path)
    return path


@pytest.fixture(scope="module")
def port(prefix: Path) -> Iterator[int]:
    server = make_server(str(prefix), port=0, live_ttl_s=0.1)
    serve_in_thread(server)
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def request(port: int, method: str, target: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A raw request: `target` goes on the wire as written (no client-side normalisation of `..`)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, target, headers=headers or {})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


def get_json(port: int, target: str) -> Any:
    status, body = request(port, "GET", target)
    assert status == 200, body
    return json.loads(body)


def write_synthetic_prefix(prefix: Path, steps: int) -> str:
    """The benchmark's synthetic data DAG (download -> dedup -> filter -> tokenize -> mix -> train -> eval)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from bench_dashboard import write_prefix
    finally:
        sys.path.pop(0)
    return write_prefix(prefix, steps)


def experiment_file(prefix: Path, script: str) -> str:
    return next(path.name for path in (prefix / "experiments").iterdir() if path.name.startswith(script + "-"))


def step_path(prefix: Path, name: str, index: int = 0) -> str:
    folder, stem = name.rsplit("/", 1)
    return f"{folder}/" + sorted(path.name for path in (prefix / folder).iterdir() if path.name.startswith(stem))[index]


def test_experiments_newest_first_with_counts(prefix: Path, port: int) -> None:
    experiments = get_json(port, "/api/experiments")["experiments"]
    assert [experiment["script"] for experiment in experiments] == ["lsq.py", "lsq_lr005.py"]
    assert experiments[0]["counts"] == {"FAILED": 1, "DEP_FAILED": 1, "SUCCESS": 4}
    assert experiments[0]["description"] == "the dashboard test DAG" and experiments[0]["steps"] == 6


def test_graph_has_every_step_edge_and_pseudo_dependency(prefix: Path, port: int) -> None:
    graph = get_json(port, f"/api/experiment/graph?file={experiment_file(prefix, 'lsq')}")
    assert not graph["grouped"]
    names = {node["id"]: node["label"] for node in graph["nodes"]}
    statuses = {node["label"]: node["status"] for node in graph["nodes"]}
    assert statuses["data/broken"] == "FAILED" and statuses["report/broken"] == "DEP_FAILED"
    edges = {(names[edge["source"]], names[edge["target"]]): edge["blocking"] for edge in graph["edges"]}
    assert edges == {
        ("data/raw", "data/clean"): True,
        ("data/clean", "train/lsq"): True,
        ("train/lsq", "eval/lsq"): True,
        ("data/raw", "eval/lsq"): False,
        ("data/broken", "report/broken"): True,
    }


def test_step_table_filters_sorts_and_pages(prefix: Path, port: int) -> None:
    base = f"/api/experiment/steps?file={experiment_file(prefix, 'lsq')}"
    failed = get_json(port, base + "&status=FAILED,DEP_FAILED")
    assert [row["name"] for row in failed["rows"]] == ["data/broken", "report/broken"]
    assert failed["rows"][0]["message"].startswith("ValueError") and failed["matched"] == 2
    assert [row["name"] for row in get_json(port, base + "&name=LSQ")["rows"]] == ["train/lsq", "eval/lsq"]
    assert [row["name"] for row in get_json(port, base + "&name=/^data/(raw|clean)$/")["rows"]] == [
        "data/raw",
        "data/clean",
    ]
    by_name = get_json(port, base + "&sort=name&desc=1&offset=1&limit=2")
    assert [row["name"] for row in by_name["rows"]] == ["report/broken", "eval/lsq"] and by_name["matched"] == 6
    rows = {row["name"]: row for row in get_json(port, base)["rows"]}
    assert rows["data/clean"]["figures"] == {"docs_in": 40, "docs_out": 30, "tokens_in": 200, "tokens_out": 150}
    assert rows["data/raw"]["progress"]["shards_done"] == 4 and rows["train/lsq"]["attempts"] == 1
    status, _ = request(port, "GET", base + "&sort=bogus")
    assert status == 400


def test_step_page_data(prefix: Path, port: int) -> None:
    train = step_path(prefix, "train/lsq", index=[0, 1][0])
    detail = get_json(port, f"/api/step?path={train}")
    lr = detail["explain"]["flat"]
    assert {"key": "name", "value": "train/lsq"} in lr
    kinds = {row["key"]: row["kind"] for row in detail["config"]}
    assert kinds == {"input_path": "dependency", "output_path": "plain", "lr": "versioned", "steps": "versioned"}
    [other] = detail["explain"]["others"]
    assert [diff["key"] for diff in other["differences"]] == ["config.lr"]
    assert [event["status"] for event in detail["live"]["events"]] == ["WAITING", "RUNNING", "SUCCESS"]
    assert "--run_only" in detail["rerun"] and "train/lsq" in detail["rerun"] and detail["drift"] is None
    metrics = get_json(port, f"/api/step/metrics?path={train}")
    assert metrics["rows"] == 60 and metrics["x"] == "step" and "loss" in metrics["keys"]
    assert metrics["series"]["loss"]["y"][-1] < metrics["series"]["loss"]["y"][0]
    assert "step 0 loss" in get_json(port, f"/api/step/log?path={train}")["text"]


def test_file_browser_and_previews(prefix: Path, port: int) -> None:
    clean = step_path(prefix, "data/clean")
    names = [entry["name"] for entry in get_json(port, f"/api/step/files?path={clean}")["entries"]]
    assert names[:2] == ["docs.jsonl", "stats.json"] and ".executor_status" in names and "logs" in names
    rows = get_json(port, f"/api/step/preview?path={clean}&file=docs.jsonl")
    assert rows["kind"] == "jsonl" and rows["rows"][0]["id"] == 1 and len(rows["rows"]) == 30
    assert get_json(port, f"/api/step/preview?path={clean}&file=stats.json")["document"]["docs_out"] == 30
    history = get_json(port, f"/api/step/preview?path={clean}&file=.executor_status")
    assert history["rows"][-1]["status"] == "SUCCESS"
    assert get_json(port, f"/api/step/files?path={clean}&dir=logs")["entries"][0]["name"] == "step.log"


def test_code_drift_is_shown(tmp_path: Path) -> None:
    build_prefix(tmp_path)
    lsq = experiment_file(tmp_path, "lsq")
    record = json.loads((tmp_path / "experiments" / lsq).read_text())
    for step in record["steps"]:
        step["code_fingerprint"] = "0" * 64
    (tmp_path / "experiments" / "drifted-00000000.json").write_text(json.dumps(record))
    app = DashboardApp(str(tmp_path))
    detail = json.loads(
        app.handle("/api/step", {"path": step_path(tmp_path, "data/clean"), "experiment": "drifted-00000000.json"}).body
    )
    assert "source changed" in detail["drift"]
    rows = json.loads(app.handle("/api/experiment/steps", {"file": "drifted-00000000.json"}).body)["rows"]
    assert {row["name"] for row in rows if row["drift"]} == {"data/raw", "data/clean", "train/lsq", "eval/lsq"}


def test_memory_prefix_through_fsspec() -> None:
    prefix = "memory://dashboard-test"
    steps = dag_steps(lr=0.1)
    Executor(prefix).run([steps["eval"]], caller="experiments/mem.py")
    app = DashboardApp(prefix)
    [summary] = json.loads(app.handle("/api/experiments", {}).body)["experiments"]
    assert summary["counts"] == {"SUCCESS": 4}
    page = json.loads(app.handle("/api/experiment/steps", {"file": summary["file"], "name": "train"}).body)
    metrics = json.loads(app.handle("/api/step/metrics", {"path": page["rows"][0]["path"]}).body)
    assert metrics["rows"] == 60


@pytest.mark.gcs
def test_gcs_prefix_through_gcsfs(gcs_emulator: str) -> None:
    prefix = f"{gcs_emulator}/dashboard-{os.getpid()}"
    steps = dag_steps(lr=0.1)
    Executor(prefix).run([steps["eval"]], caller="experiments/gcs.py")
    app = DashboardApp(prefix)
    [summary] = json.loads(app.handle("/api/experiments", {}).body)["experiments"]
    assert summary["counts"] == {"SUCCESS": 4} and summary["script"] == "gcs.py"
    page = json.loads(app.handle("/api/experiment/steps", {"file": summary["file"], "name": "train"}).body)
    [train] = page["rows"]
    assert train["status"] == "SUCCESS"
    metrics = json.loads(app.handle("/api/step/metrics", {"path": train["path"]}).body)
    assert metrics["rows"] == 60
    assert app.handle("/api/step", {"path": "gs://another-bucket/x"}).status == 400


# --- security --------------------------------------------------------------------------------

TRAVERSALS = [
    "/api/step?path=../../../../etc/passwd",
    "/api/step?path=..%2F..%2F..%2Fetc%2Fpasswd",
    "/api/step?path=%2Fetc%2Fpasswd",
    "/api/step?path=gs://other-bucket/x",
    "/api/step?path=s3%3A%2F%2Fother%2Fx",
    "/api/step?path=data/./raw",
    "/api/step?path=data//raw",
    "/api/step?path=data%5C..%5C..%5Cetc",
    "/api/step?path=data%00/raw",
    "/api/step/preview?path=data&file=../../../../etc/passwd",
    "/api/step/preview?path=data&file=%2Fetc%2Fpasswd",
    "/api/step/files?path=data&dir=..",
    "/api/step/log?path=..",
    "/api/step/metrics?path=data&file=../../../etc/hostname",
    "/api/experiment?file=../../../../etc/passwd",
    "/api/experiment/steps?file=%2Fetc%2Fpasswd",
    "/step/../../etc/passwd",
    "/step/%2e%2e/%2e%2e/etc/passwd",
    "/static/../app.py",
    "/static/%2e%2e/app.py",
    "/static/vendor/../../app.py",
    "/../../etc/passwd",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_path_traversal_is_refused(prefix: Path, port: int, target: str) -> None:
    status, body = request(port, "GET", target)
    assert 400 <= status < 500, (target, status)
    assert b"root:" not in body and b"def " not in body


def test_symlink_out_of_the_prefix_is_refused(tmp_path: Path) -> None:
    (tmp_path / "prefix").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.txt").write_text("secret")
    os.symlink(tmp_path / "secret", tmp_path / "prefix" / "escape")
    with pytest.raises(UnsafePathError):
        resolve_under(str(tmp_path / "prefix"), "escape/key.txt")
    app = DashboardApp(str(tmp_path / "prefix"))
    assert app.handle("/api/step/preview", {"path": "escape", "file": "key.txt"}).status == 400


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in root.rglob("*")}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_get_and_head_are_allowed(prefix: Path, port: int, method: str) -> None:
    before = tree_snapshot(prefix)
    for target in ("/api/experiments", f"/api/step?path={step_path(prefix, 'data/raw')}", "/"):
        status, _ = request(port, method, target)
        assert status == 405, (method, target)
    assert request(port, "HEAD", "/api/experiments")[0] == 200
    assert tree_snapshot(prefix) == before


def test_reading_every_page_writes_nothing(prefix: Path, port: int) -> None:
    before = tree_snapshot(prefix)
    train = step_path(prefix, "train/lsq")
    for target in (
        "/",
        "/api/experiments",
        f"/api/step?path={train}",
        f"/api/step/files?path={train}",
        f"/api/step/preview?path={train}&file=metrics.jsonl",
        f"/api/step/log?path={train}",
    ):
        assert request(port, "GET", target)[0] == 200
    assert tree_snapshot(prefix) == before


def test_default_bind_is_loopback_and_others_warn(prefix: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert DEFAULT_HOST == "127.0.0.1"
    assert build_parser().parse_args(["dashboard"]).host == "127.0.0.1"
    server = make_server(str(prefix), port=0)
    assert server.server_address[0] == "127.0.0.1"
    server.server_close()
    with caplog.at_level(logging.WARNING, logger="executor.watch.server"):
        exposed = make_server(str(prefix), host="0.0.0.0", port=0)
        exposed.server_close()
    assert "anyone who can reach this port" in caplog.text


def test_foreign_host_header_and_headers(prefix: Path, port: int) -> None:
    assert request(port, "GET", "/api/experiments", {"Host": "evil.example"})[0] == 403
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/")
    response = connection.getresponse()
    page = response.read().decode()
    assert "script-src 'self'" in response.getheader("Content-Security-Policy")
    connection.close()
    assert '<script src="/static/' in page and "http" not in page.replace("http-equiv", "")


def test_big_dag_is_grouped_and_paginated(tmp_path: Path) -> None:
    file = write_synthetic_prefix(tmp_path, 1000)
    app = DashboardApp(str(tmp_path))
    graph = json.loads(app.handle("/api/experiment/graph", {"file": file}).body)
    assert graph["grouped"] and graph["group_by"] == "name"
    sizes = {node["label"]: node["size"] for node in graph["nodes"]}
    assert sizes == {
        "download/*": 248,
        "dedup/*": 248,
        "filter/*": 248,
        "tokenize/*": 248,
        "mix/*": 1,
        "train/*": 4,
        "eval/*": 3,
    }
    edges = {
        (graph["nodes"][edge["source"]]["label"], graph["nodes"][edge["target"]]["label"]) for edge in graph["edges"]
    }
    assert ("tokenize/*", "mix/*") in edges and ("mix/*", "train/*") in edges
    page = json.loads(app.handle("/api/experiment/steps", {"file": file, "prefix": "dedup/", "offset": "200"}).body)
    assert page["matched"] == 248 and len(page["rows"]) == 48 and page["rows"][0]["name"].startswith("dedup/")
    summary = json.loads(app.handle("/api/experiment", {"file": file}).body)
    assert summary["running_shards"]["steps"] == summary["counts"]["RUNNING"] == 30


def test_config_rows_tag_a_dotted_dict_key_as_versioned(tmp_path: Path) -> None:
    """The step page keys config rows as the version does (identity.join_key), so a dict key holding a dot is
    tagged versioned, not plain (a dotted-path join would give `opts.a.b`, which the version never names)."""
    from dataclasses import dataclass

    from executor import THIS_OUTPUT_PATH, ExecutorStep, versioned
    from executor.watch.step_view import config_rows

    @dataclass(frozen=True)
    class DottedConfig:
        opts: dict
        output_path: str

    config = DottedConfig(opts={"a.b": versioned(1), "c": 2}, output_path=THIS_OUTPUT_PATH)
    step = ExecutorStep(name="dotted", fn=_write_nothing, config=config)
    executor = Executor(str(tmp_path))
    executor.run([step])
    info = json.loads(Path(executor.output_paths[step], ".executor_info").read_text())
    kinds = {row["key"]: row["kind"] for row in config_rows(info)}
    assert kinds['opts.["a.b"]'] == "versioned" and kinds["opts.c"] == "plain", kinds


def _write_nothing(config: Any) -> None:
    pass


def test_a_running_step_gone_quiet_is_stalled_on_every_answer_with_no_publisher(tmp_path: Path, fast_leases) -> None:  # type: ignore[no-untyped-def]
    """No publisher runs. A RUNNING step with a live lease whose last metrics line is 10 minutes old, past its
    allowance (2 minutes: it stepped every second, training/stall_rule.py), is stalled on the list, its experiment,
    its row and its step page, since that line; a step that has just written a line is not."""
    prefix = tmp_path / "prefix"
    with (
        running_step(prefix, "dashboard-quiet", "train/quiet", quiet_s=600.0, times="now") as (quiet_path, quiet),
        running_step(prefix, "dashboard-busy", "train/busy", times="now") as (_, busy),
    ):
        server = make_server(str(prefix), port=0, live_ttl_s=0.1)
        serve_in_thread(server)
        try:
            port = server.server_address[1]
            last = json.loads(Path(quiet_path, METRICS_FILE).read_text().splitlines()[-1])
            since = dt.datetime.fromtimestamp(last["time"], dt.UTC).isoformat(timespec="seconds")
            stall = {"since": since, "step": 19, "after_s": 120}
            listed = {entry["script"]: entry for entry in get_json(port, "/api/experiments")["experiments"]}
            assert (listed["quiet.py"]["counts"], listed["quiet.py"]["stalled"]) == ({"RUNNING": 1}, 1)
            assert (listed["busy.py"]["counts"], listed["busy.py"]["stalled"]) == ({"RUNNING": 1}, 0)
            quiet_file, busy_file = listed["quiet.py"]["file"], listed["busy.py"]["file"]
            assert get_json(port, f"/api/experiment?file={quiet_file}")["stalled"] == 1
            assert get_json(port, f"/api/experiment?file={busy_file}")["stalled"] == 0
            [row] = get_json(port, f"/api/experiment/steps?file={quiet_file}")["rows"]
            assert (row["status"], row["stalled"]) == ("RUNNING", stall)
            assert get_json(port, f"/api/experiment/steps?file={busy_file}")["rows"][0]["stalled"] is None
            assert get_json(port, f"/api/step/live?path={quiet}")["stalled"] == stall
            assert get_json(port, f"/api/step?path={quiet}")["live"]["stalled"] == stall
            assert get_json(port, f"/api/step/live?path={busy}")["stalled"] is None
        finally:
            server.shutdown()
            server.server_close()
    finished = DashboardApp(str(prefix), stalls=LiveStalls())  # the gates opened: both steps ended SUCCESS
    for relative in (quiet, busy):
        assert json.loads(finished.handle("/api/step/live", {"path": relative}).body)["stalled"] is None


@pytest.mark.parametrize(("quiet_s", "stalled"), [(0.0, False), (600.0, True)])
def test_a_long_runs_stall_is_decided_by_its_newest_lines(tmp_path: Path, fast_leases, quiet_s, stalled) -> None:  # type: ignore[no-untyped-def]
    """A RUNNING run whose metrics outgrow what the views read of a file (`files.MAX_METRICS_BYTES`, its first
    lines, here two days old): the live dashboard and the publisher's alerts read its newest lines for the stall
    rule (`files.metrics_tail_records`), so a run that has just written a line is not stalled, and one quiet for 10
    minutes past its 2-minute allowance is, since its newest line."""
    prefix = tmp_path / "prefix"
    steps = files.MAX_METRICS_BYTES // 200  # lines of ~230 bytes, one second apart
    with running_step(prefix, f"long-{quiet_s}", "train/long", steps=steps, quiet_s=quiet_s, times="now") as (
        output_path,
        relative,
    ):
        metrics = Path(output_path, METRICS_FILE)
        assert metrics.stat().st_size > files.MAX_METRICS_BYTES
        newest = json.loads(metrics.read_text().splitlines()[-1])
        since = dt.datetime.fromtimestamp(newest["time"], dt.UTC).isoformat(timespec="seconds")
        expected = {"since": since, "step": steps - 1, "after_s": 120} if stalled else None
        app = DashboardApp(str(prefix), stalls=LiveStalls())
        assert json.loads(app.handle("/api/step/live", {"path": relative}).body)["stalled"] == expected
        [experiment] = app.experiments.all()
        [step] = experiment.steps
        published = RunAlerts(str(prefix), None, time.time)
        published.evaluate(step, running=True, records=files.metrics_records(str(metrics)) or [])
        assert published.stalled.get(relative) == expected
        assert any(alert["rule"] == "stalled" for alert in read_alerts(output_path)) == stalled
