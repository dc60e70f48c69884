"""One round of fhir4ds (DuckDB) over ViewDefinitions, run in fhir4ds's own environment (it is no dependency):

    uv run --no-project --with fhir4ds==0.5.1 python -P tests/benchmarks/fhir4ds_views.py VIEWS RESOURCES OUT

``VIEWS`` is a JSON list of ViewDefinitions, ``RESOURCES`` an NDJSON file of resources (one per line). For each
view, in order: a fresh in-memory DuckDB datastore loads the file (``FHIRDataStore.load_from_json_file``, DuckDB's
``read_json``), then the view runs (``ViewRunner.execute_view_definition(...).fetchall()``); both timed apart, wall
and CPU (the process's, DuckDB's threads included). The rows go to ``OUT/<n>.json`` (values as fhir4ds gives them,
JSON), the figures to stdout as one JSON line; a view fhir4ds fails is reported with the reason.

fhir4ds's DuckDB dialect runs ``INSTALL json`` on every connection, which downloads the extension; the json
extension is built into the duckdb wheel, so the connection given to it only loads it (no network needed).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import fhir4ds
from fhir4ds import FHIRDataStore
from fhir4ds.dialects import DuckDBDialect


class BuiltInJson:
    """A DuckDB connection whose ``INSTALL json`` is a ``LOAD json`` (the extension ships in the wheel)."""

    def __init__(self, connection: duckdb.DuckDBPyConnection):
        self._connection = connection

    def execute(self, sql: str, *parameters):
        if sql.strip().startswith("INSTALL json"):
            sql = "LOAD json;"
        return self._connection.execute(sql, *parameters)

    def __getattr__(self, name: str):
        return getattr(self._connection, name)


def timed(work: Callable[[], object]) -> tuple[object, float, float]:
    """What ``work`` returns, its wall-clock and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def loaded_store(resources: Path) -> FHIRDataStore:
    store = FHIRDataStore(DuckDBDialect(connection=BuiltInJson(duckdb.connect(":memory:"))))
    store.load_from_json_file(str(resources))
    return store


def run_view(view: dict, resources: Path, out: Path) -> dict:
    store, load_seconds, load_cpu = timed(lambda: loaded_store(resources))
    figures = {"resource": view["resource"], "load_seconds": load_seconds, "load_cpu": load_cpu}
    try:
        rows, seconds, cpu = timed(lambda: store.view_runner().execute_view_definition(view).fetchall())
    except Exception as error:  # whatever fhir4ds raises is the reason it could not run the view
        return figures | {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
    out.write_text(json.dumps([list(row) for row in rows], default=str))
    return figures | {
        "query_seconds": seconds,
        "query_cpu": cpu,
        "seconds": load_seconds + seconds,
        "cpu": load_cpu + cpu,
        "rows": len(rows),
    }


def main() -> None:
    views_path, resources, out = (Path(argument) for argument in sys.argv[1:4])
    logging.disable(logging.CRITICAL)  # fhir4ds logs its fallbacks and failures; they are reported here
    views = json.loads(views_path.read_text())
    threads = duckdb.connect(":memory:").execute("SELECT current_setting('threads')").fetchone()[0]
    measured = [run_view(view, resources, out / f"{number}.json") for number, view in enumerate(views)]
    print(
        json.dumps(
            {"fhir4ds": fhir4ds.__version__, "duckdb": duckdb.__version__, "threads": threads, "views": measured}
        )
    )


if __name__ == "__main__":
    main()
