"""The SQL-on-FHIR v2 conformance tests, one case per test and way of running a view (and its lines read as ``view run``
reads a file), through the engine: the shared
half (shared/testdata/sql-on-fhir) and files of the other half kept here (tests/sof-conformance-extra, see its
README), all at one upstream commit."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from flows.view_cli import write_csv
from tasks.sof.errors import ViewError
from tasks.sof.output import CsvWriter, json_bytes
from tasks.sof.resources import read_rows
from tasks.sof.view import compile_view
from tests.conftest import TESTDATA
from tests.support.sof import WAYS, in_one_way

SUITE = TESTDATA / "sql-on-fhir"
EXTRA = Path(__file__).parent / "sof-conformance-extra"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(), parse_float=Decimal)


def cases(*folders: Path) -> list:
    found = []
    for path in sorted(path for folder in folders for path in folder.glob("*.json")):
        if path.name == "tests.schema.json":
            continue
        suite = load(path)
        for index, test in enumerate(suite["tests"]):
            found.append(pytest.param(path, index, id=f"{path.stem}: {test['title']}"))
    return found


def run(view: dict[str, Any], resources: list[dict[str, Any]], way: str) -> list[dict[str, Any]]:
    """The view's rows over the resources run one way, or as NDJSON lines as ``view run`` reads them (``lines``:
    ``read_rows``, orjson's parse first)."""
    if way == "lines":
        compiled = compile_view(view)
        lines = enumerate(map(json_bytes, resources), 1)
        return [dict(zip(compiled.columns, row, strict=True)) for row in read_rows(compiled, "suite", lines)]
    compiled = in_one_way(compile_view(view), way)
    return [dict(zip(compiled.columns, row, strict=True)) for resource in resources for row in compiled.rows(resource)]


def canonical(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as comparable text, order-insensitive (the suite's expectations are); decimals compared as JSON numbers
    are, by value (0.95000000 is 0.95)."""
    return sorted(json.dumps(row, sort_keys=True, default=lambda value: str(value.normalize())) for row in rows)


@pytest.mark.parametrize("way", [*WAYS, "lines"])
@pytest.mark.parametrize(("path", "index"), cases(SUITE, EXTRA))
def test_conformance(path: Path, index: int, way: str):
    suite = load(path)
    test = suite["tests"][index]
    if "expectError" in test:
        with pytest.raises(ViewError):
            run(test["view"], suite["resources"], way)
        return
    rows = run(test["view"], suite["resources"], way)
    if "expectCount" in test:
        assert len(rows) == test["expectCount"]
    else:
        assert canonical(rows) == canonical(test["expect"])


@pytest.mark.parametrize(("path", "index"), cases(SUITE, EXTRA))
def test_rows_for_csv_are_the_same_csv_as_the_rows_of_the_lines_way(path: Path, index: int, tmp_path: Path):
    """``view run``'s CSV and the flattener take the rows for CSV cells (``''`` where a value is missing), and
    ``view run`` writes a file's CSV block by block (``csv_parts``), taken where the block is all of the view's
    type: the same bytes as the rows of the ``lines`` way written to CSV, or the same error."""
    suite = load(path)
    test = suite["tests"][index]
    files = {"all": tmp_path / "resources.ndjson", "own": tmp_path / "own-type.ndjson"}
    files["all"].write_bytes(b"".join(json_bytes(resource) + b"\n" for resource in suite["resources"]))
    own_type = [json_bytes(r) + b"\n" for r in suite["resources"] if r["resourceType"] == test["view"].get("resource")]
    files["own"].write_bytes(b"".join(own_type))
    written = []
    for way in ("lines", "lines for csv", "all", "own"):
        out, lines = io.StringIO(), enumerate(map(json_bytes, suite["resources"]), 1)
        try:
            view = compile_view(test["view"])
            if way in files:
                write_csv(view, files[way], out)  # the header, then the rows
            else:
                (writer := CsvWriter(out)).writerow(view.columns)
                writer.writerows(read_rows(view, "suite", lines, csv=way == "lines for csv"))
        except ViewError as exc:
            out.write(f"error: {type(exc).__name__}")
        written.append(out.getvalue())
    assert written[1:] == [written[0]] * 3
    assert ("error: " in written[0]) == ("expectError" in test)


def test_the_suite_s_views_are_read_block_by_block():
    """The block path of ``view run``'s CSV (``struct_rows``) is taken by the suite's cases that it is made for (views
    the generated function runs) over their resources of the view's type, so the test above compares it there."""
    taken = []
    for path, index in (case.values for case in cases(SUITE, EXTRA)):
        suite = load(path)
        test = suite["tests"][index]
        if "expectError" in test:
            continue
        block = [json_bytes(r) + b"\n" for r in suite["resources"] if r["resourceType"] == test["view"]["resource"]]
        if (csv_of := compile_view(test["view"]).block_csv) is not None and csv_of(b"".join(block)) is not None:
            taken.append(test["title"])
    assert {"select & column", "forEachOrNull: null case", "forEach: two on the same level"} <= set(taken)
    assert len(taken) >= 20


def test_the_shared_suite_has_its_70_tests():
    assert len(cases(SUITE)) == 70
