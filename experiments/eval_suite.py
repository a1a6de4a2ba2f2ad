"""The hero DAG's external eval suite: Paloma's 16 subsets at full scale, offline stand-ins at tiny scale.

    text, subsets = suite_text(paloma=False)   # tiny: offline text (steps/corpora/eval_suite_text.py); full: Paloma
    suite = default_eval_suite(subsets, tokenizer, tokens_per_subset=2048, min_tokens=64)

The subsets' text is also what decontamination removes from the training data (`subsets.values()` are among its
eval paths), so it exists before the tokenizer; the suite step caps each subset to the same tokens with the
run's tokenizer (steps/tokenize/eval_suite.py). Every train and evaluate step of the ladder and the hero reads
the same capped sequences, and the ladder fits their macro loss (`SUITE_MACRO_LOSS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from executor import THIS_OUTPUT_PATH, ExecutorStep, output_path_of, versioned
from experiments.defaults import default_download
from steps.corpora.eval_suite_text import EvalSuiteTextConfig, build_eval_suite_text
from steps.corpora.locked_packages import file_sha256
from steps.data.source_schema import SourceSchema
from steps.tokenize.configs import EvalSuiteConfig

PALOMA_SOURCE = "hf://datasets/allenai/paloma"
PALOMA_SUBSETS = (
    "4chan_meta_sep",
    "c4_100_domains",
    "c4_en",
    "dolma-v1_5",
    "dolma_100_programing_languages",
    "dolma_100_subreddits",
    "falcon-refinedweb",
    "gab",
    "m2d2_s2orc_unsplit",
    "m2d2_wikipedia_unsplit",
    "manosphere_meta_sep",
    "mc4",
    "ptb",
    "redpajama",
    "twitterAAE_HELM_fixed",
    "wikitext_103",
)
"""Paloma's 16 subsets (Magnusson et al. 2023; the list Marin evaluates on): each `<subset>/val/*.jsonl.gz` of
allenai/paloma on the Hub, records with `text` and `id`. The validation split: test stays unseen."""
PALOMA_SCHEMA = SourceSchema("text", "id", gated=True, license="ODC-By 1.0 (AI2 ImpACT low-risk terms; gated)")
TINY_SUITE_SUBSETS = (
    "package_readmes",
    "package_licenses",
    "package_docs",
    "doctests",
    "c_headers",
    "cython_sources",
    "type_stubs",
    "protobuf_definitions",
    "message_catalogs",
)
"""Nine subsets of the locked packages' files that no tiny training source reads (steps/corpora/eval_suite_text.py)."""
LOCK_FILE = Path(__file__).resolve().parent.parent / "requirements.lock"
"""The lock the tiny suite's text is read from: what `make install` installed."""


def paloma_include() -> list[str]:
    """Download globs for the validation files of every Paloma subset."""
    return [f"{subset}/val/*" for subset in PALOMA_SUBSETS]


def default_eval_suite_text(
    subsets: Sequence[str], bytes_per_subset: int = 16_000, lock_file: Path = LOCK_FILE
) -> ExecutorStep:
    """The tiny suite's text, from the packages `lock_file` pins (its sha256 versioned): `subsets/<subset>/` each."""
    return ExecutorStep(
        name="eval_suite/text",
        fn=build_eval_suite_text,
        description=f"{len(subsets)} held-out subsets of the locked packages' text, {bytes_per_subset:,} bytes each",
        config=EvalSuiteTextConfig(output_path=THIS_OUTPUT_PATH, subsets=versioned(list(subsets)),
                                   lock_file=str(lock_file), lock_sha256=versioned(file_sha256(lock_file)),
                                   bytes_per_subset=versioned(bytes_per_subset)),
    )


def suite_text(paloma: bool) -> tuple[ExecutorStep, dict[str, Any]]:
    """The step that brings the suite's text (Paloma's validation files from the Hub, or the offline stand-ins)
    and each subset's documents folder inside it."""
    if paloma:
        download = default_download("paloma", PALOMA_SOURCE, include=paloma_include(), schema=PALOMA_SCHEMA)
        return download, {subset: output_path_of(download, f"files/{subset}/val") for subset in PALOMA_SUBSETS}
    text = default_eval_suite_text(TINY_SUITE_SUBSETS)
    return text, {subset: output_path_of(text, f"subsets/{subset}") for subset in TINY_SUITE_SUBSETS}


def default_eval_suite(
    subsets: dict[str, Any], tokenizer: ExecutorStep, tokens_per_subset: int, min_tokens: int
) -> ExecutorStep:
    """Every subset tokenized with the run's tokenizer, capped to `tokens_per_subset`, as a validation cache."""
    return ExecutorStep(
        name="eval_suite",
        fn="steps.tokenize.eval_suite:build_eval_suite",
        description=f"{len(subsets)} held-out subsets of {tokens_per_subset:,} tokens each (the ladder's metric)",
        config=EvalSuiteConfig(subsets=subsets, tokenizer_path=output_path_of(tokenizer),
                               output_path=THIS_OUTPUT_PATH, tokens_per_subset=versioned(tokens_per_subset),
                               min_tokens=versioned(min_tokens)),
    )
