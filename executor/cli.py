"""`python -m executor status|explain|verify`: inspect what a DAG left in storage.

python -m executor status outputs                     # every step under a prefix
python -m executor status outputs/experiments/demo-1a2b3c4d.json
python -m executor explain outputs/tokenizer-5e6f7a8b # why this hash; diff vs other versions
python -m executor explain outputs tokenizer          # by step name (regex) under a prefix
python -m executor verify outputs/tokenizer-5e6f7a8b  # recompute checksums vs the manifest
python -m executor dashboard --prefix outputs         # live read-only web view at http://127.0.0.1:8765/
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from executor import storage
from executor.explain import explain_output
from executor.inventory import (
    StepRow,
    experiment_rows,
    latest_experiment,
    load_experiment,
    prefix_rows,
    status_counts,
)
from executor.main import configure_logging, resolve_prefix
from executor.records import verify_manifest
from executor.status import INFO_FILE

STATUS_STYLES = {
    "SUCCESS": "green",
    "RUNNING": "cyan",
    "WAITING": "yellow",
    "FAILED": "bold red",
    "DEP_FAILED": "red",
}


def _rows_and_title(target: str) -> tuple[list[StepRow], str, dict[str, str]]:
    """Rows for an experiment file, a single step output, or a prefix; plus a title and fingerprints."""
    target = storage.make_absolute(target)
    if target.endswith(".json"):
        record = load_experiment(target)
        title = f"experiment {storage.basename(target)} ({record.get('caller')}, {record.get('created')})"
        return experiment_rows(record), title, {}
    if storage.exists(storage.join(target, INFO_FILE)):
        rows = [row for row in prefix_rows(storage.dirname(target)) if row.output_path == target]
        return rows, target, {}
    return prefix_rows(target), f"prefix {target}", {}


def render_status(rows: list[StepRow], title: str, console: Console) -> None:
    table = Table(title=title, title_justify="left")
    for column in ("step", "status", "attempts", "updated", "worker / message", "path"):
        table.add_column(column, overflow="fold")
    for row in rows:
        status = row.status or "never ran"
        style = STATUS_STYLES.get(status, "dim")
        note = row.message or row.worker or ""
        if row.progress:
            done, total = row.progress.get("shards_done", 0), row.progress.get("shards_total", 0)
            note = f"shards {done}/{total}, {row.progress.get('rows', 0)} rows; {note}"
        if row.drift:
            note = f"code drift! {note}"
        table.add_row(row.label, f"[{style}]{status}[/]", str(row.attempts), row.updated or "", note, row.output_path)
    console.print(table)
    counts = status_counts(rows)
    console.print(
        "  ".join(f"[{STATUS_STYLES.get(key, 'dim')}]{key}[/]: {value}" for key, value in sorted(counts.items()))
    )


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    rows, title, _ = _rows_and_title(args.target)
    if args.name:
        pattern = re.compile(args.name)
        rows = [row for row in rows if pattern.search(row.name)]
    if not rows:
        console.print(f"no steps found under {args.target}")
        return 1
    render_status(rows, title, console)
    return 1 if any(row.status == "FAILED" for row in rows) else 0


def _outputs_for(target: str, name: str | None) -> list[str]:
    target = storage.make_absolute(target)
    if name is None:
        return [target]
    if target.endswith(".json"):
        steps = load_experiment(target)["steps"]
        candidates = [(step["name"], step["output_path"]) for step in steps]
    else:
        experiment = latest_experiment(target)
        if experiment is not None:
            candidates = [(step["name"], step["output_path"]) for step in load_experiment(experiment)["steps"]]
        else:
            candidates = [(row.name, row.output_path) for row in prefix_rows(target)]
    pattern = re.compile(name)
    return [path for step_name, path in candidates if pattern.search(step_name)]


def cmd_explain(args: argparse.Namespace, console: Console) -> int:
    outputs = _outputs_for(args.target, args.step)
    if not outputs:
        console.print(f"no step matching {args.step!r} under {args.target}")
        return 1
    for output_path in outputs:
        try:
            report = explain_output(output_path)
        except FileNotFoundError as error:
            console.print(f"[red]{error}[/]")
            return 1
        console.print(report.render(), highlight=False, markup=False)
        console.print()
    return 0


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    worst = 0
    for output_path in args.outputs:
        problems = verify_manifest(storage.make_absolute(output_path))
        if problems:
            worst = 1
            console.print(f"[red]{output_path}: {len(problems)} problem(s)[/]")
            for problem in problems:
                console.print(f"  {problem}", markup=False)
        else:
            console.print(f"[green]{output_path}: every file matches its manifest[/]")
    return worst


def cmd_dashboard(args: argparse.Namespace, console: Console) -> int:
    from executor.dashboard import serve  # imported here: the other commands do not need the web server

    serve(storage.make_absolute(resolve_prefix(args.prefix)), host=args.host, port=args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m executor", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="status of every step under a prefix or of an experiment")
    status.add_argument("target", help="a prefix, an experiment JSON, or one step's output path")
    status.add_argument("--name", help="only steps whose name matches this regex")
    explain = commands.add_parser("explain", help="why a step's hash is what it is")
    explain.add_argument("target", help="a step's output path, or a prefix / experiment JSON with STEP")
    explain.add_argument("step", nargs="?", help="regex of step names (when target is a prefix or experiment)")
    verify = commands.add_parser("verify", help="recompute checksums of finished steps against their manifests")
    verify.add_argument("outputs", nargs="+", help="step output paths")
    dashboard = commands.add_parser("dashboard", help="serve a live, read-only web dashboard of a prefix")
    dashboard.add_argument("--prefix", help="default: $EXECUTOR_PREFIX, else ./outputs (local, gs://, s3://)")
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="bind address; anything but loopback is logged as a warning"
    )
    dashboard.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    console = Console(width=200) if not sys.stdout.isatty() else Console()
    handlers = {"status": cmd_status, "explain": cmd_explain, "verify": cmd_verify, "dashboard": cmd_dashboard}
    return handlers[args.command](args, console)
