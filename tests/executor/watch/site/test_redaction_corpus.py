"""A corpus of real-looking secrets, planted in every place a step records text, and every published byte searched
(docs/watching.md, "What is published, exactly"): the config, the experiment's description, a status event's
message and details, a metrics line, an alert, another step's stats.json. Then a host name first learned in a
later cycle: the files and metrics lines an earlier cycle published with it are published again without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from publish_dag import metrics_line

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of
from executor.store.events import StatusEvent, StepStatus, append_event
from executor.store.layout import ALERTS_FILE, METRICS_FILE, STATS_FILE
from executor.watch.site.publish import SitePublisher

EMAIL = "jane.planted@example.com"
HOME_USER = "janerv5"
AWS_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYPLANTED1"
TOKEN = "tok3nPLANTEDvalue"
PASSWORD = "pa55PLANTEDword"
BEARER = "eyJhbGciPLANTEDbearer"
URL_PASSWORD = "urlpwPLANTED"
HOOK_PATH = "T0PLANTED/B0PLANTED/XhookPLANTED"
PRIVATE_KEY_BODY = "MIIEvQIBADANBgkqPLANTEDkeybody"
LEARNED_HOST = "worker-node-planted7"
"""A host name the publisher learns only from a status event's `worker` field, written bare elsewhere."""
METRICS_HOST = "gpu-box-planted42"
"""A host name a metrics line's `host` field teaches, written bare in an earlier line of the same run."""

FREE_TEXT = (
    f"launched by {EMAIL} from /home/{HOME_USER}/repo (also /Users/{HOME_USER}/x); "
    f"aws_secret_access_key={AWS_SECRET} token: {TOKEN} password = '{PASSWORD}' "
    f"Authorization: Bearer {BEARER} data at https://bob:{URL_PASSWORD}@data.example.org/x "
    f"and bob:{URL_PASSWORD}@mirror.example.org/y; hook hooks.slack.com/services/{HOOK_PATH} "
    f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PRIVATE_KEY_BODY}\n-----END OPENSSH PRIVATE KEY-----"
)
PLANTED = {
    "email": EMAIL,
    "home folder's user name": HOME_USER,
    "aws secret in free text": AWS_SECRET,
    "token: value": TOKEN,
    "password = value": PASSWORD,
    "bearer header": BEARER,
    "password in a URL": URL_PASSWORD,
    "webhook path without a scheme": "XhookPLANTED",
    "private key": PRIVATE_KEY_BODY,
}


@dataclass(frozen=True)
class NotesConfig:
    output_path: str
    notes: str = FREE_TEXT
    launcher: str = EMAIL


def notes_step(config: NotesConfig) -> None:
    Path(config.output_path, STATS_FILE).write_text(json.dumps({"docs": 3, "note": FREE_TEXT, "by": EMAIL}))


@dataclass(frozen=True)
class ChattyRunConfig:
    output_path: str
    notes_path: str
    comment: str = f"on {LEARNED_HOST}: {FREE_TEXT}"


def chatty_run(config: ChattyRunConfig) -> None:
    lines = [metrics_line(step) for step in range(80)]  # lines 2-4 are not among the grid's last 50 rows
    lines[2] |= {"comment": f"checkpoint copied from {METRICS_HOST}"}
    lines[3] |= {"note": FREE_TEXT, "where": f"running on {LEARNED_HOST}", "launcher": EMAIL}
    lines[4] |= {"host": METRICS_HOST}
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


def searched(site: Path, planted: dict[str, str]) -> list[tuple[str, str]]:
    published = {path: path.read_bytes() for path in site.rglob("*") if path.is_file()}
    assert len(published) > 20
    return [(kind, str(path.relative_to(site))) for kind, value in planted.items()
            for path, data in published.items() if value.encode() in data]  # fmt: skip


def build_chatty_prefix(prefix: Path) -> tuple[str, str]:
    """The notes step and the chatty run, every secret planted; their output paths (run, notes)."""
    notes = ExecutorStep(name="data/notes", fn=notes_step, config=NotesConfig(output_path=THIS_OUTPUT_PATH))
    config = ChattyRunConfig(output_path=THIS_OUTPUT_PATH, notes_path=output_path_of(notes))
    run = ExecutorStep(name="train/chatty", fn=chatty_run, config=config)
    executor = Executor(str(prefix))
    executor.run([notes, run], caller="experiments/chatty.py", description=f"by {EMAIL}: {FREE_TEXT}")
    run_path, notes_path = executor.output_paths[run], executor.output_paths[notes]
    details = {"launcher": EMAIL, "command": FREE_TEXT, "cwd": f"/home/{HOME_USER}/repo"}
    append_event(notes_path, StatusEvent(StepStatus.SUCCESS, message=FREE_TEXT, details=details))
    alert = {"rule": "loss_spike", "step": 5, "value": 9.0, "threshold": 4.0, "time": 1.0, "message": FREE_TEXT}
    Path(run_path, ALERTS_FILE).write_text(json.dumps(alert) + "\n")
    return run_path, notes_path


def test_no_planted_secret_survives_in_any_published_byte(tmp_path: Path) -> None:
    run_path, notes_path = build_chatty_prefix(tmp_path / "prefix")
    site = tmp_path / "site"
    publisher = SitePublisher(str(tmp_path / "prefix"), str(site))
    publisher.cycle()
    assert not searched(site, {**PLANTED, "host taught by a later metrics line": METRICS_HOST})
    assert searched(site, {"learned host": LEARNED_HOST})  # not learned yet: only its own name says it is a host

    # The host's name is learned (a status event's worker field) one cycle later, in another step's folder:
    # every file, the run's metrics lines published a cycle ago included, goes out again without it.
    append_event(notes_path, StatusEvent(StepStatus.SUCCESS, worker=f"{LEARNED_HOST}:4242", message="rerun"))
    publisher.cycle()
    publisher.cycle()
    assert not searched(site, {**PLANTED, "learned host": LEARNED_HOST})
    relative = Path(run_path).relative_to(tmp_path / "prefix").as_posix()
    index = json.loads((site / "data/step" / relative / "metrics/index.json").read_text())
    assert index["epoch"] == 2 and index["lines"] == 80  # out again twice (a name from each), old epochs gone
    assert sorted(path.name[:2] for path in (site / "data/step" / relative / "metrics").glob("[sc][0-9]*")) == ["c2"]
    step = json.loads((site / "data/step" / relative / "step.json").read_text())
    comment = next(row["value"] for row in step["config"] if row["key"] == "comment")
    assert comment.startswith("on <redacted>: launched by <email> from …/repo (also …/x); ")
    assert "aws_secret_access_key=<redacted> token: <redacted>" in comment
    assert "hooks.slack.com/<redacted>" in comment and "<redacted> private key" in comment


def test_a_publisher_started_later_rechecks_what_an_earlier_one_wrote(tmp_path: Path) -> None:
    """Publisher A writes the run's metrics lines with a host name it has not learned, and stops. Publisher B,
    started on the same site, learns the name from a status event: the lines A wrote go out again without it, so
    no published byte holds it. No record of the names is kept (in the site or elsewhere): a third publisher
    searches the published lines for the names it knows, finds none, and publishes nothing anew."""
    run_path, notes_path = build_chatty_prefix(tmp_path / "prefix")
    site = tmp_path / "site"
    SitePublisher(str(tmp_path / "prefix"), str(site)).cycle()
    relative = Path(run_path).relative_to(tmp_path / "prefix").as_posix()
    leaked = {path for _, path in searched(site, {"learned host": LEARNED_HOST})}
    assert f"data/step/{relative}/metrics/c1-00000000.jsonl" in leaked  # not learned yet: A's lines hold it

    append_event(notes_path, StatusEvent(StepStatus.SUCCESS, worker=f"{LEARNED_HOST}:4242", message="rerun"))
    SitePublisher(str(tmp_path / "prefix"), str(site)).cycle()
    assert not searched(site, {**PLANTED, "learned host": LEARNED_HOST, "metrics host": METRICS_HOST})
    index_file = site / "data/step" / relative / "metrics/index.json"
    index = json.loads(index_file.read_text())
    # A published them twice (its first look, then without the host a later line taught); B twice more: without
    # the host the event taught, then without the one that later line teaches, which B too learns only there.
    assert index["epoch"] == 3 and index["lines"] == 80

    SitePublisher(str(tmp_path / "prefix"), str(site)).cycle()
    assert json.loads(index_file.read_text()) == index
