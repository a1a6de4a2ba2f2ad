"""Sources that hold text: every full-scale source states its text column and license, a source whose Parquet
schema has no text column is refused before a dry run plans anything, and a source that names its columns
otherwise is downloaded into the `text` / `id` every reader expects."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments import hero_535b
from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.data.download import DownloadConfig, download
from steps.data.source_schema import SourceSchema, SourceSchemaError, check_source_schema


def parquet_source(folder: Path, columns: dict[str, list]) -> str:
    (folder / "data" / "python").mkdir(parents=True)
    pq.write_table(pa.table(columns), folder / "data" / "python" / "train-00000.parquet")
    return str(folder / "data")


def test_every_full_scale_source_states_its_text_column_and_license() -> None:
    scale = hero_535b.full_scale()
    for name, spec in {**scale.sources, "eval_sets": scale.eval_sets}.items():
        schema = spec["schema"]
        assert schema.text_column and schema.license, name
    assert "the-stack-v2" not in scale.sources["code"]["source"]
    assert scale.sources["code"]["schema"].text_column == "content"


def test_a_source_without_its_text_column_is_refused_before_planning(tmp_path: Path) -> None:
    """What the-stack-v2-dedup's files hold: blob ids and repository metadata, no contents."""
    blobs = parquet_source(tmp_path / "stack-v2", {"blob_id": ["a1", "b2"], "repo_name": ["x/y", "z/w"],
                                                   "path": ["f.py", "g.py"]})  # fmt: skip
    with pytest.raises(SourceSchemaError, match=r"source code .*no text column 'content'.*blob_id"):
        check_source_schema("code", blobs, ["*/*.parquet"], SourceSchema("content", "blob_id"))
    full = hero_535b.full_scale()
    sources = {"code": {**full.sources["code"], "source": blobs}}
    with pytest.raises(SourceSchemaError, match=r"source code \(.*stack-v2/data\)"):
        hero_535b.check_sources(dataclasses.replace(full, sources=sources, eval_sets={"include": ["*"]}))
    unreachable = check_source_schema("web", str(tmp_path / "nowhere"), ["*.parquet"], SourceSchema())
    assert "not checked" in unreachable


def test_a_source_with_other_column_names_is_downloaded_as_documents(tmp_path: Path) -> None:
    source = parquet_source(tmp_path / "stack", {"hexsha": ["3f2a", "9c1b"], "content": ["def f():\n    return 1\n",
                                                 "print('hi')\n"], "lang": ["Python", "Python"]})  # fmt: skip
    assert "holds text column 'content'" in check_source_schema("code", source, ["*/*.parquet"],
                                                                SourceSchema("content", "hexsha"))  # fmt: skip
    output = tmp_path / "download"
    download(DownloadConfig(source=source, output_path=str(output), include=["*/*.parquet"], text_column="content",
                            id_column="hexsha"))  # fmt: skip
    documents = [doc for path in list_input_files(str(output / "files"))
                 for doc in read_documents(path, ReadReport(), raw=True)]  # fmt: skip
    assert [(doc["id"], doc["text"]) for doc in documents] == [("3f2a", "def f():\n    return 1\n"),
                                                               ("9c1b", "print('hi')\n")]  # fmt: skip
    numbered = tmp_path / "numbered"
    download(DownloadConfig(source=source, output_path=str(numbered), include=["*/*.parquet"], text_column="content",
                            id_column=None))  # fmt: skip
    files = list_input_files(str(numbered / "files"))
    ids = [doc["id"] for path in files for doc in read_documents(path, ReadReport())]
    assert ids == ["python/train-00000.parquet:0", "python/train-00000.parquet:1"]
