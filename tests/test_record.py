"""The job's one record (``tasks.job.record``): no update is lost to another thread or process, the one rule that
settles Prefect vs the file, gates with their notes, the job lock that tells its holder in this process, and a
``job.json`` that is no job record: one line naming the file, exit 2, for ``status`` and ``continue``; ``list``
and ``prune`` go on with the other jobs."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flows.gates import InspectionInput
from flows.job_card import STEP_TABLE_ROWS, inspection_lines, step_table_rows
from flows.job_state import finished_steps, job_lock
from tests.support.results import write_step_record
from flows.run import EXIT_OK, EXIT_USAGE, main
from tasks.core.readable import MAX_NOTE_BYTES
from tasks.job.contract import StepResult
from tasks.job.layout import JobPaths
from tasks.job.record import (
    RecordError,
    COMPLETED,
    MAX_RECORD_BYTES,
    FileEntry,
    JobRecord,
    changing_record,
    counts_text,
    read_facts,
    read_record,
    record_facts,
)
from tests.conftest import REPO_ROOT
from tests.support.jobs import put_flow_run

WRITERS, FACTS_EACH = 4, 25


def record_many(job_dir: str, writer: str) -> None:
    for number in range(FACTS_EACH):
        record_facts(Path(job_dir), **{f"{writer}-{number}": number})


@pytest.mark.slow
def test_facts_from_threads_and_processes_at_once_are_all_kept(tmp_path):
    threads = [threading.Thread(target=record_many, args=(str(tmp_path), f"thread{i}")) for i in range(WRITERS)]
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=record_many, args=(str(tmp_path), f"process{i}")) for i in range(WRITERS)]
    for worker in [*threads, *processes]:
        worker.start()
    for worker in [*threads, *processes]:
        worker.join(timeout=120)
    assert all(process.exitcode == 0 for process in processes)

    assert len(read_facts(tmp_path)) == 2 * WRITERS * FACTS_EACH
    assert read_record(tmp_path).job_id == tmp_path.name


def test_a_fact_set_to_none_is_removed_and_the_others_are_kept(tmp_path):
    record_facts(tmp_path, extraction_job_id="x", crtdl_path="/c.json")
    record_facts(tmp_path, extraction_job_id=None)
    assert read_facts(tmp_path) == {"crtdl_path": "/c.json"}


@pytest.mark.slow
def test_the_job_lock_is_taken_again_by_its_holder_and_refused_to_another_process(tmp_path):
    paths = JobPaths(tmp_path / "job")
    with job_lock(paths):
        with job_lock(paths):  # the same process (continue, then its flow): owns nothing, releases nothing
            pass
        take = (
            "from pathlib import Path; from flows.job_state import job_lock; from tasks.job.layout import JobPaths; "
            f"job_lock(JobPaths(Path({str(paths.job_dir)!r}))).__enter__()"
        )
        other = subprocess.run(
            [sys.executable, "-c", take],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        assert "JobLockedError" in other.stderr, other.stderr
    assert (paths.job_dir / ".lock").read_text() == "", "released by its first holder, emptied"
    with job_lock(paths):
        pass


def test_a_step_table_lists_its_first_thousand_files_then_sums_the_rest_in_one_row():
    files = [
        FileEntry(name=f"batch-{n:05d}.ndjson", size=10, resources=1, bundles=1, bundled=2)
        for n in range(STEP_TABLE_ROWS + 2500)
    ]
    rows = step_table_rows(files)
    assert len(rows) == STEP_TABLE_ROWS + 1 == 1001
    assert rows[0] == {"name": "batch-00000.ndjson", "size": 10, "contents": "1 Bundle holding 2 resources"}
    assert rows[-2]["name"] == "batch-00999.ndjson"
    assert rows[-1] == {"name": "… 2500 more files", "size": 25000, "contents": "2500 Bundles holding 5000 resources"}
    assert len(step_table_rows(files[:STEP_TABLE_ROWS])) == STEP_TABLE_ROWS


def test_counts_say_bundles_and_resources_apart():
    bundles = FileEntry(name="batch.ndjson.zst", size=1, resources=2, bundles=2, bundled=19)
    bare = FileEntry(name="core.ndjson", size=1, resources=12, bundles=0, bundled=0)
    mixed = FileEntry(name="mixed.ndjson", size=1, resources=5, bundles=2, bundled=19)
    csv = FileEntry(name="Patient.csv", size=1, resources=4)
    assert counts_text([bundles]) == "2 Bundles holding 19 resources"
    assert counts_text([bare]) == "12 resources"
    assert counts_text([mixed]) == "3 resources, 2 Bundles holding 19 resources"
    assert counts_text([bundles, bare, csv]) == "12 resources, 2 Bundles holding 19 resources, 4 rows"
    assert counts_text([]) == "0 resources"
    one = [
        FileEntry(name="a.ndjson", size=1, resources=2, bundles=1, bundled=1),
        FileEntry(name="a.csv", size=1, resources=1),
    ]
    assert counts_text(one) == "1 resource, 1 Bundle holding 1 resource, 1 row"


# --- a job.json that is no job record ---------------------------------------------------------------------------

JOB_ID = "00000000-0000-0000-0000-000000000001"
GOOD_ID = "00000000-0000-0000-0000-000000000002"
VALID = {"job_id": JOB_ID, "enabled_steps": ["local_import"], "created_at": "2026-01-01T00:00:00+00:00"}


HOSTILE = {
    "truncated": (json.dumps(VALID)[:25].encode(), "is not valid JSON"),
    "empty": (b"", "is not valid JSON"),
    "binary": (bytes(range(128, 256)) * 8, "is not UTF-8 text"),
    "NUL bytes": (b"\0" * 64, "is not valid JSON"),
    "a list": (b"[]", "is no job record (expected a JSON object)"),
    "an empty object": (b"{}", "is no job record (job_id: Field required"),
    "deeply nested": (b'{"facts": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "is nested too deeply"),
    "wrong types": (json.dumps({**VALID, "facts": 3}).encode(), "facts: Input should be a valid dictionary"),
    "a wrong time": (json.dumps({**VALID, "created_at": "yesterday"}).encode(), "created_at: Value error"),
    "a key with a line break": (json.dumps({**VALID, "overrides": {"x\n1": 3}}).encode(), "overrides.x\\n1: Input"),
    "a newer version": (
        json.dumps({**VALID, "version": 99}).encode(),
        "has version 99; this dupflow reads version 3 only",
    ),
    "300 MB": (None, f"is larger than {MAX_RECORD_BYTES // 2**20} MB"),
}


def write_hostile(jobs_dir: Path, job_id: str, content: bytes | None) -> Path:
    job_file = jobs_dir / job_id / "job.json"
    job_file.parent.mkdir(parents=True)
    if content is None:
        with open(job_file, "wb") as file:
            file.truncate(300 * 2**20)  # sparse: 300 MB that take no disk
    else:
        job_file.write_bytes(content)
    return job_file


@pytest.mark.parametrize("command", ["status", "continue"])
@pytest.mark.parametrize("content,problem", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_job_json_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, command, content, problem):
    job_file = write_hostile(tmp_path / "jobs", JOB_ID, content)
    assert main([command, JOB_ID, "--jobs-dir", str(tmp_path / "jobs")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: the job record {job_file} ") and problem in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("content,problem", HOSTILE.values(), ids=HOSTILE.keys())
def test_list_shows_a_hostile_job_as_unreadable_and_prune_skips_it(
    tmp_path, capsys, empty_prefect_api, content, problem
):
    jobs_dir = tmp_path / "jobs"
    write_hostile(jobs_dir, JOB_ID, content)
    with changing_record(jobs_dir / GOOD_ID, new=JobRecord(job_id=GOOD_ID, job_input="/data")):
        pass
    put_flow_run(empty_prefect_api, jobs_dir / GOOD_ID, "COMPLETED", "Completed")
    assert main(["list", "--jobs-dir", str(jobs_dir)]) == EXIT_OK
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].startswith(f"{GOOD_ID}  Completed") and listed[1].endswith("/data"), listed
    assert listed[2].startswith(f"{JOB_ID}  unreadable") and problem in listed[2], listed
    assert main(["prune", "--jobs-dir", str(jobs_dir)]) == EXIT_OK
    pruned = capsys.readouterr().out
    assert f"kept {JOB_ID}: its job.json cannot be read (look at it yourself): the job record" in pruned, pruned
    assert problem in pruned and f"{GOOD_ID}  Completed" in pruned, pruned


@pytest.mark.parametrize("version", [None, 2], ids=["version 1", "version 2"])
def test_a_record_of_an_earlier_version_is_refused_in_one_line_naming_what_to_do(tmp_path, version):
    """Versions 1 and 2 were never released: they also held the job's state, flow runs, steps and gates (now
    Prefect's); their readers went, and such a record is one line naming the version and the fix."""
    older = {**VALID, "state": COMPLETED, "steps": {"00": {"step": "local_import"}}}
    (tmp_path / "job.json").write_text(json.dumps(older | ({"version": version} if version else {})))

    with pytest.raises(RecordError) as refused:
        read_record(tmp_path)

    assert str(refused.value) == (
        f"the job record {tmp_path / 'job.json'} has version {version or 1}; this dupflow reads version 3 only: "
        "finish the job with the dupflow that made it, or start it anew"
    )


HOSTILE_NOTES = {  # as typed -> as kept and shown
    "escape-sequences": ("ok\x1b[2J\x1b]0;owned\x07 done", "ok [2J ]0;owned done"),
    "carriage-return": ("rejected\rapproved", "rejected approved"),
    "bidi-override": ("checked \u202egnp.exe", "checked gnp.exe"),
    "zero-width-and-separators": ("a\u200bb\u2028c\u2029d", "a b c d"),
    "html-and-link": ("<script>alert(1)</script> [go](javascript:x)", "<script>alert(1)</script> [go](javascript:x)"),
    "120-KB": ("x" * 120_000, "x" * (MAX_NOTE_BYTES - 30) + " … (cut at 4 KB of 117.2 KB)"),
}


@pytest.mark.parametrize(("note", "kept"), HOSTILE_NOTES.values(), ids=HOSTILE_NOTES.keys())
def test_a_note_is_kept_without_control_or_bidi_characters_and_at_most_4_KB(note, kept):
    """The form's answer as the flow takes it (the server keeps whatever an API client sent)."""
    assert InspectionInput.model_validate({"confirmed": True, "note": note}).note == kept


def test_the_job_record_card_shows_a_note_as_text_never_as_html_or_a_link():
    note = InspectionInput.model_validate({"confirmed": True, "note": HOSTILE_NOTES["html-and-link"][0]}).note
    released = StepResult(step="wait", position=1, folder="import", summary={"inspection note": note})

    (line,) = inspection_lines([released])

    assert "<script>" not in line and "&lt;script&gt;alert\\(1\\)&lt;/script&gt;" in line
    assert "](" not in line and "javascript:" not in line and "\\[go\\]\\(javascript\\:x\\)" in line


# --- the steps as status reads them: the run's task runs, each step's result record in the job folder -------------


def result_record(job_dir: Path, name: str, step: str, position: int) -> str:
    """A step's result record as Prefect writes it (JSON serializer), in the job's results folder; its path."""
    data = {"step": step, "position": position, "folder": step, "files": []}
    return write_step_record(job_dir / ".prefect" / "results" / name, data)


def task_run(run_id: str, name: str, attempt: int, storage_key: str, state: str = "Completed") -> dict:
    data = {"storage_key": storage_key}
    return {
        "flow_run_id": run_id,
        "name": name,
        "flow_run_run_count": attempt,
        "state": {"type": "COMPLETED", "name": state, "data": data},
    }


def test_only_the_runs_latest_attempt_and_each_steps_own_record_count_as_finished(tmp_path, empty_prefect_api):
    """A step finished in an earlier attempt may be redone (its input changed at a gate): until this attempt
    finishes it, it is not finished. The server names each record; one that is not this job's, this step's, in its
    results folder, or that says it is another step's, is none (a damaged or foreign server cannot point status at
    any file)."""
    job_dir = tmp_path / JOB_ID
    steps = ["local_import", "pseudonymizer", "wait", "flattening", "send"]
    run = {"id": "run-1", "run_count": 2}
    own = result_record(job_dir, f"{JOB_ID}-00-local_import-local-import-{'a' * 20}", "local_import", 0)
    earlier = result_record(job_dir, f"{JOB_ID}-01-pseudonymizer-pseudonymizer-{'b' * 20}", "pseudonymizer", 1)
    gate = result_record(job_dir, f"{JOB_ID}-02-wait-wait-released", "wait", 2)
    other_step = result_record(job_dir, f"{JOB_ID}-03-flattening-flattening-{'c' * 20}", "send", 4)
    (tmp_path / "passwd").write_text("root:x:0:0")
    empty_prefect_api.state.task_runs += [
        task_run("run-1", "local_import[1]", 2, own, state="Cached"),
        task_run("run-1", "pseudonymizer[2]", 1, earlier),
        task_run("run-1", "wait[3]", 2, gate),
        task_run("run-1", "flattening[4]", 2, other_step),
        task_run("run-1", "send[5]", 2, str(tmp_path / "passwd")),
        task_run("run-2", "send[5]", 2, own),
    ]

    done = finished_steps(JobPaths(job_dir), steps, run)

    assert sorted(done) == [0, 2, 3] and done[0].cached and not done[2].cached
    assert done[3] == f"the result record {Path(other_step).name} holds the result of step 5 (send)"
