"""`python -m executor status|explain|verify|compare|pin|dashboard|publish|wandb-sync`: what a DAG left in storage.

python -m executor status outputs                     # every step under a prefix
python -m executor status 'outputs/experiments/demo-*.json'   # experiment files (several, or a glob)
python -m executor status outputs --latest demo       # the newest experiment of experiments/demo.py
python -m executor explain outputs/tokenizer-5e6f7a8b # why this hash; diff vs other versions
python -m executor explain outputs 'tokenize.*'       # by step name (a regex matching the whole name)
python -m executor verify outputs                     # recompute checksums of every finished step
python -m executor compare outputs other/outputs      # same hash, same result? (exit 1 if not)
python -m executor pin experiments/demo.py            # pin its finished steps' digests: experiments/demo.pins.json
python -m executor dashboard --prefix outputs         # live read-only web view at http://127.0.0.1:8765/
python -m executor publish --prefix outputs --to site --watch 60   # a static public site, republished each minute
python -m executor wandb-sync outputs/train/hero-1a2b3c4d  # upload a train step's offline wandb run

A target is a prefix, one step's output folder, or experiment files (paths or quoted globs). Code drift
is judged against the fingerprint the newest experiment file recorded for each step (this command
cannot import your code). A target that does not exist, or whose object store does not answer within 12 s
(offline, no credentials: executor/store/probe.py), is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from executor.cli.executor_main import configure_logging, resolve_prefix
from executor.cli.status_table import prefix_of, render_status, rows_and_title
from executor.cli.wandb_sync import WandbSyncError, sync_step
from executor.dag.compare import compare_prefixes
from executor.dag.explain import explain_output
from executor.dag.patterns import PatternError, compile_pattern
from executor.dag.pins import PinError, write_pins
from executor.dag.records import verify_manifest
from executor.store import storage
from executor.store.events import StepStatus
from executor.store.experiments import current_fingerprints, latest_experiment, read_experiment
from executor.store.layout import INFO_FILE
from executor.store.probe import StoreUnreachableError, probe
from executor.store.step_rows import CORRUPT, StepRow, prefix_rows
from executor.watch.site.files import PublishError
from executor.watch.training.alerts import AlertConfigError

EXAMPLES = "\n".join("  " + line for line in __doc__.split("\n\n")[1].splitlines())


class TargetError(ValueError):
    """A command-line target that names nothing stored; the CLI prints it as one line."""


def expand_targets(targets: Sequence[str]) -> list[str]:
    """Absolute paths of the targets, quoted globs expanded (sorted); a target matching nothing is an error."""
    found: list[str] = []
    for target in targets:
        target = storage.make_absolute(target)
        if any(char in target for char in "*?["):
            fs, fs_path = storage.filesystem(target)
            matches = sorted(fs.glob(fs_path))
            if not matches:
                raise TargetError(f"{target}: no file matches this pattern")
            found.extend(fs.unstrip_protocol(match) if storage.is_url(target) else match for match in matches)
        elif target.endswith(".json") and not probe(target):
            raise TargetError(f"{target}: no such experiment file (list them: ls {storage.dirname(target)})")
        elif not target.endswith(".json") and not probe(target):
            raise TargetError(
                f"{target}: nothing is stored there (no such prefix, step output or bucket); check the path"
            )
        else:
            found.append(target)
    return found


def _with_latest(targets: list[str], latest: str | None) -> list[str]:
    """`--latest NAME` turns a prefix target into its newest experiment file of `experiments/NAME.py`."""
    if latest is None:
        return targets
    chosen = []
    for target in targets or [storage.make_absolute(resolve_prefix(None))]:
        experiment = latest_experiment(target, latest)
        if experiment is None:
            raise TargetError(f"{target}: no experiment file of {latest!r} under {storage.join(target, 'experiments')}")
        chosen.append(experiment)
    return chosen


def _selected_rows(target: str, name: str | None) -> tuple[list[StepRow], str]:
    rows, title = rows_and_title(target)
    if name:
        pattern = compile_pattern(name, "--name", (row.name for row in rows))
        rows = [row for row in rows if pattern.fullmatch(row.name)]
    return rows, title


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    worst = 0
    for target in _with_latest(expand_targets(args.targets or [resolve_prefix(None)]), args.latest):
        rows, title = _selected_rows(target, args.name)
        if not rows:
            console.print(f"no steps found under {target}")
            worst = max(worst, 1)
            continue
        render_status(rows, title, console)
        worst = max(worst, 1 if any(row.status in (StepStatus.FAILED, CORRUPT) for row in rows) else 0)
    return worst


def _candidates(target: str) -> tuple[list[tuple[str, str]], str]:
    """(step name, output path) of the steps `explain TARGET NAME` chooses from, and where they come from."""
    if target.endswith(".json"):
        return [(step["name"], step["output_path"]) for step in read_experiment(target)["steps"]], target
    experiment = latest_experiment(target)
    if experiment is not None:
        steps = read_experiment(experiment)["steps"]
        return [(step["name"], step["output_path"]) for step in steps], f"the newest experiment {experiment}"
    return [(row.name, row.output_path) for row in prefix_rows(target)], f"every step stored under {target}"


def _outputs_for(target: str, name: str | None, console: Console) -> list[str]:
    """The outputs to explain; when the prefix holds other versions of a chosen name, say which is shown."""
    if name is None:
        return [target]
    candidates, source = _candidates(target)
    pattern = compile_pattern(name, "explain STEP", (step_name for step_name, _path in candidates))
    chosen = [(step_name, path) for step_name, path in candidates if pattern.fullmatch(step_name)]
    if target.endswith(".json") or not chosen:
        return [path for _name, path in chosen]
    stored = [(row.name, row.output_path) for row in prefix_rows(target)]
    for step_name in dict.fromkeys(step_name for step_name, _path in chosen):
        versions = sorted(path for stored_name, path in stored if stored_name == step_name)
        shown = [path for chosen_name, path in chosen if chosen_name == step_name]
        if any(path not in shown for path in versions):
            console.print(
                f"{step_name}: {len(versions)} versions stored; explaining {', '.join(shown)} (from {source}). "
                f"Others: {', '.join(path for path in versions if path not in shown)} (explain one by its path)",
                highlight=False,
                markup=False,
            )
    return [path for _name, path in chosen]


def _explain_target(target: str, step: str | None, console: Console) -> int:
    outputs = _outputs_for(target, step, console)
    if not outputs:
        console.print(f"no step matching {step!r} under {target}")
        return 1
    if target.endswith(".json"):
        steps = read_experiment(target)["steps"]
        fingerprints = {entry["output_path"]: entry.get("code_fingerprint") for entry in steps}
    else:
        fingerprints = current_fingerprints(target if step is not None else prefix_of(target))
    for output_path in outputs:
        try:
            report = explain_output(output_path, fingerprints.get(output_path))
        except FileNotFoundError as error:
            console.print(f"[red]{error}[/]")
            return 1
        console.print(report.render(), highlight=False, markup=False)
        console.print()
    return 0


def cmd_explain(args: argparse.Namespace, console: Console) -> int:
    """Each target (a quoted glob may name several step outputs or experiment files) in turn."""
    return max(_explain_target(target, args.step, console) for target in expand_targets([args.target]))


def _verify_one(output_path: str, console: Console) -> bool:
    problems = verify_manifest(output_path)
    if problems:
        console.print(f"[red]{output_path}: {len(problems)} problem(s)[/]")
        for problem in problems:
            console.print(f"  {problem}", markup=False)
    else:
        console.print(f"[green]{output_path}: every file matches its manifest[/]")
    return not problems


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    """One output: verify it. A prefix or experiment file: every SUCCESS step in it, then a summary."""
    worst = 0
    for target in expand_targets(args.targets):
        if not target.endswith(".json") and storage.exists(storage.join(target, INFO_FILE)):
            worst = max(worst, 0 if _verify_one(target, console) else 1)
            continue
        rows, title = rows_and_title(target)
        finished = [row for row in rows if row.status == StepStatus.SUCCESS]
        bad = [row for row in finished if not _verify_one(row.output_path, console)]
        unfinished = len(rows) - len(finished)
        style = "red" if bad else "green"
        console.print(
            f"[{style}]{title}: {len(finished) - len(bad)} of {len(finished)} finished step(s) match their "
            f"manifests; {len(bad)} with problems; {unfinished} not finished (not verified)[/]"
        )
        worst = max(worst, 1 if bad or not rows else 0)
    return worst


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    """Exit 1 when a step with the same hash holds different bytes under the two prefixes."""
    for target in (args.a, args.b):
        if not storage.exists(target):
            raise TargetError(f"{target}: no such prefix")
    if args.rtol is not None and not 0 <= args.rtol < 1:
        raise TargetError(f"--rtol {args.rtol}: give a relative tolerance in [0, 1), e.g. 1e-5")
    comparison = compare_prefixes(args.a, args.b, args.experiment, args.rtol, args.recorded, args.bytes)
    console.print(comparison.render(), highlight=False, markup=False)
    return 1 if comparison.differing else 0


def cmd_pin(args: argparse.Namespace, console: Console) -> int:
    path, pins, left_out = write_pins(args.experiment, storage.make_absolute(resolve_prefix(args.prefix)), args.to)
    console.print(f"pinned {len(pins)} step(s) (name, version hash, output digest) in {path}", highlight=False)
    if left_out:
        console.print(f"not pinned, not finished: {', '.join(left_out)}", highlight=False, markup=False)
    script = args.experiment if args.experiment.endswith(".py") else "EXPERIMENT.py"
    console.print(f"run with it: python {script} --pins {path}", highlight=False, markup=False)
    return 0


def cmd_dashboard(args: argparse.Namespace, console: Console) -> int:
    from executor.watch.server import serve  # imported here: the other commands do not need the web server

    serve(storage.make_absolute(resolve_prefix(args.prefix)), host=args.host, port=args.port)
    return 0


def cmd_publish(args: argparse.Namespace, console: Console) -> int:
    from executor.watch.site.publish import open_hint, publish  # imported here, like the dashboard

    prefix = resolve_prefix(args.prefix)
    if args.watch:  # it publishes until interrupted: say how to open the site first
        console.print(f"publishing {prefix} to {args.to} every {args.watch:g} s; {open_hint(args.to)}", soft_wrap=True)
    publish(prefix, args.to, watch_s=args.watch, webhook_url=args.webhook)
    if not args.watch:
        console.print(f"published {prefix} to {args.to}; {open_hint(args.to)}", soft_wrap=True)
    return 0


def cmd_wandb_sync(args: argparse.Namespace, console: Console) -> int:
    for run in sync_step(args.output_path):
        console.print(f"uploaded {run}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m executor",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, example: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    status = command(
        "status", "status of the steps under a prefix or in experiment files", "python -m executor status outputs"
    )
    status.add_argument("targets", nargs="*", help="prefixes, experiment JSON files or globs, or step output paths")
    status.add_argument("--name", help="only steps whose whole name matches this regex")
    status.add_argument("--latest", metavar="NAME", help="the newest experiment file of experiments/NAME.py")
    explain = command("explain", "why a step's hash is what it is", "python -m executor explain outputs '^tokenizer$'")
    explain.add_argument("target", help="a step's output path, or a prefix / experiment JSON with STEP")
    explain.add_argument(
        "step", nargs="?", help="regex matching whole step names (when target is a prefix or experiment)"
    )
    verify = command(
        "verify", "recompute checksums of finished steps against their manifests", "python -m executor verify outputs"
    )
    verify.add_argument("targets", nargs="+", help="step output paths, prefixes, or experiment JSON files or globs")
    compare = command(
        "compare",
        "whether two prefixes hold the same results under the same step hashes (docs/reproducibility.md)",
        "python -m executor compare outputs /mnt/other/outputs --rtol 1e-5",
    )
    compare.add_argument("a", help="a prefix (local, gs://, s3://)")
    compare.add_argument("b", help="the prefix to compare it with")
    compare.add_argument("--experiment", metavar="FILE", help="only the steps of this experiment JSON file")
    compare.add_argument(
        "--rtol",
        type=float,
        help="let the numbers of JSON/JSONL files (metrics, stats) differ by this relative tolerance",
    )
    compare.add_argument(
        "--recorded", action="store_true", help="compare the digests the steps recorded instead of reading every file"
    )
    compare.add_argument(
        "--bytes",
        action="store_true",
        help="ask for the same bytes: no measured times, prefixes, checkpoint file names or run records set aside",
    )
    pin = command(
        "pin",
        "write a pin file: each finished step's name, version hash and output digest; runs given it fail loudly",
        "python -m executor pin experiments/hero_535b.py --prefix outputs",
    )
    pin.add_argument("experiment", help="an experiment script (its newest run under --prefix) or experiment JSON file")
    pin.add_argument("--prefix", help="for a script: where it ran (default: $EXECUTOR_PREFIX, else ./outputs)")
    pin.add_argument("--to", help="where to write the pin file (default: beside the experiment, NAME.pins.json)")
    dashboard = command(
        "dashboard",
        "serve a live, read-only web dashboard of a prefix",
        "python -m executor dashboard --prefix outputs",
    )
    dashboard.add_argument("--prefix", help="default: $EXECUTOR_PREFIX, else ./outputs (local, gs://, s3://)")
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="bind address; anything but loopback is logged as a warning"
    )
    dashboard.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    publish = command(
        "publish",
        "write a static, read-only site of every experiment under a prefix (docs/watching.md)",
        "python -m executor publish --prefix outputs --to gs://my-public-bucket/site --watch 60",
    )
    publish.add_argument("--prefix", help="default: $EXECUTOR_PREFIX, else ./outputs (local, gs://, s3://)")
    publish.add_argument("--to", required=True, help="destination: a local folder, gs://bucket/path or s3://...")
    publish.add_argument("--watch", type=float, metavar="SECONDS", help="republish what changed every SECONDS")
    publish.add_argument("--webhook", help="POST each new alert as JSON to this URL")
    wandb_sync = command(
        "wandb-sync",
        "upload a train step's offline wandb runs (when the network allows)",
        "python -m executor wandb-sync outputs/train/hero-1a2b3c4d",
    )
    wandb_sync.add_argument("output_path", help="a train step's output path (local, gs://, s3://)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    console = Console(width=200) if not sys.stdout.isatty() else Console()
    handlers = {"status": cmd_status, "explain": cmd_explain, "verify": cmd_verify, "compare": cmd_compare,
                "pin": cmd_pin, "dashboard": cmd_dashboard, "publish": cmd_publish,
                "wandb-sync": cmd_wandb_sync}  # fmt: skip
    try:
        return handlers[args.command](args, console)
    except (
        TargetError,
        PatternError,
        StoreUnreachableError,
        FileNotFoundError,
        PublishError,
        AlertConfigError,
        WandbSyncError,
        PinError,
    ) as error:
        print(f"python -m executor {args.command}: {error}", file=sys.stderr)
        return 2
