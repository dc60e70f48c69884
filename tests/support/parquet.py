"""A typed Observation view and its CSV rows, as the Parquet tests write and read them."""

from __future__ import annotations

import io
from pathlib import Path

from tasks.sof.output import CsvWriter

TYPED_VIEW = {
    "resourceType": "ViewDefinition",
    "resource": "Observation",
    "select": [
        {
            "column": [
                {"name": "id", "path": "id", "type": "id"},
                {"name": "final", "path": "status = 'final'", "type": "boolean"},
                {"name": "count", "path": "valueInteger", "type": "integer"},
            ]
        },
        {
            "column": [
                {"name": "value", "path": "valueQuantity.value", "type": "decimal"},
                {"name": "effective", "path": "effectiveDateTime", "type": "dateTime"},
                {"name": "codes", "path": "code.coding.code", "type": "code", "collection": True},
                {"name": "note", "path": "note.text.first()"},
            ]
        },
    ],
}
COLUMNS = ["id", "final", "count", "value", "effective", "codes", "note"]
ROWS = [
    ["o1", "true", "7", "1.50", "2020", '["a","b"]', 'line one\nline "two", three'],
    ["o2", "false", "", "123456789012345678901234567890123456789.5", "2021-03-04T05:06:07+01:00", "[]", ""],
    ["o3", "", "-42", "", "", "", "a bare\rCR"],
]


def write_csv(path: Path, columns: list[str], rows: list[list[str]]) -> Path:
    """``columns`` and ``rows`` written to ``path`` as the flattening writes a group CSV."""
    text = io.StringIO()
    writer = CsvWriter(text)
    for row in [columns, *rows]:
        writer.writerow(row)
    path.write_text(text.getvalue(), encoding="utf-8")
    return path
