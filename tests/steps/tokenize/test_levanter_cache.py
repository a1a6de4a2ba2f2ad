"""The tokenize step's cache writer against Levanter's own: the same files byte for byte, the same ledger, the
same rows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from levanter.store.cache import CacheLedger, CacheMetadata, SerialCacheWriter

from executor.shards.writer import ShardWriter
from steps.tokenize.levanter_cache import EXEMPLAR, LEDGER_FILE, TOKENS_FIELD, PartWriter, load_cache

BOS, EOS = 1, 2
METADATA = {"tokenizer": "test", "vocab_size": 5000, "append_bos": True, "append_eos": True}


def documents() -> list[list[int]]:
    """70 documents of 0 to 600 ids (one empty), written in batches of 10."""
    rng = np.random.default_rng(7)
    return [rng.integers(3, 5000, size=int(length)).tolist() for length in [0, *rng.integers(1, 600, size=69)]]


def levanters_cache(path: Path, docs: list[list[int]]) -> None:
    """What Levanter's own writer leaves for the same framed documents, a batch at a time."""
    with SerialCacheWriter(str(path), EXEMPLAR, metadata=CacheMetadata(METADATA)) as writer:
        for start in range(0, len(docs), 10):
            framed = [np.array([BOS, *ids, EOS], dtype=np.int32) for ids in docs[start : start + 10]]
            writer.write_batch({TOKENS_FIELD: framed})


def our_cache(
    output: Path, docs: list[list[int]], flush_tokens: int, first_flush_tokens: int = 1 << 30, align_tokens: int = 1
) -> tuple[Path, list[dict]]:
    writer = ShardWriter(str(output), "00000")
    part = PartWriter(writer, "train/part-00000", METADATA, prefix=[BOS], suffix=[EOS], flush_tokens=flush_tokens,
                      first_flush_tokens=first_flush_tokens, align_tokens=align_tokens)  # fmt: skip
    for start in range(0, len(docs), 10):
        part.write(docs[start : start + 10])
    part.close()
    assert (part.rows, part.tokens) == (len(docs), sum(len(ids) + 2 for ids in docs))
    return output / "train" / "part-00000", writer.commit()


def file_bytes(cache: Path) -> dict[str, bytes]:
    return {str(path.relative_to(cache)): path.read_bytes() for path in sorted(cache.rglob("*")) if path.is_file()}


def array_metadata(cache: Path) -> dict[str, dict]:
    return {name: json.loads((cache / TOKENS_FIELD / name / "zarr.json").read_text()) for name in ("offsets", "data")}


@pytest.mark.parametrize(
    ("flush_tokens", "first_flush_tokens", "align_tokens"),
    [
        pytest.param(1 << 30, 1 << 30, 1, id="one-write-at-close"),
        pytest.param(1, 1, 1, id="a-write-per-batch"),  # close writes only the offsets
        pytest.param(5000, 1 << 30, 1, id="writes-then-the-rest-at-close"),  # every second batch; the seventh at close
        # In the background once 1000 tokens are held, then whenever as many are held as were written before.
        pytest.param(1 << 30, 1000, 1, id="doubling-writes"),
        # The same, each write cut at a multiple of 700 tokens (the default cuts at the stored chunk, 262,144):
        # the rest stays buffered, so rows straddle writes.
        pytest.param(1 << 30, 1000, 700, id="doubling-writes-cut-at-700"),
    ],
)
def test_a_part_is_what_levanters_own_writer_leaves(tmp_path, flush_tokens, first_flush_tokens, align_tokens):
    docs = documents()
    theirs = tmp_path / "theirs"
    levanters_cache(theirs, docs)
    ours, manifest = our_cache(tmp_path / "ours", docs, flush_tokens, first_flush_tokens, align_tokens)

    assert array_metadata(ours) == array_metadata(theirs)
    # Byte for byte: the arrays' stored files (compressed chunks, shard index) and the ledger, whichever
    # order and grouping of tensorstore writes produced them.
    assert file_bytes(ours) == file_bytes(theirs)
    our_ledger, their_ledger = CacheLedger.load(str(ours)), CacheLedger.load(str(theirs))
    for field in ("total_num_rows", "shard_rows", "is_finished", "finished_shards", "field_counts", "metadata"):
        assert getattr(our_ledger, field) == getattr(their_ledger, field), field
    ours_read, their_cache = load_cache(str(ours)), load_cache(str(theirs))
    assert len(ours_read) == len(their_cache) == len(docs)
    indices = list(range(len(docs)))
    pairs = zip(ours_read.get_batch_sync(indices), their_cache.get_batch_sync(indices), strict=True)
    for index, (mine, levanters) in enumerate(pairs):
        assert mine[TOKENS_FIELD].dtype == np.int32
        assert mine[TOKENS_FIELD].tolist() == levanters[TOKENS_FIELD].tolist() == [BOS, *docs[index], EOS]
    # The shard's manifest lists every file of the committed folder, the ledger among them.
    names = {entry["path"] for entry in manifest}
    assert f"train/part-00000/{LEDGER_FILE}" in names
    assert names == {f"train/part-00000/{path.relative_to(ours)}" for path in ours.rglob("*") if path.is_file()}


def test_a_part_writes_its_rows_while_the_group_goes_on_once_a_stored_chunk_is_held(tmp_path):
    """With the defaults, a part past one stored chunk of tokens (262,144) starts writing it in tensorstore's
    threads and returns to the caller: the data file exists before the part is closed, so closing it (between
    the group's last encoding and the next one's first) compresses and writes only the rest."""
    writer = ShardWriter(str(tmp_path / "out"), "00000")
    part = PartWriter(writer, "train/part-00000", METADATA, prefix=[BOS], suffix=[EOS])
    docs = [[3 + index % 4000] * 1000 for index in range(300)]  # 300,600 tokens framed
    part.write(docs[:200])
    part.write(docs[200:])
    data_file = Path(writer.temp_root) / "train" / "part-00000" / TOKENS_FIELD / "data" / "c" / "0"
    deadline = time.monotonic() + 60  # a deadlock guard, not a timing: the write runs in the background
    while not data_file.exists():
        assert time.monotonic() < deadline, "no data written before the part was closed"
        time.sleep(0.01)
    part.close()
    writer.commit()
    cache = load_cache(str(tmp_path / "out" / "train" / "part-00000"))
    stored = [row[TOKENS_FIELD].tolist() for row in cache.get_batch_sync(list(range(len(cache))))]
    assert stored == [[BOS, *ids, EOS] for ids in docs]


def test_rows_without_tokens_are_kept(tmp_path):
    """Unframed empty documents: rows of no token, which the part still counts and writes, as Levanter does."""
    writer = ShardWriter(str(tmp_path / "out"), "00000")
    part = PartWriter(writer, "train/part-00000", METADATA)
    part.write([[], []])
    part.close()
    writer.commit()
    ours = tmp_path / "out" / "train" / "part-00000"
    with SerialCacheWriter(str(tmp_path / "theirs"), EXEMPLAR, metadata=CacheMetadata(METADATA)) as theirs:
        theirs.write_batch({TOKENS_FIELD: [np.zeros((0,), dtype=np.int32)] * 2})
    assert (part.rows, part.tokens) == (2, 0)
    cache = load_cache(str(ours))
    assert [row[TOKENS_FIELD].tolist() for row in cache.get_batch_sync([0, 1])] == [[], []]
    assert file_bytes(ours) == file_bytes(tmp_path / "theirs")


def test_a_part_without_documents_leaves_no_folder(tmp_path):
    writer = ShardWriter(str(tmp_path / "out"), "00000")
    part = PartWriter(writer, "validation/part-00000", METADATA, prefix=[BOS], suffix=[EOS])
    part.write([])
    part.close()
    assert writer.commit() == [] and not (tmp_path / "out" / "validation").exists()


def test_encodings_are_written_as_their_ids_and_a_length_that_lies_is_refused(tmp_path):
    """`write_encodings` (the tokenize step's path) leaves the bytes `write` leaves for the encodings' ids; an
    encoding whose len() is not its number of ids fails loudly, naming the part, instead of shifting rows."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{index}": index + 3 for index in range(40)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    rng = np.random.default_rng(3)
    texts = [" ".join(f"w{word}" for word in rng.integers(0, 40, size=int(size))) for size in rng.integers(0, 300, 25)]
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    written = {}
    for how in ("ids", "encodings"):
        writer = ShardWriter(str(tmp_path / how), "00000")
        part = PartWriter(writer, "train/part-00000", METADATA, prefix=[BOS], suffix=[EOS], first_flush_tokens=500)
        for start in range(0, len(encodings), 7):
            batch = encodings[start : start + 7]
            part.write([encoding.ids for encoding in batch]) if how == "ids" else part.write_encodings(batch)
        part.close()
        writer.commit()
        written[how] = file_bytes(tmp_path / how / "train" / "part-00000")
    assert written["encodings"] == written["ids"] and any(name.endswith("data/c/0") for name in written["ids"])

    class Lying:
        def __init__(self, ids: list[int], length: int):
            self.ids, self.length = ids, length

        def __len__(self) -> int:
            return self.length

    part = PartWriter(ShardWriter(str(tmp_path / "lying"), "00000"), "train/part-00000", METADATA)
    with pytest.raises(ValueError, match=r"train/part-00000: 2 rows hold more ids than their lengths say"):
        part.write_encodings([Lying([5, 6, 7], 3), Lying([8, 9], 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"train/part-00000: 1 rows hold fewer ids than their lengths say"):
        part.write_encodings([Lying([5], 4)])  # type: ignore[list-item]


def test_a_ledger_names_its_tokenizer_relatively_and_levanters_loader_sees_the_same_tokenizer(tmp_path, caplog):
    """A cache written under two prefixes is the same bytes (the ledgers name the tokenizer relative to their own
    folder), and Levanter's loader, given the tokenizer by its absolute path, logs no mismatch for it; it still
    warns when the tokenizer is another one, or another figure differs."""
    import logging

    from levanter.store.cache import TreeCache

    from steps.tokenize.levanter_cache import PartFigures, ledger_metadata, write_sharded_ledger

    docs = documents()[:20]
    written = {}
    for prefix in ("a", "b"):
        tokenizer = tmp_path / prefix / "tokenizer" / "hero-36d921a7"
        output = tmp_path / prefix / "tokenized" / "cells-5c976cfd"
        metadata = {**METADATA, "tokenizer": str(tokenizer)}
        output.mkdir(parents=True)  # what the executor writes before the step runs: where its prefix ends
        info = {"name": "tokenized/cells", "hash": "5c976cfd" + "0" * 56, "output_path": str(output)}
        (output / ".executor_info").write_text(json.dumps(info))
        writer = ShardWriter(str(output), "00000")
        part = PartWriter(writer, "train/part-00000", metadata, prefix=[BOS], suffix=[EOS])
        part.write(docs)
        part.close()
        writer.commit()
        write_sharded_ledger(str(output / "train"), [PartFigures("part-00000", part.rows, part.tokens)], metadata,
                             str(output))  # fmt: skip
        written[prefix] = (output, file_bytes(output / "train"), metadata)
    assert written["a"][1] == written["b"][1]
    ledger = json.loads((written["a"][0] / "train" / LEDGER_FILE).read_text())
    assert ledger["metadata"]["preprocessor_metadata"]["tokenizer"] == "../../../tokenizer/hero-36d921a7"
    part_ledger = json.loads((written["a"][0] / "train" / "part-00000" / LEDGER_FILE).read_text())
    assert part_ledger["metadata"]["preprocessor_metadata"]["tokenizer"] == "../../../../tokenizer/hero-36d921a7"
    outside = {**METADATA, "tokenizer": str(tmp_path / "elsewhere" / "tokenizer")}  # not a step of this prefix
    assert ledger_metadata(outside, str(written["a"][0]), str(written["a"][0] / "train")) == outside

    output, _, metadata = written["b"]
    with caplog.at_level(logging.WARNING, logger="levanter.store.cache"):
        TreeCache.load(str(output / "train"), EXEMPLAR, CacheMetadata(metadata))
    assert "Metadata mismatch" not in caplog.text
    other = {**metadata, "tokenizer": str(tmp_path / "b" / "tokenizer" / "other-0badc0de")}
    wider = {**metadata, "vocab_size": 6000}
    for loader in (other, wider):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="levanter.store.cache"):
            TreeCache.load(str(output / "train"), EXEMPLAR, CacheMetadata(loader))
        assert "Metadata mismatch" in caplog.text, loader
