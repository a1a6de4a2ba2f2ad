"""The `status` command's table: a row per step of an experiment file, one step output, or a prefix.

Each row is the step's `StepState` (executor/store/step_rows.py), the model the dashboard and the site read too,
so the three never disagree about a step: its status, attempts, last update, the digest its SUCCESS committed,
its worker or message, shard progress while it runs, a lost lease holder, and code drift against the fingerprint
the newest experiment file recorded for it.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from executor.store import storage
from executor.store.experiments import current_fingerprints, read_experiment
from executor.store.layout import EXPERIMENTS_DIR, INFO_FILE
from executor.store.step_rows import StepRow, experiment_rows, prefix_rows, status_counts

STATUS_STYLES = {
    "SUCCESS": "green",
    "RUNNING": "cyan",
    "WAITING": "yellow",
    "FAILED": "bold red",
    "DEP_FAILED": "red",
    "CORRUPT": "bold red",
}
DIGEST_CHARS = 12
"""How much of an output digest `status` shows (`explain` and `compare` show it whole)."""


def rows_and_title(target: str) -> tuple[list[StepRow], str]:
    """Rows for an experiment file, a single step output, or a prefix; plus a title."""
    if target.endswith(".json"):
        record = read_experiment(target)
        title = f"experiment {storage.basename(target)} ({record.get('caller')}, {record.get('created')})"
        return experiment_rows(record), title
    if storage.exists(storage.join(target, INFO_FILE)):
        fingerprints = current_fingerprints(prefix_of(target))
        rows = [row for row in prefix_rows(storage.dirname(target), fingerprints) if row.output_path == target]
        return rows, target
    return prefix_rows(target, current_fingerprints(target)), f"prefix {target}"


def prefix_of(output_path: str, max_depth: int = 3) -> str:
    """The prefix a step output lies under: the nearest parent holding `experiments/` (names may hold '/')."""
    parent = storage.dirname(output_path)
    for _level in range(max_depth):
        if storage.exists(storage.join(parent, EXPERIMENTS_DIR)):
            return parent
        parent = storage.dirname(parent)
    return storage.dirname(output_path)


def step_label(row: StepRow) -> str:
    """`tokenized/code-1a2b3c4d`: the full step name (it may hold '/') with the output's hash suffix."""
    short = storage.basename(row.name)
    if row.label.startswith(short + "-"):
        return row.name + row.label[len(short) :]
    return row.label


def render_status(rows: list[StepRow], title: str, console: Console) -> None:
    table = Table(title=title, title_justify="left")
    for column in ("step", "status", "attempts", "updated", "digest", "worker / message", "path"):
        table.add_column(column, overflow="fold")
    for row in rows:
        status = f"{row.status} - holder lost" if row.holder_lost else row.status or "never ran"
        style = "bold yellow" if row.holder_lost else STATUS_STYLES.get(status, "dim")
        note = row.state.message or row.state.worker or ""
        if row.progress:
            done, total = row.progress.get("shards_done", 0), row.progress.get("shards_total", 0)
            note = f"shards {done}/{total}, {row.progress.get('rows', 0)} rows; {note}"
        if row.drift:
            note = f"code drift! {note}"
        digest = row.state.digest[:DIGEST_CHARS] if row.state.digest else ""
        table.add_row(
            step_label(row),
            f"[{style}]{status}[/]",
            str(row.state.attempts),
            row.state.updated or "",
            digest,
            note,
            row.output_path,
        )
    console.print(table)
    for row in rows:
        if row.holder_lost:  # a line of its own, never folded: the one thing to know about a dead run
            console.print(f"{step_label(row)}: {row.shown_status} ({row.output_path})", markup=False, soft_wrap=True)
    counts = status_counts(rows)
    console.print(
        "  ".join(f"[{STATUS_STYLES.get(key, 'dim')}]{key}[/]: {value}" for key, value in sorted(counts.items()))
    )
