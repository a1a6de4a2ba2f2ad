"""Tokenize documents into a Levanter cache (train and validation splits) that Levanter's trainer reads as is.

    tokenized = ExecutorStep(
        name="tokenized/prose",
        fn=tokenize,
        config=TokenizeConfig(
            input_paths=[output_path_of(quality_filter, "docs")],
            tokenizer_path=output_path_of(tokenizer),
            validation_fraction=versioned(0.01),
            output_path=THIS_OUTPUT_PATH,
        ),
    )
    # Levanter: DatasetComponent(cache_dir=<output>), LmDataConfig(tokenizer=<tokenizer_path>, auto_build_caches=False)

Shard groups of consecutive input files up to `group_bytes` (`steps/tokenize/groups.py`: a file that big
or bigger is a group of its own), run with `run_sharded` (Ray tasks or processes): the group reads its
files' documents in order with the one document reader (`steps/data/documents.py`: bad lines are counted, not fatal),
encodes them in batches with HF `tokenizers` (`encode_batch_fast`, in the process's encoding threads), frames each
document as Levanter's `BatchTokenizer` does (BOS when the tokenizer has one, the text's ids, EOS),
and streams them into two Levanter sub-caches, `train/part-<group>/` and `validation/part-<group>/`
(`steps/tokenize/levanter_cache.py`). The group is committed with its marker; a restarted step redoes only
groups without one. In threads, a group hands its reading slot to the next once its last batch is submitted
(`_READING_SLOTS`), so group boundaries do not idle the tokenizer. Once all are committed, each split gets
a sharded `shard_ledger.json` over its parts, and that ledger is what makes it a cache: Levanter refuses a
split without one.

A document longer than `max_document_chars` (a million characters by default) is encoded in pieces cut at
whitespace (`document_pieces`), whose ids make its one row: encoding a 50 MB document whole held 7.7 GB, far
past a shard's 2 GiB (steps/README.md); in pieces, the shard stays near 1 GB.

A document goes to validation when the xxh3 hash of its id falls in the first
`validation_fraction` of the hash range: stable however the inputs are sharded.

One difference from Levanter's builder: it appends `" " + eos_token` to the text before encoding, so a
byte-level BPE spends a token on that space; we append the EOS id, so a document decodes back to
exactly its text and costs one token less.

Output: `train/`, `validation/` (Levanter caches), `stats.json`: documents, tokens, bytes and bytes
per token overall, per split and per source; bad lines by reason with samples; empty input files; documents
split for length (`split_documents`) and their pieces (`document_pieces`).
A step that would leave no training document fails instead of writing an empty cache.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import xxhash
from tokenizers import Encoding, Tokenizer

from executor import ShardReport, ShardWriter, recorded_path, run_sharded, storage
from steps.data.documents import (
    ReadReport,
    flow_stats,
    list_input_files,
    merge_stats,
    read_documents,
    write_stats,
)
from steps.tokenize.configs import TokenizeConfig
from steps.tokenize.groups import FileGroup, component_of, file_sizes, group_files
from steps.tokenize.levanter_cache import (
    PartFigures,
    PartWriter,
    check_cache_path,
    close_parts,
    write_sharded_ledger,
)
from steps.tokenize.train_tokenizer import SpecialTokenIds, load_tokenizer, special_token_ids

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")
COMPONENTS_FILE = "components.json"
NO_SOURCE = "(none)"
_HASH_RANGE = float(1 << 64)
BATCH_CHARS = 1 << 17
"""An encode call also ends at this many characters of text: batches small enough that the encoding threads
finish their last ones close together at a group's end (one long document still makes a batch of its own
length), and a batch of huge documents stays bounded."""
ENCODE_THREADS = max(2, os.cpu_count() or 1)
"""Threads encoding batches in this process (`_encoders`), each one batch at a time with the tokenizer's own
thread pool off (`_tokenizer_pool_off`): `encode_batch_fast` then encodes in the calling thread with the GIL
released. The tokenizer's pool (rayon) spreads each call over every core instead, and several calls at once
nest on its threads' stacks, so that the six a group kept in flight all ended together at the group's very
end, where their framing then ran on one core while the other idled (30 ms of bench_tokenize's ~950). Three
default runs of bench_tokenize on 2 cores: 0.964, 0.939 and 0.972 of raw `encode_batch_fast`, against 0.926,
0.929 and 0.949 for six batches at once through the tokenizer's pool."""
ENCODE_AHEAD = ENCODE_THREADS
"""Batches a shard group keeps encoding at once while it frames and writes one more: a group running alone
(the last one) keeps every encoding thread busy. Memory is one more than this many batches' texts and
encodings, `BATCH_CHARS` each at most (an encoded batch of 512k characters held 17 MB here, so about 4 MB a
batch of 128k), and `ENCODE_AHEAD_CHARS` bounds them whatever the core count."""
ENCODE_AHEAD_CHARS = 1 << 21
"""Characters a shard group keeps encoding at once at most, however many batches that is (one batch at least):
encoding holds ~100-150 bytes a character of code until a batch's ids are taken, so 2 M characters are ~300 MB.
On 16 cores, 16 batches of 128k characters about fill it; 16 pieces of a long document (`max_document_chars`,
a million characters each) took a 50 MB document's step to 3.0 GB without it."""
_CUT_SCAN_CHARS = 1 << 12
"""A long document's cut is looked for this many characters at a time, backwards from the piece's limit."""
_SPACE_BEFORE_WORD = re.compile(r"\s(?=\S)")
"""The last whitespace character of a run: a byte-level BPE's pre-tokenizer starts a word there (with the
space), so text cut just before it pre-tokenizes, and so encodes, as the uncut text does."""
_READING_SLOTS: dict[str, threading.BoundedSemaphore] = {}
"""Output path -> slots of a step whose groups run in threads of this process: `max_workers` of them. A group
holds one while it reads and submits batches and gives it back once its last batch is submitted, so that the
next group reads and encodes while this one frames its last batches, closes its parts and commits (twice as
many group threads run, at most `max_workers` of them reading). Without it, groups of equal files reach
their ends together and the tokenizer's threads idle through every group boundary. Groups in processes or
Ray tasks have no slot: each worker holds its own tokenizer, and a group runs in it from start to commit."""


class EmptyTokenizeOutputError(ValueError):
    """Every input document was bad or the inputs were empty: no training data to write."""


def tokenize(config: TokenizeConfig) -> None:
    step = f"tokenize ({config.output_path})"
    check_cache_path(config.output_path, step)
    if not 0.0 <= config.validation_fraction < 1.0:
        raise ValueError(f"{step}: validation_fraction must be in [0, 1), got {config.validation_fraction}")
    if config.max_document_chars < 0:
        raise ValueError(f"{step}: max_document_chars must be 0 or more (0: never split a document), got "
                         f"{config.max_document_chars}")  # fmt: skip
    if config.group_bytes < 0:
        raise ValueError(f"{step}: group_bytes must be 0 or more (0: one shard group per file), got "
                         f"{config.group_bytes}")  # fmt: skip
    _framing(config.tokenizer_path)  # a tokenizer without an EOS fails here, before any shard runs
    files = list_input_files(config.input_paths)
    key = component_of if config.per_folder else (lambda _path: "")
    groups = group_files(config, files, file_sizes(files), config.group_bytes, key)
    max_workers = config.max_workers
    if config.parallelism == "thread":
        max_workers = max(1, config.max_workers or os.cpu_count() or 1)
        _READING_SLOTS[config.output_path] = threading.BoundedSemaphore(max_workers)
        max_workers *= 2  # the other half frame, close and commit the groups that gave their slots back
    try:
        report = run_sharded(
            config.output_path,
            groups,
            _tokenize_shard,
            parallelism=config.parallelism,
            max_workers=max_workers,
            description="tokenize",
        )
    finally:
        _READING_SLOTS.pop(config.output_path, None)
    stats = _stats(report, config, len(files))
    if stats["splits"]["train"]["documents"] == 0:
        raise EmptyTokenizeOutputError(
            f"{step}: no training document in {len(files)} input file(s) ({stats['empty_files']} empty, bad lines: "
            f"{stats['bad_input']}); check the inputs {config.input_paths}, samples: {stats['bad_samples'][:3]}"
        )
    metadata = cache_metadata(config.tokenizer_path)
    if config.per_folder:
        stats["components"] = _write_components(config.output_path, report, metadata)
    else:
        _write_ledgers(config.output_path, config.output_path, sorted(report.markers.items()), metadata)
    write_stats(config.output_path, stats)
    logger.info(
        "%s: %d documents, %d tokens (%.2f bytes per token)",
        step,
        stats["documents"],
        stats["tokens"],
        stats["bytes_per_token"],
    )


def _write_ledgers(
    output_path: str, cache_dir: str, markers: list[tuple[str, dict[str, Any]]], metadata: dict[str, Any]
) -> None:
    """One Levanter cache per split under `cache_dir` (in the step's `output_path`) over the committed parts of
    `markers`' shard groups."""
    for split in SPLITS:
        parts = [
            PartFigures(f"part-{shard_id}", marker["stats"][f"{split}_docs"], marker["stats"][f"{split}_tokens"])
            for shard_id, marker in markers
        ]
        write_sharded_ledger(storage.join(cache_dir, split), parts, metadata, output_path)


def _write_components(output_path: str, report: ShardReport, metadata: dict[str, Any]) -> dict[str, Any]:
    """With `per_folder`: each component's caches, and components.json naming those a trainer can use.

    A component with documents in both splits is listed under `components` (trained on and evaluated); one
    whose documents all fell in `train/` (a small cell: the validation share is drawn by id hash) under
    `train_only`: trained on, with no validation loss of its own, so no data is lost from the mixture. One
    without training documents is listed under `excluded` with its figures and gets no cache."""
    by_component: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for shard_id, marker in sorted(report.markers.items()):
        by_component.setdefault(marker["stats"]["component"], []).append((shard_id, marker))
    usable: dict[str, dict[str, int]] = {}
    train_only: dict[str, dict[str, int]] = {}
    excluded: dict[str, dict[str, int]] = {}
    for name, markers in sorted(by_component.items()):
        figures = {f"{split}_{what}": sum(m["stats"][f"{split}_{what}"] for _, m in markers)
                   for split in SPLITS for what in ("docs", "tokens")}  # fmt: skip
        if not figures["train_docs"]:
            excluded[name] = figures
            continue
        _write_ledgers(output_path, storage.join(output_path, name), markers, metadata)
        (usable if figures["validation_docs"] else train_only)[name] = figures
    document = {"components": usable, "train_only": train_only, "excluded": excluded}
    storage.write_json_atomic(storage.join(output_path, COMPONENTS_FILE), document)
    if train_only:
        logger.info("tokenize (%s): %d component(s) without validation documents are trained on only: %s",
                    output_path, len(train_only), sorted(train_only))  # fmt: skip
    if excluded:
        logger.warning("tokenize (%s): %d component(s) without training documents left out: %s",
                       output_path, len(excluded), sorted(excluded))  # fmt: skip
    return document


def load_components(tokenized_path: str, *, train_only: bool = False) -> dict[str, str]:
    """Component name -> cache folder of a `per_folder` tokenize output: those with both splits, or with
    `train_only`, those with training documents only (their `validation/` cache is empty)."""
    document = storage.read_json(storage.join(tokenized_path, COMPONENTS_FILE))
    if document is None:
        raise FileNotFoundError(f"no {COMPONENTS_FILE} under {tokenized_path}: point at a tokenize step run "
                                "with per_folder=True")  # fmt: skip
    listed = document.get("train_only", {}) if train_only else document["components"]
    return {name: storage.join(tokenized_path, name) for name in listed}


@functools.lru_cache(maxsize=4)
def _framing(tokenizer_path: str) -> tuple[Tokenizer, SpecialTokenIds]:
    """The tokenizer and its BOS/EOS ids, loaded once per worker process."""
    tokenizer = load_tokenizer(tokenizer_path)
    return tokenizer, special_token_ids(tokenizer_path, tokenizer)


def cache_metadata(tokenizer_path: str) -> dict[str, Any]:
    """What Levanter's `BatchTokenizer.metadata` holds for this tokenizer, so that its cache loader finds the
    ledger's metadata equal to its own (it warns otherwise)."""
    return dict(_cache_metadata(tokenizer_path))


@functools.lru_cache(maxsize=4)
def _cache_metadata(tokenizer_path: str) -> dict[str, Any]:
    tokenizer, special = _framing(tokenizer_path)
    return {
        "tokenizer": tokenizer_path,
        "vocab_size": tokenizer.get_vocab_size(),
        "return_attention_mask": False,
        "padding": False,
        "max_length": None,
        "append_bos": special.bos is not None,
        "append_eos": True,
    }


def in_validation(doc_id: str, validation_fraction: float) -> bool:
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8")) < validation_fraction * _HASH_RANGE


def _tokenize_shard(group: FileGroup[TokenizeConfig], writer: ShardWriter) -> dict[str, Any]:
    config = group.config
    tokenizer, special = _framing(config.tokenizer_path)
    metadata = cache_metadata(config.tokenizer_path)
    folder = f"{component_of(group.paths[0])}/" if config.per_folder else ""
    prefix, suffix = ([] if special.bos is None else [special.bos]), [special.eos]
    parts = {
        split: PartWriter(writer, f"{folder}{split}/part-{group.name}", metadata, prefix, suffix) for split in SPLITS
    }
    report = ReadReport()
    by_source: dict[str, Counter[str]] = {"docs": Counter(), "tokens": Counter(), "bytes": Counter()}
    empty_files: list[str] = []
    documents = _group_documents(group.paths, report, config.raw_input, empty_files)
    pieces = _split_documents(documents, config.max_document_chars)
    slot = _READING_SLOTS.get(config.output_path)
    split_ids: list[np.ndarray] = []  # the ids of a split document's pieces so far
    split_bytes = split_documents = pieces_made = 0
    for batch, encodings in _encoded_batches(tokenizer, pieces, config.batch_size, BATCH_CHARS, slot):
        rows: dict[str, list[Encoding]] = {split: [] for split in SPLITS}
        for document, encoding in zip(batch, encodings, strict=True):
            if _PIECE in document:  # a piece of a long document: its row is written with its last piece
                split_ids.append(np.array(encoding.ids, dtype=np.int32))
                split_bytes += len(document["text"].encode("utf-8"))
                pieces_made += 1
                if not document[_LAST_PIECE]:
                    continue
            split = "validation" if in_validation(document["id"], config.validation_fraction) else "train"
            if split_ids:
                parts[split].write_encodings(rows[split])  # the rows before it, in order
                parts[split].write_ids(split_ids)
                rows[split], tokens, text_bytes = [], sum(map(len, split_ids)), split_bytes
                split_ids, split_bytes, split_documents = [], 0, split_documents + 1
            else:
                rows[split].append(encoding)
                tokens, text_bytes = len(encoding), len(document["text"].encode("utf-8"))
            source = document["source"] or NO_SOURCE
            by_source["docs"][source] += 1
            by_source["tokens"][source] += tokens + len(prefix) + len(suffix)
            by_source["bytes"][source] += text_bytes
        for split in SPLITS:
            parts[split].write_encodings(rows[split])
    close_parts(parts.values())
    stats = flow_stats(report, report.docs, report.bytes)
    for split, part in parts.items():
        stats[f"{split}_docs"], stats[f"{split}_tokens"] = part.rows, part.tokens
    stats.update({f"{what}_by_source": dict(counts) for what, counts in by_source.items()})
    stats["empty_files"] = len(empty_files)
    stats["split_documents"], stats["document_pieces"] = split_documents, pieces_made
    if config.per_folder:
        stats["component"] = component_of(group.paths[0])
    return stats


def _group_documents(
    paths: Iterable[str], report: ReadReport, raw: bool, empty_files: list[str]
) -> Iterator[dict[str, Any]]:
    """The good documents of each file in turn, noting in `empty_files` each file that had none."""
    for path in paths:
        before = report.docs
        yield from read_documents(path, report, raw)
        if report.docs == before:
            empty_files.append(path)


_PIECE = "piece"
"""Key of a split document's piece (a copy of its record with the piece as its text): the piece's index."""
_LAST_PIECE = "last_piece"


def document_pieces(text: str, max_chars: int) -> Iterator[str]:
    """`text` in pieces of at most `max_chars` characters, end to end; each cut just before the last
    whitespace of a run (`_SPACE_BEFORE_WORD`), the latest one the piece holds, or at `max_chars` if it holds
    none. A text no longer than `max_chars`, or any text if it is 0, is one piece."""
    start = 0
    while max_chars and len(text) - start > max_chars:
        cut = _cut_before_word(text, start + 1, start + max_chars)
        yield text[start:cut]
        start = cut
    yield text[start:]


def _cut_before_word(text: str, low: int, high: int) -> int:
    """The last position in [low, high] of a whitespace that a non-space follows, else `high`. Looked for
    backwards, `_CUT_SCAN_CHARS` at a time, so a piece's cut costs a scan of its end, not of all of it."""
    end = high + 1
    while end > low:
        begin = max(low, end - _CUT_SCAN_CHARS)
        matches = list(_SPACE_BEFORE_WORD.finditer(text, begin, end + 1))  # end + 1: the lookahead sees text[end]
        if matches:
            return matches[-1].start()
        end = begin
    return high


def _split_documents(documents: Iterable[dict[str, Any]], max_chars: int) -> Iterator[dict[str, Any]]:
    """Each document as it is, or, if it is longer than `max_chars` characters, its pieces in order, made one at
    a time (`document_pieces`): copies of its record with the piece as its text, its index under `_PIECE` and
    whether it is the last under `_LAST_PIECE`."""
    for document in documents:
        if not max_chars or len(document["text"]) <= max_chars:
            yield document
            continue
        pieces = document_pieces(document["text"], max_chars)
        piece, index = next(pieces), 0
        for following in pieces:
            yield {**document, "text": piece, _PIECE: index, _LAST_PIECE: False}
            piece, index = following, index + 1
        yield {**document, "text": piece, _PIECE: index, _LAST_PIECE: True}


def _encoded_batches(
    tokenizer: Tokenizer,
    documents: Iterable[dict[str, Any]],
    batch_size: int,
    batch_chars: int,
    slot: contextlib.AbstractContextManager[Any] | None = None,
) -> Iterator[tuple[tuple[dict[str, Any], ...], list[Encoding]]]:
    """Batches of documents with their encodings, in order. Up to `ENCODE_AHEAD` batches encode in the
    process's encoding threads while the caller handles the one before and the next is read:
    `encode_batch_fast` releases the GIL, so the Python work (reading, framing, writing) runs beside the Rust
    encoding instead of idling its cores; fewer once they hold `ENCODE_AHEAD_CHARS` characters. `slot` is held
    while reading and submitting (see `_READING_SLOTS`) and given back before the last batches are waited for."""
    encoders = _encoders()
    with _tokenizer_pool_off():
        ahead: deque[tuple[tuple[dict[str, Any], ...], Future[list[Encoding]]]] = deque()
        ahead_chars = 0
        try:
            with slot or contextlib.nullcontext():
                for batch in _batches(documents, batch_size, batch_chars):
                    texts = [document["text"] for document in batch]
                    encoding = encoders.submit(tokenizer.encode_batch_fast, texts, add_special_tokens=False)
                    ahead.append((batch, encoding))
                    ahead_chars += sum(map(len, texts))
                    while len(ahead) > ENCODE_AHEAD or (len(ahead) > 1 and ahead_chars > ENCODE_AHEAD_CHARS):
                        done, encoding = ahead.popleft()
                        ahead_chars -= sum(len(document["text"]) for document in done)
                        yield done, encoding.result()
            while ahead:
                done, encoding = ahead.popleft()
                yield done, encoding.result()
        finally:  # a failed or abandoned group leaves no batch of its encoding after the pool is back on
            for _, encoding in ahead:
                encoding.cancel() or encoding.exception()


_ENCODERS: ThreadPoolExecutor | None = None
_ENCODERS_LOCK = threading.Lock()


def _encoders() -> ThreadPoolExecutor:
    """The process's `ENCODE_THREADS` encoding threads, shared by the groups running in it, so that its threads
    do not outnumber the cores however many of its groups read at once, and a group running alone uses them all."""
    global _ENCODERS
    with _ENCODERS_LOCK:
        if _ENCODERS is None:
            _ENCODERS = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="encode")
        return _ENCODERS


_POOL_VARIABLE = "TOKENIZERS_PARALLELISM"
_POOL_LOCK = threading.Lock()
_pool_off_users = 0
_pool_setting_before: str | None = None


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: no encoding thread, no group encoding, no lock holder."""
    global _ENCODERS, _ENCODERS_LOCK, _POOL_LOCK, _pool_off_users
    _ENCODERS, _ENCODERS_LOCK = None, threading.Lock()
    _POOL_LOCK, _pool_off_users = threading.Lock(), 0


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def _tokenizer_pool_off() -> Iterator[None]:
    """`tokenizers`' own thread pool off (TOKENIZERS_PARALLELISM=false, which it reads at every call) while any
    group of this process encodes; the variable is as it was once the last one ends. It is the process's
    environment: another caller of `tokenizers` in this process meanwhile encodes in its calling thread too."""
    global _pool_off_users, _pool_setting_before
    with _POOL_LOCK:
        if _pool_off_users == 0:
            _pool_setting_before = os.environ.get(_POOL_VARIABLE)
            os.environ[_POOL_VARIABLE] = "false"
        _pool_off_users += 1
    try:
        yield
    finally:
        with _POOL_LOCK:
            _pool_off_users -= 1
            if _pool_off_users == 0:
                if _pool_setting_before is None:
                    os.environ.pop(_POOL_VARIABLE, None)
                else:
                    os.environ[_POOL_VARIABLE] = _pool_setting_before


def _batches(
    documents: Iterable[dict[str, Any]], batch_size: int, batch_chars: int
) -> Iterator[tuple[dict[str, Any], ...]]:
    """Runs of at most `batch_size` documents, ending early once they hold `batch_chars` characters of text."""
    batch: list[dict[str, Any]] = []
    chars = 0
    for document in documents:
        batch.append(document)
        chars += len(document["text"])
        if len(batch) >= batch_size or chars >= batch_chars:
            yield tuple(batch)
            batch, chars = [], 0
    if batch:
        yield tuple(batch)


def _stats(report: ShardReport, config: TokenizeConfig, files: int) -> dict[str, Any]:
    merged = merge_stats(report)
    splits = {
        split: {"documents": merged.get(f"{split}_docs", 0), "tokens": merged.get(f"{split}_tokens", 0)}
        for split in SPLITS
    }
    tokens = sum(split["tokens"] for split in splits.values())
    sources = {
        source: {
            "documents": merged["docs_by_source"][source],
            "tokens": merged["tokens_by_source"][source],
            "bytes": merged["bytes_by_source"][source],
            "bytes_per_token": merged["bytes_by_source"][source] / merged["tokens_by_source"][source],
        }
        for source in sorted(merged.get("docs_by_source", {}))
    }
    return {
        "documents": merged.get("docs_out", 0),
        "tokens": tokens,
        "bytes": merged.get("bytes_out", 0),
        "bytes_per_token": merged.get("bytes_out", 0) / tokens if tokens else 0.0,
        "splits": splits,
        "sources": sources,
        "empty_files": merged.get("empty_files", 0),
        "split_documents": merged.get("split_documents", 0),
        "document_pieces": merged.get("document_pieces", 0),
        "max_document_chars": config.max_document_chars,
        "bad_input": merged.get("bad_input", {}),
        "bad_samples": merged.get("bad_samples", []),
        "shards": report.total,
        "files": files,
        "docs_in": merged.get("docs_in", 0),
        "docs_out": merged.get("docs_out", 0),
        "bytes_in": merged.get("bytes_in", 0),
        "tokens_out": tokens,
        "tokenizer": recorded_path(config.tokenizer_path, config.output_path),
        "validation_fraction": config.validation_fraction,
    }
