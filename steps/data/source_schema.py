"""What a source's files hold: the column with the text, the one with an id, the license; checked before a run.

Why: a dataset can look like text and hold none. `bigcode/the-stack-v2-dedup`'s Parquet files carry Software
Heritage blob ids and repository metadata, not file contents, so downloading them yields no document at all,
found only when the first data step reads them. Every full-scale source therefore states its schema
(`SourceSchema`), and `check_source_schema` reads the schema of one of its Parquet files wherever the source
is reachable (a local folder, a bucket, the Hub when online) and refuses a source without its text column
before anything runs. Where the metadata cannot be reached (offline, gated without a token) the check says
so and passes: it can only refuse what it can see.

At download, `normalize_parquet` renames a source's text and id columns to the `text` and `id` every
reader here expects (other columns are kept), or numbers the rows as ids where the source has none, so
the steps after it never need to know a source's own names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from executor import storage

logger = logging.getLogger(__name__)


class SourceSchemaError(ValueError):
    """A source's files do not hold the columns its schema says (no text column: nothing to train on)."""


@dataclass(frozen=True)
class SourceSchema:
    text_column: str = "text"
    """The column holding each document's text. Versioned (through the download's config)."""
    id_column: str | None = "id"
    """The column holding a document id; None numbers the rows of each file (`<file>:<row>`). Versioned."""
    license: str = ""
    """The license the data is published under, as its card states it. Documentation only."""
    gated: bool = False
    """Whether the Hub asks users to accept terms (a token of an account that did is needed). Documentation only."""


def check_source_schema(name: str, source: str, include: list[str], schema: SourceSchema) -> str:
    """Refuse `source` (a folder URL) if a Parquet file of it that `include` matches lacks the text column;
    returns what was checked, or why nothing could be."""
    try:
        fs, root = storage.filesystem(source)
        files = sorted(path for pattern in include for path in fs.glob(f"{root.rstrip('/')}/{pattern}"))
    except (OSError, ValueError, ImportError, httpx.HTTPError) as error:  # offline, gated, no such filesystem
        return f"source {name}: metadata of {source} not reachable ({type(error).__name__}); not checked"
    parquet = [path for path in files if path.endswith(".parquet")]
    if not parquet:
        return f"source {name}: no Parquet file under {source} matching {include}; not checked"
    try:
        with fs.open(parquet[0], "rb") as handle:
            columns = pq.read_schema(handle).names
    except OSError as error:
        return f"source {name}: schema of {parquet[0]} not readable ({type(error).__name__}); not checked"
    if schema.text_column not in columns:
        raise SourceSchemaError(
            f"source {name} ({source}): {parquet[0]} has no text column {schema.text_column!r} (columns: {columns}); "
            "point the source at a dataset whose files hold the documents' text, or set its text_column"
        )
    return f"source {name}: {parquet[0]} holds text column {schema.text_column!r}"


def normalize_parquet(path: str, relative: str, text_column: str, id_column: str | None) -> None:
    """Rewrite the Parquet file at `path` (a local file) with the columns `text` and `id` every reader expects."""
    table = pq.read_table(path)
    if text_column not in table.column_names:
        raise SourceSchemaError(f"{relative}: no text column {text_column!r} (columns: {table.column_names}); "
                                "the source holds no documents to read")  # fmt: skip
    renames = {text_column: "text"}
    if id_column is not None:
        if id_column not in table.column_names:
            raise SourceSchemaError(f"{relative}: no id column {id_column!r} (columns: {table.column_names}); "
                                    "set id_column=None to number the rows")  # fmt: skip
        renames[id_column] = "id"
    kept = [column for column in table.column_names if column in renames or column not in ("text", "id")]
    table = table.select(kept).rename_columns([renames.get(column, column) for column in kept])
    if id_column is None:
        table = table.append_column("id", pa.array([f"{relative}:{row}" for row in range(table.num_rows)]))
    pq.write_table(table, path, compression="zstd")
