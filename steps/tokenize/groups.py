"""Shard groups of the tokenize step: runs of consecutive input files, as many as fill `group_bytes`.

A shard group is the tokenize step's unit of work and of resume: it reads its files in order, encodes
them as one stream of batches, writes one sub-cache per split and commits them with its marker. Each
group pays a fixed cost at its ends that no encoding overlaps: the first batch is read before the
tokenizer has work, and the last one is framed, the parts are compressed and written, hashed and renamed
after it has none (about 25 ms a group on a local disk, far more on GCS). One group per file made that cost
a share of the run that grew as files shrank: `bench_tokenize`'s ten files of 0.15 MB each spent a tenth of
their time at group ends. So consecutive files share a group until they hold `group_bytes` bytes as stored:
small files go together, and a file of that size or more (a real corpus shard, typically 100 MB or more) is
a group of its own, named and laid out exactly as before (`part-00042`).

Grouping never changes the cache's rows, only how they are split into sub-caches: the groups' parts are
listed in file order, so the documents come out in the same order. A group of several files is named by
its first and last file index (`00040-00043`, sub-caches `part-00040-00043`), never like a one-file group,
so a marker or a part left by another grouping (an earlier release, another `group_bytes`) is never
taken for this group's: the group runs again and its part goes in a folder of its own. The rule reads only
the files' listed sizes, which a content-hashed input keeps, so a restart finds the same groups.

With `per_folder`, a group never spans two component folders: each component keeps caches of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from executor import Shard, storage


@dataclass(frozen=True)
class FileGroup[ConfigT]:
    """Consecutive input files tokenized as one shard group: the step's config, the first file's index in
    the step's file list, and the files' paths in order."""

    config: ConfigT
    first_index: int
    paths: tuple[str, ...]

    @property
    def name(self) -> str:
        """The group's shard id and the suffix of its parts' folders (`part-<name>`)."""
        last = self.first_index + len(self.paths) - 1
        return f"{self.first_index:05d}" if last == self.first_index else f"{self.first_index:05d}-{last:05d}"


def component_of(path: str) -> str:
    """The component a file belongs to with `per_folder`: the name of the folder holding it."""
    return storage.basename(storage.dirname(path))


def file_sizes(files: Sequence[str]) -> list[int]:
    """The stored size of each file, from one listing call of its file system."""
    if not files:
        return []
    fs, _ = storage.filesystem(files[0])
    return [int(size or 0) for size in fs.sizes([storage.filesystem(path)[1] for path in files])]


def group_files[ConfigT](
    config: ConfigT,
    files: Sequence[str],
    sizes: Sequence[int],
    group_bytes: int,
    key: Callable[[str], str] = lambda _path: "",
) -> list[Shard]:
    """One shard per run of consecutive `files` (with their `sizes`): a group takes the next file while the
    files it holds have fewer than `group_bytes` bytes and share its first file's `key` (the component). A file
    of `group_bytes` or more is a group of its own."""
    groups: list[list[int]] = []
    held = 0
    for index, (path, size) in enumerate(zip(files, sizes, strict=True)):
        full = held >= group_bytes or size >= group_bytes
        if not groups or full or key(path) != key(files[groups[-1][0]]):
            groups.append([])
            held = 0
        groups[-1].append(index)
        held += size
    shards = []
    for indices in groups:
        group = FileGroup(config, indices[0], tuple(files[index] for index in indices))
        shards.append(Shard(group.name, group))
    return shards
