"""The 535B-A23B MoE run as one DAG: data -> cells -> tokenize -> two-phase mixture -> 4-rung ladder -> hero.

    download/<source> -> data/<source>/exact_dedup -> heuristics -> fasttext_filter -> fuzzy_dedup -> decontaminate
        (sources: web, code, math, reference, books; quality/fasttext_model learns reference vs web;
         decontamination against download/eval_sets)
    every source's clean docs -> tokenizer/hero (BPE) -> mix/cells (topic x quality) -> tokenized/cells
                                                          mix/cells -> mix/weights (two phases, exposure cap)
    train/d768, d1024, d1536, d2048 -> evaluate/<rung> -> scaling/ladder -> train/d6144 -> evaluate/d6144

    python experiments/hero_535b.py --scale full --dry_run true --plan_json plan.json   # the real plan, in < 1 s
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
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from executor import ExecutorStep, ResourceConfig, executor_main, output_path_of, storage
from executor.errors import ConfigError
from executor.executor import Executor
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
)
from experiments.train_defaults import (
    Recipe,
    Rung,
    default_evaluate,
    default_scaling,
    default_tokenize_cells,
    default_train,
)
from steps.model.model_size import MoeShape, ladder_shape

logger = logging.getLogger(__name__)

SOURCES = ("web", "code", "math", "reference", "books")
PHASE_FRACTIONS = (0.8, 0.2)
"""Pretraining, then the cooldown mixture from 80% of the steps."""
H100_BF16_PEAK = 989e12
PLANNING_MFU = 0.4


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
    bootstrap_samples: int = 1000
    """Draws behind the prediction's band where the asymptote is free (the DAG fixes it)."""


FULL_RUNGS = (
    ("d768", 768, 8, 1024, 11_420),
    ("d1024", 1024, 12, 2048, 15_276),
    ("d1536", 1536, 16, 6144, 15_128),
    ("d2048", 2048, 22, 11_264, 20_072),
)
"""(rung, d_model, layers, batch, steps): the published ladder."""
FULL_HERO = ("d6144", 6144, 48, 11_264, 390_251)
NODE = ResourceConfig(gpus=8, accelerator_type="H100")
"""What a train or evaluate step asks Ray for at full scale: one 8 x H100 node (infra/README.md). A Ray task
cannot span nodes; the hero and the larger rungs need Levanter's multi-host launch, which this does not do."""


def _full_rung(name: str, d_model: int, layers: int, batch: int, steps: int) -> Rung:
    return Rung(name, ladder_shape(d_model, layers), batch, steps, NODE)


def full_scale() -> Scale:
    hub = "hf://datasets"
    return Scale(
        name="full",
        sources={
            "web": {"source": f"{hub}/HuggingFaceFW/fineweb-edu/data", "include": ["*/*.parquet"]},
            "code": {"source": f"{hub}/bigcode/the-stack-v2-dedup/data", "include": ["*/*.parquet"]},
            "math": {"source": f"{hub}/open-web-math/open-web-math/data", "include": ["*.parquet"]},
            "reference": {"source": f"{hub}/wikimedia/wikipedia/20231101.en", "include": ["*.parquet"]},
            "books": {"source": f"{hub}/manu/project_gutenberg/data", "include": ["*.parquet"]},
        },
        eval_sets={"source": f"{hub}/cais/mmlu/all", "include": ["test-*.parquet"]},
        keep_fraction={"web": 0.3, "code": 0.9, "math": 0.8, "reference": 0.9, "books": 0.8},
        vocab_size=128_256,
        tokenizer_sample_bytes=10 << 30,
        topics=40,
        quality_buckets=5,
        cells_sample_docs=1_000_000,
        validation_fraction=0.001,
        rungs=tuple(_full_rung(*rung) for rung in FULL_RUNGS),
        hero=_full_rung(*FULL_HERO),
        recipe=Recipe(
            learning_rate=3e-4,
            warmup=0.01,
            peak_flops_per_second=H100_BF16_PEAK,
            temporary_checkpoint_seconds=1800,
            max_eval_batches=64,
            eval_batches=512,
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


def tiny_scale() -> Scale:
    corpus_domains = {
        "web": "web_docstrings",
        "code": "code_stdlib",
        "math": "math_docstrings",
        "reference": "reference_pydoc",
        "books": "prose_kjv",
    }
    rung = lambda name, d, layers, steps: Rung(name, tiny_shape(d, layers, TINY_VOCAB), 8, steps)  # noqa: E731
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
            learning_rate=1e-2,
            warmup=0.1,
            mixture_block_size=8,
            evals_per_run=5,
            max_eval_batches=2,
            eval_batches=2,  # the batches of the train step's own evals: evaluate/<rung> must agree with them
            checkpoints_per_run=2,
            temporary_checkpoint_seconds=20,
        ),
        corpus={"docs_per_domain": 120, "near_copies": 2, "eval_docs": 4, "domains": list(corpus_domains.values())},
        fuzzy_bands=(16, 6),
        # One bit per byte (about what large models reach on English text) at the tokenizer's 2.79 bytes per token
        # (tokenizer/hero's stats.json): ln 2 x 2.79 nats. Set from the text, never from the runs.
        irreducible_loss=1.93,
        bootstrap_samples=300,
    )


SCALES = {"full": full_scale, "tiny": tiny_scale}


@dataclass
class HeroDag:
    steps: list[ExecutorStep]
    trains: dict[str, tuple[Rung, ExecutorStep]]
    """Rung name -> (rung, its train step)."""
    scaling: ExecutorStep
    hero_eval: ExecutorStep


def build_dag(scale: Scale) -> HeroDag:
    """Every step of the run at `scale`."""
    steps: list[ExecutorStep] = []
    corpus = None
    if scale.corpus:
        corpus = default_real_corpus(**scale.corpus)
        steps.append(corpus)

    def download(name: str, spec: dict) -> ExecutorStep:
        if "source" in spec:
            return default_download(name, spec["source"], include=spec["include"])
        if corpus is None:
            raise ConfigError(f"scale {scale.name}: download {name} names no source and the scale has no corpus")
        source = output_path_of(corpus, "eval" if name == "eval_sets" else "raw")
        return default_download(name, source, include=spec["include"])

    evals = download("eval_sets", scale.eval_sets)
    downloads = {source: download(source, spec) for source, spec in scale.sources.items()}
    classifier = default_quality_classifier(
        positive=output_path_of(downloads["reference"], "files"), negative=output_path_of(downloads["web"], "files")
    )
    steps += [evals, *downloads.values(), classifier]
    clean = []
    for source, fetched in downloads.items():
        exact = default_dedup([fetched], name=f"data/{source}/exact_dedup")
        heuristics = default_quality_heuristics(
            exact, skip_sources=["*"] if source == "code" else ["code_*"], name=f"data/{source}/heuristics"
        )
        kept = default_fasttext_filter(
            heuristics, classifier, scale.keep_fraction[source], name=f"data/{source}/fasttext_filter"
        )
        fuzzy = default_fuzzy_dedup(kept, *scale.fuzzy_bands, name=f"data/{source}/fuzzy_dedup")
        decontaminated = default_decontaminate(
            fuzzy, [output_path_of(evals, "files")], name=f"data/{source}/decontaminate"
        )
        steps += [exact, heuristics, kept, fuzzy, decontaminated]
        clean.append(decontaminated)

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
    steps += [tokenizer, cells, tokenized, weights]

    trains, ladder = {}, []
    for rung in scale.rungs:
        trained = default_train(rung, scale.recipe, tokenizer, tokenized, weights)
        evaluated = default_evaluate(rung, scale.recipe, trained, tokenizer, tokenized)
        trains[rung.name] = (rung, trained)
        ladder.append((rung, trained, evaluated))
        steps += [trained, evaluated]
    scaling = default_scaling(ladder, scale.hero, scale.irreducible_loss, scale.bootstrap_samples)
    hero = default_train(scale.hero, scale.recipe, tokenizer, tokenized, weights, prediction=scaling)
    hero_eval = default_evaluate(scale.hero, scale.recipe, hero, tokenizer, tokenized)
    trains[scale.hero.name] = (scale.hero, hero)
    steps += [scaling, hero, hero_eval]
    return HeroDag(steps=steps, trains=trains, scaling=scaling, hero_eval=hero_eval)


def plan_entries(executor: Executor, dag: HeroDag) -> list[dict]:
    """The plan as JSON rows: every step's name, hash, output path and action; train steps add their figures."""
    figures = {step: rung.figures() for rung, step in dag.trains.values()}
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
        entries.append(entry)
    return entries


def print_totals(scale: Scale, dag: HeroDag) -> None:
    """Tokens, FLOPs and H100-hours (at PLANNING_MFU) per training run and in all."""
    print(
        f"\nTraining at scale {scale.name} (H100-hours at {PLANNING_MFU:.0%} MFU of {H100_BF16_PEAK / 1e12:.0f} "
        "TFLOP/s bf16):"
    )
    total_tokens = total_flops = 0.0
    for rung, _ in dag.trains.values():
        hours = rung.flops / (H100_BF16_PEAK * PLANNING_MFU) / 3600
        print(
            f"  {rung.name:>6}: {rung.figures()['total_params'] / 1e9:8.3f}B total, "
            f"{rung.figures()['active_params'] / 1e9:7.3f}B active, {rung.tokens:.3g} tokens, {rung.flops:.2g} FLOPs, "
            f"{hours:,.0f} H100-hours"
        )
        total_tokens += rung.tokens
        total_flops += rung.flops
    hours = total_flops / (H100_BF16_PEAK * PLANNING_MFU) / 3600
    print(f"  all: {total_tokens:.3g} tokens, {total_flops:.3g} FLOPs, {hours:,.0f} H100-hours")


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
        print(f"  achieved macro held-out loss: {achieved['macro_loss']:.4f}  [{executor.output_paths[dag.hero_eval]}]")
    if prediction is not None and achieved is not None:
        p, loss = prediction["prediction"], achieved["macro_loss"]
        where = "inside" if p["low"] <= loss <= p["high"] else "OUTSIDE"
        print(f"  achieved vs predicted: {100 * (loss - p['loss']) / p['loss']:+.2f}%, {where} the band")
    print(f"  watch it: python -m executor dashboard --prefix {executor.prefix}")


def main(argv: Sequence[str] | None = None) -> Executor:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], add_help=False)
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--plan_json", default=None, help="also write the plan as JSON to this path")
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    scale = SCALES[known.scale]()
    dag = build_dag(scale)
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
