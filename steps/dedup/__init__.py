"""Deduplication: exact (normalized paragraphs and documents) and fuzzy (MinHash LSH, verified pairs, components).

Takes in: `docs/` folders. Hands on: the same documents less the duplicates, with stats of what was dropped
(`steps/corpora/dedup_eval.py` scores fuzzy dedup against a corpus with planted duplicates).
"""
