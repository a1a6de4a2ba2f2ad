"""Documents in and out: download sources, read any document file, write JSONL shards.

Takes in: a source URL or folder (JSONL plain/gz/zst, Parquet). Hands on: `docs/` folders of JSONL shards
that every later stage reads through the one reader (`documents.read_documents`), plus the hand-over of
intermediate arrays between the stages of a multi-stage step (`arrays`).
"""
