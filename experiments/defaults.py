"""Step builders that experiments share, so that an experiment file only says *what* it wants.

Each builder decides which config fields are versioned: everything that changes a step's output
(the source, how many documents, the vocabulary size, the interpreter whose stdlib is read), and
nothing that only changes how the work is laid out (shard sizes, batch sizes).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

from executor import THIS_OUTPUT_PATH, ExecutorStep, output_path_of, versioned
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
