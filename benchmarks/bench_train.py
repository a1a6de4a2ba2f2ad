"""Training FLOP/s of the tiny MoE on this machine against the dense matmul peak of the same machine.

Builds real data (Python stdlib text -> a BPE tokenizer -> a tokenize-step cache), runs the train step for
`--steps` steps, and takes the model FLOP/s it logged to metrics.jsonl (tokens/s x FLOPs per token from
steps/model/model_size.py) as the median over the steps after the first few (compilation). In the same run it
measures the peak: the best FLOP/s of a large f32 `jnp.dot` on the same JAX backend. The last line printed
is one JSON object with both and `ratio_vs_peak`.

    python benchmarks/bench_train.py                               # d=1024 (67M active), capacity 1.25
    python benchmarks/bench_train.py --capacity-factor none        # dropless grouped matmuls
    python benchmarks/bench_train.py --comm                        # expert parallelism's collectives, 4 CPU devices
    python benchmarks/bench_train.py --comm --capacity-factor none # the same, dropless

On this 2-core machine (idle), ratio_vs_peak was 0.49 with the defaults (about 2.5 minutes), 0.38 at d=512 and
0.33 at d=256 with capacity 1.25, and 0.14 dropless at d=256: XLA's CPU grouped matmul (`ragged_dot`) runs at
about a seventh of a dense matmul, so capacity (one batched matmul over expert slots) is what makes CPU
training efficient.

`--comm` compiles the tiny hero-shaped MoE's training step on 4 fake CPU devices (data=2 x expert=2) as the
train step runs it: Levanter's own `Trainer` and jitted step on the layout `trainer_mesh` gives the train step
(dense weights FSDP over every device, routed experts split over `expert` and FSDP over `data`), with the capacity
factor given (tests/support/expert_parallel_run.py). It reports `comm_bytes_ratio`: the bytes of every collective of
the compiled step (each op's result on one device, every array of a tuple-valued one; an op is counted once,
which is exact here: the model has one layer period, so no collective sits in a loop run more than once; an op
whose groups hold one device, which XLA keeps for a `psum` over a mesh axis of size 1, moves nothing) over the
least an expert-parallel step with FSDP moves, in the same units:

- the routed copies' all-to-alls: to the experts and back, forward and backward (4 per MoE layer), each
  exactly the device's tokens x top-k rows of the experts' input width (no capacity slack);
- each weight split over devices gathered once to what a device computes with (a routed expert's local
  experts whole, any other weight whole; the tiny model does not rematerialise, so once) and its gradient
  reduce-scattered back to its shard;
- the gradient of a weight, or of a weight's shard, that is the same on several devices holding different
  tokens, all-reduced over them: the router bias and loads, split over `expert` only, are the same on both
  `data` devices (`all-reduce of shards`), a leaf held whole is the same everywhere (`all-reduce`). A dense
  weight is split over every device (its gradient only reduce-scattered); a routed expert's gradient sums
  over `data` only (its tokens reach it by the all-to-all).

`moved_by_kind` and `minimum_by_kind` give the bytes and op counts per collective kind next to the ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from results import record

from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.model.model_size import MoeShape, active_params, flops_per_token, total_params
from steps.tokenize.tokenize import TokenizeConfig, tokenize
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, load_tokenizer, train_tokenizer
from steps.train.train import TrainConfig, train
from steps.train.train_metrics import read_metrics

WARMUP_STEPS = 3
DTYPE_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "pred": 1}


def comm_bytes_ratio(capacity_factor: float | None) -> dict:
    """The `--comm` leg (module docstring)."""
    runner = Path(__file__).resolve().parent.parent / "tests" / "support" / "expert_parallel_run.py"
    command = [sys.executable, str(runner), "4", *([] if capacity_factor is None else [str(capacity_factor)])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1].removeprefix("RESULT "))
    moved: dict[str, dict[str, int]] = {}
    for op in result["collectives"]:
        # A collective over a group of one device (a mesh axis of size 1) moves nothing; listed on its own.
        kind = moved.setdefault(op["op"] if op["group"] > 1 else "one-device groups", {"bytes": 0, "count": 0})
        kind["bytes"] += array_bytes(op["shape"])
        kind["count"] += 1
    total = sum(kind["bytes"] for name, kind in moved.items() if name != "one-device groups")
    needed = result["minimum_collective_bytes"]
    return {"leg": "expert_parallel_comm", "devices": 4, "mesh": {"data": 2, "expert": 2},
            "capacity_factor": capacity_factor, "collective_bytes": total, "minimum_bytes": needed,
            "comm_bytes_ratio": total / needed, "moved_by_kind": moved,
            "minimum_by_kind": result["minimum_by_kind"]}  # fmt: skip


def array_bytes(shape: str) -> int:
    """`f32[4,16]` -> 256."""
    dtype, dims = re.fullmatch(r"([a-z0-9]+)\[([0-9,]*)\]", shape).groups()  # type: ignore[union-attr]
    return DTYPE_BYTES[dtype] * math.prod(int(dim) for dim in dims.split(",") if dim)


def matmul_peak_flops(size: int, repeats: int) -> float:
    """Best FLOP/s of an f32 size x size matmul: the dense peak the training figure is compared with."""
    left = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    right = jax.random.normal(jax.random.PRNGKey(1), (size, size), jnp.float32)
    product = jax.jit(jnp.dot)
    product(left, right).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(left, right).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def build_data(root: Path, vocab_size: int) -> tuple[str, str]:
    corpus = str(root / "corpus")
    build_text_corpus(TextCorpusConfig(source="python_stdlib", max_docs=200, docs_per_shard=100, output_path=corpus))
    tokenizer = str(root / "tokenizer")
    train_tokenizer(TrainTokenizerConfig(input_paths=[corpus], vocab_size=vocab_size, sample_bytes=1_000_000,
                                         output_path=tokenizer))  # fmt: skip
    cache = str(root / "tokenized")
    tokenize(TokenizeConfig(input_paths=[f"{corpus}/shard-*.jsonl.gz"], tokenizer_path=tokenizer,
                            validation_fraction=0.05, output_path=cache, parallelism="thread"))  # fmt: skip
    return tokenizer, cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--comm", action="store_true", help="only the expert-parallel collectives leg")
    parser.add_argument(
        "--capacity-factor",
        type=lambda text: None if text.lower() == "none" else float(text),
        default=1.25,
        help="experts take at most this multiple of a fair share of tokens; none: dropless",
    )
    args = parser.parse_args()
    if args.comm:
        record("bench_train_comm", comm_bytes_ratio(args.capacity_factor), parser, args, variant=("comm",))
        return

    with tempfile.TemporaryDirectory(prefix="bench-train-") as scratch:
        root = Path(scratch)
        tokenizer, cache = build_data(root, args.vocab)
        heads = max(1, args.d_model // 64)
        vocab = load_tokenizer(tokenizer).get_vocab_size()
        shape = MoeShape(d_model=args.d_model, n_layers=args.layers, vocab_size=vocab,
                         n_heads=heads, head_dim=64, kv_heads_local=heads, kv_heads_global=heads, global_every=1,
                         sliding_window=None, n_experts=args.experts, top_k=args.top_k, expert_width=2 * args.d_model,
                         latent_dim=None, n_shared_experts=0, shared_width=0, seq_len=args.seq_len)  # fmt: skip
        output_path = str(root / "train-bench")
        train(TrainConfig(shape=shape, tokenizer_path=tokenizer, components={"stdlib": cache}, output_path=output_path,
                          num_train_steps=args.steps, train_batch_size=args.batch, steps_per_eval=10**9,
                          max_eval_batches=1, hf_export=False, capacity_factor=args.capacity_factor,
                          checkpoint_every_steps=10**9, temporary_checkpoint_seconds=10**9,
                          watch_interval=10**9))  # fmt: skip
        achieved = [
            record["model_flops_per_second"]
            for record in read_metrics(output_path)
            if "model_flops_per_second" in record and (record["step"] or 0) >= WARMUP_STEPS
        ]
    peak = matmul_peak_flops(args.matmul_size, repeats=10)
    train_flops = statistics.median(achieved)
    record("bench_train", {
        "backend": jax.default_backend(), "devices": jax.device_count(),
        "shape": {"d_model": args.d_model, "layers": args.layers, "experts": args.experts, "top_k": args.top_k,
                  "seq_len": args.seq_len, "batch": args.batch},
        "active_params": active_params(shape), "total_params": total_params(shape),
        "flops_per_token": flops_per_token(shape), "steps_measured": len(achieved),
        "train_flops_per_second": train_flops, "matmul_peak_flops_per_second": peak,
        "capacity_factor": args.capacity_factor, "ratio_vs_peak": train_flops / peak,
    }, parser, args)  # fmt: skip


if __name__ == "__main__":
    main()
