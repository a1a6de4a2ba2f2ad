"""Step builders that experiments share, so that an experiment file only says *what* it wants.

Each builder decides which config fields are versioned: everything that changes a step's output
(the source, how many documents, the vocabulary size, the interpreter whose stdlib is read), and
nothing that only changes how the work is laid out (shard sizes, batch sizes).
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from executor import THIS_OUTPUT_PATH, ConfigError, ExecutorStep, InputName, VersionedValue, output_path_of, versioned
from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.data.download import DownloadConfig, download
from steps.data.source_schema import SourceSchema
from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.filter.decontaminate import DecontaminateConfig, decontaminate
from steps.filter.fasttext_quality import (
    FasttextFilterConfig,
    TrainClassifierConfig,
    fasttext_filter,
    train_quality_classifier,
)
from steps.filter.quality_heuristics import FILTERS, QualityHeuristicsConfig, quality_heuristics
from steps.tokenize.cells import CellsConfig, build_cells
from steps.tokenize.mixture_weights import MixtureWeightsConfig, as_schedule, check_schedule, mixture_weights
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, train_tokenizer

if TYPE_CHECKING:
    from levanter.data.text.datasets import LmDataConfig

logger = logging.getLogger(__name__)


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
    corpora: Sequence[ExecutorStep],
    vocab_size: int = 4096,
    min_frequency: int = 2,
    sample_bytes: int | None = None,
    name: str = "tokenizer/byte_bpe",
) -> ExecutorStep[TrainTokenizerConfig]:
    """A byte-level BPE tokenizer trained on the union of `corpora` (text corpora, or document steps: their docs)."""
    return ExecutorStep(
        name=name,
        fn=train_tokenizer,
        description=f"Byte-level BPE, {vocab_size} tokens, trained on {', '.join(c.name for c in corpora)}",
        config=TrainTokenizerConfig(
            input_paths=[output_path_of(c) if c.fn is build_text_corpus else _docs_of(c) for c in corpora],
            vocab_size=versioned(vocab_size),
            min_frequency=versioned(min_frequency),
            special_tokens=versioned(["<|endoftext|>"]),
            sample_bytes=versioned(sample_bytes) if sample_bytes is not None else None,
            output_path=THIS_OUTPUT_PATH,
        ),
    )


# Data steps (issue 4): download -> exact dedup -> fuzzy dedup -> quality. Each takes the upstream step and
# reads its `docs/` (or, for download, `files/`); every knob that changes which documents survive is versioned.


def default_real_corpus(
    docs_per_domain: int = 300,
    near_copies: int = 10,
    eval_docs: int = 0,
    domains: Sequence[str] | None = None,
    cross_copies: int = 0,
) -> ExecutorStep[RealCorpusConfig]:
    """The offline multi-domain corpus (KJV prose, stdlib code, pydoc reference) with planted duplicates,
    and with `eval_docs` > 0 an eval set per domain that quotes training documents (for decontamination);
    `cross_copies` > 0 plants copies of each domain's documents in the next one's file."""
    return ExecutorStep(
        name="raw/real_corpus",
        fn=build_real_corpus,
        description=f"{docs_per_domain} docs per domain with planted exact and near duplicates",
        config=RealCorpusConfig(
            output_path=THIS_OUTPUT_PATH,
            docs_per_domain=versioned(docs_per_domain),
            near_copies=versioned(near_copies),
            eval_docs=versioned(eval_docs),
            domains=versioned(list(domains)) if domains is not None else None,
            # Not hashed when 0, so corpora built before cross-source copies existed keep their hash.
            cross_copies=versioned(cross_copies) if cross_copies else 0,
            # The stdlib's text is an input the executor cannot see; its version stands in for it.
            seed=versioned(0),
        ),
        code_version=platform.python_version(),
    )


def default_download(
    name: str, source: Any, include: Sequence[str] = ("*",), schema: SourceSchema | None = None
) -> ExecutorStep[DownloadConfig]:
    """Fetch the files under `source` (a URL, or another step's output) matching `include`; with `schema`,
    its text and id columns become `text` and `id` (versioned only where they differ, so hashes stay)."""
    columns: dict[str, Any] = {}
    if schema is not None and (schema.text_column, schema.id_column) != ("text", "id"):
        columns = {"text_column": versioned(schema.text_column), "id_column": versioned(schema.id_column)}
    return ExecutorStep(
        name=f"download/{name}",
        fn=download,
        description=f"Download {include} from {source}",
        config=DownloadConfig(source=versioned(source) if isinstance(source, str) else source,
                              include=versioned(list(include)), output_path=THIS_OUTPUT_PATH, **columns),
    )


def default_dedup(inputs: Sequence[ExecutorStep], paragraphs: bool = True, name: str = "dedup/exact",
                  sources: Sequence[str] | None = None) -> ExecutorStep[ExactDedupConfig]:  # fmt: skip
    """Exact document- and paragraph-level dedup over `inputs` (downloads or document steps), first wins.
    With `sources` (a name per input), one pass over every source that writes each one's `docs/<source>/`."""
    return ExecutorStep(
        name=name,
        fn=exact_dedup,
        description="Exact dedup of documents" + (" and paragraphs" if paragraphs else "") + _across(sources),
        config=ExactDedupConfig(input_paths=[_docs_of(step) for step in inputs], paragraphs=versioned(paragraphs),
                                min_paragraph_chars=versioned(64), input_sources=_versioned_names(sources),
                                output_path=THIS_OUTPUT_PATH),
        code_version="2",  # 2: CRLF and CR line endings split paragraphs
    )


def default_fuzzy_dedup(inputs: ExecutorStep | Sequence[ExecutorStep], bands: int = 16, rows: int = 6,
                        jaccard_threshold: float = 0.65, name: str = "dedup/fuzzy",
                        sources: Sequence[str] | None = None) -> ExecutorStep[FuzzyDedupConfig]:  # fmt: skip
    """MinHash + LSH near-duplicate removal with verified pairs, one document kept per verified star.
    With `sources` (a name per input), one pass over every source that writes each one's `docs/<source>/`."""
    steps = [inputs] if isinstance(inputs, ExecutorStep) else list(inputs)
    return ExecutorStep(
        name=name,
        fn=fuzzy_dedup,
        description=f"MinHash LSH, 5-grams, {bands} bands x {rows} rows, pairs verified at Jaccard {jaccard_threshold}"
        + _across(sources),
        config=FuzzyDedupConfig(input_paths=[_docs_of(step) for step in steps], n_grams=versioned(5),
                                bands=versioned(bands), rows=versioned(rows), seed=versioned(1),
                                jaccard_threshold=versioned(jaccard_threshold), all_pairs_bucket_size=versioned(32),
                                input_sources=_versioned_names(sources), raw_input=False,
                                output_path=THIS_OUTPUT_PATH),
        # 2: normalization turns punctuation into spaces and folds diacritics
        # 3: components split into stars verified against the kept document (chains no longer drop far ends)
        code_version="3",
    )


def docs_of_source(step: ExecutorStep, source: str) -> InputName:
    """One source's documents in the output of a dedup step run over many sources (`sources=`)."""
    return output_path_of(step, f"docs/{source}")


def _versioned_names(sources: Sequence[str] | None) -> Any:
    return versioned(list(sources)) if sources is not None else None


def _across(sources: Sequence[str] | None) -> str:
    return f", across {len(sources)} sources" if sources is not None else ""


def default_decontaminate(input_step: ExecutorStep | InputName, eval_sets: Sequence[Any], n_grams: int = 13,
                          threshold: float = 0.0, name: str = "dedup/decontaminate") -> ExecutorStep:  # fmt: skip
    """Drop documents sharing `n_grams`-word n-grams with the eval sets (paths inside step outputs)."""
    return ExecutorStep(
        name=name,
        fn=decontaminate,
        description=f"drop documents sharing {n_grams}-grams with the eval sets (threshold {threshold})",
        config=DecontaminateConfig(input_paths=[_docs_of(input_step)], eval_paths=list(eval_sets),
                                   n_grams=versioned(n_grams), threshold=versioned(threshold),
                                   output_path=THIS_OUTPUT_PATH),
        code_version="2",  # 2: the new normalization; eval items shorter than n_grams are matched whole
    )


def default_quality_heuristics(input_step: ExecutorStep | InputName, skip_sources: Sequence[str] = ("code_*",),
                               name: str = "quality/heuristics") -> ExecutorStep:  # fmt: skip
    """datatrove's Gopher / C4 / FineWeb heuristics, with code sources passed through."""
    return ExecutorStep(
        name=name,
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
        # 3: held-out split by normalized-text hash (copies of a text on one side); unknown labels refused.
        code_version="3",
    )


def default_fasttext_filter(input_step: ExecutorStep | InputName, model: ExecutorStep, keep_fraction: float = 0.8,
                            name: str = "quality/fasttext_filter") -> ExecutorStep:  # fmt: skip
    """Keep the top `keep_fraction` of documents by the classifier's positive score."""
    return ExecutorStep(
        name=name,
        fn=fasttext_filter,
        description=f"Keep the top {keep_fraction:.0%} by fastText score",
        config=FasttextFilterConfig(input_paths=[_docs_of(input_step)], model_path=output_path_of(model),
                                    keep_fraction=versioned(keep_fraction), output_path=THIS_OUTPUT_PATH),
        code_version="2",  # 2: an exact threshold, so the kept share is met on saturated scores
    )


def _docs_of(step: ExecutorStep | InputName) -> Any:
    """Where a step keeps its documents: `files/` for downloads, `docs/` for every document step (a path
    inside a step's output, such as `docs_of_source`, is taken as it is)."""
    if isinstance(step, InputName):
        return step
    return output_path_of(step, "files" if step.fn is download else "docs")


# Mixing (issue 9): cells -> weights -> one Levanter data config. Marin's shape: components are tokenized steps
# (or existing caches), weights name components, and the result is Levanter's own LmDataConfig, so training
# reads the mixture with Levanter's MixtureDataset.


@dataclass(frozen=True)
class TokenizedCache:
    """A Levanter cache made outside this DAG: `cache_dir` holds `train/` and `validation/`."""

    cache_dir: str
    """The cache root (a path or a marker such as output_path_of(step))."""
    tokenizer: str
    """The HF tokenizer directory or name it was tokenized with."""


def lm_mixture_data_config(
    components: Mapping[str, ExecutorStep | TokenizedCache],
    weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
    *,
    missing_weights_are_validation: bool = True,
    mixture_block_size: int = 2048,
    batch_size: int | None = None,
    shuffle: bool = True,
) -> LmDataConfig:
    """A Levanter data config mixing `components` (tokenize steps or `TokenizedCache`s) by `weights`.

    `weights` is a dict (one phase) or `[(start_step, weights), ...]`; start steps are training steps.
    Components without a weight (in any phase) are validation-only. Every component must use the same
    tokenizer. Weights and start steps are versioned: a step whose config holds this data config gets a
    new hash when the mixture changes. With `batch_size`, each phase start is checked to fall on a
    mixture block (see `phase_start`).
    """
    from levanter.data.text.datasets import DatasetComponent, LmDataConfig  # jax: only for DAGs that train

    where = "lm_mixture_data_config"
    if not components:
        raise ConfigError(f"{where}: no components; give a name -> tokenize step mapping")
    schedule = as_schedule(weights)
    check_schedule(schedule, list(components), where)
    weighted = {name for _, phase in schedule for name, weight in phase.items() if weight > 0}
    unweighted = sorted(set(components) - {name for _, phase in schedule for name in phase})
    if unweighted and not missing_weights_are_validation:
        raise ConfigError(f"{where}: components {unweighted} have no weight; give them one, or pass "
                          "missing_weights_are_validation=True to make them validation-only")  # fmt: skip
    if batch_size is not None:
        for start, _ in schedule:
            if start * batch_size % mixture_block_size:
                raise ConfigError(f"{where}: a phase starts at step {start}, where sequence {start * batch_size} "
                                  f"is not a multiple of mixture_block_size={mixture_block_size}; "
                                  "use steps.tokenize.mixture_weights.phase_start()")  # fmt: skip
    tokenizer = _one_tokenizer(components, where)
    versioned_schedule = [(versioned(start), {name: versioned(float(phase.get(name, 0.0))) for name in components})
                          for start, phase in schedule]  # fmt: skip
    logger.info("%s: %d components, %d weighted, %d phases", where, len(components), len(weighted), len(schedule))
    return LmDataConfig(
        tokenizer=tokenizer,
        cache_dir=None,
        components={name: DatasetComponent(cache_dir=_cache_dir(c)) for name, c in components.items()},
        train_weights=versioned_schedule[0][1] if len(schedule) == 1 else versioned_schedule,
        mixture_block_size=mixture_block_size,
        shuffle=shuffle,
        auto_build_caches=False,
    )


def _cache_dir(component: ExecutorStep | TokenizedCache) -> Any:
    return output_path_of(component) if isinstance(component, ExecutorStep) else component.cache_dir


def _tokenizer_of(component: ExecutorStep | TokenizedCache) -> Any:
    if isinstance(component, TokenizedCache):
        return component.tokenizer
    tokenizer = getattr(component.config, "tokenizer_path", None)
    if tokenizer is None:
        raise ConfigError(f"lm_mixture_data_config: step {component.name} has no config.tokenizer_path; "
                          "components must be tokenize steps or TokenizedCache")  # fmt: skip
    return tokenizer


def _tokenizer_key(tokenizer: Any) -> Any:
    """What makes two tokenizers the same: a path string, or the step (and subpath) an input marker names."""
    if isinstance(tokenizer, VersionedValue):
        return _tokenizer_key(tokenizer.value)
    if isinstance(tokenizer, ExecutorStep):
        return InputName(tokenizer)
    return tokenizer.rstrip("/") if isinstance(tokenizer, str) else tokenizer


def _one_tokenizer(components: Mapping[str, ExecutorStep | TokenizedCache], where: str) -> Any:
    first_name, first = next(iter(components.items()))
    tokenizer = _tokenizer_of(first)
    for name, component in components.items():
        other = _tokenizer_of(component)
        if _tokenizer_key(other) != _tokenizer_key(tokenizer):
            raise ConfigError(
                f"{where}: all components must share one tokenizer, but {name!r} ({_describe(component)}) uses "
                f"{_describe_tokenizer(other)} and {first_name!r} ({_describe(first)}) uses "
                f"{_describe_tokenizer(tokenizer)}; tokenize both with the same tokenizer step"
            )
    return tokenizer


def _describe(component: ExecutorStep | TokenizedCache) -> str:
    return f"step {component.name}" if isinstance(component, ExecutorStep) else f"cache {component.cache_dir}"


def _describe_tokenizer(tokenizer: Any) -> str:
    key = _tokenizer_key(tokenizer)
    if isinstance(key, InputName) and key.step is not None:
        return f"the output of step {key.step.name}" + (f"/{key.name}" if key.name else "")
    return repr(key.name if isinstance(key, InputName) else key)


def default_cells(documents: ExecutorStep | Sequence[ExecutorStep], tokenizer: ExecutorStep,
                  quality_model: ExecutorStep | None, topics: int = 40, quality_buckets: int = 5,
                  sample_docs: int = 20_000) -> ExecutorStep:  # fmt: skip
    """Topic x quality cells of the docs of `documents` (one step or several; 40 x 5 in the hero)."""
    inputs = [documents] if isinstance(documents, ExecutorStep) else list(documents)
    return ExecutorStep(
        name="mix/cells",
        fn=build_cells,
        description=f"{topics} topics x {quality_buckets} quality buckets",
        config=CellsConfig(input_paths=[_docs_of(step) for step in inputs], tokenizer_path=output_path_of(tokenizer),
                           quality_model_path=None if quality_model is None else output_path_of(quality_model),
                           topics=versioned(topics), quality_buckets=versioned(quality_buckets),
                           sample_docs=versioned(sample_docs), sample_files=versioned(64), embedding_dim=versioned(64),
                           vocab_size=versioned(20_000), max_df=versioned(0.5), kmeans_iterations=versioned(50),
                           seed=versioned(0), top_terms=versioned(8), output_path=THIS_OUTPUT_PATH),
    )  # fmt: skip


def default_mixture_weights(cells: ExecutorStep, train_tokens: int, max_epochs: float = 8.0,
                            phase_fractions: Sequence[float] = (0.8, 0.2),
                            quality_multipliers: Sequence[Sequence[float]] = ()) -> ExecutorStep:  # fmt: skip
    """Per-cell weights from `cells`' token counts, each cell seen at most `max_epochs` times."""
    return ExecutorStep(
        name="mix/weights",
        fn=mixture_weights,
        description=f"weights for {train_tokens} tokens in {len(phase_fractions)} phase(s), cap {max_epochs} epochs",
        config=MixtureWeightsConfig(composition_path=output_path_of(cells), train_tokens=versioned(train_tokens),
                                    max_epochs=versioned(max_epochs), phase_fractions=versioned(list(phase_fractions)),
                                    quality_multipliers=versioned([list(m) for m in quality_multipliers]),
                                    output_path=THIS_OUTPUT_PATH),
    )  # fmt: skip
