"""A topic model trained on the corpus itself: TF-IDF over a learned vocabulary, truncated SVD, k-means.

Everything is numpy and offline, so a document's topic is a function of the corpus and the
config alone (no downloaded embedding model, no network). Fitting runs once, on a sample:

1. vocabulary: the `vocab_size` words (lower-cased runs of letters) with the highest document
   frequency among those in at least 2 sample documents and at most `max_df` of them (so "the"
   and "def" do not dominate every topic);
2. TF-IDF rows, sublinear term frequency (1 + log tf) times smoothed idf, L2-normalized, kept
   sparse as CSR arrays (indptr, indices, data) since a document uses a few hundred of the terms;
3. randomized truncated SVD (Halko, Martinsson & Tropp 2011) of the sample matrix to `dim`
   components: latent semantic analysis, which merges synonyms and co-occurring terms;
4. k-means (k-means++ seeding, Lloyd iterations, best of a few restarts) on the L2-normalized
   embeddings (spherical k-means: cosine similarity to unit centroids).

`TopicModel.assign` then maps any document to its nearest centroid, and `top_terms` reads a
cluster's words back off its centroid through the SVD components. A cluster that no sample
document is nearest to keeps its seed centroid; it may end up with no documents at all, which
the cells step counts and reports.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_WORD = re.compile(r"[^\W\d_]{2,}")
"""A word: two or more letters (any script); digits and underscores split words."""
_POWER_ITERATIONS = 2
_OVERSAMPLES = 10
_RESTARTS = 4
"""k-means runs from this many seedings and keeps the tightest clustering (Lloyd's finds local optima)."""
TOPIC_CHARS = 16_384
"""Only a document's first characters are read for its topic: they tell it, and a 1 MB source file
then costs no more than a page."""


def words(text: str) -> list[str]:
    return _WORD.findall(text[:TOPIC_CHARS].lower())


@dataclass(frozen=True)
class Csr:
    """A sparse row matrix: row i holds `data[indptr[i]:indptr[i+1]]` at columns `indices[...]`."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    columns: int

    @property
    def rows(self) -> int:
        return len(self.indptr) - 1

    def times(self, dense: np.ndarray) -> np.ndarray:
        """self @ dense (columns x r) -> rows x r."""
        out = np.zeros((self.rows, dense.shape[1]), dtype=np.float64)
        if len(self.data) == 0:
            return out
        products = self.data[:, None] * dense[self.indices]
        starts = self.indptr[:-1]
        nonempty = starts < self.indptr[1:]
        out[nonempty] = np.add.reduceat(products, starts[nonempty], axis=0)
        return out

    def transpose_times(self, dense: np.ndarray) -> np.ndarray:
        """self.T @ dense (rows x r) -> columns x r."""
        row_of = np.repeat(np.arange(self.rows), np.diff(self.indptr))
        return np.stack([np.bincount(self.indices, weights=self.data * dense[row_of, j], minlength=self.columns)
                         for j in range(dense.shape[1])], axis=1)  # fmt: skip


@dataclass(frozen=True)
class TopicModel:
    vocabulary: list[str]
    idf: np.ndarray
    components: np.ndarray
    """dim x vocabulary: the SVD's right singular vectors."""
    centroids: np.ndarray
    """k x dim, unit length."""

    def tfidf(self, texts: Sequence[str]) -> Csr:
        index = {term: position for position, term in enumerate(self.vocabulary)}
        indptr, indices, data = [0], [], []
        for text in texts:
            counts = Counter(index[word] for word in words(text) if word in index)
            columns = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            frequencies = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            weights = (1.0 + np.log(frequencies)) * self.idf[columns]
            norm = float(np.linalg.norm(weights))
            indices.append(columns)
            data.append(weights / norm if norm else weights)
            indptr.append(indptr[-1] + len(columns))
        return Csr(np.array(indptr, dtype=np.int64), _concat(indices, np.int64), _concat(data, np.float64),
                   len(self.vocabulary))  # fmt: skip

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return _unit_rows(self.tfidf(texts).times(self.components.T))

    def assign(self, texts: Sequence[str]) -> np.ndarray:
        """The nearest centroid (cosine) of each text; a text with no vocabulary word embeds to zero and,
        every similarity being 0, goes to cluster 0."""
        if not texts:
            return np.zeros(0, dtype=np.int64)
        return np.argmax(self.embed(texts) @ self.centroids.T, axis=1)

    def top_terms(self, count: int) -> list[list[str]]:
        """The `count` words that weigh most in each centroid, mapped back to term space."""
        term_weights = self.centroids @ self.components
        return [[self.vocabulary[i] for i in np.argsort(-row, kind="stable")[:count]] for row in term_weights]

    def to_bytes(self) -> bytes:
        sink = io.BytesIO()
        np.savez(sink, vocabulary=np.array(self.vocabulary, dtype=str), idf=self.idf, components=self.components,
                 centroids=self.centroids)  # fmt: skip
        return sink.getvalue()

    @staticmethod
    def from_bytes(data: bytes) -> TopicModel:
        with np.load(io.BytesIO(data)) as arrays:
            return TopicModel(arrays["vocabulary"].tolist(), arrays["idf"], arrays["components"], arrays["centroids"])


def fit_topic_model(texts: Sequence[str], clusters: int, dim: int, vocab_size: int, max_df: float,
                    iterations: int, seed: int) -> TopicModel:  # fmt: skip
    """Fit vocabulary, idf, SVD and k-means on `texts` (a sample of the corpus)."""
    if not texts:
        raise ValueError("the topic model needs at least one sample document")
    frequency = Counter(word for text in texts for word in set(words(text)))
    ceiling = max(2, int(max_df * len(texts)))
    kept = sorted((term for term, df in frequency.items() if 2 <= df <= ceiling), key=lambda t: (-frequency[t], t))
    vocabulary = sorted(kept[:vocab_size])
    if not vocabulary:
        raise ValueError(f"no word occurs in 2 to {ceiling} of the {len(texts)} sample documents; "
                         "sample more documents or raise max_df")  # fmt: skip
    df = np.array([frequency[term] for term in vocabulary], dtype=np.float64)
    idf = np.log((1 + len(texts)) / (1 + df)) + 1
    rng = np.random.default_rng(seed)
    empty = TopicModel(vocabulary, idf, np.zeros((0, len(vocabulary))), np.zeros((0, 0)))
    matrix = empty.tfidf(texts)
    components = _randomized_svd(matrix, min(dim, len(vocabulary), len(texts)), rng)
    embeddings = _unit_rows(matrix.times(components.T))
    centroids = _kmeans(embeddings, clusters, iterations, rng)
    return TopicModel(vocabulary, idf, components, centroids)


def _randomized_svd(matrix: Csr, rank: int, rng: np.random.Generator) -> np.ndarray:
    """The top `rank` right singular vectors (rank x columns) of `matrix`."""
    width = min(rank + _OVERSAMPLES, matrix.columns, matrix.rows)
    basis = np.linalg.qr(matrix.times(rng.standard_normal((matrix.columns, width))))[0]
    for _ in range(_POWER_ITERATIONS):  # sharpens the spectrum so the basis finds the top directions
        basis = np.linalg.qr(matrix.times(np.linalg.qr(matrix.transpose_times(basis))[0]))[0]
    small = matrix.transpose_times(basis).T  # basis.T @ matrix, width x columns
    _, _, right = np.linalg.svd(small, full_matrices=False)
    right = right[:rank]
    # Singular vectors are defined up to sign: fix it so that refits give identical embeddings.
    signs = np.sign(right[np.arange(len(right)), np.argmax(np.abs(right), axis=1)])
    return right * signs[:, None]


def _kmeans(points: np.ndarray, clusters: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """The best of `_RESTARTS` runs: the one whose points are closest (cosine) to their centroids."""
    runs = [_lloyd(points, _kmeans_plus_plus(points, clusters, rng), iterations) for _ in range(_RESTARTS)]
    return max(runs, key=lambda centroids: float(np.max(points @ centroids.T, axis=1).sum()))


def _lloyd(points: np.ndarray, centroids: np.ndarray, iterations: int) -> np.ndarray:
    for _ in range(iterations):
        nearest = np.argmax(points @ centroids.T, axis=1)
        updated = centroids.copy()
        for cluster in range(len(centroids)):
            members = points[nearest == cluster]
            if len(members):
                updated[cluster] = members.sum(axis=0)
        updated = _unit_rows(updated)
        if np.allclose(updated, centroids):
            break
        centroids = updated
    return centroids


def _kmeans_plus_plus(points: np.ndarray, clusters: int, rng: np.random.Generator) -> np.ndarray:
    """Seeds drawn with probability proportional to squared distance to the nearest seed so far; once
    every point coincides with a seed (fewer distinct points than clusters), the rest are drawn uniformly."""
    chosen = [int(rng.integers(len(points)))]
    distances = np.sum((points - points[chosen[0]]) ** 2, axis=1)
    while len(chosen) < clusters:
        total = float(distances.sum())
        pick = int(rng.choice(len(points), p=distances / total)) if total > 0 else int(rng.integers(len(points)))
        chosen.append(pick)
        distances = np.minimum(distances, np.sum((points - points[pick]) ** 2, axis=1))
    return points[chosen].copy()


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)
