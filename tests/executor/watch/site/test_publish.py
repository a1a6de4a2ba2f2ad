"""`python -m executor publish`: the static site of a prefix, on a local folder and on the GCS emulator.

The prefix is a real DAG (tests/support/publish_dag.py). The tests check that every page's JSON is there, that
nothing private is (logs, secret config values, user and host names, paths of the machine), and that a
republish writes only what changed, with the metrics lines appended. What a cycle costs as a run grows, and
what an idle cycle reads: test_publish_cost.py beside this file. Pages in Chromium: tests/e2e/test_publish_browser.py.
"""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from publish_dag import LOG_SECRET, SECRET, build_publish_prefix, metrics_line

from executor import storage
from executor.store.layout import METRICS_FILE
from executor.watch.site.files import PublishError
from executor.watch.site.publish import SitePublisher


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    prefix = tmp_path_factory.mktemp("publish") / "prefix"
    return {"prefix": prefix, "paths": build_publish_prefix(prefix)}


def copy_prefix(built: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of the built prefix, for a test that appends to it."""
    copy = tmp_path / "prefix"
    shutil.copytree(built["prefix"], copy)
    return copy


def site_json(site: Path, relative: str) -> Any:
    return json.loads((site / relative).read_text())


def published_lines(site: Path, relative: str) -> list[dict[str, Any]]:
    """A step's metrics lines as the site holds them: its sealed segments, then its open chunks, in order."""
    folder = site / "data" / "step" / relative / "metrics"
    index = json.loads((folder / "index.json").read_text())
    names = [f"s{index['epoch']}-{number:05d}.jsonl" for number in range(index["segments"])]
    names += [f"c{index['epoch']}-{number:08d}.jsonl" for number in range(index["first_chunk"], index["next_chunk"])]
    return [json.loads(line) for name in names for line in (folder / name).read_text().splitlines()]


def test_the_site_holds_every_page_of_every_experiment(built, tmp_path: Path) -> None:
    site = tmp_path / "site"
    report = SitePublisher(str(built["prefix"]), str(site)).cycle()
    assert report.experiments == 1 and report.steps == 3
    listing = site_json(site, "data/experiments.json")
    [experiment] = listing["experiments"]
    assert experiment["script"] == "publish_demo.py" and experiment["counts"] == {"SUCCESS": 3}
    assert experiment["alerts"] == 2  # the faulty run: one NaN episode and one spike
    folder = f"data/experiment/{experiment['file']}"
    assert len(site_json(site, f"{folder}/steps.json")["rows"]) == 3
    assert len(site_json(site, f"{folder}/graph.json")["nodes"]) == 3
    run = site_json(site, f"data/step/{built['paths']['healthy']}/run.json")
    assert run["alerts"] == [] and run["last_step"] == 79 and run["charts"][0]["series"][0]["label"] == "train/loss"
    assert [line["step"] for line in published_lines(site, built["paths"]["healthy"])] == list(range(80))
    faulty = site_json(site, f"data/step/{built['paths']['faulty']}/run.json")
    assert [(alert["rule"], alert["step"]) for alert in faulty["alerts"]] == [
        ("nonfinite_loss", 30),
        ("loss_spike", 60),
    ]
    assert (site / "index.html").read_text().count('data-site="static"') == 1
    assert (site / "static" / "vendor" / "uPlot.iife.min.js").exists()


def test_nothing_private_is_published(built, tmp_path: Path) -> None:
    site = tmp_path / "site"
    SitePublisher(str(built["prefix"]), str(site)).cycle()
    text = "\n".join(path.read_text() for path in (site / "data").rglob("*") if path.is_file())
    step = site_json(site, f"data/step/{built['paths']['healthy']}/step.json")
    rows = {row["key"]: row["value"] for row in step["config"]}
    assert rows["api_token"] == "<redacted>" and rows["scratch_dir"] == "…/scratch"
    assert rows["output_path"].startswith("<prefix>/train/healthy-")
    for private in (SECRET, LOG_SECRET, str(built["prefix"]), str(Path.home()) + "/", "/home/someone"):
        assert private not in text, private
    for name in (getpass.getuser(), socket.gethostname()):  # as a value: short names occur inside other words
        assert f'"{name}"' not in text, name
    assert not any(path.name.endswith(".log") for path in site.rglob("*"))


def test_a_republish_writes_only_what_changed(built, tmp_path: Path) -> None:
    prefix = copy_prefix(built, tmp_path)
    publisher = SitePublisher(str(prefix), str(tmp_path / "site"), segment_bytes=4096)
    first = publisher.cycle()
    assert first.files_written > 40
    idle = publisher.cycle()
    assert (idle.files_written, idle.bytes_written) == (0, 0)
    relative = built["paths"]["healthy"]
    metrics = prefix / relative / METRICS_FILE
    with metrics.open("a") as handle:
        handle.write(json.dumps(metrics_line(80)) + "\n")
    grown = publisher.cycle()
    lines = published_lines(tmp_path / "site", relative)
    assert [line["step"] for line in lines] == list(range(81))  # the appended line is out on the next cycle
    index = site_json(tmp_path / "site", f"data/step/{relative}/metrics/index.json")
    assert (index["segments"], index["first_chunk"], index["next_chunk"]) == (1, 0, 1)  # 80 lines sealed, 1 open
    # the new chunk, the index, the step's file listing, its run and metrics views, site.json (published at),
    # their folders' manifests
    assert grown.files_written <= 10


def test_publish_to_the_gcs_emulator_sets_content_types_and_cache_control(built, gcs_emulator: str) -> None:
    site = f"{gcs_emulator}/site-{uuid.uuid4().hex[:8]}"
    report = SitePublisher(str(built["prefix"]), site).cycle()
    assert report.files_written > 40
    fs, root = storage.filesystem(site)
    listing = json.loads(fs.cat_file(f"{root}/data/experiments.json"))
    assert listing["experiments"][0]["alerts"] == 2
    info = fs.info(f"{root}/data/experiments.json")
    assert info["contentType"].startswith("application/json")
    assert info.get("cacheControl") == "public, max-age=5"
    assert fs.info(f"{root}/index.html")["contentType"].startswith("text/html")
    assert fs.info(f"{root}/static/main.js")["contentType"].startswith(("text/javascript", "application/javascript"))
    again = SitePublisher(str(built["prefix"]), site).cycle()  # a new publisher reads the site's manifest
    assert again.files_written == 0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "executor", *args], capture_output=True, text=True, timeout=120)


def test_bad_input_gets_a_clear_error(built, tmp_path: Path) -> None:
    missing = run_cli("publish", "--prefix", str(tmp_path / "nowhere"), "--to", str(tmp_path / "site"))
    assert missing.returncode == 2 and "nowhere does not exist" in missing.stderr and "Traceback" not in missing.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    unwritable = run_cli("publish", "--prefix", str(built["prefix"]), "--to", str(blocker / "site"))
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert "destination" in unwritable.stderr and str(blocker) in unwritable.stderr
    with pytest.raises(PublishError, match="does not exist"):
        SitePublisher(str(tmp_path / "nowhere"), str(tmp_path / "site"))


def test_the_cli_publishes_a_prefix(built, tmp_path: Path) -> None:
    result = run_cli("publish", "--prefix", str(built["prefix"]), "--to", str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "data" / "experiments.json").exists()
