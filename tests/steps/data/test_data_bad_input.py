"""Bad input that used to crash a whole step: lone surrogates, deep JSON, truncated archives, CRLF text,
and the corpus reader that had none of the document reader's checks. Each is counted, sampled, and the
rest of the file kept."""

from __future__ import annotations

import gzip
import json

import zstandard

from steps.data.documents import ReadReport, list_input_files, read_documents, read_shard_table
from steps.data.jsonl_shards import read_records
from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup, paragraph_spans
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.tokenize.corpus_stats import CorpusStatsConfig, compute_corpus_stats


def word(number: int) -> str:
    return "".join(chr(ord("a") + number // 26**place % 26) for place in range(3))


GOOD = [{"id": f"d{i}", "text": " ".join(word(i * 1031 + k * 17) for k in range(12)), "source": "s"} for i in range(4)]
SURROGATE = b'{"id": "s", "text": "a lone \\ud800 half of a pair"}'
DEEP = b'{"id": "deep", "text": "t", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def jsonl(records: list) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def kept_ids(output: str) -> list[str]:
    paths = list_input_files(f"{output}/docs")
    return [row for path in paths for row in read_shard_table(path).column("id").to_pylist()]


def test_lone_surrogates_and_deep_json_are_counted_and_the_rest_kept(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_bytes(jsonl(GOOD[:2]) + SURROGATE + b"\n" + DEEP + b"\n" + jsonl(GOOD[2:4]))
    for step, config in ((exact_dedup, ExactDedupConfig), (fuzzy_dedup, FuzzyDedupConfig)):
        output = str(tmp_path / step.__name__)
        step(config(input_paths=[str(inputs)], output_path=output, parallelism="thread"))
        stats = json.loads(open(f"{output}/stats.json").read())
        assert stats["bad_input"] == {"lone_surrogate": 1, "json_too_deep": 1}
        assert {sample["line"] for sample in stats["bad_samples"]} == {3, 4}
        assert kept_ids(output) == ["d0", "d1", "d2", "d3"]


def test_a_truncated_archive_keeps_its_complete_lines_and_names_the_file(tmp_path):
    many = [{"id": f"d{i}", "text": f"number {i} squared is {i * i}, cubed {i**3}"} for i in range(5000)]
    whole = jsonl(many)
    for suffix, compressed in ((".gz", gzip.compress(whole)), (".zst", zstandard.ZstdCompressor().compress(whole))):
        path = tmp_path / f"cut.jsonl{suffix}"
        path.write_bytes(compressed[: len(compressed) // 2])
        report = ReadReport()
        ids = [document["id"] for document in read_documents(str(path), report)]
        assert 0 < len(ids) < len(many)
        assert ids == [f"d{i}" for i in range(len(ids))]
        assert report.bad["truncated_file"] == 1
        assert any(sample["reason"] == "truncated_file" and sample["file"] == str(path) for sample in report.samples)


def test_corpus_records_go_through_the_document_reader(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = jsonl(GOOD[:3]) + b'{"id": "m", "source": "s"}\n{broken\n' + SURROGATE + b"\n"
    (corpus / "shard-00000.jsonl.gz").write_bytes(gzip.compress(lines))
    report = ReadReport()
    assert [record["id"] for record in read_records(str(corpus), report)] == ["d0", "d1", "d2"]
    assert dict(report.bad) == {"missing_text": 1, "malformed_json": 1, "lone_surrogate": 1}
    output = tmp_path / "stats"
    compute_corpus_stats(CorpusStatsConfig(input_paths=[str(corpus)], output_path=str(output)))
    stats = json.loads((output / "stats.json").read_text())
    assert stats["docs"] == 3
    assert stats["inputs"][0]["bad_input"] == {"missing_text": 1, "malformed_json": 1, "lone_surrogate": 1}


PARAGRAPH = "This paragraph is long enough to be deduplicated, and it appears in two documents."


def test_crlf_and_cr_text_splits_into_paragraphs(tmp_path):
    for newline in ("\r\n", "\r"):
        text = f"First paragraph{newline}{newline}{PARAGRAPH}{newline} {newline}Third{newline}"
        assert [text[start:end] for start, end in paragraph_spans(text)] == ["First paragraph", PARAGRAPH, "Third"]
    inputs = tmp_path / "in"
    inputs.mkdir()
    documents = [{"id": "unix", "text": f"Opening words.\n\n{PARAGRAPH}\n"},
                 {"id": "windows", "text": f"Other opening words.\r\n\r\n{PARAGRAPH}\r\n"}]  # fmt: skip
    (inputs / "a.jsonl").write_bytes(jsonl(documents))
    output = tmp_path / "out"
    exact_dedup(ExactDedupConfig(input_paths=[str(inputs)], output_path=str(output)))
    table = read_shard_table(str(output / "docs" / "shard-00000.parquet"))
    texts = {row["id"]: row["text"] for row in table.to_pylist()}
    assert texts["windows"] == "Other opening words.\r\n\r\n"
    assert texts["unix"] == documents[0]["text"]
