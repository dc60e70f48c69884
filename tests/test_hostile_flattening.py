"""Hostile inputs to flattening (issue 22): cartesian products, bare carriage returns, backtracking regexes,
runaway repeats, deep nesting, and a CRTDL whose groups route nothing. Each test failed before its fix.

Memory bounds are measured in a child process (its own peak RSS, and its children's); what used to hang runs in a
child with a generous deadline, or in process where it now finishes at once.
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import tracemalloc
from decimal import Decimal
from itertools import islice
from pathlib import Path

import orjson
import pytest

from config.settings import RetrySettings, TlsSettings
from tasks.clients.flattener import Flattener, StepError, parse_row
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.flattening import flatten_with_service, plan_views
from tasks.job.flattening_outcome import FlatteningError, engine_errors_as_step_errors
from tests.flattening_runs import flatten_files
from tasks.sof.view import compile_view
from tasks.sof.errors import FhirPathError, ResourceLineError, ViewDefinitionError, ViewEvaluationError
from tasks.sof.fhirpath import compile_path
from tasks.sof.fhirpath_shared import MAX_COMPUTED_SIZE, MAX_EXPRESSION_DEPTH, MAX_REPEAT_ELEMENTS
from tasks.sof.flatten import FilePlan, GroupPlan, flatten_file
from tasks.streams.ndjson import WHOLE_FILE
from tasks.streams.spans import Piece
from tasks.sof.resources import parse_line
from tasks.sof.view import MAX_ROWS_PER_RESOURCE, MAX_SELECT_DEPTH
from tests.conftest import REPO_ROOT, TESTDATA
from tests.peak_rss import run_measured

EXAMPLE = TESTDATA / "flattening" / "example"
EXAMPLE_CRTDL = EXAMPLE / "example-crtdl.json"
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"
TORCH_RESULT = TESTDATA / "extraction" / "example-result"
TORCH_BATCH = TORCH_RESULT / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"
MB = 1024 * 1024
DIAGNOSE = "https://www.medizininformatik-initiative.de/fhir/core/modul-diagnose/StructureDefinition/Diagnose"
CHILD_DEADLINE = 120
SLICE_SYSTEMS = (
    "http://snomed.info/sct",
    "http://fhir.de/CodeSystem/bfarm/icd-10-gm",
    "http://fhir.de/CodeSystem/bfarm/alpha-id",
    "http://www.orpha.net",
)


def write_ndjson(path: Path, resources: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(resource) + b"\n" for resource in resources))
    return path


def run_flattening(paths: list[Path], out: Path, crtdl: Path = EXAMPLE_CRTDL, lookup: Path = LOOKUP, service=None):
    views, skipped = plan_views(crtdl, lookup)
    if service is None:
        return flatten_files(paths, out, views, skipped, max_line_bytes=10 * MB)
    return flatten_with_service(paths, out, views, skipped, 10 * MB, service, 500 * MB)


def run_with_service(server, paths: list[Path], out: Path, crtdl: Path = EXAMPLE_CRTDL):
    retry = RetrySettings(max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0)
    with ServiceClient(ServiceEndpoint("flattening", server.base_url), TlsSettings(), retry) as client:
        return run_flattening(paths, out, crtdl, service=Flattener(client))


def view_of(group_name: str):
    views, _ = plan_views(EXAMPLE_CRTDL, LOOKUP)
    return next(view.view for view in views if view.group.name == group_name)


def view_cli(tmp_path: Path, view: dict, resources: list[dict], *args: str) -> list[str]:
    """The ``view run`` command line over the view and resources (written to ``tmp_path``)."""
    (tmp_path / "view.json").write_text(json.dumps(view))
    data = write_ndjson(tmp_path / "data.ndjson", resources)
    return [sys.executable, "-m", "flows.run", "view", "run", str(tmp_path / "view.json"), str(data), *args]


CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def run_view_cli(tmp_path: Path, view: dict, resources: list[dict], *args: str) -> subprocess.CompletedProcess:
    """``view run`` in a child, output as bytes (text mode would turn a lone CR into a line end)."""
    command = view_cli(tmp_path, view, resources, *args)
    return subprocess.run(command, cwd=REPO_ROOT, env=CHILD_ENV, capture_output=True, timeout=CHILD_DEADLINE)


# --- 4. a cartesian product of millions of rows streams -----------------------------------------------------------


def condition_with_codings(per_system: int, ident: str = "c-many-codings") -> dict:
    """A Condition with ``per_system`` codings in each of the four slices the Diagnose lookup table reads."""
    codings = [{"system": system, "code": f"{n:04d}"} for system in SLICE_SYSTEMS for n in range(per_system)]
    return {
        "resourceType": "Condition",
        "id": ident,
        "meta": {"profile": [DIAGNOSE]},  # a plain import: the Diagnosis group takes a Condition of its profile
        "subject": {"reference": "Patient/p1"},
        "code": {"coding": codings},
        "recordedDate": "2024-01-15",
    }


def test_the_rows_of_a_large_product_come_one_at_a_time() -> None:
    view = compile_view(view_of("Diagnosis"))
    condition = condition_with_codings(20)  # 20**4 = 160,000 rows

    tracemalloc.start()
    try:
        first = list(islice(view.rows(condition), 3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 2 * MB, f"{peak / MB:.1f} MB held for three rows"
    sct, icd10, alpha, orpha = SLICE_SYSTEMS
    assert [row[:10] for row in first] == [
        ("c-many-codings", "Patient/p1", sct, "0000", icd10, "0000", alpha, "0000", orpha, code)
        for code in ("0000", "0001", "0002")
    ]


def test_a_product_streams_in_the_same_order_as_it_was_built() -> None:
    view = compile_view(view_of("Diagnosis"))
    rows = list(view.rows(condition_with_codings(3)))

    assert len(rows) == 3**4
    codes = [(row[3], row[5], row[7], row[9]) for row in rows]
    assert codes == sorted(codes)
    assert len(set(codes)) == 81


def test_more_rows_than_the_limit_is_an_error_naming_view_and_resource() -> None:
    view = compile_view(view_of("Diagnosis"), max_rows_per_resource=1000)

    with pytest.raises(ViewEvaluationError) as error:
        sum(1 for _ in view.rows(condition_with_codings(6)))  # 1,296 rows

    message = str(error.value)
    assert "view 'Diagnosis'" in message
    assert "Condition/c-many-codings" in message
    assert "more than 1,000 rows" in message
    assert MAX_ROWS_PER_RESOURCE >= 1_000_000


CHILD_FLATTENING = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tasks.flattening import plan_views
    from tasks.job.flattening_outcome import FlatteningError
    from tests.flattening_runs import flatten_files

    source, out, crtdl, lookup = map(Path, sys.argv[1:5])
    views, skipped = plan_views(crtdl, lookup)
    try:
        outcome = flatten_files([source], out, views, skipped, max_line_bytes=1 << 24)
        error = None
    except FlatteningError as exc:
        error = str(exc)
    print(json.dumps({"error": error}))
    """
)


@pytest.mark.slow
def test_a_condition_with_60_codings_per_slice_ends_in_bounded_memory_with_a_clear_error(tmp_path) -> None:
    source = write_ndjson(tmp_path / "in" / "conditions.ndjson", [condition_with_codings(60, "c-13-million-rows")])
    assert source.stat().st_size < 20_000  # the 15 KB resource: 60**4 = 12,960,000 rows
    out = tmp_path / "out"

    with (tmp_path / "stdout.txt").open("wb") as stdout, (tmp_path / "stderr.txt").open("wb") as stderr:
        child = run_measured(
            [sys.executable, "-c", CHILD_FLATTENING, str(source), str(out), str(EXAMPLE_CRTDL), str(LOOKUP)],
            timeout=300,
            cwd=REPO_ROOT,
            env=CHILD_ENV,
            stdout=stdout,
            stderr=stderr,
        )

    assert child.returncode == 0, (tmp_path / "stderr.txt").read_text()
    report = json.loads((tmp_path / "stdout.txt").read_text().splitlines()[-1])
    assert child.peak_mb < 400, (child, report)
    assert report["error"] is not None
    assert "Diagnosis.csv: view 'Diagnosis', Condition/c-13-million-rows" in report["error"]
    assert f"more than {MAX_ROWS_PER_RESOURCE:,} rows" in report["error"]
    assert not list(out.glob("*.csv")) and not list(out.glob(".*"))


# --- 5. a bare carriage return is quoted (RFC 4180) ------------------------------------------------------------------


def strict_rfc4180_records(text: str) -> list[list[str]]:
    """RFC 4180 with LF line ends, strictly: a CR, LF or quote outside a quoted field is an error, not a row end."""
    records: list[list[str]] = []
    record: list[str] = []
    position = 0
    while position < len(text):
        if text[position] == '"':
            value, position = _quoted_field(text, position)
        else:
            end = min((i for i in (text.find(",", position), text.find("\n", position)) if i >= 0), default=len(text))
            value = text[position:end]
            if "\r" in value or '"' in value:
                raise ValueError(f"unquoted field {value!r} holds a CR or a quote (offset {position})")
            position = end
        record.append(value)
        if position == len(text) or text[position] == "\n":
            records.append(record)
            record = []
        elif text[position] != ",":
            raise ValueError(f"{text[position]!r} after a field at offset {position}")
        position += 1
    return records


def _quoted_field(text: str, position: int) -> tuple[str, int]:
    value, position = [], position + 1
    while True:
        end = text.find('"', position)
        if end < 0:
            raise ValueError("a quoted field is not closed")
        value.append(text[position:end])
        if text[end + 1 : end + 2] != '"':
            return "".join(value), end + 1
        value.append('"')
        position = end + 2


def patients_with_carriage_returns(count: int) -> list[dict]:
    """Patients whose gender is odd text: a bare CR in every fifth, CR LF, quotes and commas in others."""
    odd = ["line one\rline two", "a\r", "crlf\r\nend", 'say "hi", then go', "plain"]
    return [
        {"resourceType": "Patient", "id": f"p{i}", "gender": odd[i % len(odd)], "birthDate": "1970-01-01"}
        for i in range(count)
    ]


def assert_csv_reads_back(text: str, genders: list[str]) -> None:
    for records in (list(csv.reader(io.StringIO(text, newline=""))), strict_rfc4180_records(text)):
        assert len(records) == 1 + len(genders)
        column = records[0].index("gender")
        assert [record[column] for record in records[1:]] == genders


@pytest.mark.parametrize("engine", ["embedded", "service"])
def test_a_bare_carriage_return_is_quoted_so_25_rows_read_back_as_25(tmp_path, engine, request) -> None:
    patients = patients_with_carriage_returns(25)
    source = write_ndjson(tmp_path / "in" / "patients.ndjson", patients)
    out = tmp_path / "out"

    if engine == "service":
        run_with_service(request.getfixturevalue("flattener_fake"), [source], out)
    else:
        run_flattening([source], out)

    text = (out / "MII PR Person Patient (Pseudonymisiert).csv").read_bytes().decode()
    assert_csv_reads_back(text, [p["gender"] for p in patients])


@pytest.mark.slow
def test_view_run_csv_quotes_a_bare_carriage_return(tmp_path) -> None:
    view = {
        "resourceType": "ViewDefinition",
        "resource": "Patient",
        "select": [{"column": [{"name": "id", "path": "id"}, {"name": "gender", "path": "gender"}]}],
    }
    patients = patients_with_carriage_returns(25)

    result = run_view_cli(tmp_path, view, patients, "--format", "csv")

    assert result.returncode == 0, result.stderr
    assert_csv_reads_back(result.stdout.decode(), [p["gender"] for p in patients])


# --- 10. regexes, repeats and nesting are bounded ------------------------------------------------------------------


BACKTRACKING = "^(a+)+$"
HOSTILE_TEXT = "a" * 34 + "!"  # 35 characters: about 2**34 steps for a backtracking engine


def patient_view(path: str) -> dict:
    """A Patient view of one column ``v``."""
    return {
        "resourceType": "ViewDefinition",
        "resource": "Patient",
        "select": [{"column": [{"name": "v", "path": path}]}],
    }


def hostile_patient() -> dict:
    return {"resourceType": "Patient", "id": "p", "gender": HOSTILE_TEXT}


def test_a_backtracking_regex_in_the_lookup_file_does_not_hang_flattening(tmp_path) -> None:
    tables = json.loads(LOOKUP.read_text())
    gender = tables[0]["elements"]["Patient.gender"]["viewDefinition"]["select"][0]["column"][0]
    gender["path"] = f"gender.where($this.matches('{BACKTRACKING}').not())"
    lookup = tmp_path / "lookup.json"
    lookup.write_text(json.dumps(tables))
    source = write_ndjson(tmp_path / "in" / "p.ndjson", [hostile_patient()])

    run_flattening([source], tmp_path / "out", lookup=lookup)

    rows = list(csv.DictReader((tmp_path / "out" / "MII PR Person Patient (Pseudonymisiert).csv").open(newline="")))
    assert [row["gender"] for row in rows] == [HOSTILE_TEXT]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"gender.matches('{BACKTRACKING}')", False),
        (f"gender.replaceMatches('{BACKTRACKING}', 'x')", HOSTILE_TEXT),
        ("gender.replaceMatches('(a)(a)', '$2-$1')", "a-a" * 17 + "!"),
        ("gender.matches('^a+!$')", True),
    ],
)
def test_view_run_evaluates_regexes_in_linear_time(tmp_path, path, expected) -> None:
    result = run_view_cli(tmp_path, patient_view(path), [hostile_patient()])

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"v": expected}


def test_a_regex_re2_cannot_run_is_a_clear_error_naming_it() -> None:
    view = compile_view(patient_view("gender.matches('(a)\\\\1')"))

    with pytest.raises(ViewEvaluationError) as error:
        list(view.rows({"resourceType": "Patient", "id": "p", "gender": "aa"}))

    message = str(error.value)
    assert "column 'v'" in message and "regular expression '(a)" in message
    assert "backreferences" in message


def nested_items(depth: int) -> dict:
    """A QuestionnaireResponse whose items are nested ``depth`` levels deep, one item per level."""
    response = {"resourceType": "QuestionnaireResponse", "id": "q", "status": "completed"}
    node = response
    for level in range(depth):
        node["item"] = [{"linkId": str(level)}]
        node = node["item"][0]
    return response


def repeat_view(paths: list[str]) -> dict:
    return {
        "resourceType": "ViewDefinition",
        "name": "items",
        "resource": "QuestionnaireResponse",
        "select": [{"repeat": paths, "column": [{"name": "link", "path": "linkId"}]}],
    }


@pytest.mark.slow
def test_view_run_stops_an_exponential_repeat_naming_it(tmp_path) -> None:
    result = run_view_cli(tmp_path, repeat_view(["item", "item"]), [nested_items(40)])  # 2**41 elements

    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert f"repeat ['item', 'item'] reaches more than {MAX_REPEAT_ELEMENTS:,} elements" in stderr
    assert "view 'items', QuestionnaireResponse/q" in stderr


def test_a_repeat_over_deeply_nested_data_gives_every_level() -> None:
    view = compile_view(repeat_view(["item"]))

    rows = list(view.rows(nested_items(3000)))

    assert rows == [(str(level),) for level in range(3000)]


def test_the_fhirpath_repeat_function_is_bounded() -> None:
    flat = {"resourceType": "QuestionnaireResponse", "id": "q", "status": "completed"}
    flat["item"] = [{"linkId": str(n)} for n in range(MAX_REPEAT_ELEMENTS + 1)]
    view = compile_view(
        repeat_view(["item"]) | {"select": [{"column": [{"name": "n", "path": "repeat(item).count()"}]}]}
    )

    with pytest.raises(ViewEvaluationError, match=rf"repeat\(\) reaches more than {MAX_REPEAT_ELEMENTS:,} elements"):
        list(view.rows(flat))
    assert list(view.rows(nested_items(50))) == [(50,)]


@pytest.mark.parametrize(
    ("path", "function"),
    [
        (f"({' | '.join(map(str, range(40)))}).aggregate($total.combine($total), 'x')", "aggregate()"),
        ("id" + ".replace('x', 'xxxxxxxxxx')" * 12, "replace()"),
        ("id" + f".replaceMatches('x', '{'x' * 1000}')" * 3, "replaceMatches()"),
        ("id.repeat($this & $this)", "repeat()"),
        ("id" + ".select($this & $this)" * 40, "&"),
        ("id" + ".select($this + $this)" * 40, "+"),
        ("(id" + " | id & '1'" * 4 + ").repeat($this & 'x').join('')", "repeat()"),
    ],
)
def test_an_expression_of_bounded_size_builds_no_value_of_unbounded_size(path: str, function: str) -> None:
    """Doubling per element, or a thousand times per call: 16 GB from a line of a view, before the bound."""
    view = compile_view({"resource": "Patient", "select": [{"column": [{"name": "c", "path": path}]}]})
    refused = rf"{re.escape(function)} makes a value of more than {MAX_COMPUTED_SIZE:,} characters"
    with pytest.raises(ViewEvaluationError, match=refused):
        list(view.rows({"resourceType": "Patient", "id": "x"}))


def test_bounded_replace_and_aggregate_keep_fhirpaths_results() -> None:
    view = compile_view(
        {
            "resource": "Patient",
            "select": [
                {
                    "column": [
                        {"name": "r", "path": "id.replace('a', 'bc')"},
                        {"name": "e", "path": "id.replace('', '-')"},
                        {"name": "s", "path": "(1 | 2 | 3).aggregate($total + $this, 0)"},
                    ]
                }
            ],
        }
    )
    assert list(view.rows({"resourceType": "Patient", "id": "xay"})) == [("xbcy", "-x-a-y-", 6)]


@pytest.mark.slow
def test_view_run_over_two_sibling_foreach_of_100k_codings_streams_and_stops_at_the_row_limit(tmp_path) -> None:
    coding = [{"system": "http://loinc.org", "code": str(n)} for n in range(100_000)]
    observation = {"resourceType": "Observation", "id": "o-wide", "status": "final", "code": {"coding": coding}}
    view = {
        "resourceType": "ViewDefinition",
        "name": "pairs",
        "resource": "Observation",
        "select": [
            {"forEach": "code.coding", "column": [{"name": "a", "path": "code"}]},
            {"forEach": "code.coding", "column": [{"name": "b", "path": "code"}]},
        ],
    }
    command = view_cli(tmp_path, view, [observation], "--format", "csv")
    with (tmp_path / "rows.csv").open("wb") as rows, (tmp_path / "stderr.txt").open("wb") as errors:
        child = run_measured(command, timeout=300, cwd=REPO_ROOT, env=CHILD_ENV, stdout=rows, stderr=errors)

    stderr = (tmp_path / "stderr.txt").read_text()
    assert child.returncode == 1, stderr
    assert "view 'pairs', Observation/o-wide" in stderr and f"more than {MAX_ROWS_PER_RESOURCE:,} rows" in stderr
    assert sum(1 for _ in (tmp_path / "rows.csv").open("rb")) == 1 + MAX_ROWS_PER_RESOURCE
    assert child.peak_mb < 400, f"peak RSS {child.peak_mb:.0f} MB"


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("(" * 3000 + "id" + ")" * 3000, f"nested more than {MAX_EXPRESSION_DEPTH} levels deep"),
        ("(" * 150 + "id" + ")" * 150, f"nested more than {MAX_EXPRESSION_DEPTH} levels deep"),
        ("+".join(["1"] * 120), f"nested more than {MAX_EXPRESSION_DEPTH} levels deep"),
    ],
)
def test_a_deeply_nested_expression_is_refused_clearly_when_compiled(expression, fragment) -> None:
    with pytest.raises(ViewDefinitionError) as error:
        compile_view(patient_view(expression))

    assert fragment in str(error.value)
    assert len(str(error.value)) < 400


def test_a_stack_that_runs_out_while_evaluating_is_a_fhirpath_error_not_a_recursion_error() -> None:
    evaluate = compile_path("(" * 45 + "id" + ")" * 45)  # within MAX_EXPRESSION_DEPTH
    patient = {"resourceType": "Patient", "id": "p"}
    assert evaluate.collect(patient, "Patient", {})[0] == ["p"]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)  # a caller that is already deep in its stack
    try:
        with pytest.raises(FhirPathError, match="ran out of Python's stack"):
            evaluate.collect(patient, "Patient", {})
    finally:
        sys.setrecursionlimit(limit)


def test_deeply_nested_selects_are_refused_clearly() -> None:
    select: dict = {"column": [{"name": "id", "path": "id"}]}
    for _ in range(1500):
        select = {"select": [select]}

    with pytest.raises(ViewDefinitionError, match=f"selects are nested more than {MAX_SELECT_DEPTH} levels deep"):
        compile_view({"resource": "Patient", "select": [select]})


def test_a_deeply_nested_line_with_decimals_is_a_clear_line_error() -> None:
    line = ('{"a":' * 5000 + "1.5" + "}" * 5000).encode()

    with pytest.raises(ResourceLineError, match="batch.ndjson: line 7 is nested too deeply"):
        parse_line("batch.ndjson", 7, line)


# --- 17b. a flattening that routes nothing fails ------------------------------------------------------------------


def crtdl_with_other_group_ids(tmp_path: Path) -> Path:
    crtdl = json.loads((TORCH_RESULT / "example-crtdl-multi-procedure.json").read_text())
    for number, group in enumerate(crtdl["dataExtraction"]["attributeGroups"]):
        group["id"] = f"renamed-{number}"
    path = tmp_path / "crtdl.json"
    path.write_text(json.dumps(crtdl))
    return path


@pytest.mark.parametrize("engine", ["embedded", "service"])
def test_groups_that_match_no_provenance_fail_naming_expected_and_seen_ids(tmp_path, engine, request) -> None:
    crtdl = crtdl_with_other_group_ids(tmp_path)
    out = tmp_path / "out"

    with pytest.raises(FlatteningError) as error:
        if engine == "service":
            run_with_service(request.getfixturevalue("flattener_fake"), [TORCH_BATCH], out, crtdl)
        else:
            run_flattening([TORCH_BATCH], out, crtdl)

    message = str(error.value)
    assert "no input resource was routed to any attribute group" in message
    assert "renamed-0" in message and "renamed-3" in message
    assert "d20a1423-4188-4c3f-98c8-725b0f09746b" in message and "generated-86a1da51" in message
    assert "the CRTDL the extraction ran with" in message
    assert not list(out.glob("*.csv")) and not list(out.glob(".*"))


def test_resources_of_no_group_type_fail_naming_the_types(tmp_path) -> None:
    source = write_ndjson(tmp_path / "in" / "encounters.ndjson", [{"resourceType": "Encounter", "id": "e1"}])

    with pytest.raises(FlatteningError) as error:
        run_flattening([source], tmp_path / "out")

    message = str(error.value)
    assert "no input resource was routed to any attribute group" in message
    assert "Encounter 1" in message and "Condition" in message and "Patient" in message


def test_a_job_whose_groups_all_get_resources_still_completes(tmp_path) -> None:
    outcome = run_flattening([TORCH_BATCH], tmp_path / "out", TORCH_RESULT / "example-crtdl-multi-procedure.json")

    assert sum(group.resources for group in outcome.groups) == 7
    assert outcome.unrouted["Encounter"] == 2


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (b'{"id":' + b"[" * 5000 + b"]" * 5000 + b"}", "depth limit"),
        (b'{"id":"p1","v":NaN}', "unexpected character"),
        (b'{"id":"a\\ud800b"}', "surrogate"),
    ],
    ids=["deeply-nested", "NaN", "lone-surrogate"],
)
def test_a_service_row_that_no_csv_could_hold_is_an_error_naming_the_line(line, said):
    """``json`` raised RecursionError on the first, took NaN as a cell ``nan``, and the third failed the CSV's
    UTF-8 writing as a bare UnicodeEncodeError."""
    with pytest.raises(StepError, match=f"answer line 7 is not JSON .*{said}"):
        parse_row(line, 7)
    assert parse_row(b'{"id":"p1","v":1.50}', 1) == {"id": "p1", "v": Decimal("1.50")}


def flattened_alone(tmp_path: Path, line: bytes, columns: list[dict]) -> Path:
    """Flatten one ``line`` by a Patient view of ``columns``, as a step's file task does; the CSV part."""
    view = {"resource": "Patient", "select": [{"column": columns}]}
    source = tmp_path / "in.ndjson"
    source.write_bytes(line + b"\n")
    group = GroupPlan("g", "p.csv", "Patient", json.dumps(view))
    with engine_errors_as_step_errors():
        pieces = [Piece(source.name, WHOLE_FILE, 1, 1)]
        flatten_file(FilePlan(str(tmp_path), pieces, str(tmp_path / "parts"), "p1", (group,), (), False, 1 << 24))
    return tmp_path / "parts" / "p1" / "p.csv"


def test_an_object_cell_nested_deeper_than_json_can_be_written_is_an_error_naming_view_and_file(tmp_path):
    """orjson reads 1024 levels but writes 254: the cell raised a bare TypeError."""
    extension = {"url": "u", "valueString": "x"}
    for _ in range(300):
        extension = {"url": "u", "extension": [extension]}
    line = json.dumps({"resourceType": "Patient", "id": "p1", "extension": [extension]}).encode()
    columns = [{"name": "id", "path": "id"}, {"name": "ext", "path": "extension", "collection": True}]
    with pytest.raises(FlatteningError, match=f"p.csv: a cell from {tmp_path / 'in.ndjson'} cannot be written"):
        flattened_alone(tmp_path, line, columns)


@pytest.mark.parametrize("decimals", ["", ',"multipleBirthDecimal":1.5'], ids=["no-decimal", "a-decimal"])
@pytest.mark.parametrize(("value", "said"), [(b'"a\\ud800b"', "surrogate"), (b"NaN", ""), (b"-Infinity", "")])
def test_a_lone_surrogate_or_nan_is_refused_naming_the_line_whatever_else_the_line_holds(
    tmp_path, decimals, value, said
):
    """With a decimal in the line the decimal-keeping parser took them: the CSV failed with UnicodeEncodeError, or
    got a cell NaN."""
    line = b'{"resourceType":"Patient","id":"p1","gender":%s%s}' % (value, decimals.encode())
    columns = [{"name": "id", "path": "id"}, {"name": "g", "path": "gender"}]
    with pytest.raises(FlatteningError, match=f"in.ndjson: line 1 is not valid JSON .*{said}"):
        flattened_alone(tmp_path, line, columns)


def test_a_view_error_shows_the_resources_id_escaped_and_cut():
    """The id comes from the data: a newline in it forged a line of the message, a megabyte of it made one."""
    column = {"name": "c", "path": "id.replace('x', 'xx')"}
    view = compile_view({"resource": "Patient", "select": [{"column": [column]}]})
    forged = "p1\n12:00:00 INFO flattening finished OK\x1b[2J" + "x" * 1_000_000
    with pytest.raises(ViewEvaluationError) as refused:
        list(view.rows({"resourceType": "Patient", "id": forged}))
    message = str(refused.value)
    assert "Patient/'p1\\n12:00:00 INFO flattening finished OK\\x1b[2J" in message and len(message) < 1000
    assert message.isprintable()
