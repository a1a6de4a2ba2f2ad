"""The tokenize and eval-suite steps' configs, apart from their steps (steps/tokenize/tokenize.py, eval_suite.py,
which load Levanter's cache writer): a DAG's definition builds them without loading JAX or Levanter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MAX_DOCUMENT_CHARS = 1_000_000
"""`TokenizeConfig.max_document_chars`' default. Encoding holds ~350 bytes per token until its ids are taken
(a 50 MB document of code, 23 M tokens, peaked at 7.7 GB); a piece of a million characters holds ~150 MB."""


@dataclass(frozen=True)
class TokenizeConfig:
    input_paths: list[str]
    """Document files, folders or globs (JSONL or Parquet; a data step's `docs/`), read in this order. Dependencies."""
    tokenizer_path: str
    """A train_tokenizer output (an HF tokenizer directory). A dependency; give Levanter's trainer the same path."""
    output_path: str
    """Where train/, validation/ and stats.json go (THIS_OUTPUT_PATH in a DAG): a local path, gs:// or s3://."""
    validation_fraction: float = 0.01
    """Share of documents (by hash of their id) held out in the validation split. Versioned."""
    raw_input: bool = True
    """Whether an input file with no usable document is an error (False for our own outputs, where an
    upstream filter may have emptied a shard: it is then counted in stats.json as an empty file)."""
    batch_size: int = 512
    """Documents per `encode_batch_fast` call at most (see `BATCH_CHARS`); memory and speed only, so unversioned."""
    parallelism: str = "auto"
    """How shard groups run: auto (Ray when initialized, else processes), ray, process or thread. Plain."""
    max_workers: int | None = None
    """Shard groups reading and encoding at once (default: the CPUs); with threads, as many more may be finishing
    (framing their last batches, committing) meanwhile. Plain."""
    group_bytes: int = 64 << 20
    """Consecutive input files are tokenized as one shard group until they hold this many bytes as stored (a
    file this big or bigger is a group of its own; 0: one group per file). A group is the unit of resume and has
    a fixed cost at its ends (see `steps/tokenize/groups.py`); grouping splits the cache into sub-caches
    differently but leaves its rows and their order as they are, so it is plain (unversioned)."""
    per_folder: bool = False
    """Each input file belongs to the component named by its parent folder (a cells step's `cells/<cell>/`):
    every component gets its own `<name>/train` and `<name>/validation` caches, listed in components.json.
    One step then tokenizes any number of cells. Versioned."""
    max_document_chars: int = MAX_DOCUMENT_CHARS
    """A longer document is encoded in pieces of at most this many characters, each cut just before the last
    whitespace of a run where the piece has one (`document_pieces`): its pieces' ids, end to end, make its one
    row (BOS and EOS framing the whole), so a shard's memory is bounded whatever a document's size. Cut there,
    byte-level BPE text encodes to the uncut text's tokens; a piece with no whitespace (a 1 MB base64 blob) is
    cut at the limit, mid-word. stats.json counts `split_documents` and their `document_pieces`. 0: never
    split. Versioned (wrap it in `versioned()` to hash it: a plain default leaves existing steps' hashes)."""


@dataclass(frozen=True)
class EvalSuiteConfig:
    subsets: Mapping[str, str]
    """Subset name -> folder (or file) of its documents (JSONL or Parquet with `text` and `id`). Dependencies."""
    tokenizer_path: str
    """The run's tokenizer (a train_tokenizer output). A dependency."""
    output_path: str
    """Where each subset's `validation/` cache and suite.json go (THIS_OUTPUT_PATH)."""
    tokens_per_subset: int
    """Each subset's tokens, exactly (a subset with fewer is used whole): make it a multiple of the sequence
    length, eval batch size x eval batches x sequence length to read every sequence once. Versioned."""
    min_tokens: int = 1
    """A subset with fewer tokens is refused (give the sequence length: Levanter reads no partial sequence).
    Versioned."""
