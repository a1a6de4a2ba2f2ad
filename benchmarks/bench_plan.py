"""How planning and hashing scale: cost per step should stay flat from 1,000 to 10,000 steps.

The DAG is shaped like a data + training pipeline:

    download -> dedup -> filter -> tokenize      one chain per source (hundreds to thousands of sources)
    tokenize x 50 -> mixture                     fan-in: each mixture blends a group of sources
    mixture + previous checkpoint -> train       a ladder of training stages, depth >= 50
    train -> eval                                one eval per stage (a few extra evals pad to exactly N)

Configs are frozen dataclasses mixing versioned values (nested dataclasses, lists, dicts), plain
fields that are not hashed, `output_path_of(step, sub)` dependencies, non-blocking dependencies,
hard-coded input paths and `THIS_OUTPUT_PATH`. Planning is timed twice: with every step passed
to `build_plan`, as an experiment file that lists all its steps would, and with only the leaves
(steps nothing depends on), so that a cost that grows with the number of requested steps shows
up as the gap between the two.

    .venv/bin/python benchmarks/bench_plan.py                  # 1,000 and 10,000 steps
    .venv/bin/python benchmarks/bench_plan.py --sizes 500 5000 50000

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from results import record

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, InputName, output_path_of, this_output_path, versioned
from executor.dag.identity import walk_config
from executor.dag.plan import Plan, build_plan

PREFIX = "/tmp/prefix"
MIXTURE_GROUP = 50
"""Tokenized sources blended by one mixture step (the fan-in width)."""
MIN_LADDER_DEPTH = 50
"""Training stages, each resuming from the previous checkpoint: the longest chain in the DAG."""
STEPS_PER_SOURCE = 4
"""download, dedup, filter, tokenize."""


# --- configs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DedupParams:
    ngram_size: int
    jaccard_threshold: float
    num_permutations: int


@dataclass(frozen=True)
class FilterRule:
    name: str
    threshold: float


@dataclass(frozen=True)
class ModelSpec:
    hidden_dim: int
    num_layers: int
    activation: str


@dataclass(frozen=True)
class DownloadConfig:
    url: Any
    revision: Any
    output_path: Any
    num_threads: int = 16
    """Plain: not hashed."""


@dataclass(frozen=True)
class DedupConfig:
    input_path: Any
    params: Any
    languages: Any
    output_path: Any
    num_workers: int = 32


@dataclass(frozen=True)
class FilterConfig:
    input_path: Any
    rules: Any
    quality_threshold: Any
    output_path: Any
    report_path: Any
    log_level: str = "INFO"


@dataclass(frozen=True)
class TokenizeConfig:
    input_path: Any
    tokenizer: Any
    tokenizer_files: Any
    max_length: Any
    dedup_report: Any
    """Non-blocking: recorded in the version, never waited for."""
    output_path: Any
    cache_path: Any
    num_threads: int = 8


@dataclass(frozen=True)
class MixtureConfig:
    components: tuple[Any, ...]
    weights: Any
    seed: Any
    reference_stats: Any
    output_path: Any


@dataclass(frozen=True)
class TrainConfig:
    data: Any
    init_checkpoint: Any
    validation: Any
    model: Any
    optimizer: Any
    num_train_steps: Any
    output_path: Any
    checkpoint_dir: Any
    log_every: int = 100


@dataclass(frozen=True)
class EvalConfig:
    checkpoint: Any
    tasks: Any
    previous_metrics: Any
    output_path: Any
    batch_size: int = 64


def _plan_only(config: Any) -> None:
    """The function of every step; never called, because the benchmark only plans."""
    raise NotImplementedError("bench_plan plans the DAG and runs no step")


# --- the synthetic DAG ------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    sources: int
    mixtures: int
    ladder_depth: int
    extra_evals: int

    @property
    def total(self) -> int:
        return STEPS_PER_SOURCE * self.sources + self.mixtures + 2 * self.ladder_depth + self.extra_evals


def layout_for(target_steps: int) -> Layout:
    """Split `target_steps` into sources, mixtures and a ladder, padding with evals to hit it exactly."""
    ladder_depth = max(MIN_LADDER_DEPTH, target_steps // 20)
    budget = target_steps - 2 * ladder_depth
    if budget < STEPS_PER_SOURCE + 1:
        raise ValueError(f"{target_steps} steps is too few; use at least {2 * MIN_LADDER_DEPTH + STEPS_PER_SOURCE + 1}")
    sources = budget * MIXTURE_GROUP // (STEPS_PER_SOURCE * MIXTURE_GROUP + 1)
    while STEPS_PER_SOURCE * (sources + 1) + math.ceil((sources + 1) / MIXTURE_GROUP) <= budget:
        sources += 1
    mixtures = math.ceil(sources / MIXTURE_GROUP)
    extra_evals = budget - STEPS_PER_SOURCE * sources - mixtures
    return Layout(sources=sources, mixtures=mixtures, ladder_depth=ladder_depth, extra_evals=extra_evals)


def source_chain(index: int) -> list[ExecutorStep]:
    """download -> dedup -> filter -> tokenize for one source, in that order."""
    source = f"src{index:05d}"
    download = ExecutorStep(
        name=f"data/{source}/download",
        fn=_plan_only,
        config=DownloadConfig(
            url=versioned(f"https://data.example.com/{source}/v{1 + index % 3}/shards.json"),
            revision=versioned("2024-06-01"),
            output_path=THIS_OUTPUT_PATH,
        ),
    )
    dedup = ExecutorStep(
        name=f"data/{source}/dedup",
        fn=_plan_only,
        config=DedupConfig(
            input_path=output_path_of(download, "docs"),
            params=versioned(DedupParams(ngram_size=13, jaccard_threshold=0.8, num_permutations=128)),
            languages=versioned(["en", "de", "fr"] if index % 5 == 0 else ["en"]),
            output_path=THIS_OUTPUT_PATH,
        ),
    )
    quality_filter = ExecutorStep(
        name=f"data/{source}/filter",
        fn=_plan_only,
        config=FilterConfig(
            input_path=dedup / "docs",
            rules=versioned([FilterRule("min_words", 50), FilterRule("max_symbol_ratio", 0.1)]),
            quality_threshold=versioned(0.5),
            output_path=THIS_OUTPUT_PATH,
            report_path=this_output_path("report"),
        ),
    )
    tokenize = ExecutorStep(
        name=f"data/{source}/tokenize",
        fn=_plan_only,
        config=TokenizeConfig(
            input_path=quality_filter / "docs",
            tokenizer=versioned("meta-llama/Meta-Llama-3-8B"),
            tokenizer_files=InputName.hardcoded("gs://models/llama3/tokenizer"),
            max_length=versioned(8192),
            dedup_report=output_path_of(dedup, "report").nonblocking(),
            output_path=THIS_OUTPUT_PATH,
            cache_path=this_output_path("cache"),
        ),
    )
    return [download, dedup, quality_filter, tokenize]


def mixture_steps(tokenized: list[ExecutorStep], filters: list[ExecutorStep]) -> list[ExecutorStep]:
    mixtures: list[ExecutorStep] = []
    for start in range(0, len(tokenized), MIXTURE_GROUP):
        group = tokenized[start : start + MIXTURE_GROUP]
        mixtures.append(
            ExecutorStep(
                name=f"data/mixture{len(mixtures):03d}",
                fn=_plan_only,
                config=MixtureConfig(
                    components=tuple(output_path_of(step, "tokens") for step in group),
                    weights=versioned([round(1 / len(group), 6)] * len(group)),
                    seed=versioned(0),
                    reference_stats=output_path_of(filters[start], "report").nonblocking(),
                    output_path=THIS_OUTPUT_PATH,
                ),
            )
        )
    return mixtures


def training_ladder(layout: Layout, mixtures: list[ExecutorStep], filters: list[ExecutorStep]) -> list[ExecutorStep]:
    """Train stages resuming from each other's checkpoints, one eval per stage, extra evals at the end."""
    stages: list[ExecutorStep] = []
    evals: list[ExecutorStep] = []
    for stage in range(layout.ladder_depth):
        previous = stages[-1] if stages else None
        train = ExecutorStep(
            name=f"train/stage{stage:04d}",
            fn=_plan_only,
            config=TrainConfig(
                data=output_path_of(mixtures[stage % len(mixtures)], "tokens"),
                init_checkpoint=output_path_of(previous, "checkpoints/final") if previous else None,
                validation=output_path_of(filters[stage % len(filters)], "validation").nonblocking(),
                model=versioned(ModelSpec(hidden_dim=2048, num_layers=24, activation="swiglu")),
                optimizer=versioned({"name": "adamw", "lr": 3e-4 * 0.97**stage, "betas": [0.9, 0.95]}),
                num_train_steps=versioned(2000),
                output_path=THIS_OUTPUT_PATH,
                checkpoint_dir=this_output_path("checkpoints"),
            ),
        )
        stages.append(train)
        evals.append(eval_step(f"eval/stage{stage:04d}", train, ["mmlu", "hellaswag"], evals[-1] if evals else None))
    for extra in range(layout.extra_evals):
        train = stages[-1 - extra]
        evals.append(eval_step(f"eval/long_context/{train.name}", train, ["ruler", "needle"], None))
    return stages + evals


def eval_step(name: str, train: ExecutorStep, tasks: list[str], previous: ExecutorStep | None) -> ExecutorStep:
    return ExecutorStep(
        name=name,
        fn=_plan_only,
        config=EvalConfig(
            checkpoint=output_path_of(train, "checkpoints/final"),
            tasks=versioned(tasks),
            previous_metrics=output_path_of(previous, "metrics.json").nonblocking() if previous else None,
            output_path=THIS_OUTPUT_PATH,
        ),
    )


def build_pipeline(target_steps: int) -> list[ExecutorStep]:
    """A DAG of exactly `target_steps` distinct steps, dependencies first."""
    layout = layout_for(target_steps)
    sources = [step for index in range(layout.sources) for step in source_chain(index)]
    filters, tokenized = sources[2::STEPS_PER_SOURCE], sources[3::STEPS_PER_SOURCE]
    mixtures = mixture_steps(tokenized, filters)
    steps = sources + mixtures + training_ladder(layout, mixtures, filters)
    if len(steps) != target_steps:
        raise RuntimeError(f"the layout {layout} gives {len(steps)} steps, not {target_steps}")
    return steps


# --- measuring --------------------------------------------------------------------------------


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds `work` took, and its result."""
    gc.collect()
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def version_sizes(plan: Plan) -> dict[str, float]:
    sizes = [len(planned.version_str) for planned in plan.steps]
    ladder = [len(planned.version_str) for planned in plan.steps if planned.name.startswith("train/")]
    return {
        "max_version_json_chars": max(sizes),
        "mean_version_json_chars": round(statistics.fmean(sizes), 1),
        # Stage 0 has no checkpoint to resume from, so stage 1 is the first like the others.
        "train_version_chars_stage1": ladder[1],
        "train_version_chars_last": ladder[-1],
    }


def leaves(steps: list[ExecutorStep]) -> list[ExecutorStep]:
    """The steps no other step depends on (blocking or not); planning them reaches the whole DAG."""
    referenced = {
        id(marker.step)
        for step in steps
        for _key, marker in walk_config(step.config)
        if isinstance(marker, InputName) and marker.step is not None
    }
    return [step for step in steps if id(step) not in referenced]


def measure_plans(sizes: list[int], repeats: int) -> list[dict[str, float]]:
    """Best-of-`repeats` timings per size. Sizes take turns within each repeat, so a slow spell on
    a shared machine hits every size alike instead of skewing the ratio between them."""
    best = {size: {"construct_s": math.inf, "plan_s": math.inf, "leaves_s": math.inf} for size in sizes}
    plans: dict[int, Plan] = {}
    roots: dict[int, list[ExecutorStep]] = {}
    for _ in range(repeats):
        for size in sizes:
            timings = best[size]
            construct_s, steps = timed(functools.partial(build_pipeline, size))
            roots[size] = leaves(steps)
            plan_s, plans[size] = timed(functools.partial(build_plan, steps, PREFIX))
            leaves_s, leaves_plan = timed(functools.partial(build_plan, roots[size], PREFIX))
            for planned_steps in (plans[size].steps, leaves_plan.steps):
                if len(planned_steps) != size:
                    raise RuntimeError(f"expected {size} distinct planned steps, got {len(planned_steps)}")
            for key, seconds in (("construct_s", construct_s), ("plan_s", plan_s), ("leaves_s", leaves_s)):
                timings[key] = min(timings[key], seconds)
    return [
        {
            "steps": size,
            "leaves": len(roots[size]),
            **best[size],
            "construct_us_per_step": best[size]["construct_s"] / size * 1e6,
            "plan_us_per_step": best[size]["plan_s"] / size * 1e6,
            "leaves_us_per_step": best[size]["leaves_s"] / size * 1e6,
            **version_sizes(plans[size]),
        }
        for size in sizes
    ]


def measure_dry_run(target_steps: int, repeats: int) -> dict[str, float]:
    """`Executor.run(dry_run=True)` on a fresh empty local prefix: plan, then read every status file."""
    steps = build_pipeline(target_steps)

    def dry_run() -> None:
        with tempfile.TemporaryDirectory(prefix="bench_plan-") as prefix, contextlib.redirect_stdout(io.StringIO()):
            Executor(prefix=prefix).run(steps, dry_run=True)

    dry_run_s = min(timed(dry_run)[0] for _ in range(repeats))
    return {"steps": target_steps, "dry_run_s": dry_run_s, "dry_run_ms_per_step": dry_run_s / target_steps * 1e3}


def size_label(steps: int) -> str:
    return f"{steps // 1000}k" if steps % 1000 == 0 else str(steps)


def report_sizes(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Print one line per DAG size and the growth from smallest to largest; return the figures."""
    figures: dict[str, Any] = {}
    for result in results:
        label = size_label(result["steps"])
        print(
            f"{result['steps']:>7} steps: construct {result['construct_s'] * 1e3:7.1f} ms "
            f"({result['construct_us_per_step']:5.1f} us/step); plan all steps {result['plan_s'] * 1e3:7.1f} ms "
            f"({result['plan_us_per_step']:5.1f} us/step); plan from {result['leaves']} leaves "
            f"{result['leaves_s'] * 1e3:7.1f} ms ({result['leaves_us_per_step']:5.1f} us/step)"
        )
        print(
            f"{'':>7}        version JSON max {result['max_version_json_chars']} chars, mean "
            f"{result['mean_version_json_chars']}; train stage 1 {result['train_version_chars_stage1']} chars, "
            f"last stage {result['train_version_chars_last']}"
        )
        figures[f"construct_us_per_step_{label}"] = round(result["construct_us_per_step"], 2)
        figures[f"plan_us_per_step_{label}"] = round(result["plan_us_per_step"], 2)
        figures[f"plan_leaves_us_per_step_{label}"] = round(result["leaves_us_per_step"], 2)
        figures[f"max_version_json_chars_{label}"] = result["max_version_json_chars"]
    smallest, largest = results[0], results[-1]
    if len(results) > 1:
        growth = f"{size_label(largest['steps'])}_over_{size_label(smallest['steps'])}"
        ratio = largest["plan_s"] / smallest["plan_s"]
        leaves_ratio = largest["leaves_s"] / smallest["leaves_s"]
        size_ratio = largest["steps"] / smallest["steps"]
        print(
            f"plan time grows {ratio:.1f}x (all steps) and {leaves_ratio:.1f}x (from leaves) "
            f"for {size_ratio:.0f}x the steps; linear is {size_ratio:.0f}x"
        )
        figures[f"ratio_{growth}"] = round(ratio, 2)
        figures[f"ratio_leaves_{growth}"] = round(leaves_ratio, 2)
    figures["max_version_json_chars"] = max(result["max_version_json_chars"] for result in results)
    figures["mean_version_json_chars"] = largest["mean_version_json_chars"]
    figures["train_version_chars_stage1"] = largest["train_version_chars_stage1"]
    figures["train_version_chars_last"] = largest["train_version_chars_last"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000], help="DAG sizes in steps")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement; the fastest counts")
    parser.add_argument("--dry-run-size", type=int, default=1000, help="DAG size for the dry run (0 skips it)")
    args = parser.parse_args()

    figures = report_sizes(measure_plans(sorted(set(args.sizes)), args.repeats))
    if args.dry_run_size:
        dry = measure_dry_run(args.dry_run_size, args.repeats)
        print(
            f"{dry['steps']:>7} steps: dry run on an empty local prefix {dry['dry_run_s'] * 1e3:.1f} ms "
            f"({dry['dry_run_ms_per_step']:.3f} ms/step, planning and status reads)"
        )
        figures[f"dry_run_ms_per_step_{size_label(args.dry_run_size)}"] = round(dry["dry_run_ms_per_step"], 4)
    record("bench_plan", figures, parser, args)


if __name__ == "__main__":
    main()
