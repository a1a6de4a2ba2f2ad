"""Intermediate files are stored by destination: a consumer lists only its own folder, once.

A filesystem that counts listings (`ls`, `find`, `glob`) wraps the local disk under its own
protocol; both dedup steps run on it in threads (so the counts are in this process) over 2 and
then 6 input files. On an object store a recursive listing returns every object under the prefix,
so the test insists that no intermediate folder is ever listed recursively and that each
consumer's listing is one `ls` of its own `to-*` folder.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup


class CountingFileSystem(LocalFileSystem):
    """The local disk under `countfile://`, recording each top-level listing: (method, path, entries)."""

    protocol = ("countfile",)
    listings: ClassVar[list[tuple[str, str, int]]] = []
    _lock = threading.Lock()
    _nesting = threading.local()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        text = str(path)
        return super()._strip_protocol(text.removeprefix("countfile://"))

    def _counted(self, method: str, path: str, call: Any) -> Any:
        depth = getattr(self._nesting, "depth", 0)
        self._nesting.depth = depth + 1
        result: Any = []
        try:
            result = call()
        finally:  # a listing of a missing folder is a request all the same
            self._nesting.depth = depth
            if depth == 0:
                with self._lock:
                    self.listings.append((method, self._strip_protocol(path), len(result)))
        return result

    def ls(self, path: Any, detail: bool = False, **kwargs: Any) -> Any:
        return self._counted("ls", path, lambda: super(CountingFileSystem, self).ls(path, detail=detail, **kwargs))

    def find(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._counted("find", path, lambda: super(CountingFileSystem, self).find(path, *args, **kwargs))

    def glob(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._counted("glob", path, lambda: super(CountingFileSystem, self).glob(path, *args, **kwargs))


fsspec.register_implementation("countfile", CountingFileSystem, clobber=True)


def word(number: int) -> str:
    return "".join(chr(ord("a") + number // 26**place % 26) for place in range(3))


def write_inputs(folder: Any, files: int) -> None:
    """`files` JSONL files; file f holds 6 new documents and a one-word-changed copy of each of file f-1's."""
    folder.mkdir()
    for index in range(files):
        documents = []
        for doc in range(6):
            words = [word(index * 6000 + doc * 400 + k) for k in range(80)]
            documents.append({"id": f"f{index}-d{doc}", "text": " ".join(words)})
            if index:
                copy = [word((index - 1) * 6000 + doc * 400 + k) for k in range(80)]
                copy[40] = "changed"
                documents.append({"id": f"f{index}-copy{doc}", "text": " ".join(copy)})
        (folder / f"part-{index:03d}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))


def intermediate_listings(output: str) -> list[tuple[str, str, int]]:
    work = CountingFileSystem._strip_protocol(f"{output}/work/")
    listings = CountingFileSystem.listings
    return [entry for entry in listings if entry[1].startswith(work) and "/.executor" not in entry[1]]


@pytest.mark.parametrize("files", [2, 6])
def test_consumers_list_only_their_own_folder_once(tmp_path, files):
    write_inputs(tmp_path / "in", files)
    inputs = f"countfile://{tmp_path}/in"
    runs = [(exact_dedup, ExactDedupConfig(input_paths=[inputs], output_path=f"countfile://{tmp_path}/exact",
                                           partitions=3, parallelism="thread")),
            (fuzzy_dedup, FuzzyDedupConfig(input_paths=[inputs], output_path=f"countfile://{tmp_path}/fuzzy",
                                           hash_ranges=2, node_partitions=3, parallelism="thread"))]  # fmt: skip
    for step, config in runs:
        CountingFileSystem.listings.clear()
        step(config)
        listings = intermediate_listings(config.output_path)
        assert listings, "the stages hand data over through listed folders"
        assert {method for method, _path, _entries in listings} == {"ls"}, "no recursive listing of work/"
        folders = Counter(path.rstrip("/") for _method, path, _entries in listings)
        assert all(path.rsplit("/", 1)[1].startswith("to-") for path in folders)
        # Each consumer lists its folder once; only the converged round's edge folders have two consumers,
        # the round that found no violation and the cluster assignment.
        assert all(count == 1 or "/edges/" in path or "/round-" in path for path, count in folders.items())
        assert max(folders.values()) <= 2
        # A folder holds at most one file per producer: input files, LSH partitions or graph partitions.
        producers = max(files, config.bands * 2 if step is fuzzy_dedup else 3, 3)
        assert max(entries for _method, _path, entries in listings) <= producers
    stats = json.loads(open(f"{tmp_path}/fuzzy/stats.json").read())
    assert stats["dropped"]["fuzzy_duplicate"] == 6 * (files - 1)
