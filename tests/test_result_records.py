"""A job's result records are data: one that names another serializer, foreign code or another job is never
decoded, and Prefect takes it as missing; a record is written whole or not at all. Through Prefect's own result
store over ``JobResultStorage``, as a task's cache lookup reads it."""

from __future__ import annotations

import base64
import json
import pickle
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from prefect.results import ResultStore
from prefect.serializers import JSONSerializer

from flows.run import EXIT_FAILED, EXIT_OK, main
from tasks.job.contract import DataFile, StepResult
from tasks.job.record import RecordError
from tasks.job.result_records import read_result_record
from tasks.job.result_storage import JobResultStorage
from tasks.streams.files import JobWriteError
from tasks.streams.spans import Piece
from tests.conftest import run_cli, run_cli_here
from tests.support.filesystem import fill, small_tmpfs
from tests.support.jobs import job_file, source_dir, step_results
from tests.support.results import write_step_record

JOB_ID = "4c7cbb2f-4a4e-4a8f-9d1e-5e0a4b1c2d3e"
OTHER_JOB = "9f0e1d2c-3b4a-4c5d-8e6f-7a8b9c0d1e2f"


class OpensAFile:
    """A pickled payload that, decoded, creates ``path``: proof that decoding ran code."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def results_of(root: Path, job_id: str = JOB_ID) -> Path:
    return root / "jobs" / job_id / ".prefect" / "results"


def record_name(job_id: str = JOB_ID) -> str:
    return f"{job_id}-00-local_import-local-import-{'a' * 20}"


def pickle_record(path: Path, marker: Path) -> None:
    """A record rewritten as in the finding: Prefect's pickle serializer, a payload that runs on decoding."""
    serializer = {"type": "pickle", "picklelib": "pickle", "picklelib_version": None}
    payload = base64.encodebytes(pickle.dumps(OpensAFile(marker))).decode()
    metadata = {"storage_key": str(path), "serializer": serializer, "expiration": None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": metadata, "result": payload}))


def store_over(results: Path) -> ResultStore:
    return ResultStore(result_storage=JobResultStorage(basepath=str(results)), serializer=JSONSerializer())


def step_data(files: int) -> dict[str, Any]:
    listed = [{"name": f"f{n}.ndjson", "size": 10, "resources": 1} for n in range(files)]
    return {"step": "local_import", "position": 0, "folder": "import", "files": listed}


def test_the_pickle_payload_of_the_finding_runs_code_when_prefect_decodes_it(tmp_path):
    """The payload is live: Prefect's own decoder, given the file, runs it (what the lookup did before)."""
    from prefect.results import ResultRecord

    record, marker = results_of(tmp_path) / record_name(), tmp_path / "ran"
    pickle_record(record, marker)
    ResultRecord.deserialize(record.read_bytes())
    assert marker.exists()


def test_a_record_rewritten_to_name_pickle_is_set_aside_undecoded_and_is_no_cached_result(tmp_path, caplog):
    results, marker = results_of(tmp_path), tmp_path / "ran"
    record = results / record_name()
    pickle_record(record, marker)

    assert not store_over(results).exists(str(record))

    assert not marker.exists()
    assert not record.exists()
    assert (results / f"rejected-{record.name}").is_file()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "dupflow.results"]
    assert line == (
        f"the result record {record.name} names the serializer 'pickle', not the JSON one dupflow writes: "
        f"kept as rejected-{record.name}; its work is done again"
    )


@pytest.mark.parametrize(
    "named",
    [
        pytest.param({"__class__": "planted_module.Anything", "data": {}}, id="a module on the path"),
        pytest.param({"__class__": "subprocess.Popen", "data": ["true"]}, id="a class of the library"),
        pytest.param({"__exc_type__": "planted_module.Boom", "message": "x"}, id="an exception type"),
        pytest.param({"__class__": "tasks.job.contract.settings_of", "data": {}}, id="a function of ours"),
        pytest.param({"__class__": f"{Piece.__module__}.Piece", "data": {}}, id="a dataclass of ours, no file"),
    ],
)
def test_a_json_record_naming_foreign_code_is_refused_before_anything_is_imported(tmp_path, monkeypatch, named):
    """Prefect's JSON decoder imports the module a ``__class__`` names: a module planted beside the jobs
    (``./jobs`` is on the path of ``python -m flows.run``) would run."""
    planted, marker = tmp_path / "planted_module.py", tmp_path / "ran"
    planted.write_text(f"open({str(marker)!r}, 'w')\nclass Anything:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    record = results_of(tmp_path) / record_name()
    write_step_record(record, step_data(1))
    document = json.loads(record.read_text())
    document["result"] = json.dumps({"files": [named]})
    record.write_text(json.dumps(document))

    with pytest.raises(RecordError, match=f"the result record {record.name} names '.*', no result type"):
        JobResultStorage(basepath=str(record.parent)).read_path(str(record))

    assert not marker.exists() and "planted_module" not in sys.modules


def test_a_record_copied_from_another_job_is_refused_and_its_job_named(tmp_path):
    """The finding: another job's record under this job's name made ``status`` show that job's 8 files."""
    theirs = results_of(tmp_path, OTHER_JOB) / record_name(OTHER_JOB)
    write_step_record(theirs, step_data(8))
    ours = results_of(tmp_path) / record_name()
    ours.parent.mkdir(parents=True)
    ours.write_bytes(theirs.read_bytes())

    with pytest.raises(RecordError) as refused:
        read_result_record(ours)

    assert str(refused.value) == (f"the result record {ours.name} was written as '{theirs.name}' of job '{OTHER_JOB}'")
    assert not store_over(ours.parent).exists(str(ours))


@pytest.mark.parametrize("content", [b"", b'{"metadata": {}', b"[]"], ids=["empty", "cut", "no record"])
def test_an_empty_or_cut_record_is_no_result(tmp_path, content):
    record = results_of(tmp_path) / record_name()
    record.parent.mkdir(parents=True)
    record.write_bytes(content)

    assert not store_over(record.parent).exists(str(record))
    assert (record.parent / f"rejected-{record.name}").read_bytes() == content


def test_a_record_as_dupflow_writes_it_is_read_back_whole(tmp_path):
    results = results_of(tmp_path)
    store = store_over(results)
    files = [DataFile(name="a", size=1, resources=1)]
    result = StepResult(step="local_import", position=0, folder="import", files=files)
    key = str(results / record_name())
    store.persist_result_record(store.create_result_record(result, key=key))

    assert store.exists(key)
    assert store.read(key).result == result
    assert read_result_record(Path(key))[1]["metadata"]["storage_key"] == key


def test_a_step_record_holds_its_files_as_columns_and_one_written_as_a_list_is_read_too(tmp_path):
    results = results_of(tmp_path)
    store = store_over(results)
    files = [DataFile(name="a", size=1, resources=1, modified_ns=7), DataFile(name="b", size=2, resources=3)]
    result = StepResult(step="local_import", position=0, folder="import", files=files)
    key = str(results / record_name())
    store.persist_result_record(store.create_result_record(result, key=key))
    document = read_result_record(Path(key))[1]
    written = json.loads(document["result"])["data"]

    assert written["files"] == {
        "name": ["a", "b"],
        "size": [1, 2],
        "resources": [1, 3],
        "bundles": [0, 0],
        "bundled": [0, 0],
        "modified_ns": [7, None],
    }
    assert store.read(key).result == result
    written["files"] = [asdict(each) for each in files]  # as dupflow wrote it before
    document["result"] = json.dumps({"__class__": "tasks.job.contract.StepResult", "data": written})
    Path(key).write_text(json.dumps(document))
    assert store_over(results).read(key).result == result


@pytest.mark.slow  # mounts a file system
def test_a_record_that_cannot_be_written_whole_leaves_the_old_one_and_names_the_full_disk(tmp_path):
    """``LocalFileSystem`` wrote in place: a full disk left 0-byte records."""
    with small_tmpfs(results_of(tmp_path), "16k") as results:
        store = store_over(results)
        key = str(results / record_name())
        store.persist_result_record(store.create_result_record({"first": 1}, key=key))
        fill(results)

        with pytest.raises(JobWriteError, match=f"^no space left on {results}: cannot write {record_name()};"):
            store.persist_result_record(store.create_result_record({"second": "x" * 4096}, key=key))

        assert store_over(results).read(key).result == {"first": 1}
        assert sorted(path.name for path in results.iterdir()) == sorted([record_name(), "filler"])


SAMPLE = Path(__file__).resolve().parent.parent / "config" / "sample-data"


def waiting_job(tmp_path: Path, write_config: Any, files: dict[str, int], name: str = "in") -> Path:
    """A local_import job suspended at its wait step; its directory."""
    source = source_dir(tmp_path / name, files)
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}, "compression": {"enabled": False}})
    jobs = set((tmp_path / "jobs").glob("*"))
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    (job_dir,) = set((tmp_path / "jobs").glob("*")) - jobs
    return job_dir


def step_record_of(job_dir: Path) -> Path:
    (record,) = (job_dir / ".prefect" / "results").glob("*-00-local_import-local-import-*")
    return record


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_continue_of_a_job_whose_record_names_pickle_runs_no_code_and_does_the_step_again(tmp_path, write_config):
    """The finding: the record's pickled ``os.system(...)`` ran as the operator on ``continue``."""
    job_dir, marker = waiting_job(tmp_path, write_config, {"a.ndjson": 3}), tmp_path / "ran"
    record = step_record_of(job_dir)
    pickle_record(record, marker)

    status = run_cli_here("status", str(job_dir)).stdout
    continued = run_cli("continue", str(job_dir), "--no-progress")

    assert f"1. local_import: not finished: the result record {record.name} names the serializer 'pickle'" in status
    assert continued.returncode == EXIT_OK, continued.stderr
    assert not marker.exists()
    said = [line for line in (continued.stdout + continued.stderr).splitlines() if record.name in line]
    assert len(said) == 1 and said[0].endswith(f"kept as rejected-{record.name}; its work is done again")
    assert job_file(job_dir)["state"] == "Completed"
    assert step_results(job_dir)[0]["files"][0]["resources"] == 3
    assert (record.parent / f"rejected-{record.name}").is_file()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_step_record_copied_from_another_job_is_not_shown_as_this_jobs_and_continue_redoes_it(tmp_path, write_config):
    """The finding: another job's record under this job's name made ``status`` show that job's files."""
    theirs = waiting_job(tmp_path, write_config, {f"{n}.ndjson": 1 for n in range(8)}, "theirs")
    ours = waiting_job(tmp_path, write_config, {"a.ndjson": 2}, "ours")
    record = step_record_of(ours)
    record.write_bytes(step_record_of(theirs).read_bytes())

    status = run_cli_here("status", str(ours)).stdout
    assert f"not finished: the result record {record.name} was written as" in status
    assert f"of job '{theirs.name}'" in status and "8 files" not in status

    assert main(["continue", str(ours), "--no-progress"]) == EXIT_OK
    assert [f["name"] for f in step_results(ours)[0]["files"]] == ["a.ndjson"]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_full_disk_while_results_are_written_fails_the_job_and_keeps_the_inspection_note(tmp_path, write_config):
    """The finding: the task "Completed", the job ended Completed with three 0-byte records, the note lost."""
    job_dir = waiting_job(tmp_path, write_config, {"a.ndjson": 2})
    results = job_dir / ".prefect" / "results"
    kept = {path.name: path.read_bytes() for path in results.iterdir()}
    with small_tmpfs(results, "1m"):
        for name, data in kept.items():
            (results / name).write_bytes(data)
        filler = fill(results)

        failed = run_cli("continue", str(job_dir), "--note", "checked the dates", "--no-progress")

        assert failed.returncode == EXIT_FAILED
        assert f"failed: JobWriteError: no space left on {results}" in failed.stderr
        assert all(path.stat().st_size > 0 for path in results.iterdir())
        assert job_file(job_dir)["state"] == "Failed"
        filler.unlink()

        assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK
        assert step_results(job_dir)[1]["summary"] == {"inspection note": "checked the dates"}
