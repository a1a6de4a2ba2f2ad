"""From clean documents to what the trainer reads: a tokenizer, topic x quality cells, Levanter caches, mixture weights.

Takes in: `docs/` folders. Hands on: a byte-level BPE tokenizer (`train_tokenizer`; `corpus_stats` reports
corpora side by side with their tokens per byte), documents split into
cells (`topics`, `cells`), one Levanter cache per source or cell (`tokenize`, `levanter_cache`), and a
phase schedule of mixture weights (`mixture_weights`) for the train step, and the eval suite (`eval_suite`): held-out
subsets capped to the same tokens, the ladder's metric.
"""
