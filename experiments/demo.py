"""Demo DAG: two real corpora from this machine's Python stdlib, a tokenizer trained on both, and stats.

    corpus/python_stdlib ─────┬──> tokenizer/byte_bpe ──┐
    corpus/python_docstrings ─┴─────────────────────────┴──> stats/corpora

    EXECUTOR_PREFIX=/tmp/demo-out python experiments/demo.py       # run what is not done yet
    EXECUTOR_PREFIX=/tmp/demo-out python experiments/demo.py       # again: every step is skipped
    python experiments/demo.py --dry_run true                      # say what would run

Everything runs offline in seconds. The stats step is written out in full to show the step API;
the others come from `experiments/defaults.py`.
"""

from executor import THIS_OUTPUT_PATH, ExecutorStep, executor_main, output_path_of, versioned
from experiments.defaults import default_text_corpus, default_tokenizer
from experiments.summary import print_summary
from steps.tokenize.corpus_stats import CorpusStatsConfig, compute_corpus_stats


def build_steps(max_docs: int = 200, vocab_size: int = 4096) -> list[ExecutorStep]:
    """The demo DAG; tests build it smaller."""
    code = default_text_corpus("python_stdlib", max_docs=max_docs)
    prose = default_text_corpus("python_docstrings", max_docs=max_docs)
    tokenizer = default_tokenizer([code, prose], vocab_size=vocab_size)
    stats = ExecutorStep(
        name="stats/corpora",
        fn=compute_corpus_stats,
        description="Docs, bytes, whitespace tokens, common words and tokens per byte of code vs prose",
        config=CorpusStatsConfig(
            input_paths=[output_path_of(code), output_path_of(prose)],
            tokenizer_path=output_path_of(tokenizer),
            top_words=versioned(20),
            output_path=THIS_OUTPUT_PATH,
        ),
    )
    return [code, prose, tokenizer, stats]


steps = build_steps()

if __name__ == "__main__":
    executor = executor_main(steps, description="Stdlib code and docstring corpora -> byte-level BPE -> stats")
    print_summary(executor, steps)
