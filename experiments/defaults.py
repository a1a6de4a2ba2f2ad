"""Step builders that experiments share, so that an experiment file only says *what* it wants.

Each builder decides which config fields are versioned: everything that changes a step's output
(the source, how many documents, the vocabulary size, the interpreter whose stdlib is read), and
nothing that only changes how the work is laid out (shard sizes, batch sizes).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

from executor import THIS_OUTPUT_PATH, ExecutorStep, output_path_of, versioned
from steps.decontaminate import DecontaminateConfig, decontaminate
from steps.dedup_exact import ExactDedupConfig, exact_dedup
from steps.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.download import DownloadConfig, download
from steps.fasttext_quality import (
    FasttextFilterConfig,
    TrainClassifierConfig,
    fasttext_filter,
    train_quality_classifier,
)
from steps.quality_heuristics import FILTERS, QualityHeuristicsConfig, quality_heuristics
from steps.real_corpus import RealCorpusConfig, build_real_corpus
from steps.text_corpus import TextCorpusConfig, build_text_corpus
from steps.train_tokenizer import TrainTokenizerConfig, train_tokenizer


def default_text_corpus(
    source: str, max_docs: int = 400, docs_per_shard: int = 100, min_docstring_chars: int = 200
) -> ExecutorStep[TextCorpusConfig]:
    """A corpus read from this interpreter's stdlib; `source` is "python_stdlib" or "python_docstrings"."""
    return ExecutorStep(
        name=f"corpus/{source}",
        fn=build_text_corpus,
        description=f"The first {max_docs} {source} documents of Python {platform.python_version()}'s stdlib",
        config=TextCorpusConfig(
            source=versioned(source),
            max_docs=versioned(max_docs),
            docs_per_shard=docs_per_shard,
            min_docstring_chars=versioned(min_docstring_chars),
            # The stdlib's text is an input the executor cannot see; its version stands in for it.
            python_version=versioned(platform.python_version()),
            output_path=THIS_OUTPUT_PATH,
        ),
    )


def default_tokenizer(
    corpora: Sequence[ExecutorStep], vocab_size: int = 4096, min_frequency: int = 2
) -> ExecutorStep[TrainTokenizerConfig]:
    """A byte-level BPE tokenizer trained on the union of `corpora`."""
    return ExecutorStep(
        name="tokenizer/byte_bpe",
        fn=train_tokenizer,
        description=f"Byte-level BPE, {vocab_size} tokens, trained on {', '.join(c.name for c in corpora)}",
        config=TrainTokenizerConfig(
            input_paths=[output_path_of(corpus) for corpus in corpora],
            vocab_size=versioned(vocab_size),
            min_frequency=versioned(min_frequency),
            special_tokens=versioned(["<|endoftext|>"]),
            output_path=THIS_OUTPUT_PATH,
        ),
    )


# Data steps (issue 4): download -> exact dedup -> fuzzy dedup -> quality. Each takes the upstream step and
# reads its `docs/` (or, for download, `files/`); every knob that changes which documents survive is versioned.


def default_real_corpus(
    docs_per_domain: int = 300, near_copies: int = 10, eval_docs: int = 0
) -> ExecutorStep[RealCorpusConfig]:
    """The offline multi-domain corpus (KJV prose, stdlib code, pydoc reference) with planted duplicates,
    and with `eval_docs` > 0 an eval set per domain that quotes training documents (for decontamination)."""
    return ExecutorStep(
        name="raw/real_corpus",
        fn=build_real_corpus,
        description=f"{docs_per_domain} docs per domain with planted exact and near duplicates",
        config=RealCorpusConfig(
            output_path=THIS_OUTPUT_PATH,
            docs_per_domain=versioned(docs_per_domain),
            near_copies=versioned(near_copies),
            eval_docs=versioned(eval_docs),
            # The stdlib's text is an input the executor cannot see; its version stands in for it.
            seed=versioned(0),
        ),
        code_version=platform.python_version(),
    )


def default_download(
    name: str, source: Any, include: Sequence[str] = ("*",)
) -> ExecutorStep[DownloadConfig]:
    """Fetch the files under `source` (a URL, or another step's output) matching `include`."""
    return ExecutorStep(
        name=f"download/{name}",
        fn=download,
        description=f"Download {include} from {source}",
        config=DownloadConfig(source=versioned(source) if isinstance(source, str) else source,
                              include=versioned(list(include)), output_path=THIS_OUTPUT_PATH),
    )


def default_dedup(inputs: Sequence[ExecutorStep], paragraphs: bool = True) -> ExecutorStep[ExactDedupConfig]:
    """Exact document- and paragraph-level dedup over `inputs` (downloads or document steps), first wins."""
    return ExecutorStep(
        name="dedup/exact",
        fn=exact_dedup,
        description="Exact dedup of documents" + (" and paragraphs" if paragraphs else ""),
        config=ExactDedupConfig(input_paths=[_docs_of(step) for step in inputs], paragraphs=versioned(paragraphs),
                                min_paragraph_chars=versioned(64), output_path=THIS_OUTPUT_PATH),
    )


def default_fuzzy_dedup(input_step: ExecutorStep, bands: int = 16, rows: int = 6,
                        jaccard_threshold: float = 0.65) -> ExecutorStep[FuzzyDedupConfig]:  # fmt: skip
    """MinHash + LSH near-duplicate removal with verified pairs, one document kept per cluster."""
    return ExecutorStep(
        name="dedup/fuzzy",
        fn=fuzzy_dedup,
        description=f"MinHash LSH, 5-grams, {bands} bands x {rows} rows, pairs verified at Jaccard {jaccard_threshold}",
        config=FuzzyDedupConfig(input_paths=[_docs_of(input_step)], n_grams=versioned(5), bands=versioned(bands),
                                rows=versioned(rows), seed=versioned(1), jaccard_threshold=versioned(jaccard_threshold),
                                all_pairs_bucket_size=versioned(32), raw_input=False,
                                output_path=THIS_OUTPUT_PATH),
    )


def default_decontaminate(input_step: ExecutorStep, eval_sets: Sequence[Any], n_grams: int = 13,
                          threshold: float = 0.0) -> ExecutorStep:  # fmt: skip
    """Drop documents sharing `n_grams`-word n-grams with the eval sets (paths inside step outputs)."""
    return ExecutorStep(
        name="dedup/decontaminate",
        fn=decontaminate,
        description=f"drop documents sharing {n_grams}-grams with the eval sets (threshold {threshold})",
        config=DecontaminateConfig(input_paths=[_docs_of(input_step)], eval_paths=list(eval_sets),
                                   n_grams=versioned(n_grams), threshold=versioned(threshold),
                                   output_path=THIS_OUTPUT_PATH),
    )


def default_quality_heuristics(input_step: ExecutorStep, skip_sources: Sequence[str] = ("code_*",)) -> ExecutorStep:
    """datatrove's Gopher / C4 / FineWeb heuristics, with code sources passed through."""
    return ExecutorStep(
        name="quality/heuristics",
        fn=quality_heuristics,
        description=f"Gopher, C4 and FineWeb heuristics (sources {list(skip_sources)} pass through)",
        config=QualityHeuristicsConfig(input_paths=[_docs_of(input_step)], filters=versioned(list(FILTERS)),
                                       skip_sources=versioned(list(skip_sources)),
                                       output_path=THIS_OUTPUT_PATH),
    )


def default_quality_classifier(positive: Any, negative: Any) -> ExecutorStep:
    """A fastText classifier of `positive` vs `negative` documents (paths or globs inside step outputs)."""
    return ExecutorStep(
        name="quality/fasttext_model",
        fn=train_quality_classifier,
        description="fastText quality classifier",
        config=TrainClassifierConfig(positive_paths=[positive], negative_paths=[negative],
                                     epochs=versioned(5), dim=versioned(32), bucket=versioned(100_000),
                                     output_path=THIS_OUTPUT_PATH),
        # 2: trained in a fresh process, no longer from fastText's uninitialized embedding rows.
        code_version="2",
    )


def default_fasttext_filter(input_step: ExecutorStep, model: ExecutorStep, keep_fraction: float = 0.8) -> ExecutorStep:
    """Keep the top `keep_fraction` of documents by the classifier's positive score."""
    return ExecutorStep(
        name="quality/fasttext_filter",
        fn=fasttext_filter,
        description=f"Keep the top {keep_fraction:.0%} by fastText score",
        config=FasttextFilterConfig(input_paths=[_docs_of(input_step)], model_path=output_path_of(model),
                                    keep_fraction=versioned(keep_fraction), output_path=THIS_OUTPUT_PATH),
    )


def _docs_of(step: ExecutorStep) -> Any:
    """Where a step keeps its documents: `files/` for downloads, `docs/` for every document step."""
    return output_path_of(step, "files" if step.fn is download else "docs")
