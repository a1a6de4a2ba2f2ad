"""Every name a step folder may hold, and the prefix's experiment files: the one list of them.

Under `<prefix>/<name>-<hash>/`:

    .executor_info      JSON: name, fn, resolved config, version, hash, dependencies, fingerprint, who/when
    .executor_status    JSON lines, one event each (events.py); the last line is the current status
    .executor_lease/    numbered lease objects (lease.py)
    .executor_manifest  JSON: every output file with size and sha256, written just before SUCCESS
    .executor_progress  JSON: shard progress while a sharded step runs
    .executor_shards/   one commit marker per finished shard (executor/shards/writer.py)
    .executor_tmp/      shard files being written, moved into place at the shard's commit
    logs/step.log       the step's captured log
    gang.json           a multi-host step's gang: hosts, placement, each member's node, pid and state
    stats.json          the step's own figures (docs/bytes/tokens in and out), by convention
    metrics.jsonl       training/eval metrics, one JSON object per line (on an object store, segments under
                        metrics.jsonl.d/: metrics_log.py reads both)
    ...                 the step's own outputs; those the training steps write and the views read are named
                        below, under "By the training steps' convention"

Under `<prefix>/experiments/`: `<script>-<hash>.json`, one per experiment run (executor/dag/records.py writes
them, experiments.py reads them).

A name the executor owns starts with `.executor_` (plus `logs/`): `is_metadata` and `is_executor_record` say
which files are records rather than outputs, for manifests, digests and listings.
"""

from __future__ import annotations

INFO_FILE = ".executor_info"
STATUS_FILE = ".executor_status"
LEASE_DIR = ".executor_lease"
MANIFEST_FILE = ".executor_manifest"
PROGRESS_FILE = ".executor_progress"
"""JSON written while a sharded step runs: {"shards_total", "shards_done", "rows", "bytes", "updated"}."""
SHARD_DIR = ".executor_shards"
"""A sharded step's commit markers, one per finished shard (at any depth: a nested stage has its own)."""
TEMP_DIR = ".executor_tmp"
"""Where a shard's files are written before its commit moves them into place."""
LOG_DIR = "logs"
LOG_FILE = "logs/step.log"
GANG_FILE = "gang.json"
"""A multi-host step's gang (executor/run/gang.py): hosts, placement, each member's node, pid and state."""
STATS_FILE = "stats.json"
"""A step's own figures, by convention: docs_in/docs_out, bytes_in/bytes_out, tokens_in/tokens_out, ..."""
METRICS_FILE = "metrics.jsonl"
"""A training or eval step's metrics, one JSON object per line, each with a "step" key; on an object store
written as segments under `metrics.jsonl.d/` (executor/store/metrics_log.py, which reads both)."""
METADATA_NAMES = frozenset({INFO_FILE, STATUS_FILE, LEASE_DIR, MANIFEST_FILE, LOG_DIR, PROGRESS_FILE})

HASH_CHARS = 8
"""Hex characters of the version hash in a step folder's name, `<name>-<hash[:HASH_CHARS]>`."""

EXPERIMENTS_DIR = "experiments"
"""`<prefix>/experiments/<script>-<hash>.json`: the steps of one experiment run, with their paths."""

# By the training steps' convention (steps/train, steps/scaling, steps/tokenize write them; the training views
# and alert rules in executor/watch/training read them). The executor itself never needs them.
LINEAGE_FILE = "lineage.json"
"""A fork's parent run and the step it started from (steps/train/train.py writes it, the run view draws it)."""
PREDICTION_SEAL_FILE = "prediction_seal.json"
"""Written by a run watched against a prediction, when it starts: the prediction's digest and time."""
PREDICTION_FILE = "prediction.json"
"""A scaling step's fit and prediction (the ladder view)."""
COMPOSITION_FILE = "composition.json"
"""A cells step's topic x quality cells (the composition view)."""
WEIGHTS_FILE = "weights.json"
"""A mixture-weights step's weights per phase (the composition view)."""
MIXTURE_FILE = "mixture.json"
"""A train step's planned mixture schedule (served against planned)."""
OPTIMIZER_GROUPS_FILE = "optimizer_groups.json"
"""A train step's optimizer and which group each parameter is in (steps/train/optimizer.py writes it)."""
RESULTS_FILE = "results.json"
"""An evaluate step's results (the ladder view's achieved loss)."""
ALERTS_FILE = "alerts.jsonl"
"""A watched run's alerts, one JSON object per line (executor/watch/training/alerts.py)."""
CHECKPOINTS_DIR = "checkpoints"
"""The folder under a train step's output whose contents a forced rerun must not discard unasked
(executor/run/force_guard.py)."""
WANDB_RUNS_DIR = "wandb/wandb"
"""A train step's offline wandb runs (`python -m executor wandb-sync`)."""


def is_metadata(top_level_name: str) -> bool:
    """Names the executor owns (and their temp files, which other executors may be writing right now)."""
    return top_level_name in METADATA_NAMES or top_level_name.startswith(".executor_")


def is_executor_record(relative: str) -> bool:
    """A file the executor owns, by its path relative to the output: under a top-level metadata name, or under
    a `.executor_*` name at any depth (a nested sharded stage's markers and progress,
    `work/hashes/.executor_shards/`, which hold times and worker ids). Manifests and digests leave these out."""
    parts = relative.split("/")
    return is_metadata(parts[0]) or any(part.startswith(".executor_") for part in parts)


def relative_to(prefix: str, full_path: str) -> str | None:
    """`full_path` relative to `prefix`, or None if it does not lie under it."""
    base = prefix.rstrip("/") + "/"
    if full_path.startswith(base) and len(full_path) > len(base):
        return full_path[len(base) :].rstrip("/")
    return None
