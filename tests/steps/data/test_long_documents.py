"""A 50 MB document keeps tokenize and exact dedup under a shard's 2 GiB (steps/README.md), each step run in a
fresh process (`tests/support/long_document_run.py`) whose peak resident memory is read at its end; and bounding it
changes no output: the split document's tokens are those of its pieces, which are those of the uncut text,
and a document hashed in windows has the hash it had whole."""

from __future__ import annotations

import glob
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import xxhash
from paths import REPO, SUPPORT

from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup, paragraph_spans, text_hash
from steps.tokenize.levanter_cache import load_cache
from steps.tokenize.tokenize import TokenizeConfig, document_pieces, tokenize
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, load_tokenizer, special_token_ids, train_tokenizer

RUNNER = SUPPORT / "long_document_run.py"
SHARD_BUDGET_BYTES = 2 << 30
LONG_CHARS = 50_000_000
_BREAK = r"(?>\r\n|\r|\n)"
WHOLE_PARAGRAPH = re.compile(rf"\S(?:(?!{_BREAK}[ \t]*{_BREAK})[\s\S])*")
"""How exact dedup found paragraphs before: matching each one whole (a backtracking frame per character)."""


def hash_whole(text: str, seed: int) -> int:
    """How exact dedup hashed a text before windows: normalised whole, then hashed."""
    return xxhash.xxh3_64_intdigest(re.sub(r"\s+", " ", text).strip(), seed=seed)


def stdlib_text(chars: int) -> str:
    """Real text of `chars` characters: the stdlib's top-level sources, blank lines dropped (so the whole is one
    paragraph, the hardest case for paragraph dedup), repeated as often as needed."""
    texts, held = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        texts.append("\n".join(line for line in lines if line.strip()))
        held += len(texts[-1])
        if held >= min(chars, 4_000_000):
            break
    base = "\n".join(texts)
    return (base * (chars // len(base) + 1))[:chars]


@pytest.fixture(scope="module")
def long_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One JSONL file: the 50 MB document between two short ones, the second short one twice."""
    short = stdlib_text(3_000)
    records = [
        {"id": "short-0", "text": short[:1_500], "source": "short"},
        {"id": "long", "text": stdlib_text(LONG_CHARS), "source": "long"},
        {"id": "short-1", "text": short, "source": "short"},
        {"id": "short-2", "text": short, "source": "short"},
    ]
    path = tmp_path_factory.mktemp("long") / "docs.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    sample = tmp_path_factory.mktemp("sample") / "docs.jsonl"
    texts = stdlib_text(600_000)
    sample.write_text("".join(json.dumps({"id": str(start), "text": texts[start : start + 20_000]}) + "\n"
                              for start in range(0, len(texts), 20_000)))  # fmt: skip
    output_path = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(TrainTokenizerConfig(input_paths=[str(sample)], vocab_size=600, sample_bytes=400_000,
                                         output_path=output_path))  # fmt: skip
    return output_path


def run_in_child(*args: str) -> int:
    """Run the step in a fresh interpreter; its peak resident memory in bytes (VmHWM)."""
    done = subprocess.run([sys.executable, str(RUNNER), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_bytes"]


def cached_rows(split_path: str) -> list[np.ndarray]:
    cache = load_cache(split_path)
    return [row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))]


@pytest.mark.slow
def test_a_50_mb_document_tokenizes_in_pieces_under_the_shard_budget(long_input, tokenizer_path, tmp_path):
    """Encoded whole, the document held 7.7 GB; in pieces of a million characters the step stays under 2 GiB with
    16 encoding threads (a 16-core machine's), and the document is still one row: BOS/EOS around its pieces'
    ids, end to end."""
    output_path = str(tmp_path / "tokenized")
    peak = run_in_child("tokenize", str(long_input), output_path, tokenizer_path, "16")
    assert peak < SHARD_BUDGET_BYTES, f"tokenize peaked at {peak / 2**30:.2f} GiB"

    stats = json.loads(Path(output_path, "stats.json").read_text())
    text = stdlib_text(LONG_CHARS)
    pieces = list(document_pieces(text, 1_000_000))
    assert len(pieces) >= 50 and max(len(piece) for piece in pieces) <= 1_000_000
    assert (stats["split_documents"], stats["document_pieces"], stats["documents"]) == (1, len(pieces), 4)
    tokenizer = load_tokenizer(tokenizer_path)
    special = special_token_ids(tokenizer_path, tokenizer)
    prefix, eos = ([] if special.bos is None else [special.bos]), special.eos
    rows = cached_rows(f"{output_path}/train")
    assert len(rows) == 4
    long_row = rows[1]
    assert long_row[: len(prefix)].tolist() == prefix and long_row[-1] == eos
    start = len(prefix)
    for piece in pieces:  # one piece at a time: the whole document's encoding is what the step avoids
        ids = np.array(tokenizer.encode(piece, add_special_tokens=False).ids, dtype=np.int32)
        assert np.array_equal(long_row[start : start + len(ids)], ids)
        start += len(ids)
    assert start == len(long_row) - 1
    assert stats["sources"]["long"]["tokens"] == len(long_row)
    assert stats["sources"]["long"]["bytes"] == len(text.encode("utf-8"))


def test_pieces_cut_before_a_word_and_encode_to_the_uncut_documents_tokens(tokenizer_path, tmp_path):
    """A document over `max_document_chars` is cut just before the last whitespace of a run, so that its pieces
    encode to the very tokens of the uncut text; only a piece without whitespace is cut at the limit."""
    text = stdlib_text(200_000).replace("\n", "  \n\t ", 7)
    pieces = list(document_pieces(text, 9_000))
    assert "".join(pieces) == text and len(pieces) > 22 and max(map(len, pieces)) <= 9_000
    assert all(piece[0].isspace() and not piece[1].isspace() for piece in pieces[1:])
    assert list(document_pieces("x" * 25, 10)) == ["x" * 10, "x" * 10, "x" * 5]
    assert list(document_pieces(text, 0)) == [text] == list(document_pieces(text, len(text)))

    documents = tmp_path / "docs.jsonl"
    records = [{"id": "a", "text": "short one"}, {"id": "b", "text": text}, {"id": "c", "text": "short two"}]
    documents.write_text("".join(json.dumps(record) + "\n" for record in records))
    outputs = {}
    for limit in (0, 9_000):
        outputs[limit] = str(tmp_path / f"limit-{limit}")
        tokenize(TokenizeConfig(input_paths=[str(documents)], tokenizer_path=tokenizer_path, output_path=outputs[limit],
                                validation_fraction=0.0, parallelism="thread", max_document_chars=limit))  # fmt: skip
    split, whole = (cached_rows(f"{outputs[limit]}/train") for limit in (9_000, 0))
    assert [row.tolist() for row in split] == [row.tolist() for row in whole]
    stats = {limit: json.loads(Path(path, "stats.json").read_text()) for limit, path in outputs.items()}
    assert (stats[9_000]["split_documents"], stats[9_000]["document_pieces"]) == (1, len(pieces))
    assert (stats[0]["split_documents"], stats[0]["document_pieces"]) == (0, 0)
    assert stats[9_000]["tokens"] == stats[0]["tokens"] and stats[9_000]["bytes"] == stats[0]["bytes"]


def test_a_negative_max_document_chars_is_refused_by_name(tokenizer_path, tmp_path):
    with pytest.raises(ValueError, match="max_document_chars must be 0 or more"):
        tokenize(TokenizeConfig(input_paths=[str(tmp_path)], tokenizer_path=tokenizer_path,
                                output_path=str(tmp_path / "out"), max_document_chars=-1))  # fmt: skip


@pytest.mark.slow
def test_a_50_mb_document_dedups_in_hash_windows_under_the_shard_budget(long_input, tmp_path):
    """Hashed whole, the one-paragraph document held 3.6 GB; in windows the step stays under 2 GiB, the document
    and its paragraph have the hashes they had whole, and the repeated short document still goes."""
    output_path = tmp_path / "deduped"
    peak = run_in_child("dedup", str(long_input), str(output_path))
    assert peak < SHARD_BUDGET_BYTES, f"exact dedup peaked at {peak / 2**30:.2f} GiB"

    stats = json.loads((output_path / "stats.json").read_text())
    assert stats["windowed_documents"] == 1 and stats["dropped"]["exact_duplicate"] == 1
    kept = pq.read_table(glob.glob(f"{output_path}/docs/*.parquet")).to_pylist()
    text = stdlib_text(LONG_CHARS)
    assert [document["id"] for document in kept] == ["short-0", "long", "short-1"]
    assert kept[1]["text"] == text
    stored = {int(value) for path in glob.glob(f"{output_path}/work/hashes/**/*.npz", recursive=True)
              for value in np.load(path)["hash"]}  # fmt: skip
    assert paragraph_spans(text) == [(0, len(text.rstrip()))]
    assert {hash_whole(text, 0), hash_whole(text, 1)} <= stored  # the document's, its one paragraph's


def tricky_texts() -> list[str]:
    rng = random.Random(7)
    alphabet = ["a", "b", "é", "字", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\r\n \t\r\n", "\u3000", "\xa0", "."]
    texts = ["", " ", "\n\n", "  lead and trail  ", "one\n\ntwo\r\n\r\nthree\r\rfour\n \t\nfive  \n"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(300)]
    return [*texts, stdlib_text(20_000)]


def test_windowed_hashes_equal_the_whole_texts_hashes_whatever_the_window():
    """Whitespace runs across window edges, whitespace-only windows, leading and trailing whitespace, Unicode
    spaces: every window gives the hash of the whole normalised text, so existing dedup outputs keep their
    meaning; a paragraph is hashed from its span as its slice was."""
    for text in tricky_texts():
        for window in (1, 2, 3, 7, 64, 1 << 20):
            assert text_hash(text, 0, window) == hash_whole(text, 0), (text, window)
        for start, end in paragraph_spans(text):
            assert text_hash(text, 1, 5, start, end) == hash_whole(text[start:end], 1)


def test_paragraph_spans_are_those_of_matching_each_paragraph_whole():
    for text in tricky_texts():
        whole = [
            (match.start(), match.start() + len(match.group().rstrip())) for match in WHOLE_PARAGRAPH.finditer(text)
        ]
        assert paragraph_spans(text) == whole, text


def test_exact_dedup_in_small_windows_keeps_the_outputs_of_large_ones(tmp_path):
    documents = tmp_path / "docs.jsonl"
    text = stdlib_text(30_000)
    reflowed = text.replace("\n", " \n  ")
    records = [{"id": "a", "text": text}, {"id": "b", "text": reflowed}, {"id": "c", "text": text[:9_000] + "\n\nend"}]
    documents.write_text("".join(json.dumps(record) + "\n" for record in records))
    outputs = {}
    for window in (7, 1 << 20):
        output_path = tmp_path / f"window-{window}"
        exact_dedup(ExactDedupConfig(input_paths=[str(documents)], output_path=str(output_path), parallelism="thread",
                                     min_paragraph_chars=16, hash_window_chars=window))  # fmt: skip
        stats = json.loads((output_path / "stats.json").read_text())
        outputs[window] = pq.read_table(glob.glob(f"{output_path}/docs/*.parquet")).to_pylist(), stats["dropped"]
        assert stats["windowed_documents"] == (3 if window == 7 else 0)
    assert outputs[7] == outputs[1 << 20]
    assert outputs[7][1]["exact_duplicate"] == 1  # the reflowed copy


def test_a_hash_window_under_one_character_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="hash_window_chars must be 1 or more"):
        exact_dedup(
            ExactDedupConfig(input_paths=[str(tmp_path)], output_path=str(tmp_path / "out"), hash_window_chars=0)
        )
