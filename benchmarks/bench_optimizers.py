"""The tiny ladder under each optimizer, side by side: the table in docs/hero.md ("The hero's recipe"), produced.

Runs `experiments/hero_535b.py --scale tiny --backend ray` once with `--optimizer hero` and once with
`--optimizer adamw`, both under one prefix, so the data steps (corpus, dedup, filters, tokenizer, mixture, caches,
eval suite) run once and each optimizer trains and evaluates its own four rungs, fits its own law and trains its
own hero. It then reads each run's finished files through the experiment file the run wrote under
`<prefix>/experiments/` (the newest whose train steps all use that optimizer): the rungs' `evaluate/<rung>`
`results.json` (`macro_loss`, the eval suite's macro loss in nats per token), `scaling/ladder`'s
`prediction.json` (the fit and the hero's predicted loss with its 90% band) and `evaluate/<hero>`'s
`results.json` (the achieved loss). It writes them to benchmarks/results/optimizers.json and renders the table
into docs/hero.md between the markers `BEGIN` and `END` below, and the `hero` column, the DAG `make demo` runs, as
the tiny ladder's own table between `LADDER_BEGIN` and `END`; the last line printed is that JSON.

    python benchmarks/bench_optimizers.py                     # trains both ladders in a temporary prefix
    python benchmarks/bench_optimizers.py --prefix /tmp/opt   # keeps the prefix; run again, it trains nothing
    python benchmarks/bench_optimizers.py --render            # only re-render docs/hero.md from the committed JSON

On this shared 2-core machine the defaults took 28 minutes on 2026-12-06, while other jobs pushed the load
average past 60 (the JSON holds each run's wall time and the load); `hero`'s whole DAG alone took 8.5 minutes at a
load near 7.
tests/project/test_optimizer_table.py fails when docs/hero.md's block is not what `--render` writes.

optimizers.json:

    {"date": "2026-12-06", "started": ISO time (UTC), "git_commit": the worktree's HEAD,
     "machine": {"cores", "cpu_model", "cpu_id", "vector_isa", "memory_gib": benchmarks/results.py's `machine()`
                 (the file of 2026-12-06 has the model name alone),
                 "load_average_start": [1, 5, 15 min], "load_average_end": [...]},
     "optimizers": {"hero" | "adamw": {
         "recipe": the column's label (the rungs' train config, in words),
         "wall_seconds": the run's wall time (the first run's includes the shared data steps),
         "rungs": [{"name": "d768", "flops": training FLOPs, "loss": evaluate's macro_loss,
                    "d_model": the train step's model width, "steps": its train steps}, ...],
         "fit": {"E", "A", "alpha", "rms_log_residual"}: L(C) = E + A C^-alpha, E fixed by the ladder,
         "hero": {"name", "flops", "d_model", "steps", "predicted", "low", "high", "achieved",
                  "relative_error": (achieved - predicted) / predicted, "inside": low <= achieved <= high}}}}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Run as a script from anywhere or imported by a test: this checkout's executor, the benchmarks' `results` and the
# tests' `run_processes`.
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests" / "support")]

from results import machine as machine_record  # noqa: E402
from results import record  # noqa: E402
from run_processes import run_demo  # noqa: E402

from executor import storage  # noqa: E402
from executor.dag.records import cpu_words  # noqa: E402
from executor.store.experiments import experiments_by_age, parse_experiment  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "optimizers.json"
DOC = REPO / "docs" / "hero.md"
BEGIN = "<!-- generated: optimizer-comparison (benchmarks/bench_optimizers.py) -->"
LADDER_BEGIN = "<!-- generated: tiny-ladder (benchmarks/bench_optimizers.py) -->"
"""docs/hero.md's tiny ladder under `LADDER_OPTIMIZER`, the recipe `make demo` trains: one block between this
marker and `END`, as the comparison is."""
END = "<!-- end generated -->"
LADDER_OPTIMIZER = "hero"
OPTIMIZERS = ("hero", "adamw")
"""In run order: the first run also runs the data steps both share. Columns are rendered adamw first."""
COLUMNS = ("adamw", "hero")
RUN_TIMEOUT_S = 3600
DOC_WIDTH = 115
"""docs/hero.md's line width, for the notes under the table."""


def run_ladder(prefix: str, optimizer: str, log: Path) -> float:
    """The tiny hero DAG under `optimizer`; returns its wall seconds. Its output goes to `log`."""
    code, seconds, _output = run_demo(prefix, log, "--optimizer", optimizer, env=os.environ, timeout_s=RUN_TIMEOUT_S)
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the tiny ladder with --optimizer {optimizer} failed (exit {code}); end of {log}:\n{tail}")
    return seconds


def _recipe_label(train_config: dict[str, Any]) -> str:
    decay = f"{train_config['lr_schedule']} to {train_config['min_lr_ratio']:.0%}"
    if train_config["optimizer"] == "hero":
        return f"MuonH / AdamH / Adam, heuristic rates, {decay}"
    return f"lr {train_config['learning_rate']:g}, {decay}"


def _read_json(path: str) -> dict[str, Any]:
    document = storage.read_json(path)
    if document is None:
        raise FileNotFoundError(f"{path} is missing: did its step finish? Rerun with the same --prefix")
    return document


def _trains_with(record: dict[str, Any], optimizer: str) -> bool:
    trains = [step for step in record.get("steps", []) if step["name"].startswith("train/")]
    return bool(trains) and all(step["config"].get("optimizer") == optimizer for step in trains)


def read_figures(prefix: str, optimizer: str) -> dict[str, Any]:
    """One optimizer's figures from the newest experiment file under `prefix` whose train steps all use it."""
    found = [(file, record) for file, record in experiments_by_age(prefix) if _trains_with(record, optimizer)]
    if not found:
        raise FileNotFoundError(f"no experiment file under {prefix}/experiments trained with {optimizer}")
    file, record = found[-1]
    experiment = parse_experiment(prefix, file, record)
    output_of = {step.name: step.output_path for step in experiment.steps}
    config_of = {step["name"]: step["config"] for step in record["steps"]}

    def loss_of(name: str) -> float:
        return _read_json(storage.join(output_of[f"evaluate/{name}"], "results.json"))["macro_loss"]

    prediction = _read_json(storage.join(output_of["scaling/ladder"], "prediction.json"))

    def run_of(name: str) -> dict[str, Any]:
        """The train step's size: its model width and its steps."""
        train = config_of[f"train/{name}"]
        return {"d_model": train["shape"]["d_model"], "steps": train["num_train_steps"]}

    rungs = [
        {"name": rung["name"], "flops": rung["compute"], "loss": loss_of(rung["name"]), **run_of(rung["name"])}
        for rung in prediction["rungs"]
    ]
    target, band, fit = prediction["target"], prediction["prediction"], prediction["fit"]
    achieved = loss_of(target["name"])
    return {
        "recipe": _recipe_label(config_of[f"train/{rungs[0]['name']}"]),
        "rungs": rungs,
        "fit": {"E": fit["asymptote"], "A": fit["A"], "alpha": fit["alpha"],
                "rms_log_residual": fit["rms_log_residual"]},
        "hero": {"name": target["name"], "flops": target["compute"], **run_of(target["name"]),
                 "predicted": band["loss"], "low": band["low"],
                 "high": band["high"], "achieved": achieved,
                 "relative_error": (achieved - band["loss"]) / band["loss"],
                 "inside": band["low"] <= achieved <= band["high"]},
    }  # fmt: skip


def _flops(value: float) -> str:
    """1.7e10, as the docs write FLOPs."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def render_block(results: dict[str, Any]) -> str:
    """The markdown between the markers: the table, the per-rung differences, the date and the machine."""
    columns = [results["optimizers"][name] for name in COLUMNS]
    heroes = [column["hero"] for column in columns]
    lines = [_row("run", [f"`{name}` ({column['recipe']})" for name, column in zip(COLUMNS, columns, strict=True)]),
             "|---|---|---|"]  # fmt: skip
    for index, rung in enumerate(columns[0]["rungs"]):
        flops = _flops(rung["flops"]) + (" FLOPs" if index == 0 else "")
        lines.append(_row(f"{rung['name']} ({flops})", [f"{column['rungs'][index]['loss']:.3f}" for column in columns]))
    asymptotes = {column["fit"]["E"] for column in columns}
    fits = [f"L = {c['fit']['E']:.3g} + {c['fit']['A']:.2f} C^-{c['fit']['alpha']:.4f}" for c in columns]
    residuals = [f"{column['fit']['rms_log_residual']:.4f}" for column in columns]
    fits = [f"{fits[0]} (rms log residual {residuals[0]})", f"{fits[1]} ({residuals[1]})"]
    lines.append(_row(f"fit, E = {next(iter(asymptotes)):.3g}" if len(asymptotes) == 1 else "fit", fits))
    predicted = [f"{hero['predicted']:.3f}, band {hero['low']:.3f} .. {hero['high']:.3f}" for hero in heroes]
    lines.append(_row(f"hero ({_flops(heroes[0]['flops'])}) predicted", predicted))
    achieved = [
        f"{hero['achieved']:.3f}, {100 * hero['relative_error']:+.2f}%, {'inside' if hero['inside'] else 'OUTSIDE'}"
        for hero in heroes
    ]
    lines.append(_row("hero achieved", achieved))
    pairs = zip(columns[0]["rungs"], columns[1]["rungs"], strict=True)
    differences = ", ".join(f"{second['loss'] - first['loss']:+.3f} ({first['name']})" for first, second in pairs)
    machine = results["machine"]
    start, end = (
        " / ".join(f"{load:.1f}" for load in machine[key]) for key in ("load_average_start", "load_average_end")
    )
    minutes = {name: results["optimizers"][name]["wall_seconds"] / 60 for name in OPTIMIZERS}
    notes = [
        f"`{COLUMNS[1]}` minus `{COLUMNS[0]}` per rung: {differences}; alpha {columns[1]['fit']['alpha']:.4f} against"
        f" {columns[0]['fit']['alpha']:.4f}.",
        f"Produced by `python benchmarks/bench_optimizers.py` on {results['date']} (commit {results['git_commit'][:8]})"
        f" on {machine['cores']} cores ({cpu_words(machine)}), load average (1 / 5 / 15 min) {start} at the start and"
        f" {end} at the end: `{OPTIMIZERS[0]}` {minutes[OPTIMIZERS[0]]:.1f} min with the shared data steps,"
        f" `{OPTIMIZERS[1]}` {minutes[OPTIMIZERS[1]]:.1f} min; figures in `benchmarks/results/optimizers.json`.",
    ]
    for note in notes:
        lines += ["", textwrap.fill(note, width=DOC_WIDTH, break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


def render_ladder(results: dict[str, Any]) -> str:
    """The markdown of the tiny ladder block: `LADDER_OPTIMIZER`'s rungs, fit and hero, with where they came from."""
    found = results["optimizers"][LADDER_OPTIMIZER]
    hero, fit = found["hero"], found["fit"]
    lines = ["| run | d_model | steps | FLOPs | suite macro loss (nats per token) |", "|---|---|---|---|---|"]
    for rung in found["rungs"]:
        lines.append(_row(rung["name"], [str(rung["d_model"]), str(rung["steps"]), _flops(rung["flops"]),
                                         f"{rung['loss']:.3f}"]))  # fmt: skip
    lines.append(_row(f"fit, E = {fit['E']:.3g}", ["", "", "", f"alpha {fit['alpha']:.4f} (rms log residual "
                                                                f"{fit['rms_log_residual']:.4f})"]))  # fmt: skip
    size = [str(hero["d_model"]), str(hero["steps"]), _flops(hero["flops"])]
    lines.append(_row(f"{hero['name']} (hero) predicted", [*size, f"{hero['predicted']:.3f}, band {hero['low']:.3f}"
                                                                  f" .. {hero['high']:.3f}"]))  # fmt: skip
    verdict = "inside the band" if hero["inside"] else "OUTSIDE the band"
    achieved = f"{hero['achieved']:.3f}, {100 * hero['relative_error']:+.2f}%, {verdict}"
    lines.append(_row(f"{hero['name']} (hero) achieved", ["", "", "", achieved]))
    machine = results["machine"]
    note = (
        f"The `{LADDER_OPTIMIZER}` column of `python benchmarks/bench_optimizers.py`'s run on {results['date']}"
        f" (commit {results['git_commit'][:8]}, {machine['cores']} cores: {cpu_words(machine)}), the DAG `make demo`"
        " runs; figures in `benchmarks/results/optimizers.json`. They are that CPU's: another vector extension lands"
        " elsewhere in the band ([On one machine](#on-one-machine)); `bench_demo`'s latest run, with its machine, is on"
        " the [benchmarks page](benchmarks.md#bench_demo)."
    )
    return "\n".join([*lines, "", textwrap.fill(note, width=DOC_WIDTH, break_long_words=False)])


def _render_between(text: str, begin: str, body: str) -> str:
    """`text` with what lies between `begin` and the next `END` replaced by `body`."""
    start = text.find(begin)
    end = text.find(END, start + len(begin)) if start >= 0 else -1
    if start < 0 or end < 0:
        raise ValueError(f"{DOC} has no `{begin}` ... `{END}` block to render into")
    # Blank lines around the block: Markdown would read a table glued to an HTML comment as part of it.
    return text[: start + len(begin)] + "\n\n" + body + "\n\n" + text[end:]


def render_docs(results: dict[str, Any], text: str) -> str:
    """`text` (docs/hero.md) with the comparison block and the tiny ladder block rendered from `results`."""
    text = _render_between(text, BEGIN, render_block(results))
    return _render_between(text, LADDER_BEGIN, render_ladder(results))


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def measure(prefix: str, log: Path) -> dict[str, Any]:
    """Both ladders under `prefix`, then their figures (module docstring)."""
    now = datetime.datetime.now(datetime.UTC)
    results: dict[str, Any] = {
        "date": now.date().isoformat(), "started": now.isoformat(timespec="seconds"), "git_commit": git_commit(),
        "machine": {**{key: value for key, value in machine_record().items() if key != "load_average"},
                    "load_average_start": list(os.getloadavg())},
    }  # fmt: skip
    seconds = {}
    for optimizer in OPTIMIZERS:
        print(f"training the tiny ladder with {optimizer} under {prefix} (log: {log})", flush=True)
        seconds[optimizer] = run_ladder(prefix, optimizer, log)
    results["machine"]["load_average_end"] = list(os.getloadavg())
    results["optimizers"] = {
        optimizer: {**read_figures(prefix, optimizer), "wall_seconds": round(seconds[optimizer], 1)}
        for optimizer in OPTIMIZERS
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefix", default=None, help="the runs' prefix, kept (default: a temporary one)")
    parser.add_argument("--render", action="store_true", help=f"only re-render {DOC.name} from {RESULTS.name}")
    args = parser.parse_args()
    if args.render:
        results = json.loads(RESULTS.read_text())
    elif args.prefix is not None:
        Path(args.prefix).mkdir(parents=True, exist_ok=True)
        results = measure(args.prefix, Path(args.prefix).with_suffix(".log"))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-optimizers-") as scratch:
            results = measure(os.path.join(scratch, "prefix"), Path(scratch) / "runs.log")
    DOC.write_text(render_docs(results, DOC.read_text()))
    if not args.render:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        record("bench_optimizers", headline(results), parser, args, variant=("prefix",))
    else:
        print(json.dumps(results))


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """The benchmarks page's figures (benchmarks/results/bench_optimizers.json): per optimizer, each rung's loss,
    the fitted alpha, and the hero's prediction, band and landing; the whole table is optimizers.json."""
    figures: dict[str, Any] = {}
    for optimizer, found in results["optimizers"].items():
        hero = found["hero"]
        figures[optimizer] = {
            **{rung["name"]: round(rung["loss"], 4) for rung in found["rungs"]},
            "alpha": round(found["fit"]["alpha"], 4),
            "hero_predicted": round(hero["predicted"], 4),
            "hero_low": round(hero["low"], 4),
            "hero_high": round(hero["high"], 4),
            "hero_achieved": round(hero["achieved"], 4),
            "hero_relative_error": round(hero["relative_error"], 4),
            "hero_inside": hero["inside"],
        }
    return figures


if __name__ == "__main__":
    main()
