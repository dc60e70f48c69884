"""A finished group CSV as Parquet, typed from its ViewDefinition's columns.

A cell its type cannot hold raises ``ViewError`` naming file, column and row, never the value (it is
patient data). Blocks, row groups and types: docs/development.md, "The SQL-on-FHIR engine".
"""

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

# Arrow's allocator (mimalloc) kept freed memory for reuse: a 120 MB CSV took the process up by 196
# MB, now 102 MB. It reads the setting when pyarrow loads (this module is imported only for a job
# that asks for Parquet).
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")

import pyarrow as pa  # noqa: E402
import pyarrow.csv as pa_csv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tasks.core.json_shapes import JsonObject
from tasks.streams.files import close_synced, renamed_when_done
from tasks.sof.errors import ViewError
from tasks.sof.view import all_selects, compile_view


BLOCK_BYTES = 1024 * 1024
MAX_BLOCK_BYTES = 1024 * BLOCK_BYTES  # a row longer than this (a CSV row of over 1 GB) is refused
# the Parquet writer holds a row group's pages: 32 MB took 45 MB more
ROW_GROUP_BYTES = 8 * 1024 * 1024
ROW_GROUP_MAX_ROWS = 1 << 30  # rows do not cut a row group: its bytes do
COMPRESSION = "zstd"
INTEGER_TYPES = frozenset({"integer", "positiveInt", "unsignedInt", "integer64"})
# any other type: text
ARROW_TYPES = {"boolean": pa.bool_(), **dict.fromkeys(INTEGER_TYPES, pa.int64())}
_CONVERSION_ERROR = re.compile(
    r"In CSV column #(?P<index>\d+): (?:Row #(?P<row>\d+): )?CSV conversion error to (?P<type>\w+)"
)
_ROW_OVER_BLOCK = "straddling object straddles two block boundaries"
_CELL_VALUE = re.compile(r"'[^']*'")  # a quoted value in pyarrow's reason


def write_parquet(
    csv_path: Path, view: JsonObject, parquet_path: Path, row_group_bytes: int = ROW_GROUP_BYTES
) -> int:
    """Write ``view``'s group CSV as ``parquet_path`` (renamed when done); its rows.

    Note: read in blocks of ``BLOCK_BYTES``; a row longer than a block (a large base64 or
    collection cell) starts it again with blocks four times as large, up to
    ``MAX_BLOCK_BYTES``."""
    schema = parquet_schema(view)
    block = min(BLOCK_BYTES, row_group_bytes)
    with renamed_when_done(parquet_path) as temporary:
        while True:
            try:
                rows = _converted(csv_path, schema, temporary, row_group_bytes, block)
                break
            except pa.ArrowInvalid as exc:
                if _ROW_OVER_BLOCK not in str(exc) or block >= MAX_BLOCK_BYTES:
                    problem = _arrow_problem(exc, schema)
                    raise ViewError(
                        f"{csv_path.name} cannot be written as Parquet: {problem}"
                    ) from None
                block *= 4
        with open(temporary, "rb") as written:  # pyarrow closed it unsynced
            close_synced(written)
        return rows


def parquet_rows(path: Path) -> int:
    """The rows a Parquet file's footer records; ``ViewError`` when it is none."""
    try:
        return pq.read_metadata(path).num_rows  # type: ignore[no-any-return]  # pyarrow: untyped
    except (pa.ArrowException, OSError) as exc:
        raise ViewError(f"{path.name} cannot be read as a Parquet file ({exc})") from None


def parquet_schema(view: JsonObject) -> pa.Schema:
    """The view's columns in the engine's order, each with its Parquet type.

    Note: a column of a unionAll is of its branches' type where they agree, else text."""
    root = compile_view(view).root
    columns = [column for select in all_selects(root) for column in select.columns]
    schema = []
    for name in root.names:
        kinds = {column.fhir_type for column in columns if column.name == name}
        kind = kinds.pop() if len(kinds) == 1 else None  # the branches agree, or it is text
        schema.append((name, ARROW_TYPES.get(kind, pa.string())))
    return pa.schema(schema)


def _converted(
    csv_path: Path, schema: pa.Schema, parquet_path: Path, row_group_bytes: int, block: int
) -> int:
    rows = 0
    reader = pa_csv.open_csv(
        csv_path,
        read_options=pa_csv.ReadOptions(block_size=block),
        parse_options=pa_csv.ParseOptions(newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(
            column_types={field.name: field.type for field in schema},
            null_values=[""],
            strings_can_be_null=True,
            true_values=["true"],
            false_values=["false"],
        ),
    )
    if reader.schema.names != schema.names:
        raise ViewError(
            f"{csv_path.name} has the columns {reader.schema.names}, but its ViewDefinition has "
            f"{schema.names}: convert a CSV with the view that wrote it"
        )
    with pq.ParquetWriter(parquet_path, schema, compression=COMPRESSION) as writer:
        for group in _row_groups(reader, row_group_bytes):
            table = pa.Table.from_batches(group, schema)
            writer.write_table(table, row_group_size=ROW_GROUP_MAX_ROWS)
            rows += table.num_rows
    return rows


def _row_groups(
    batches: Iterable[pa.RecordBatch], row_group_bytes: int
) -> Iterator[list[pa.RecordBatch]]:
    """The batches in runs of at least ``row_group_bytes`` (the last may be smaller)."""
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        group.append(batch)
        size += batch.nbytes
        if size >= row_group_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def _arrow_problem(exc: pa.ArrowInvalid, schema: pa.Schema) -> str:
    """pyarrow's reason in one line, never a cell's value (patient data).

    Note: for a cell its column's type cannot hold: the column, the row and the fix."""
    reason = str(exc).splitlines()[0]
    if (found := _CONVERSION_ERROR.search(reason)) is None:
        return _CELL_VALUE.sub("'…'", reason)
    name = schema.field(int(found["index"])).name
    row = f", row {found['row']}" if found["row"] else ""
    return (
        f"column {name!r}{row}: a value that is no {found['type']}; its type in the "
        "ViewDefinition does not fit its values: correct the type or remove it (the column is "
        "then text)"
    )
