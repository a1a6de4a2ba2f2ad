"""Reading documents: every format, and bad input counted, sampled and reported, never passed on."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from executor.shards.writer import ShardFailedError
from steps.data.documents import BadInputError, ReadReport, list_input_files, read_documents, table_bytes, to_table
from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup

GOOD = [{"id": f"d{i}", "text": f"document number {i} says something", "source": "s"} for i in range(3)]


def jsonl(records: list) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def test_every_format_reads_the_same_documents(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(jsonl(GOOD))
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(jsonl(GOOD)))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(GOOD)))
    (tmp_path / "d.parquet").write_bytes(table_bytes(to_table(GOOD)))
    (tmp_path / ".hidden.jsonl").write_bytes(b"not read")
    files = list_input_files(str(tmp_path))
    assert [path.rsplit("/", 1)[1] for path in files] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet"]
    for path in files:
        report = ReadReport()
        assert [doc["id"] for doc in read_documents(path, report)] == ["d0", "d1", "d2"]
        assert report.docs == 3 and not report.bad


def test_documents_read_as_the_standard_json_parser_reads_them(tmp_path):
    """The reader parses with msgspec first and hands what it refuses to `json.loads`: every value comes out as
    `json.loads` gives it (big integers, escapes, deep nesting, a repeated key), and what only the standard
    library takes (NaN, 1e400, -Infinity) is still taken, with the same values."""
    lines = [
        '{"id": 123456789012345678901234567890, "text": "big id", "metadata": {"n": -12345678901234567890}}',
        '{"id": "e", "text": "caf\\u00e9 \\ud83d\\ude00 tab\\t nul\\u0000 \\"q\\"", "source": "s", '
        '"metadata": [0.1, 1E5, -0.0]}',
        '{"id": "n", "text": "not a number", "metadata": {"x": NaN, "y": 1e400, "z": -Infinity}}',
        '{"id": "deep", "text": "nested", "metadata": ' + '{"a": ' * 1100 + "1" + "}" * 1100 + "}",
        '{"id": "dup", "text": "first", "text": "last"}',
    ]
    path = tmp_path / "values.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode() + b"\r\n"))
    report = ReadReport()
    documents = list(read_documents(str(path), report))
    expected = [json.loads(line) for line in lines]
    assert [doc["id"] for doc in documents] == [str(record["id"]) for record in expected]
    for document, record in zip(documents, expected, strict=True):
        assert document["text"] == record["text"]
        assert repr(document["metadata"]) == repr(record.get("metadata"))  # nan, inf and -0.0 compare by repr
    assert report.docs == 5 and not report.bad


def test_bad_lines_are_counted_with_samples(tmp_path):
    lines = [json.dumps(GOOD[0]).encode(), b"{not json", b'{"id": "x", "text": "caf\xe9"}',
             json.dumps({"id": "e", "text": "  "}).encode(),
             json.dumps({"id": "m"}).encode(), b"[1, 2]", json.dumps(GOOD[1]).encode()]  # fmt: skip
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    report = ReadReport()
    assert [doc["id"] for doc in read_documents(str(path), report)] == ["d0", "d1"]
    assert dict(report.bad) == {"malformed_json": 2, "invalid_utf8": 1, "empty_text": 1, "missing_text": 1}
    assert [sample["line"] for sample in report.samples] == [2, 3, 4, 5, 6]
    assert report.samples[0]["file"] == str(path)


def test_a_file_of_only_bad_lines_or_no_lines_is_an_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{oops\n\xff\xfe\n")
    with pytest.raises(BadInputError, match=r"bad.jsonl.*all 2 of its lines are bad"):
        list(read_documents(str(bad), ReadReport()))
    empty = tmp_path / "empty.jsonl.gz"
    empty.write_bytes(gzip.compress(b""))
    with pytest.raises(BadInputError, match=r"empty.jsonl.gz.*it is empty"):
        list(read_documents(str(empty), ReadReport()))


def test_a_missing_input_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*does not exist"):
        list_input_files(str(tmp_path / "nowhere"))
    (tmp_path / "notes.txt").write_text("no documents here")
    with pytest.raises(FileNotFoundError, match=r"no document files"):
        list_input_files(str(tmp_path))


def test_a_step_reports_bad_input_in_its_stats_and_fails_on_an_all_bad_shard(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_bytes(jsonl(GOOD) + b"{broken\n" + b'{"id": "u", "text": "\xc3\x28"}\n')
    output = tmp_path / "out"
    exact_dedup(ExactDedupConfig(input_paths=[str(inputs)], output_path=str(output)))
    stats = json.loads((output / "stats.json").read_text())
    assert stats["docs_in"] == 3 and stats["docs_out"] == 3
    assert stats["bad_input"] == {"malformed_json": 1, "invalid_utf8": 1}
    assert {sample["reason"] for sample in stats["bad_samples"]} == {"malformed_json", "invalid_utf8"}
    (inputs / "b.jsonl").write_bytes(b"{broken\n")
    with pytest.raises(ShardFailedError, match=r"b.jsonl"):
        exact_dedup(ExactDedupConfig(input_paths=[str(inputs)], output_path=str(tmp_path / "out2")))
