"""MinHash signatures and LSH band keys for many documents at once, in numpy.

Why it is fast: datatrove tokenizes each document with spaCy, joins every n-gram into a Python
string and hashes it with one Python call per shingle, then permutes one document at a time.
Here a whole batch of documents is normalized with C-level string methods (`lower`, a regex,
`translate`), joined into one byte buffer, and everything after that is array arithmetic:

1. word hashes: a polynomial rolling hash over the bytes, `H[i] = sum_{k<i} (b_k + 1) * B^k`
   (mod 2^64, i.e. plain uint64 wrap-around), so a word spanning bytes [s, e) hashes to
   `(H[e] - H[s]) * B^-s` (B is odd, so it has an inverse mod 2^64), then a splitmix64 finalizer;
2. shingles: the hash of words i..i+n-1 is `mix(sum_j word[i+j] * C_j)` with an odd random
   constant per position (so word order matters); n-grams that would cross a document boundary
   are dropped, and documents with fewer than n words get no shingle (as in datatrove);
3. permutations: `h_p(s) = (a_p * s + b_p) mod 2^64 >> 32` with odd `a_p` (multiply-add-shift,
   a 2-universal family that needs no 128-bit product, unlike `mod (2^61 - 1)`); the per-document
   minimum is one `np.minimum.reduceat` over the batch for each permutation;
4. band keys: each band's rows are folded into one 64-bit key; documents that share a key in
   any band are LSH candidates.

Normalization follows datatrove's `simplify_text`: lower case, digit runs to "0", punctuation and
symbols to spaces (so `state-of-the-art` is four words and `x=1+2` is `x 0 0`), diacritics folded
(NFD, combining marks dropped: `café` and `cafe\u0301` are `cafe`). It is one `str.translate` whose
table fills itself per code point on first sight, so folding costs no NFD pass per document.

A document's shingled text is capped (`MinHasher.max_chars`, 500k characters as in Marin): the
shingling arrays cost about 48 bytes per character, so callers also cut their documents into
batches of at most `BATCH_CHARS` characters (`text_batches`), which bounds a worker's peak at
about 48 x 4 MB = 200 MB whatever the file size. The rolling hash's power tables (16 bytes per byte of the
largest batch, ~64 MB) are kept between batches: recomputing them was a slow serial pass per batch.

Speed (benchmarks/bench_minhash.py, one core, text in, band keys out): 56 MB/s, 2.3x rensa fed Python
shingles and 54x datatrove's `MinhashDedupSignature` on the same corpus. Normalizing a batch is
one `str.translate` per text plus numpy passes over the joined bytes (`normalized_bytes`); a regex per
text used to cost as much as all the hashing.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

_NUMBERS = re.compile(r"\d+(?:[.,]\d+)*")
_BASE = np.uint64(0x100000001B3)
_MASK64 = (1 << 64) - 1
_SEED_CONSTANTS = 0x5EED


MAX_SHINGLED_CHARS = 500_000
"""Default cap on the characters of one document that are shingled (Marin's)."""
BATCH_CHARS = 4_000_000
"""Characters shingled at once: peak memory is about 48 bytes per character."""


def _fold(char: str) -> int | str | None:
    """What `char` becomes: a space for punctuation, symbols and separators, nothing for a combining mark,
    its letters without marks for a precomposed letter (NFD), else itself."""
    category = unicodedata.category(char)
    if category[0] in "PSZ" or char.isspace():
        return 0x20
    if category == "Mn":
        return None
    folded = "".join(part for part in unicodedata.normalize("NFD", char) if unicodedata.category(part) != "Mn")
    return folded if folded != char else ord(char)


class _FoldTable(dict[int, int | str | None]):
    """`str.translate`'s table, filled per code point on first sight: building it for all 1.1M code points
    would cost seconds in every worker process. `keep_numbers`: every decimal digit becomes "0" and "." and
    "," stay, so that numbers can be collapsed afterwards (`_collapse_numbers`)."""

    def __init__(self, keep_numbers: bool = False):
        super().__init__()
        self.keep_numbers = keep_numbers

    def __missing__(self, code: int) -> int | str | None:
        char = chr(code)
        if self.keep_numbers and (char in ".," or unicodedata.category(char) == "Nd"):
            value: int | str | None = "0" if char not in ".," else code
        else:
            value = _fold(char)
        self[code] = value
        return value


_FOLD = _FoldTable()
_FOLD_KEEPING_NUMBERS = _FoldTable(keep_numbers=True)
_ZERO, _DOT, _COMMA, _SPACE = (ord(char) for char in "0., ")


def normalize(text: str) -> str:
    """Lower case, digit runs to 0, punctuation and symbols to spaces, diacritics folded, whitespace as spaces
    (runs are not collapsed: word splitting skips them)."""
    return _NUMBERS.sub("0", text.lower()).translate(_FOLD)


def normalized_bytes(texts: Sequence[str]) -> np.ndarray:
    """UTF-8 of every text normalized, each followed by a newline: `normalize` for a whole batch.

    The same bytes as `("\\n".join(map(normalize, texts)) + "\\n").encode()`, without a regex pass per text
    (it was the costliest part of shingling): the translation maps digits to "0" and keeps "." and ",",
    then numbers are collapsed over the whole batch in numpy."""
    joined = ("\n".join(text.lower().translate(_FOLD_KEEPING_NUMBERS) for text in texts) + "\n").encode("utf-8")
    return _collapse_numbers(np.frombuffer(joined, dtype=np.uint8))


def _collapse_numbers(buffer: np.ndarray) -> np.ndarray:
    """`\\d+(?:[.,]\\d+)*` to "0" (digits are already "0"), then the remaining "." and "," to spaces."""
    digit = buffer == _ZERO
    separator = (buffer == _DOT) | (buffer == _COMMA)
    joins = np.zeros_like(digit)
    joins[1:-1] = separator[1:-1] & digit[:-2] & digit[2:]  # a separator inside a number
    number = digit | joins
    keep = ~number
    keep[0] = True
    keep[1:] |= ~number[:-1]  # the first byte of each number stays, as "0"
    out = np.where(separator & ~joins, np.uint8(_SPACE), buffer)
    return out[keep]


def text_batches(texts: Iterable[str], max_chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """Consecutive texts grouped so that a batch holds at most `max_chars` characters (or one longer text)."""
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and size + len(text) > max_chars:
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: spreads every input bit over the whole 64-bit word."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


@functools.cache
def _position_constants(n_grams: int) -> np.ndarray:
    generator = np.random.default_rng(_SEED_CONSTANTS + n_grams)
    return generator.integers(0, 2**63, size=n_grams, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


_POWER_TABLES = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))


def _powers(length: int) -> tuple[np.ndarray, np.ndarray]:
    """B^k and B^-k (mod 2^64) for k in [0, length]; kept for the next batch (cumprod is a slow serial pass).

    Shards may hash in threads: the pair is read and replaced as one tuple, never one table at a time."""
    global _POWER_TABLES
    forward, backward = _POWER_TABLES
    if len(forward) <= length:
        inverse = np.uint64(pow(int(_BASE), -1, 1 << 64))
        one = np.ones(1, dtype=np.uint64)
        forward = np.concatenate([one, np.cumprod(np.full(length, _BASE, dtype=np.uint64))])
        backward = np.concatenate([one, np.cumprod(np.full(length, inverse, dtype=np.uint64))])
        _POWER_TABLES = forward, backward
    return forward[: length + 1], backward[: length + 1]


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every normalized word, index of its document), for all texts in order."""
    buffer = normalized_bytes(texts)
    solid = (buffer != 0x20) & (buffer != 0x0A)
    edges = np.diff(solid.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    forward, backward = _powers(len(buffer))
    prefix = np.zeros(len(buffer) + 1, dtype=np.uint64)
    np.cumsum((buffer.astype(np.uint64) + np.uint64(1)) * forward[:-1], out=prefix[1:])
    hashes = _mix((prefix[ends] - prefix[starts]) * backward[starts])
    documents = np.cumsum(buffer == 0x0A)[starts]
    return hashes, documents


def shingles(texts: Sequence[str], n_grams: int) -> tuple[np.ndarray, np.ndarray]:
    """(shingle hashes, offsets): document d's shingles are `hashes[offsets[d]:offsets[d + 1]]`."""
    words, documents = word_hashes(texts)
    count = len(words) - n_grams + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(len(texts) + 1, dtype=np.int64)
    constants = _position_constants(n_grams)
    combined = np.zeros(count, dtype=np.uint64)
    for position in range(n_grams):
        combined += words[position : position + count] * constants[position]
    same_document = documents[:count] == documents[n_grams - 1 :]
    hashes = _mix(combined[same_document])
    owners = documents[:count][same_document]
    offsets = np.searchsorted(owners, np.arange(len(texts) + 1), side="left").astype(np.int64)
    return hashes, offsets


@dataclass(frozen=True)
class MinHasher:
    """Permutations for `bands * rows` MinHash values, fixed by `seed` so every worker agrees."""

    n_grams: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1
    max_chars: int = MAX_SHINGLED_CHARS
    """Only a document's first `max_chars` characters are shingled."""

    @functools.cached_property
    def _parameters(self) -> tuple[np.ndarray, np.ndarray]:
        generator = np.random.default_rng(self.seed)
        size = self.bands * self.rows
        multipliers = generator.integers(0, 2**63, size=size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        return multipliers, generator.integers(0, 2**64 - 1, size=size, dtype=np.uint64)

    def signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(uint32 signatures of shape (docs, bands * rows), bool mask of docs that have one)."""
        hashes, offsets = shingles([text[: self.max_chars] for text in texts], self.n_grams)
        has_shingles = offsets[1:] > offsets[:-1]
        starts = offsets[:-1][has_shingles]
        multipliers, increments = self._parameters
        signatures = np.full((len(texts), len(multipliers)), np.iinfo(np.uint32).max, dtype=np.uint32)
        if len(starts):
            permuted = np.empty_like(hashes)
            minima = np.empty((len(multipliers), len(starts)), dtype=np.uint64)
            for index in range(len(multipliers)):
                np.multiply(hashes, multipliers[index], out=permuted)
                np.add(permuted, increments[index], out=permuted)
                # The top 32 bits are the permuted value, and x -> x >> 32 keeps order: shift the minima only.
                np.minimum.reduceat(permuted, starts, out=minima[index])
            signatures[has_shingles] = (minima >> np.uint64(32)).astype(np.uint32).T
        return signatures, has_shingles

    def band_keys(self, signatures: np.ndarray) -> np.ndarray:
        """uint64 keys of shape (docs, bands): one per band, folding that band's rows."""
        keys = np.zeros((signatures.shape[0], self.bands), dtype=np.uint64)
        for band in range(self.bands):
            key = np.full(signatures.shape[0], band + 1, dtype=np.uint64)
            for row in range(self.rows):
                key = _mix(key ^ signatures[:, band * self.rows + row].astype(np.uint64) + np.uint64(row))
            keys[:, band] = key
        return keys


def jaccard(first: str, second: str, n_grams: int = 5) -> float:
    """Exact Jaccard similarity of the two texts' shingle sets (ground truth for tests)."""
    hashes, offsets = shingles([first, second], n_grams)
    left = set(hashes[offsets[0] : offsets[1]].tolist())
    right = set(hashes[offsets[1] : offsets[2]].tolist())
    if not left and not right:
        return 1.0 if normalize(first).split() == normalize(second).split() else 0.0
    return len(left & right) / len(left | right)


def node_partition(keys: np.ndarray, partitions: int) -> np.ndarray:
    """A stable partition for each int64 document key (used to spread graph nodes)."""
    return (_mix(keys.astype(np.uint64)) % np.uint64(partitions)).astype(np.int64)
