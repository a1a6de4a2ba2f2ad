"""MinHash signature throughput per core: ours (steps/dedup/minhash.py) vs datatrove and rensa, text in, signature out.

Same corpus (the offline real corpus: text none of the three chose), same settings (5-grams, 112
permutations), one process each, measured one after the other in one run:

- ours: normalize, shingle and permute whole batches in numpy, plus the LSH band keys;
- datatrove's `MinhashDedupSignature`: `get_shingles` (spaCy tokenizer, one xxhash call per n-gram)
  then `get_signature`, i.e. what its `run` does per document minus the file writes;
- rensa's `RMinHash` (Rust), fed 5-gram shingle strings made in Python from our normalized words,
  since rensa takes tokens, not text.

    python benchmarks/bench_minhash.py [--docs-per-domain 400] [--repeats 2]

Prints a JSON line last: docs, MB, docs/s and MB/s for each, and `ratio_vs_datatrove` and
`ratio_vs_rensa` (our throughput over theirs).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from results import record

from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.dedup.minhash import BATCH_CHARS, MinHasher, normalize, text_batches


def corpus_texts(docs_per_domain: int) -> list[str]:
    folder = tempfile.mkdtemp(prefix="bench-minhash-")
    build_real_corpus(RealCorpusConfig(output_path=folder, docs_per_domain=docs_per_domain))
    report = ReadReport()
    return [doc["text"] for path in list_input_files(f"{folder}/raw") for doc in read_documents(path, report)]


def time_ours(texts: list[str]) -> float:
    """In the fuzzy dedup step's batches (`text_batches`, at most BATCH_CHARS characters each)."""
    hasher = MinHasher(n_grams=5, bands=14, rows=8)
    hasher.signatures(texts[:10])  # builds the translation table once, as a worker would
    start = time.perf_counter()
    for batch in text_batches(texts, BATCH_CHARS):
        signatures, has = hasher.signatures(batch)
        hasher.band_keys(signatures[has])
    return time.perf_counter() - start


def time_datatrove(texts: list[str]) -> float:
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
    from datatrove.utils.hashing import HashConfig

    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, hash_config=HashConfig(precision=64))
    block = MinhashDedupSignature(output_folder=tempfile.mkdtemp(prefix="bench-dt-"), config=config)
    block.get_signature(block.get_shingles(texts[0]))
    start = time.perf_counter()
    for text in texts:
        shingles = block.get_shingles(text)
        if shingles.size:
            block.get_signature(shingles)
    return time.perf_counter() - start


def time_rensa(texts: list[str], n_grams: int = 5, permutations: int = 112) -> float:
    from rensa import RMinHash

    start = time.perf_counter()
    for text in texts:
        words = normalize(text).split()
        shingles = [" ".join(words[index : index + n_grams]) for index in range(len(words) - n_grams + 1)]
        if shingles:
            minhash = RMinHash(num_perm=permutations, seed=1)
            minhash.update(shingles)
            minhash.digest()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-domain", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2, help="passes per contender; the fastest counts")
    args = parser.parse_args()
    texts = corpus_texts(args.docs_per_domain)
    megabytes = sum(len(text.encode()) for text in texts) / 1e6
    # Best of `--repeats` passes each: a worker hashes gigabytes, so one-time costs (page faults of the first
    # batch's arrays, our power tables, the lazily filled translation table) are not what it spends.
    ours, datatrove, rensa = (
        min(timer(texts) for _ in range(args.repeats)) for timer in (time_ours, time_datatrove, time_rensa)
    )
    figures = {"benchmark": "minhash_signatures_per_core", "docs": len(texts), "mb": round(megabytes, 2)}
    for name, seconds in (("ours", ours), ("datatrove", datatrove), ("rensa", rensa)):
        figures[f"{name}_docs_per_s"] = round(len(texts) / seconds, 1)
        figures[f"{name}_mb_per_s"] = round(megabytes / seconds, 2)
    figures["ratio_vs_datatrove"] = round(datatrove / ours, 2)
    figures["ratio_vs_rensa"] = round(rensa / ours, 2)
    record("bench_minhash", figures, parser, args)


if __name__ == "__main__":
    main()
