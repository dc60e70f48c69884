"""Issue 22, hardening round two: names that come from data, hostile lookup and CRTDL files, and clear errors
where a traceback used to be.

Every file here is a real file in tmp_path (or a real device), every command a real ``python -m flows.run`` in its
own process where the exit code and the one-line error are what the user sees.
"""

from __future__ import annotations

import copy
import json
import re
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from flows.jobs import prepare_job
from tasks.clients.downloads import DownloadError, safe_file_name
from tasks.core.errors import DupflowError
from tasks.flattening import plan_views
from tasks.core.names import name_from_data_problem
from tasks.streams.ndjson import UnsafeNameError, output_name
from tasks.sof.crtdl_views import generated_group_id
from tasks.sof.lookup import lookup_problems
from tests.flattening_runs import flatten_files
from tests.conftest import REPO_ROOT, TESTDATA, run_cli_here, wait_until
from tests.fakes.extraction_content import ContentPlan, patient_bundle
from tests.fakes.extraction_crtdl import parse_crtdl as fake_server_parse_crtdl
from tests.fakes.extraction_state import Job
from tests.peak_rss import run_measured
from tests.support.filesystem import fill, small_tmpfs
from tests.support.jobs import sigint_as_in_a_terminal

EXAMPLE = TESTDATA / "flattening" / "example"
EXAMPLE_CRTDL = EXAMPLE / "example-crtdl.json"
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"
MB = 1024 * 1024


def flattening_example(tmp_path: Path, lookup: Path | str = LOOKUP) -> dict[str, Any]:
    """The configuration tree of local_import of the flattening example's data (copied to tmp_path/data), then
    flattening with ``lookup``."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "fhir-data.ndjson").write_bytes((EXAMPLE / "input" / "fhir-data.ndjson").read_bytes())
    return {
        "pipeline": {"enabled_steps": ["local_import", "flattening"]},
        "services": {"local_import": {"dir": data}, "flattening": {"lookup_path": lookup}},
    }


def example_crtdl() -> dict[str, Any]:
    return json.loads(EXAMPLE_CRTDL.read_text())


def crtdl_named(tmp_path: Path, *names: str) -> Path:
    """The example CRTDL with one Condition group per name (ids kept unique)."""
    crtdl = example_crtdl()
    groups = crtdl["dataExtraction"]["attributeGroups"]
    template = next(g for g in groups if g["name"] == "Diagnosis")
    groups.remove(template)
    for index, name in enumerate(names):
        groups.append({**copy.deepcopy(template), "id": f"diagnosis-{index}", "name": name})
    path = tmp_path / "crtdl.json"
    path.write_text(json.dumps(crtdl), encoding="utf-8")
    return path


def assert_one_clear_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The command failed with ``code`` and said so in one line, without a traceback; returns that line."""
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


def config_check_problem(config: Path) -> str:
    """``config check`` refused ``config`` with exit 2 and one problem, without a traceback; returns the problem."""
    result = run_cli_here("config", "check", str(config))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    heading, problem = result.stderr.strip().splitlines()
    assert heading == "error: invalid configuration (1 problem):"
    return problem


def refused_start(config: Path, crtdl: Path | str, **overrides: str) -> str:
    """``start``'s preparation refused the job (the command prints it as one line and exits 2); returns it."""
    with pytest.raises(DupflowError) as error:
        prepare_job(None, str(config), str(crtdl), overrides, overrides_source="--set")
    message = str(error.value)
    assert "\n" not in message and "\r" not in message
    return message


def jobs_in(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.is_dir() else []


# --- item 6: one rule for a name from data --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("x\ny.csv", "control character U+000A"),
        ("x\ry.csv", "control character U+000D"),
        ("x\ty.csv", "control character U+0009"),
        ("evil\u202egpj.csv", "bidirectional text control character U+202E"),
        ("a\u2066b.csv", "bidirectional text control character U+2066"),
        ("zero\u200bwidth.csv", "invisible format character U+200B"),
        ("line\u2028sep.csv", "U+2028"),
        ("a/b.csv", "contains /"),
        ('a\\b:c*d?e"f<g>h|i.csv', 'contains " * : < > ? \\ |'),
        ("..", "contains .."),
        ("a..b.csv", "contains .."),
        (".hidden.csv", "starts with a dot"),
        ("", "is empty"),
        ("é" * 121, "too long: 242 bytes"),
    ],
)
def test_the_one_rule_for_a_name_from_data_says_what_is_wrong(name, fragment):
    assert fragment in (name_from_data_problem(name) or "")


@pytest.mark.parametrize("name", ["Diagnosis.csv", "MII PR Person Patient (Pseudonymisiert).csv", "é" * 120, "a.b-c_d"])
def test_the_one_rule_accepts_ordinary_names(name):
    assert name_from_data_problem(name) is None


def test_start_refuses_group_names_with_control_and_bidi_characters_before_any_job_exists(tmp_path, write_config):
    config = write_config(flattening_example(tmp_path))
    crtdl = crtdl_named(tmp_path, "x\ny", "a\rb", "t\tab", "evil\u202egpj.csv")

    line = refused_start(config, crtdl)

    assert all(code in line for code in ("U+000A", "U+000D", "U+0009", "U+202E"))
    assert str(crtdl) in line and "rename the group in the CRTDL" in line
    assert "\u202e" not in line and "\t" not in line
    assert jobs_in(tmp_path / "jobs") == []


def test_start_accepts_group_names_whose_files_would_collide_and_names_the_files_by_group_id(tmp_path, write_config):
    """Issue 33 item 9: a valid CRTDL is never refused; TORCH's own has two groups named PractitionerRole."""
    config = write_config(flattening_example(tmp_path))
    torch_crtdl = REPO_ROOT / "tests" / "data" / "torch" / "crtdl-orga-with-practitioner-filter.json"
    prepare_job(None, str(config), str(torch_crtdl), {}, overrides_source="--set")
    crtdl = crtdl_named(tmp_path, "Obs a/b", "Obs a:b")

    prepared = prepare_job(None, str(config), str(crtdl), {}, overrides_source="--set")

    views, _ = plan_views(prepared.paths.job_dir / "crtdl.json", LOOKUP)
    assert [v.group.csv_name for v in views][-2:] == ["Obs a_b-diagnosis-0.csv", "Obs a_b-diagnosis-1.csv"]


@pytest.mark.parametrize("name", ["zero\u200bwidth.ndjson", "para\u2029graph.ndjson", "a:b.ndjson", "a..ndjson"])
def test_an_import_file_name_that_breaks_the_rule_is_refused(name):
    with pytest.raises(UnsafeNameError, match=f"the file name {re.escape(ascii(name))} .*; rename it"):
        output_name(name, compress=False)


@pytest.mark.parametrize("segment", ["zero%E2%80%8Bwidth.ndjson", "a%3Ab.ndjson", "bidi%E2%81%A6x.ndjson"])
def test_a_result_file_name_that_breaks_the_rule_is_refused_before_download(segment):
    with pytest.raises(DownloadError, match="cannot use .* as a file name in import/: it contains"):
        safe_file_name(f"http://files.example/result/{segment}", compress=True)


# --- item 17a: attribute groups without an id -----------------------------------------------------------------


def test_groups_without_an_id_get_one_in_the_jobs_crtdl_that_extraction_and_flattening_share(tmp_path, write_config):
    """TORCH requires a group id and names the group by it in its Provenance: the job's CRTDL (the one submitted
    and the one flattening plans from) carries a generated id for each group written without one."""
    crtdl = example_crtdl()
    for group in crtdl["dataExtraction"]["attributeGroups"]:
        del group["id"]
    given = tmp_path / "given-crtdl.json"
    given.write_text(json.dumps(crtdl))
    config = write_config(flattening_example(tmp_path))
    prepared = prepare_job(None, str(config), str(given), {}, overrides_source="--set")
    crtdl_path = prepared.paths.job_dir / "crtdl.json"
    job_groups = json.loads(crtdl_path.read_text())["dataExtraction"]["attributeGroups"]
    assert [g["id"] for g in job_groups] == [generated_group_id(g) for g in crtdl["dataExtraction"]["attributeGroups"]]
    served = fake_server_parse_crtdl(crtdl_path.read_bytes())
    assert [g.id for g in served.groups] == [g["id"] for g in job_groups]
    job = Job(
        id=str(uuid.uuid4()),
        seq=1,
        crtdl=served,
        patient_ids=("p1", "p2"),
        batch_ids=("b1",),
        batch_size=2,
        plan=ContentPlan(resources_per_patient=4, core_resources_per_group=0, default_core_types=()),
        submitted_at=0.0,
    )
    batch = tmp_path / "batch.ndjson"
    batch.write_text(
        "".join(json.dumps(patient_bundle(job, p, "2026-01-01T00:00:00Z")) + "\n" for p in job.patient_ids)
    )

    views, skipped = plan_views(crtdl_path, LOOKUP)
    outcome = flatten_files([batch], tmp_path / "out", views, skipped, max_line_bytes=10 * MB)

    assert not skipped and not outcome.unknown_groups and not outcome.unrouted
    assert {g.group.id for g in outcome.groups} == {g.id for g in served.groups}
    assert {g.group.name: g.resources for g in outcome.groups} == {
        "MII PR Person Patient (Pseudonymisiert)": 2,
        "Diagnosis": 4,
        "Procedure": 4,
    }
    assert sorted(p.name for p in (tmp_path / "out").glob("*.csv")) == [
        "Diagnosis.csv",
        "MII PR Person Patient (Pseudonymisiert).csv",
        "Procedure.csv",
    ]


# --- item 11: clear errors instead of tracebacks ----------------------------------------------------------------


def children_chain(length: int) -> list[dict[str, Any]]:
    elements = {
        f"Observation.e{i}": {
            "viewDefinition": {"column": [{"name": f"c{i}", "path": "id"}]},
            "children": [f"Observation.e{i + 1}"],
        }
        for i in range(length)
    }
    elements[f"Observation.e{length}"] = {"viewDefinition": {"column": [{"name": "last", "path": "id"}]}}
    return [{"url": "https://example.org/chain", "resourceType": "Observation", "elements": elements}]


def hostile_lookup(tmp_path: Path, kind: str) -> Path:
    if kind == "dev-zero":
        return Path("/dev/zero")
    path = tmp_path / f"{kind}.json"
    if kind == "children-chain":
        path.write_text(json.dumps(children_chain(3000)))
    else:
        path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("children-chain", "its children nest more than 64 levels deep"),
        ("deep-document", "is nested too deeply (more than 128 levels)"),
        ("dev-zero", "is larger than 16 MB"),
    ],
)
def test_a_hostile_lookup_file_is_one_clear_line_from_config_check(tmp_path, write_config, kind, fragment):
    lookup = hostile_lookup(tmp_path, kind)
    config = write_config(flattening_example(tmp_path, lookup))

    line = config_check_problem(config)

    assert line.startswith("  - services.flattening.lookup_path: ") and fragment in line
    assert line.endswith("; fix the lookup file") and (kind == "children-chain" or str(lookup) in line)


@pytest.mark.slow
def test_config_check_of_a_lookup_path_of_dev_zero_stays_small(tmp_path, write_config):
    """The read is bounded: the command's peak memory stays far below what reading /dev/zero to the end would take
    (2.7 GB before the fix)."""
    config = write_config(flattening_example(tmp_path, "/dev/zero"))
    command = [sys.executable, "-m", "flows.run", "config", "check", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = run_measured(
        command, timeout=120, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert child.returncode == 2 and child.peak_mb < 400, child


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "tree"),
    [
        (
            "services.pseudonymizer.anonymization_config",
            {"services": {"pseudonymizer": {"url": "http://127.0.0.1:9", "anonymization_config": "/dev/zero"}}},
        ),
        (
            "tls.ca_cert_path",
            {"tls": {"ca_cert_path": "/dev/zero"}, "services": {"pseudonymizer": {"url": "http://127.0.0.1:9"}}},
        ),
    ],
)
def test_a_settings_file_that_is_a_device_is_refused_by_config_check(write_config, key, tree):
    pipeline = {"enabled_steps": ["local_import", "pseudonymizer"]}
    config = write_config({"pipeline": pipeline, **tree}, jobs_dir=None)

    assert config_check_problem(config) == f"  - {key}: /dev/zero is no regular file; give the path of a file"


def test_a_children_chain_is_reported_once_without_recursion(tmp_path):
    path = tmp_path / "lookup.json"
    path.write_text(json.dumps(children_chain(3000)))
    (problem,) = lookup_problems(path)
    assert problem.startswith("table https://example.org/chain element Observation.e0: its children nest")


@pytest.mark.parametrize("length", [65, 600])
def test_a_children_chain_listed_leaf_first_is_reported_too(tmp_path, length):
    """The walk measured depth only going down from unfinished elements: listed leaf first, every element was
    finished at depth 1, the check passed, and the step died of RecursionError."""
    (table,) = children_chain(length)
    table["elements"] = dict(reversed(table["elements"].items()))
    path = tmp_path / "lookup.json"
    path.write_text(json.dumps([table]))
    (problem,) = lookup_problems(path)
    assert "its children nest more than 64 levels deep" in problem
    (tmp_path / "ok.json").write_text(
        json.dumps([{**table, "elements": dict(reversed(children_chain(63)[0]["elements"].items()))}])
    )
    assert lookup_problems(tmp_path / "ok.json") == []


def test_a_100000_deep_crtdl_is_refused_at_start_without_a_traceback(tmp_path, write_config):
    config = write_config(flattening_example(tmp_path))
    crtdl = tmp_path / "deep.json"
    crtdl.write_bytes(b"[" * 100_000 + b"]" * 100_000)

    line = refused_start(config, crtdl)

    assert (
        line
        == f"invalid CRTDL {crtdl} is nested too deeply (more than 128 levels); fix the file; nothing was submitted"
    )
    assert jobs_in(tmp_path / "jobs") == []


def test_an_oversized_crtdl_is_refused_at_start_without_reading_all_of_it(tmp_path, write_config):
    config = write_config(flattening_example(tmp_path))
    crtdl = tmp_path / "huge.json"
    with open(crtdl, "wb") as out:
        out.truncate(17 * MB)  # sparse: 17 MB of NUL bytes

    line = refused_start(config, crtdl)

    assert (
        line == f"CRTDL {crtdl} is larger than 16 MB, more than such a file ever needs; check the path; give the "
        "CRTDL JSON file as the job input"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("services.flattening.lookup_path", "/tmp/look\0up.json", "U+0000"),
        ("services.local_import.dir", "/tmp/da\nta", "U+000A"),
        ("jobs_dir", "/tmp/jo\0bs", "U+0000"),
        ("tls.ca_cert_path", "/tmp/ca\x1b.pem", "U+001B"),
        ("services.pseudonymizer.anonymization_config", "/tmp/an\0on.yaml", "U+0000"),
    ],
)
def test_a_control_character_in_a_path_key_is_refused_by_config_check_naming_the_key(write_config, key, value, code):
    *parents, leaf = key.split(".")
    block = {leaf: value}
    for parent in reversed(parents):
        block = {parent: block}
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}, **block}, jobs_dir=None)

    problem = config_check_problem(config)

    assert (
        problem
        == f"  - {key}: contains the control character {code}, which no path should have; remove it from the path"
    )


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled to the last byte; skipped where mounting is not allowed."""
    with small_tmpfs(tmp_path / "small") as mount_point:
        (mount_point / "jobs").mkdir()
        fill(mount_point)
        yield mount_point


@pytest.mark.slow
def test_a_full_disk_at_job_creation_says_no_space_left_and_leaves_nothing(tmp_path, write_config, full_disk):
    config = write_config(flattening_example(tmp_path))
    jobs = full_disk / "jobs"

    line = refused_start(config, EXAMPLE_CRTDL, jobs_dir=str(jobs))

    assert line.startswith(f"no space left on {jobs}") and "free space there" in line
    assert not any(path.name.endswith(".part") for path in full_disk.rglob("*"))
    assert jobs_in(jobs) == []


@pytest.mark.slow
def test_view_run_with_5000_nested_selects_exits_2_with_one_clear_line(tmp_path):
    select = '{"select": [' * 5000 + '{"column": [{"name": "id", "path": "id"}]}' + "]}" * 5000
    view = tmp_path / "view.json"
    view.write_text(f'{{"resourceType": "ViewDefinition", "resource": "Patient", "select": [{select}]}}')

    line = assert_one_clear_line(run_cli_here("view", "run", str(view), str(EXAMPLE / "input" / "fhir-data.ndjson")))

    assert line == f"view run: {view} is nested too deeply (more than 128 levels); fix the file"


def interrupt(process: subprocess.Popen) -> bytes:
    """Ctrl+C, pressed again while the command has not stopped 10 s later (a signal that lands just before a
    blocking read is seen only when the read returns); the command's stderr."""
    for _ in range(6):
        process.send_signal(signal.SIGINT)
        try:
            return process.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            continue
    process.kill()
    raise AssertionError("view run did not stop on Ctrl+C")


@pytest.mark.slow
def test_ctrl_c_of_view_run_exits_130_with_one_line_after_the_last_complete_row(tmp_path):
    view = tmp_path / "view.json"
    view.write_text(json.dumps({"resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}]}]}))
    resources = tmp_path / "patients.ndjson"
    os.mkfifo(resources)  # the input never ends while the test holds it open: the run is surely interrupted mid-way
    rows = tmp_path / "rows.ndjson"
    sent = 40_000
    with open(rows, "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.run", "view", "run", str(view), str(resources)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
            stdout=stdout,
            stderr=subprocess.PIPE,
            preexec_fn=sigint_as_in_a_terminal,
        )
        with open(resources, "w") as feed:  # opens once the command opens its end
            feed.write("".join(f'{{"resourceType":"Patient","id":"p{i}"}}\n' for i in range(sent)))
            feed.flush()
            wait_until(lambda: rows.stat().st_size >= 10_000 or process.poll() is not None, "rows were written")
            assert process.poll() is None, process.communicate(timeout=60)[1].decode()
            stderr = interrupt(process)

    assert process.returncode == 130, stderr.decode()
    assert stderr.decode().strip().splitlines() == ["view run interrupted (Ctrl+C); the rows above are complete"]
    written = rows.read_bytes()
    assert written.endswith(b"\n")
    lines = written.splitlines()
    assert 0 < len(lines) <= sent
    assert [json.loads(line)["id"] for line in lines] == [f"p{i}" for i in range(len(lines))]
