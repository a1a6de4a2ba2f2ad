"""The 535B-A23B MoE run as one DAG: data -> cells -> tokenize -> two-phase mixture -> 4-rung ladder -> hero.

    download/<source> -> data/exact_dedup (all sources at once) -> data/<source>/heuristics -> fasttext_filter
        -> data/fuzzy_dedup (all sources at once) -> data/<source>/decontaminate
        (sources: web, code, math, reference, books; the dedup steps skip the exempt ones (reference) and
         write docs/<source>/; quality/fasttext_model learns reference vs web; decontamination against
         download/eval_sets)
    every source's clean docs -> tokenizer/hero (BPE) -> mix/cells (topic x quality) -> tokenized/cells
                                                          mix/cells -> mix/weights (two phases, exposure cap)
    eval_suite/text (tiny) or download/paloma (full) -> the decontamination steps' eval sets, and with
        tokenizer/hero -> eval_suite (each held-out subset capped to the same tokens; the ladder's metric)
    train/d768, d1024, d1536, d2048 -> evaluate/<rung> -> scaling/ladder -> train/d6144 -> evaluate/d6144

    python experiments/hero_535b.py --scale full --dry_run true --plan_json plan.json   # the real plan, in < 1 s
    python experiments/hero_535b.py --scale full --hardware h100 --dry_run true   # refused: the hero does not fit
    python experiments/hero_535b.py --scale tiny            # the same DAG on 2 CPU cores (`make demo`)
    python experiments/hero_535b.py --scale tiny            # again: every step is skipped
    python experiments/hero_535b.py --scale tiny --force_run '["evaluate/d6144"]'

Full scale is the published recipe: hidden d, layers 8/12/16/22/48, 384 routed experts (top-8) of width d/2
in a d/2 latent, 2 shared experts, sliding-window attention with every 4th layer global, vocabulary
128,256, sequence 4096, and the ladder's batch sizes and steps (`FULL_RUNGS`). Sources stand for the
hero's ~292 (their URLs are where such data lives; the real run listed each). Tiny scale keeps every step,
edge and name; it swaps the data for offline text (steps/corpora/real_corpus.py: web <- docstrings of installed
packages, code <- the stdlib, math <- sympy/mpmath/scipy docstrings, reference <- pydoc topics, books <-
the KJV, eval sets quoting some of them) and the models for ones a CPU trains in a minute, of the same
architecture (`tiny_shape`). The one extra step, `raw/real_corpus`, stands in for the internet.

The full recipe combines experts by sigmoid renormalised to 2.5 and computes in bf16; each full train and
evaluate step carries a parallelism and memory plan for the `--hardware` profile (`FULL_DEVICES`;
steps/train/parallelism.py), and a plan that does not fit is refused before any step runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from executor import (
    ConfigError,
    Executor,
    ExecutorStep,
    ResourceConfig,
    executor_main,
    install_excepthook,
    output_path_of,
    storage,
)
from experiments.defaults import (
    default_cells,
    default_decontaminate,
    default_dedup,
    default_download,
    default_fasttext_filter,
    default_fuzzy_dedup,
    default_mixture_weights,
    default_quality_classifier,
    default_quality_heuristics,
    default_real_corpus,
    default_tokenizer,
    docs_of_source,
)
from experiments.eval_suite import default_eval_suite, suite_text
from experiments.train_defaults import (
    Recipe,
    Rung,
    default_evaluate,
    default_scaling,
    default_tokenize_cells,
    default_train,
)
from steps.data.source_schema import SourceSchema, check_source_schema
from steps.model.model_size import MoeShape, ladder_shape
from steps.scaling.ladder_config import SUITE_MACRO_LOSS
from steps.train.hardware import HARDWARE, Hardware, host_resources
from steps.train.parallelism import ParallelismPlan, devices_per_domain, expert_parallel_size, refuse_unless_fits
from steps.train.step_time import StepTimeForecast, domains_used
from steps.train.train_config import OPTIMIZERS

logger = logging.getLogger(__name__)

SOURCES = ("web", "code", "math", "reference", "books")
DEFAULT_HARDWARE = "gb200"
"""The hero's own: GB200 NVL72 racks."""
PHASE_FRACTIONS = (0.8, 0.2)
"""Pretraining, then the cooldown mixture from 80% of the steps."""


@dataclass(frozen=True)
class Scale:
    """Everything that differs between the full run and its tiny stand-in; the DAG's shape does not."""

    name: str
    sources: dict[str, dict]
    """Source -> keyword arguments of its download (`source`, `include`)."""
    eval_sets: dict
    keep_fraction: dict[str, float]
    """Per source, the share the fastText filter keeps."""
    vocab_size: int
    tokenizer_sample_bytes: int
    topics: int
    quality_buckets: int
    cells_sample_docs: int
    validation_fraction: float
    rungs: tuple[Rung, ...]
    hero: Rung
    recipe: Recipe
    corpus: dict = field(default_factory=dict)
    """Tiny only: the offline corpus standing in for the sources (default_real_corpus arguments)."""
    irreducible_loss: float = 1.69
    """The fixed asymptote E of the ladder's fit (the published method; steps/scaling/scaling.py). Full scale:
    Chinchilla's fitted E (Hoffmann et al. 2022), a stand-in until the team's own ladder sets it."""
    fuzzy_bands: tuple[int, int] = (16, 6)
    dedup_exempt: tuple[str, ...] = ("reference",)
    """Sources the global exact and fuzzy dedup passes leave out (the hero exempted 16 of its 292): curated
    ones, deduplicated upstream, kept whole rather than losing pages to copies in sources read before them."""
    bootstrap_samples: int = 1000
    """Draws behind the prediction's band where the asymptote is free (the DAG fixes it)."""
    suite_tokens_per_subset: int = 1 << 20
    """Tokens of each eval suite subset (full: Paloma's subsets, up to 256 sequences of 4096 each; tiny: exactly
    the eval batches' sequences, so every eval reads each subset whole)."""


FULL_RUNGS = (
    ("d768", 768, 8, 1024, 11_420),
    ("d1024", 1024, 12, 2048, 15_276),
    ("d1536", 1536, 16, 6144, 15_128),
    ("d2048", 2048, 22, 11_264, 20_072),
)
"""(rung, d_model, layers, batch, steps): the published ladder."""
FULL_HERO = ("d6144", 6144, 48, 11_264, 390_251)
FULL_DEVICES = {"gb200": (64, 1024), "h100": (8, 8), "tpu_v5p": (64, 1024)}
"""Hardware -> (devices of each ladder rung, devices of the hero). GB200: a rung on 64 GPUs of one NVL72 rack,
the hero on 64 GPUs of each of 16 racks (1,024: data 16 x EP64, 11 sequences each; each rack's other 8 GPUs
are spares). The published run used 11 racks, but a data axis of 11 divides neither d_model 6144 nor the
experts' width 3072, and JAX lays out no uneven split (`levanter_config.uneven_splits`); the batch of
11,264 = 2^10 x 11 sequences leaves data 8 (512 GPUs, 159 of 167 usable GB: too tight) or 16. H100: one
8-GPU node each (the hero does not fit: refused); TPU v5p: 64 chips, the hero on 1,024."""


def _full_rung(spec: tuple[str, int, int, int, int], hardware: Hardware, devices: int) -> Rung:
    """A published rung on `devices` of `hardware`: its steps run as gangs of one JAX process per host
    (executor/run/gang.py), each host asking Ray for its devices (steps/train/hardware.py), placed fast domain by fast
    domain (the hero's 256 hosts as 16 racks of 16)."""
    name, d_model, layers, batch, steps = spec
    shape = ladder_shape(d_model, layers)
    per_domain = devices_per_domain(devices, expert_parallel_size(shape, devices, hardware), hardware)
    resources = host_resources(hardware, devices // hardware.devices_per_host, per_domain // hardware.devices_per_host)
    return Rung(name, shape, batch, steps, resources, hardware, devices)


def with_stand_in_hosts(scale: Scale, hosts: int) -> Scale:
    """`scale` with every rung's (and the hero's) train and evaluate steps run as gangs of `hosts` stand-in
    hosts on this machine, over the same global fake CPU devices as the one-host run (`TINY_DEVICES`), so only
    the process layout changes and the result is the one-host run's. Resources are not hashed: the steps keep
    their paths."""

    def gang(rung: Rung) -> Rung:
        devices = rung.resources.hosts * (rung.resources.cpu_devices_per_host or 1)
        if devices % hosts:
            raise ConfigError(
                f"--hosts {hosts}: rung {rung.name} runs on {devices} fake CPU devices, which {hosts} stand-in "
                f"hosts cannot share evenly; pick a number of hosts that divides {devices}"
            )
        resources = ResourceConfig(hosts=hosts, cpu_devices_per_host=devices // hosts, cpus=1 / hosts)
        return dataclasses.replace(rung, resources=resources)

    return dataclasses.replace(scale, rungs=tuple(gang(rung) for rung in scale.rungs), hero=gang(scale.hero))


def full_scale(hardware: Hardware = HARDWARE[DEFAULT_HARDWARE]) -> Scale:
    rung_devices, hero_devices = FULL_DEVICES[hardware.name]
    hub = "hf://datasets"
    return Scale(
        name="full",
        # What each source's Parquet files hold (checked by `check_sources` where the Hub is reachable). The code
        # source is The Stack v1 (dedup): v2's files carry Software Heritage blob ids, not file contents.
        sources={
            "web": {"source": f"{hub}/HuggingFaceFW/fineweb-edu/data", "include": ["*/*.parquet"],
                    "schema": SourceSchema("text", "id", license="ODC-By 1.0")},
            "code": {"source": f"{hub}/bigcode/the-stack-dedup/data", "include": ["*/*.parquet"],
                     "schema": SourceSchema("content", "hexsha", gated=True,
                                            license="permissively licensed files, each under its own license "
                                                    "(max_stars_repo_licenses); The Stack's terms of use")},
            "math": {"source": f"{hub}/open-web-math/open-web-math/data", "include": ["*.parquet"],
                     "schema": SourceSchema("text", "url", license="ODC-By 1.0")},
            "reference": {"source": f"{hub}/wikimedia/wikipedia/20231101.en", "include": ["*.parquet"],
                          "schema": SourceSchema("text", "id", license="CC BY-SA 3.0 and GFDL")},
            "books": {"source": f"{hub}/manu/project_gutenberg/data", "include": ["*.parquet"],
                      "schema": SourceSchema("text", "id", license="public domain in the US (Project Gutenberg)")},
        },
        eval_sets={"source": f"{hub}/cais/mmlu/all", "include": ["test-*.parquet"],
                   "schema": SourceSchema("question", None, license="MIT")},
        keep_fraction={"web": 0.3, "code": 0.9, "math": 0.8, "reference": 0.9, "books": 0.8},
        vocab_size=128_256,
        tokenizer_sample_bytes=10 << 30,
        topics=40,
        quality_buckets=5,
        cells_sample_docs=1_000_000,
        validation_fraction=0.001,
        rungs=tuple(_full_rung(rung, hardware, rung_devices) for rung in FULL_RUNGS),
        hero=_full_rung(FULL_HERO, hardware, hero_devices),
        recipe=Recipe(
            learning_rate=3e-4,
            warmup=0.01,
            optimizer="hero",
            router_combine="sigmoid",
            router_combine_sum=2.5,
            compute_dtype="bfloat16",
            peak_flops_per_device=hardware.peak_flops_per_device,
            temporary_checkpoint_seconds=1800,
            eval_batch_size=1024,  # 4,096 sequences per subset, in batches that split over the hero's 1,024
            eval_batches=4,
        ),
    )


def tiny_shape(d_model: int, layers: int, vocab_size: int) -> MoeShape:
    """The hero's recipe (`ladder_shape`) in small: heads of 8; KV heads 2 on local layers (window 16 of the
    64-token sequence) and 1 on global ones (every 4th and the last); 8 routed experts (top-2), each a SwiGLU
    of width d/2 inside a d/2 latent; two shared experts of width d/2."""
    half = d_model // 2
    return MoeShape(
        d_model=d_model,
        n_layers=layers,
        vocab_size=vocab_size,
        n_heads=d_model // 8,
        head_dim=8,
        kv_heads_local=2,
        kv_heads_global=1,
        global_every=4,
        sliding_window=16,
        n_experts=8,
        top_k=2,
        expert_width=half,
        latent_dim=half,
        n_shared_experts=2,
        shared_width=half,
        seq_len=64,
    )


TINY_VOCAB = 1024
TINY_RUNGS = (("d768", 32, 2, 100), ("d1024", 48, 2, 140), ("d1536", 64, 2, 180), ("d2048", 96, 2, 240))
"""(rung it stands for, d_model, layers, steps), batch 8 of 64 tokens. Two layers, so that every model has a
local layer and a global one (the last). Steps grow with width so that compute spans 11x over the rungs
(1.7e10 to 1.9e11 FLOPs; the hero 4.0e11) and each rung sees enough tokens (51k to 123k) to learn well past the
unigram loss; a step costs about 0.1 s here, so the steps add about a minute to the demo, which compiles for
longer than it trains."""
TINY_HERO = ("d6144", 128, 2, 320)
TINY_EVAL_BATCHES = 4
"""Eval batches of 8 sequences per cell and per suite subset, in every eval: each subset holds exactly that."""
TINY_DEVICES = 2
"""Fake CPU devices of each tiny train and evaluate step (the batch splits over them): `--hosts 2` spreads the
same two over two processes, so a gang's result is the one-host run's (a different device count sums in
another order, which the tiny recipe amplifies to ~0.02 in the prediction). Layout only, never hashed."""


def tiny_scale() -> Scale:
    corpus_domains = {
        "web": "web_docstrings",
        "code": "code_stdlib",
        "math": "math_docstrings",
        "reference": "reference_pydoc",
        "books": "prose_kjv",
    }
    devices = ResourceConfig(cpu_devices_per_host=TINY_DEVICES)
    rung = lambda name, d, layers, steps: Rung(name, tiny_shape(d, layers, TINY_VOCAB), 8, steps, devices)  # noqa: E731
    return Scale(
        name="tiny",
        sources={source: {"include": [f"{domain}.*"]} for source, domain in corpus_domains.items()},
        eval_sets={"include": ["*.jsonl"]},
        keep_fraction={"web": 0.7, "code": 0.95, "math": 0.9, "reference": 0.9, "books": 0.9},
        vocab_size=TINY_VOCAB,
        tokenizer_sample_bytes=1_500_000,
        topics=4,
        quality_buckets=2,
        cells_sample_docs=2000,
        validation_fraction=0.1,
        rungs=tuple(rung(*spec) for spec in TINY_RUNGS),
        hero=rung(*TINY_HERO),
        recipe=Recipe(
            learning_rate=1e-2,  # AdamW's (`--optimizer adamw`, the comparison docs/hero.md's recipe table shows)
            warmup=0.1,
            # The hero's recipe at the published heuristic's constants (no refit): on this DAG every rung trains
            # lower than under AdamW at 1e-2 and the hero lands in its band (the figures: docs/hero.md's tables,
            # rendered by benchmarks/bench_optimizers.py from a finished run).
            optimizer="hero",
            # Levanter's mixture rounds each component's count in a block down (the rest to the largest): 8
            # sequences served a cell planned at 8.3% nothing; 512 serves every cell of 1% or more within 10%,
            # and the hero's phases are 4 and 1 whole blocks (batch 8, phase from step 256 of 320).
            mixture_block_size=512,
            evals_per_run=5,
            eval_batch_size=8,
            eval_batches=TINY_EVAL_BATCHES,
            checkpoints_per_run=2,
            temporary_checkpoint_seconds=20,
        ),
        corpus={"docs_per_domain": 120, "near_copies": 2, "eval_docs": 4, "domains": list(corpus_domains.values()),
                "cross_copies": 2},
        fuzzy_bands=(16, 6),
        # One bit per byte (about what large models reach on English text) at the eval suite's 1.97 bytes per token
        # (the mean over its subsets, eval_suite's suite.json): ln 2 x 1.97 nats. The ladder's metric is the suite's,
        # so its text sets E (the training text's 2.79 bytes per token gave 1.93 for the cells). Never the runs.
        # The suite read from the locked packages (issue 37) has 1.78 bytes per token (ln 2 x 1.78 = 1.23); on its
        # rungs the fit predicts 4.9428 with E = 1.23 and 4.9436 with 1.36, so E stays and no hash moves for it.
        irreducible_loss=1.36,
        bootstrap_samples=300,
        suite_tokens_per_subset=8 * TINY_EVAL_BATCHES * 64,
    )


SCALES = {"full": full_scale, "tiny": tiny_scale}


@dataclass
class HeroDag:
    steps: list[ExecutorStep]
    trains: dict[str, tuple[Rung, ExecutorStep]]
    """Rung name -> (rung, its train step)."""
    evaluates: dict[str, tuple[Rung, ExecutorStep]]
    """Rung name -> (rung, its evaluate step)."""
    scaling: ExecutorStep
    hero_eval: ExecutorStep
    recipe: Recipe
    """What every rung shares (its expert capacity and eval batch size the plans)."""
    eval_sets: int = 0
    """Sets each eval of a train step reads: every cell's validation split and every suite subset."""


def _data_chain(scale: Scale, downloads: dict[str, ExecutorStep], classifier: ExecutorStep, eval_paths: list[Any],
                steps: list[ExecutorStep]) -> list[ExecutorStep]:  # fmt: skip
    """Global exact dedup -> per-source heuristics and fastText -> global fuzzy dedup -> per-source decontamination;
    appends the steps to `steps` and returns each source's clean documents. The two dedup steps run over every
    source not in `scale.dedup_exempt` at once (a page copied into two sources is kept once, from the earlier
    source) and write `docs/<source>/`, so the per-source steps after them still see one source each."""
    deduplicated = [source for source in downloads if source not in scale.dedup_exempt]
    exact = default_dedup([downloads[s] for s in deduplicated], name="data/exact_dedup", sources=deduplicated)
    filtered: dict[str, ExecutorStep] = {}
    per_source: list[ExecutorStep] = []
    for source, fetched in downloads.items():
        heuristics = default_quality_heuristics(
            docs_of_source(exact, source) if source in deduplicated else fetched,
            skip_sources=["*"] if source == "code" else ["code_*"],
            name=f"data/{source}/heuristics",
        )
        filtered[source] = default_fasttext_filter(
            heuristics, classifier, scale.keep_fraction[source], name=f"data/{source}/fasttext_filter"
        )
        per_source += [heuristics, filtered[source]]
    fuzzy = default_fuzzy_dedup(
        [filtered[s] for s in deduplicated], *scale.fuzzy_bands, name="data/fuzzy_dedup", sources=deduplicated
    )
    clean = [
        default_decontaminate(
            docs_of_source(fuzzy, source) if source in deduplicated else filtered[source],
            eval_paths,
            name=f"data/{source}/decontaminate",
        )
        for source in downloads
    ]
    steps += [exact, *per_source, fuzzy, *clean]
    return clean


def build_dag(scale: Scale) -> HeroDag:
    """Every step of the run at `scale`."""
    steps: list[ExecutorStep] = []
    corpus = None
    if scale.corpus:
        corpus = default_real_corpus(**scale.corpus)
        steps.append(corpus)

    def download(name: str, spec: dict) -> ExecutorStep:
        if "source" in spec:
            return default_download(name, spec["source"], include=spec["include"], schema=spec.get("schema"))
        if corpus is None:
            raise ConfigError(f"scale {scale.name}: download {name} names no source and the scale has no corpus")
        source = output_path_of(corpus, "eval" if name == "eval_sets" else "raw")
        return default_download(name, source, include=spec["include"])

    evals = download("eval_sets", scale.eval_sets)
    downloads = {source: download(source, spec) for source, spec in scale.sources.items()}
    classifier = default_quality_classifier(
        positive=output_path_of(downloads["reference"], "files"), negative=output_path_of(downloads["web"], "files")
    )
    suite_source, suite_subsets = suite_text(paloma=scale.name == "full")
    steps += [evals, suite_source, *downloads.values(), classifier]
    # Decontamination removes the benchmark's items and the eval suite's text from every source.
    clean = _data_chain(scale, downloads, classifier, [output_path_of(evals, "files"), *suite_subsets.values()],
                        steps)  # fmt: skip

    tokenizer = default_tokenizer(
        clean, vocab_size=scale.vocab_size, sample_bytes=scale.tokenizer_sample_bytes, name="tokenizer/hero"
    )
    cells = default_cells(
        clean,
        tokenizer,
        classifier,
        topics=scale.topics,
        quality_buckets=scale.quality_buckets,
        sample_docs=scale.cells_sample_docs,
    )
    tokenized = default_tokenize_cells(cells, tokenizer, scale.validation_fraction)
    cooldown = [0.25 + 1.75 * b / max(1, scale.quality_buckets - 1) for b in range(scale.quality_buckets)]
    weights = default_mixture_weights(
        cells,
        train_tokens=scale.hero.tokens,
        max_epochs=8.0,
        phase_fractions=PHASE_FRACTIONS,
        quality_multipliers=[[1.0] * scale.quality_buckets, cooldown],
    )
    suite = default_eval_suite(suite_subsets, tokenizer, scale.suite_tokens_per_subset, scale.hero.shape.seq_len)
    steps += [tokenizer, cells, tokenized, weights, suite]

    trains, evaluates, ladder = {}, {}, []
    eval_sets = scale.topics * scale.quality_buckets + len(suite_subsets)  # every cell's validation, every subset
    for rung in scale.rungs:
        trained = default_train(rung, scale.recipe, tokenizer, tokenized, weights, eval_suite=suite,
                                eval_sets=eval_sets)  # fmt: skip
        evaluated = default_evaluate(rung, scale.recipe, trained, tokenizer, tokenized, eval_suite=suite)
        trains[rung.name] = (rung, trained)
        evaluates[rung.name] = (rung, evaluated)
        ladder.append((rung, trained, evaluated))
        steps += [trained, evaluated]
    scaling = default_scaling(ladder, scale.hero, scale.irreducible_loss, scale.bootstrap_samples, SUITE_MACRO_LOSS)
    hero = default_train(scale.hero, scale.recipe, tokenizer, tokenized, weights, prediction=scaling, eval_suite=suite,
                         eval_sets=eval_sets)  # fmt: skip
    hero_eval = default_evaluate(scale.hero, scale.recipe, hero, tokenizer, tokenized, eval_suite=suite)
    trains[scale.hero.name] = (scale.hero, hero)
    evaluates[scale.hero.name] = (scale.hero, hero_eval)
    steps += [scaling, hero, hero_eval]
    return HeroDag(steps=steps, trains=trains, evaluates=evaluates, scaling=scaling, hero_eval=hero_eval,
                   recipe=scale.recipe, eval_sets=eval_sets)  # fmt: skip


def step_plans(dag: HeroDag) -> dict[ExecutorStep, ParallelismPlan]:
    """Every train and evaluate step's parallelism and memory plan (none at a scale without hardware)."""
    plans = {}
    for steps, training in ((dag.trains, True), (dag.evaluates, False)):
        for rung, step in steps.values():
            plan = rung.plan(dag.recipe, training)
            if plan is not None:
                plans[step] = plan
    return plans


def refuse_what_does_not_fit(dag: HeroDag) -> None:
    """Raise PlanDoesNotFitError for the first train or evaluate step whose plan does not fit its devices."""
    for step, plan in step_plans(dag).items():
        refuse_unless_fits(f"{step.name} ({step.description})", plan, step.config.shape.value)


def check_sources(scale: Scale) -> list[str]:
    """Each URL source's schema against one of its Parquet files, where its metadata is reachable; raises
    `SourceSchemaError` for a source without its text column, before anything is planned or run."""
    specs = {**scale.sources, "eval_sets": scale.eval_sets}
    return [check_source_schema(name, spec["source"], spec["include"], spec["schema"])
            for name, spec in specs.items() if "source" in spec and "schema" in spec]  # fmt: skip


def plan_entries(executor: Executor, dag: HeroDag) -> list[dict]:
    """The plan as JSON rows: every step's name, hash, output path and action; train steps add their figures,
    train and evaluate steps their parallelism plan (hardware, hosts, devices, mesh, microbatch, memory, fits)."""
    figures = {step: rung.figures() for rung, step in dag.trains.values()}
    plans, forecasts = step_plans(dag), step_time_forecasts(dag)
    entries = []
    for decision in executor.decisions:
        planned = decision.planned
        entry: dict[str, Any] = {
            "name": planned.step.name,
            "hash": planned.hash,
            "output_path": planned.output_path,
            "action": decision.action,
            "reason": decision.reason,
        }
        entry.update(figures.get(planned.step, {}))
        if planned.step in plans:
            entry.update(plans[planned.step].as_json())
        if planned.step in forecasts:
            entry["step_time_estimate"] = forecasts[planned.step].bound.as_json()
            entry["step_time_forecast"] = forecasts[planned.step].as_json()
        entries.append(entry)
    return entries


def step_time_forecasts(dag: HeroDag) -> dict[ExecutorStep, StepTimeForecast]:
    """Every planned train step's roofline bound and forecast step time (steps/train/step_time.py)."""
    forecasts = {}
    for rung, step in dag.trains.values():
        forecast = rung.forecast(dag.recipe, dag.eval_sets)
        if forecast is not None:
            forecasts[step] = forecast
    return forecasts


def across(plan: ParallelismPlan, domains: int) -> str:
    """Which axis runs across the plan's fast domains: the mesh's `domain` axis, or `data` over a part-filled last
    domain; with one domain, `data` stays inside it."""
    if "domain" in plan.mesh:
        return "'domain' across them (the mesh's outermost axis), 'data' inside each"
    return f"'data' {'across' if domains > 1 else 'inside'} them"


def print_estimate(plan: ParallelismPlan, hardware: Hardware, forecast: StepTimeForecast, flops: float) -> None:
    """The layout over fast domains, each collective's axis and bytes, the roofline bound beside the plan and the
    forecast (steps/train/step_time.py), each with the hours it gives."""
    estimate = forecast.bound
    domains, per_domain = domains_used(plan, hardware)
    print(f"          layout: {domains} fast domain(s) of {hardware.fast_domain_devices} {hardware.name}s, {per_domain}"
          f" devices used in each; 'expert' inside a domain, {across(plan, domains)}")
    for collective in estimate.collectives:
        where = "crosses domains" if collective.crosses_domains else "inside a domain"
        print(f"            {collective.name:<36} on {collective.axis:<24} {where:<15} "
              f"{collective.fast_bytes / 1e9:9.2f} GB fast + {collective.slow_bytes / 1e9:7.2f} GB slow per device"
              f"{'' if collective.overlapped else ', on the critical path'}")
    terms = ", ".join(f"{name} {seconds:.3g}" for name, seconds in estimate.terms_s().items())
    hours, expected_hours = (flops / (mfu * plan.devices * hardware.peak_flops_per_device) / 3600
                             for mfu in (estimate.mfu, forecast.mfu))
    print(f"          estimate (roofline, not measured): {estimate.step_s:.3g} s/step ({terms}; "
          f"{estimate.serial_s:.3g} s with nothing overlapped), {estimate.tokens_per_s:.3g} tokens/s, "
          f"MFU at most {estimate.mfu:.0%}, {hours:,.1f} hours")
    terms = ", ".join(f"{name} {seconds:.3g}" for name, seconds in forecast.terms_s().items())
    print(f"          forecast (fitted to Marin's MFUs): {forecast.step_s:.3g} s/step ({terms}), MFU "
          f"{forecast.mfu:.1%}, {expected_hours:,.1f} hours")


def optimizer_line(rung: Rung, recipe: Recipe) -> str:
    """A rung's optimizer and the hyperparameters its train step gets (the heuristic's, under "hero")."""
    min_lr_ratio, schedule = rung.schedule(recipe)
    decay = f"{schedule} decay to {min_lr_ratio:.0%} of peak after {recipe.warmup:.0%} warm-up"
    settings = rung.hero_hyperparameters(recipe)
    if settings is None:
        rate = rung.learning_rate or recipe.learning_rate
        return f"adamw, lr {rate:.3g}, weight decay {recipe.weight_decay}, {decay}"
    return (f"hero ({recipe.heuristic.version}): muonh_lr {settings.muonh_lr:.4g}, adamh_lr {settings.adamh_lr:.4g}, "
            f"adam_lr {settings.adam_lr:.4g}, beta1 {settings.beta1}, beta2 {settings.beta2:.6g}, "
            f"epsilon {settings.epsilon:.4g}, {decay}")  # fmt: skip


def print_totals(scale: Scale, dag: HeroDag) -> None:
    """Per training run: size, tokens, FLOPs and, on planned hardware, hosts, devices, mesh, microbatch, memory
    per device, the roofline bound and the forecast (steps/train/step_time.py) and the forecast's hours; then the
    totals."""
    print(f"\nTraining at scale {scale.name} (hours at each run's forecast MFU, fitted to Marin's measured MFUs):")
    total_tokens = total_flops = device_hours = 0.0
    for rung, _ in dag.trains.values():
        figures = rung.figures()
        print(
            f"  {rung.name:>6}: {figures['total_params'] / 1e9:8.3f}B total, {figures['active_params'] / 1e9:7.3f}B "
            f"active, {rung.tokens:.3g} tokens, {rung.flops:.2g} FLOPs"
        )
        print(f"          optimizer: {optimizer_line(rung, dag.recipe)}")
        plan, forecast = rung.plan(dag.recipe), rung.forecast(dag.recipe, dag.eval_sets)
        hours = rung.hours(forecast.mfu) if forecast is not None else None
        if plan is not None and forecast is not None and rung.hardware is not None and hours is not None:
            memory = plan.memory
            print(
                f"          {plan.hosts} hosts x {plan.devices // plan.hosts} {plan.hardware} = {plan.devices} devices,"
                f" mesh {plan.mesh}, microbatch {plan.microbatch}, remat {plan.remat},"
                f" {memory.total / 1e9:.1f} GB/device of {plan.memory_limit_bytes / 1e9:.0f} (params"
                f" {memory.parameters / 1e9:.1f}, grads {memory.gradients / 1e9:.1f}, optimizer"
                f" {memory.optimizer_state / 1e9:.1f}, activations "
                f"{memory.activations / 1e9:.1f}, dispatch {memory.dispatch / 1e9:.1f})"
                f"{'' if plan.fits else ' DOES NOT FIT'}, {hours:,.1f} hours"
            )
            print_estimate(plan, rung.hardware, forecast, rung.flops)
            device_hours += hours * plan.devices
        total_tokens += rung.tokens
        total_flops += rung.flops
    print(f"  all: {total_tokens:.3g} tokens, {total_flops:.3g} FLOPs, {device_hours:,.0f} device-hours")


def print_run_summary(executor: Executor, dag: HeroDag) -> None:
    """What ran, where it is, the predicted vs achieved hero loss, and how to watch it."""
    print(f"\n{executor.summary()}; outputs under {executor.prefix}")
    prediction = storage.read_json(storage.join(executor.output_paths[dag.scaling], "prediction.json"))
    achieved = storage.read_json(storage.join(executor.output_paths[dag.hero_eval], "results.json"))
    if prediction is not None:
        p = prediction["prediction"]
        print(
            f"  predicted {prediction['target']['name']} loss: {p['loss']:.4f} (band {p['low']:.4f} .. {p['high']:.4f})"
            f"  [{executor.output_paths[dag.scaling]}/prediction.json]"
        )
    if achieved is not None:
        print(f"  achieved macro held-out loss: {achieved['macro_loss']:.4f} on {achieved.get('metric', 'components')}"
              f" ({achieved['macro_bpb']:.3f} bits per byte)  [{executor.output_paths[dag.hero_eval]}]")
    if prediction is not None and achieved is not None:
        p, loss = prediction["prediction"], achieved["macro_loss"]
        where = "inside" if p["low"] <= loss <= p["high"] else "OUTSIDE"
        print(f"  achieved vs predicted: {100 * (loss - p['loss']) / p['loss']:+.2f}%, {where} the band")
    print(f"  watch it: python -m executor dashboard --prefix {executor.prefix}")
    print(f"  publish it: python -m executor publish --prefix {executor.prefix} --to {executor.prefix}-site --watch 60")


def _is_dry_run(executor_args: Sequence[str]) -> bool:
    """Whether the arguments left for `executor_main` ask for a dry run (it parses them again itself)."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--dry_run", default="false")
    return peek.parse_known_args(list(executor_args))[0].dry_run.lower() == "true"


def main(argv: Sequence[str] | None = None) -> Executor:
    install_excepthook()  # a flag mistake here reads as one line too, as it does in executor_main
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="hero_535b.py", description=__doc__.split("\n")[0], add_help=False,
        epilog="The executor's own flags (--prefix, --dry_run, --force_run, --yes, ...) follow; `python -m executor "
               "--help` for the inspection commands.",
    )  # fmt: skip
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny",
                        help="tiny: the same DAG on 2 CPU cores (default); full: the 535B plan")  # fmt: skip
    parser.add_argument("--plan_json", default=None, help="also write the plan as JSON to this path")
    parser.add_argument("--check_sources", choices=["auto", "true", "false"], default="auto",
                        help="read each URL source's Parquet schema first (auto: on dry runs)")  # fmt: skip
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default=DEFAULT_HARDWARE,
                        help="accelerators of the full-scale plan (steps/train/hardware.py)")  # fmt: skip
    parser.add_argument("--hosts", type=int, default=1,
                        help="tiny scale: run each train and evaluate step as a gang of N stand-in hosts sharing its "
                             "fake CPU devices (TINY_DEVICES)")  # fmt: skip
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                        help="train every rung and the hero with this optimizer instead of the scale's recipe's "
                             "(steps/train/optimizer.py)")  # fmt: skip
    if "--help" in argv or "-h" in argv:  # this file's flags, then executor_main's (it prints them and exits)
        print(parser.format_help())
        executor_main([], args=["--help"])
    known, rest = parser.parse_known_args(argv)
    if known.hosts < 1:
        raise ConfigError(f"--hosts {known.hosts}: a step needs at least 1 host; give --hosts 1 or more")
    scale = full_scale(HARDWARE[known.hardware]) if known.scale == "full" else SCALES[known.scale]()
    if known.hosts > 1:
        if known.scale != "tiny":
            raise ConfigError("--hosts stands hosts in on this machine (tiny scale); full scale plans its hosts")
        scale = with_stand_in_hosts(scale, known.hosts)
    if known.optimizer is not None:
        scale = dataclasses.replace(scale, recipe=dataclasses.replace(scale.recipe, optimizer=known.optimizer))
    if known.check_sources == "true" or (known.check_sources == "auto" and _is_dry_run(rest)):
        for line in check_sources(scale):
            print(line)
    dag = build_dag(scale)
    refuse_what_does_not_fit(dag)
    started = time.perf_counter()
    executor = executor_main(dag.steps, description=f"535B-A23B MoE run at scale {scale.name}", args=rest)
    if executor.dry_run:
        print(f"planned {len(executor.decisions)} steps in {time.perf_counter() - started:.2f} s")
        print_totals(scale, dag)
    else:
        print_run_summary(executor, dag)
    if known.plan_json:
        Path(known.plan_json).write_text(json.dumps(plan_entries(executor, dag), indent=1))
    return executor


if __name__ == "__main__":
    main()
