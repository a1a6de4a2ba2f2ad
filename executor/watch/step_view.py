"""The JSON of one step's page: status history, resolved config, version, explain diff, drift, rerun.

A step is named by its output path relative to the prefix. Its `.executor_info` holds the resolved
config and the version dict; the resolved config is flattened to the same dotted keys the version
uses (`model.hidden_dim`, `input_paths.[0]`), so each field can be marked *versioned* (part of the
hash), *dependency* (an upstream output, hashed by that step's hash) or plain (never hashed).

"Why this hash" is `executor.dag.explain`'s report: the version dict, and the key-by-key diff against
every other stored version of the same step name. The code drift warning compares the fingerprint
written with SUCCESS to the current code's, as recorded by the newest experiment holding the step.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import partial
from typing import Any

from executor.dag.explain import explain, flatten_version
from executor.dag.identity import join_key
from executor.errors import StorageError
from executor.store import storage
from executor.store.events import parse_events
from executor.store.experiments import Experiment
from executor.store.layout import GANG_FILE, INFO_FILE, MANIFEST_FILE, PROGRESS_FILE, STATS_FILE, STATUS_FILE
from executor.store.lease import holder_lost_note, last_heartbeat
from executor.store.step_rows import StepState, code_drifted
from executor.watch.incidents import attempt_history
from executor.watch.step_cache import json_or_none

_DEPENDENCY = re.compile(r"^DEP\[(\d+)\](.*)$")


class StepNotFoundError(LookupError):
    """The path names no step output (no `.executor_info` and no status)."""


def flatten_config(config: Any, versioned_keys: set[str], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted keys of a resolved config: dicts always open up; lists only when a versioned key is inside."""
    if isinstance(config, dict) and config:
        rows: list[tuple[str, Any]] = []
        for key, value in config.items():
            # The version's own key encoding, so a key with a dot is quoted exactly as in version_config.
            rows.extend(flatten_config(value, versioned_keys, join_key(prefix, str(key))))
        return rows
    if isinstance(config, list) and prefix and any(key.startswith(prefix + ".[") for key in versioned_keys):
        rows = []
        for index, value in enumerate(config):
            rows.extend(flatten_config(value, versioned_keys, f"{prefix}.[{index}]"))
        return rows
    return [(prefix, config)]


def config_rows(info: dict[str, Any]) -> list[dict[str, Any]]:
    version = info.get("version") or {}
    version_config: dict[str, Any] = version.get("config") or {}
    dependencies: list[str] = version.get("dependencies") or []
    rows = []
    for key, value in flatten_config(info.get("config") or {}, set(version_config)):
        hashed = version_config.get(key)
        kind, dependency = "plain", None
        if key in version_config or any(key.startswith(versioned + ".") for versioned in version_config):
            kind = "versioned"
        match = _DEPENDENCY.match(hashed) if isinstance(hashed, str) else None
        if match and int(match.group(1)) < len(dependencies):
            kind, dependency = "dependency", dependencies[int(match.group(1))] + match.group(2)
        rows.append({"key": key, "value": value, "kind": kind, "dependency": dependency})
    return rows


def rerun_command(prefix: str, name: str, experiment: Experiment | None) -> str:
    """The command that reruns just this step (its dependencies are skipped when already SUCCESS)."""
    pattern = json.dumps([f"^{re.escape(name)}$"])
    script = experiment.caller if experiment and experiment.caller else "<experiment script>.py"
    return (
        f"python {shlex.quote(script)} --prefix {shlex.quote(prefix)} "
        f"--run_only {shlex.quote(pattern)} --force_run {shlex.quote(pattern)}"
    )


def _explain_json(output_path: str, info: dict[str, Any], fingerprint: str | None, prefix: str) -> dict[str, Any]:
    report = explain(output_path, info["version"], info["hash"], fingerprint)
    return {
        "hash": report.hash,
        "version_json": json.dumps(report.version, sort_keys=True, separators=(",", ":")),
        "flat": [{"key": key, "value": value} for key, value in sorted(flatten_version(report.version).items())],
        "others": [
            {
                "label": other.label,
                "path": other.output_path[len(prefix) + 1 :] if other.output_path.startswith(prefix + "/") else None,
                "status": other.status,
                "written": other.written,
                "differences": [
                    {
                        "key": diff.key,
                        "other": diff.other,
                        "this": diff.this,
                        "added": diff.added,
                        "removed": diff.removed,
                        "text": diff.render(),
                    }
                    for diff in other.differences
                ],
            }
            for other in report.others
        ],
    }


def live_state(output_path: str) -> dict[str, Any]:
    """What changes while a step runs: its status history, shard progress and, for a multi-host step, its
    gang's hosts and their states (one batched read)."""
    status_blob, progress_blob, gang_blob = storage.read_many(
        [storage.join(output_path, name) for name in (STATUS_FILE, PROGRESS_FILE, GANG_FILE)]
    )
    try:
        events = parse_events(status_blob, output_path)
    except StorageError as error:
        return {"status": "CORRUPT", "message": str(error), "events": [], "progress": None, "gang": None}
    state = StepState.of(events)
    lost = holder_lost_note(output_path, state.started) if state.status == "RUNNING" else None
    return {
        "status": state.status or "NEVER_RAN",
        "attempts": state.attempts,
        "started": state.started,
        "finished": state.finished,
        "message": f"RUNNING - {lost}" if lost else state.message,
        "holder_lost": lost,
        "recorded_fingerprint": state.recorded_fingerprint,
        "digest": state.digest,
        "events": [json.loads(event.to_json()) for event in events],
        "attempt_history": attempt_history(events, partial(last_heartbeat, output_path)),
        "progress": json_or_none(progress_blob),
        "gang": json_or_none(gang_blob),
    }


def step_detail(prefix: str, relative: str, output_path: str, experiment: Experiment | None) -> dict[str, Any]:
    info_blob, stats_blob, manifest_blob = storage.read_many(
        [storage.join(output_path, name) for name in (INFO_FILE, STATS_FILE, MANIFEST_FILE)]
    )
    live = live_state(output_path)
    if info_blob is None and not live["events"]:
        raise StepNotFoundError(f"{relative!r} is not a step output under {prefix} (no {INFO_FILE})")
    info = json.loads(info_blob) if info_blob else {}
    step = experiment.by_relative.get(relative) if experiment else None
    current = step.fingerprint if step else None
    recorded = live.get("recorded_fingerprint") or ""
    drift = None
    if code_drifted(recorded, current):
        drift = (
            "The step function's source changed since this output was written "
            f"(recorded {recorded[:12]}, current {(current or '')[:12]} in {experiment.file if experiment else '?'}). "
            "The output is kept (code is not hashed); bump code_version or force_run the step to rebuild it."
        )
    name = info.get("name") or (step.name if step else relative)
    manifest = json_or_none(manifest_blob)
    return {
        "path": relative,
        "output_path": output_path,
        "name": name,
        "info": {
            key: info.get(key)
            for key in (
                "fn",
                "description",
                "hash",
                "code_version",
                "code_fingerprint",
                "git_commit",
                "user",
                "host",
                "worker",
                "written",
                "started",
                "resources",
            )
        },
        "dependencies": [
            {
                **dep,
                "path": dep["output_path"][len(prefix) + 1 :] if dep["output_path"].startswith(prefix + "/") else None,
            }
            for dep in info.get("dependencies") or []
        ],
        "experiment": experiment.file if experiment else None,
        "live": live,
        "config": config_rows(info) if info else [],
        "explain": _explain_json(output_path, info, current, prefix) if info.get("version") else None,
        "drift": drift,
        "stats": json_or_none(stats_blob),
        "output_bytes": manifest.get("total_bytes") if isinstance(manifest, dict) else None,
        "output_digest": live.get("digest"),
        "rerun": rerun_command(prefix, name, experiment),
    }
