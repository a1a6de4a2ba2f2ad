"""The eval suite: held-out subsets, each capped to a fixed token count, as Levanter validation caches.

    suite = ExecutorStep(
        name="eval_suite",
        fn=build_eval_suite,
        config=EvalSuiteConfig(
            subsets={"man_syscalls": output_path_of(suite_text, "subsets/man_syscalls"), ...},
            tokenizer_path=output_path_of(tokenizer),
            tokens_per_subset=versioned(2048),
            output_path=THIS_OUTPUT_PATH,
        ),
    )

The ladder's metric is Paloma's: the unweighted mean over held-out subsets of each subset's token-weighted loss
(the macro loss), bits per byte beside it. A subset is text that never enters training (decontamination removes
its n-grams from the training data: the DAG hands the same folders to `decontaminate` as eval sets); at full
scale the subsets are Paloma's own, at tiny scale offline stand-ins (steps/corpora/eval_suite_text.py).

Each subset's documents are taken in the order of a hash of their id (whatever their files' order), framed as
the tokenize step frames them (BOS, ids, EOS), and written until the subset holds exactly `tokens_per_subset`
tokens, the last document cut short: every subset weighs the same whatever its documents' lengths, and with a
cap a multiple of the sequence length, Levanter reads exactly cap / seq_len sequences from it. A subset with
fewer tokens than one sequence is refused; one short of the cap is used whole and says so in `suite.json`.

The train step adds every subset as a validation-only component named `suite/<subset>` (so Levanter logs
`eval/suite/<subset>/loss` and `/bpb`, and `eval/suite/macro_loss`, the unweighted mean of the subsets) and the
evaluate step reads the same caches: the ladder's curve and its final point are one measurement.

Output: `<subset>/validation/` (a Levanter cache) and `suite.json` = {"tokens_per_subset", "subsets":
{name: {"documents", "tokens", "bytes", "capped"}}}.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import xxhash

from executor import ConfigError, Shard, ShardWriter, run_sharded, storage
from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.tokenize.configs import EvalSuiteConfig
from steps.tokenize.levanter_cache import PartFigures, PartWriter, check_cache_path, write_sharded_ledger
from steps.tokenize.tokenize import cache_metadata
from steps.tokenize.train_tokenizer import load_tokenizer, special_token_ids

logger = logging.getLogger(__name__)

SUITE_FILE = "suite.json"
SUITE_PREFIX = "suite/"
"""Component names of the suite's subsets in a train or evaluate step: Levanter's tag hierarchy then averages
them as `eval/suite/macro_loss`."""


class EvalSuiteError(ConfigError):
    """A subset cannot be evaluated: too little text, or none."""


def build_eval_suite(config: EvalSuiteConfig) -> dict[str, Any]:
    """The step: every subset's capped cache and suite.json; returns suite.json's content."""
    label = f"eval suite step {storage.basename(config.output_path)} ({config.output_path})"
    check_cache_path(config.output_path, label)
    if not config.subsets:
        raise ValueError(f"{label}: subsets is empty: the suite needs at least one held-out subset "
                         "(name -> documents); fix the step's config")  # fmt: skip
    if config.tokens_per_subset < config.min_tokens:
        raise ValueError(f"{label}: tokens_per_subset={config.tokens_per_subset} is below min_tokens="
                         f"{config.min_tokens} (the sequence length); fix the step's config")  # fmt: skip
    cache_metadata(config.tokenizer_path)  # a tokenizer without an EOS fails here, before any subset is read
    shards = [Shard(name, (config, name, path)) for name, path in sorted(config.subsets.items())]
    report = run_sharded(config.output_path, shards, _subset_shard, parallelism="thread", description="eval suite")
    metadata = cache_metadata(config.tokenizer_path)
    subsets: dict[str, dict[str, Any]] = {}
    for name in sorted(config.subsets):
        figures = report.markers[name]["stats"]
        if figures["tokens"] < config.min_tokens:
            raise EvalSuiteError(f"{label}: subset {name} ({config.subsets[name]}) holds {figures['tokens']} "
                                 f"tokens, fewer than one sequence ({config.min_tokens}); give it more text or "
                                 "leave it out")  # fmt: skip
        part = PartFigures("part-00000", figures["documents"], figures["tokens"])
        write_sharded_ledger(storage.join(config.output_path, name, "validation"), [part], metadata,
                             config.output_path)  # fmt: skip
        subsets[name] = {key: figures[key] for key in ("documents", "tokens", "bytes", "capped")}
        if not figures["capped"]:
            logger.warning("%s: subset %s holds %d tokens, under the cap of %d: it is used whole", label, name,
                           figures["tokens"], config.tokens_per_subset)  # fmt: skip
    document = {"tokens_per_subset": config.tokens_per_subset, "subsets": subsets}
    storage.write_json_atomic(storage.join(config.output_path, SUITE_FILE), document)
    return document


def _subset_shard(payload: tuple[EvalSuiteConfig, str, str], writer: ShardWriter) -> dict[str, Any]:
    """One subset: its documents in id-hash order, framed, until the cap; written as one cache part."""
    config, name, path = payload
    tokenizer = load_tokenizer(config.tokenizer_path)
    special = special_token_ids(config.tokenizer_path, tokenizer)
    report = ReadReport()
    documents = [doc for file in list_input_files(path) for doc in read_documents(file, report)]
    documents.sort(key=lambda doc: (xxhash.xxh3_64_intdigest(doc["id"].encode("utf-8")), doc["id"]))
    prefix = [] if special.bos is None else [special.bos]
    part = PartWriter(writer, f"{name}/validation/part-00000", cache_metadata(config.tokenizer_path))
    room, used_bytes, rows = config.tokens_per_subset, 0, 0
    for document in documents:
        framed = [*prefix, *tokenizer.encode(document["text"], add_special_tokens=False).ids, special.eos]
        kept = framed[:room]
        part.write([kept])
        room -= len(kept)
        # The bytes of the text the kept tokens spell (what bits per byte divides by, up to the cut).
        used_bytes += len(tokenizer.decode(kept, skip_special_tokens=True).encode("utf-8"))
        rows += 1
        if room == 0:
            break
    part.close()
    return {"documents": rows, "tokens": part.tokens, "bytes": used_bytes, "capped": room == 0,
            "bad_input": dict(report.bad)}  # fmt: skip


def load_suite(suite_path: str) -> dict[str, str]:
    """Component name (`suite/<subset>`) -> cache folder, for a train or evaluate step."""
    document = storage.read_json(storage.join(suite_path, SUITE_FILE))
    if document is None:
        raise FileNotFoundError(f"no {SUITE_FILE} under {suite_path}: point at an eval suite step's output")
    return {f"{SUITE_PREFIX}{name}": storage.join(suite_path, name) for name in document["subsets"]}


def suite_figures(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The macro loss and bits per byte over the suite's subsets in per-component `results` ({name: {"loss",
    "bpb"}}): the unweighted means of the subsets' token-weighted figures."""
    subsets = [figures for name, figures in results.items() if name.startswith(SUITE_PREFIX)]
    if not subsets:
        raise ValueError("no eval suite subset among the results")
    return {what: sum(figures[what] for figures in subsets) / len(subsets) for what in ("loss", "bpb")}
