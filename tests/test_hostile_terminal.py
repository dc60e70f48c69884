"""Foreign text on a terminal is plain: a hostile extraction server's Task fields (``extraction list``, ``show``,
``pause``, ``cohort preview --ids``) and every text of a damaged ``job.json`` (``status``, ``list``, ``continue``,
``prune``, ``status --json``) reach it with no escape sequence (an OSC title, a screen clear),
carriage return, C1 control, bidi control or line separator, and still recognisable (escaped, or
the controls made spaces). So do a job run's log lines (Prefect's own line of a task's failure, a
service's error text) and the job log.

Against the fake extraction server (its ``edit_task``, ``cohort_ids`` and ``fail_jobs`` switches)
and job records written by hand; commands run in-process through the real argument parser, a
job's run in a process of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flows.run import main
from tests.conftest import TESTDATA, extraction_tree, run_cli
from tests.support.hostile_text import HOSTILE, NOT_PLAIN, assert_plain
from tests.support.results import write_step_record
from tests.support.jobs import put_flow_run
from tests.fakes.extraction_crtdl import parse_crtdl
from tests.fakes.extraction_server import ExtractionServer, start_extraction_server
from tests.fakes.extraction_state import ManualClock

CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
CONSENT_AUDIT = "Consent audit NDJSON"


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# --- a hostile extraction server ----------------------------------------------------------------------------------


def set_active_batch(part: str) -> Callable[[dict], None]:
    """An edit of the Task's progress: each active batch's ``part`` (batchId or stage) hostile."""

    def edit(task: dict) -> None:
        for extension in task["extension"][0]["extension"]:
            if extension["url"] == "activeBatch":
                for sub in extension["extension"]:
                    if sub["url"] == part:
                        sub["valueString"] = HOSTILE

    return edit


TASK_EDITS: dict[str, Callable[[dict], None]] = {
    "id": lambda task: task.update(id=HOSTILE),
    "status": lambda task: task["businessStatus"]["coding"][0].update(code=HOSTILE),
    "version": lambda task: task["meta"].update(versionId=HOSTILE),
    "last updated": lambda task: task["meta"].update(lastUpdated=HOSTILE),
    "authored on": lambda task: task.update(authoredOn=HOSTILE),
    "batch id": set_active_batch("batchId"),
    "batch stage": set_active_batch("stage"),
    "consent audit URL": lambda task: task.update(
        output=[{"type": {"text": CONSENT_AUDIT}, "valueUrl": f"https://torch.example/files/{HOSTILE}"}]
    ),
}
SHOWN_BY = {
    "list": ("id", "status"),
    "show": tuple(TASK_EDITS),
    "pause": ("id", "status"),
}


@pytest.fixture
def torch():
    clock = ManualClock()
    with start_extraction_server(clock=clock, cohort_size=6, batch_size=2, max_concurrency=2) as server:
        server.state.submit(parse_crtdl(CRTDL.read_bytes()), [])
        clock.tick(0.11)  # the cohort is known, two batches are being processed
        yield server


@pytest.fixture
def config(write_config, torch: ExtractionServer) -> Path:
    tree = {"pipeline": {"enabled_steps": ["extractor"]}, "services": {"extractor": {"base_url": torch.base_url}}}
    return write_config({**tree, "retry": {"max_attempts": 1}}, jobs_dir=None)


@pytest.mark.parametrize(
    ("command", "field"), [(command, field) for command, fields in SHOWN_BY.items() for field in fields]
)
def test_a_hostile_task_field_reaches_the_terminal_plain(capsys, torch, config, command, field):
    [job_id] = torch.state.jobs
    torch.state.edit_task = TASK_EDITS[field]
    code, output = cli(capsys, "extraction", command, str(config), *([] if command == "list" else [job_id]))
    assert code == 0, output
    assert_plain(output)


def test_a_refused_consent_audit_url_is_named_plain(capsys, torch, config):
    """A URL with credentials is refused, its host named: a hostile host's escape sequences made spaces."""
    [job_id] = torch.state.jobs
    url = f"https://user:pw@{HOSTILE}/files/audit.ndjson"
    torch.state.edit_task = lambda task: task.update(output=[{"type": {"text": CONSENT_AUDIT}, "valueUrl": url}])
    code, output = cli(capsys, "extraction", "show", str(config), job_id)
    assert code == 1 and "carries a user name or password" in output and "pw" not in output, output
    assert_plain(output)


@pytest.mark.parametrize("command", ["show", "cancel", "priority"])
def test_a_dupflow_jobs_damaged_extraction_id_is_asked_for_escaped_and_named_plain(capsys, tmp_path, config, command):
    """A job.json's extraction job id is looked up as one path segment (httpx refused its controls, a traceback)."""
    job_id = damaged_job(tmp_path / "jobs", lambda record: record.update(facts={"extraction_job_id": HOSTILE}))
    extra = ["high"] if command == "priority" else []
    code, output = cli(capsys, "extraction", command, str(config), job_id, "--jobs-dir", str(tmp_path / "jobs"), *extra)
    assert code == 1 and "the extraction server has no job" in output, output
    assert_plain(output)


def test_json_output_keeps_the_servers_text_as_sent_and_escaped(capsys, torch, config):
    [job_id] = torch.state.jobs
    torch.state.edit_task = TASK_EDITS["status"]
    code, output = cli(capsys, "extraction", "show", str(config), job_id, "--json")
    assert code == 0 and NOT_PLAIN.search(output) is None
    assert json.loads(output)["status"] == HOSTILE


def test_hostile_patient_ids_of_a_cohort_preview_reach_the_terminal_plain(capsys, torch, config):
    torch.state.cohort_ids = ("pat-1", HOSTILE)
    code, output = cli(capsys, "cohort", "preview", str(config), str(CRTDL), "--ids")
    assert code == 0 and output.splitlines()[:2] == ["cohort size: 2 patients", "pat-1"]
    assert_plain(output)


def test_a_task_whose_dates_are_no_text_shows_no_age(capsys, torch, config):
    [job_id] = torch.state.jobs
    torch.state.edit_task = lambda task: task.update(authoredOn=20260101, meta={"lastUpdated": ["x"]})
    for command in (["list"], ["show", job_id]):
        code, output = cli(capsys, "extraction", command[0], str(config), *command[1:])
        assert code == 0 and "Traceback" not in output, output


# --- a damaged job record -------------------------------------------------------------------------------------------


def sane_record(job_id: str) -> dict[str, Any]:
    """A finished local import, as ``job.json`` holds it, with its step's result record (``"steps"``, written to the
    job folder's results by ``damaged_job``)."""
    return {
        "version": 3,
        "job_id": job_id,
        "config_path": "/jobs/config.yaml",
        "job_input": "/data/in",
        "enabled_steps": ["local_import"],
        "facts": {"effective_crtdl": "crtdl.json"},
        "steps": {
            "00": {
                "step": "local_import",
                "position": 0,
                "folder": "00-local_import",
                "files": [{"name": "Patient.ndjson", "size": 10, "resources": 1}],
                "summary": {"files": 1, "inspection note": "looked fine"},
            }
        },
    }


DAMAGES: dict[str, Callable[[dict], None]] = {
    "job_id": lambda record: record.update(job_id=HOSTILE),
    "job_input": lambda record: record.update(job_input=HOSTILE),
    "enabled_steps": lambda record: record.update(enabled_steps=["local_import", HOSTILE]),
    "step folder": lambda record: record["steps"]["00"].update(folder=HOSTILE),
    "file name": lambda record: record["steps"]["00"]["files"][0].update(name=HOSTILE),
    "summary": lambda record: record["steps"]["00"].update(summary={HOSTILE: HOSTILE}),
    "facts": lambda record: record.update(facts={HOSTILE: HOSTILE}),
}


def damaged_job(jobs_dir: Path, damage: Callable[[dict], None], **changes: Any) -> str:
    """A job whose ``job.json`` is ``sane_record`` with ``changes``, then ``damage``d (its steps' result records in
    the job's results folder); its id."""
    job_id = str(uuid.uuid4())
    record = sane_record(job_id) | changes
    damage(record)
    results = jobs_dir / job_id / ".prefect" / "results"
    results.mkdir(parents=True)
    for key, step in record.pop("steps").items():
        write_step_record(results / f"{job_id}-{key}-local_import-local-import-{'0' * 20}", step)
    (jobs_dir / job_id / "job.json").write_text(json.dumps(record), encoding="utf-8")
    return job_id


def completed_run_on(api: Any, job_dir: Path, state_name: str = "Completed") -> None:
    """The job's flow run, completed, with its local import's task run naming its result record (as ``status``
    finds them on a real server: tagged with the job and its directory)."""
    run_id = put_flow_run(api, job_dir, "COMPLETED", state_name, state_name)
    (result,) = (job_dir / ".prefect" / "results").iterdir()
    task_state = {"type": "COMPLETED", "name": "Completed", "data": {"storage_key": str(result)}}
    task_run = {"flow_run_id": run_id, "name": "local_import[1]", "flow_run_run_count": 1, "state": task_state}
    api.state.task_runs.append(task_run)


@pytest.mark.parametrize("damage", DAMAGES)
def test_every_text_of_a_damaged_record_reaches_status_plain(capsys, tmp_path, empty_prefect_api, damage):
    job_id = damaged_job(tmp_path / "jobs", DAMAGES[damage])
    completed_run_on(empty_prefect_api, tmp_path / "jobs" / job_id)
    code, output = cli(capsys, "status", job_id, "--jobs-dir", str(tmp_path / "jobs"))
    assert code == 0 and "1. local_import: done, 1 file" in output, output  # the step's record read
    assert_plain(output)


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_texts_reach_status_json_escaped(capsys, tmp_path, empty_prefect_api, damage):
    """JSON escapes the controls; ``ensure_ascii`` every other character outside ASCII (a bidi
    override too), which a script reads back as it was."""
    job_id = damaged_job(tmp_path / "jobs", DAMAGES[damage])
    completed_run_on(empty_prefect_api, tmp_path / "jobs" / job_id)
    code, output = cli(capsys, "status", job_id, "--jobs-dir", str(tmp_path / "jobs"), "--json")
    assert code == 0 and json.loads(output)["steps"][0]["status"] == "done", output
    assert_plain(output)


@pytest.mark.parametrize("command", ["status", "list"])
def test_a_servers_state_and_message_reach_status_and_list_plain(capsys, tmp_path, empty_prefect_api, command):
    job_id = damaged_job(tmp_path / "jobs", lambda record: None)
    completed_run_on(empty_prefect_api, tmp_path / "jobs" / job_id, state_name=HOSTILE)
    code, output = cli(
        capsys, command, *([job_id] if command == "status" else []), "--jobs-dir", str(tmp_path / "jobs")
    )
    assert code == 0 and job_id in output, output
    assert_plain(output)


@pytest.mark.usefixtures("empty_prefect_api")
@pytest.mark.parametrize("damage", ["job_id", "job_input"])
def test_every_text_of_a_damaged_record_reaches_list_plain(capsys, tmp_path, damage):
    damaged_job(tmp_path / "jobs", DAMAGES[damage])
    code, output = cli(capsys, "list", "--jobs-dir", str(tmp_path / "jobs"))
    assert code == 0, output
    assert_plain(output)


def test_continue_of_a_completed_job_with_a_damaged_id_says_it_plain(capsys, tmp_path, empty_prefect_api):
    job_id = damaged_job(tmp_path / "jobs", DAMAGES["job_id"])
    put_flow_run(empty_prefect_api, tmp_path / "jobs" / job_id, "COMPLETED", "Completed")
    code, output = cli(capsys, "continue", job_id, "--jobs-dir", str(tmp_path / "jobs"))
    assert code == 0 and "is already completed" in output, output
    assert_plain(output)


FOLLOWING = {"job_input": "https://torch.example/fhir/__status/1", "enabled_steps": ["extractor"], "steps": {}}
FOLLOWING_DAMAGES: dict[str, Callable[[dict], None]] = {
    "job_id": DAMAGES["job_id"],
    "job_input": lambda record: record.update(job_input=f"https://{HOSTILE}/fhir/__status/1"),
}


@pytest.mark.parametrize("damage", FOLLOWING_DAMAGES)
def test_continue_refusing_a_flag_names_a_damaged_records_texts_plain(capsys, tmp_path, damage):
    """A job following a status URL refuses ``--resubmit``, naming the job and its URL."""
    job_id = damaged_job(tmp_path / "jobs", FOLLOWING_DAMAGES[damage], **FOLLOWING)
    code, output = cli(capsys, "continue", job_id, "--jobs-dir", str(tmp_path / "jobs"), "--resubmit")
    assert code == 2 and "--resubmit applies to a job that submits its CRTDL" in output, output
    assert_plain(output)


def test_prune_names_a_damaged_records_configuration_plain(capsys, tmp_path, empty_prefect_api):
    """A failed job that may have left its extraction running: the dry run says how to cancel it."""
    facts = {"extraction_job_id": "e-1", "extraction_status_url": "https://torch.example/fhir/__status/e-1"}
    unfollowed = {"enabled_steps": ["extractor"], "steps": {}, "facts": facts}
    job_id = damaged_job(tmp_path / "jobs", lambda record: record.update(config_path=HOSTILE), **unfollowed)
    put_flow_run(empty_prefect_api, tmp_path / "jobs" / job_id, "FAILED", "Failed")
    code, output = cli(capsys, "prune", "--jobs-dir", str(tmp_path / "jobs"))
    assert code == 0 and "extraction cancel" in output, output
    assert_plain(output)


CONTROL_REFUSED = "in its job.json contains a control character U+001B"
SETTING = "services.local_import.dir"


def hostile_input_and_facts(record: dict) -> None:
    record.update(job_input=record["job_input"] + HOSTILE, facts={HOSTILE: HOSTILE})


CONTINUED_FIELDS: dict[str, tuple[Callable[[dict], None], int, str]] = {
    # a field's damage, the exit code of continue, what it says
    "job_id": (lambda record: record.update(job_id=HOSTILE), 2, "is not a job id"),
    "config_path": (
        lambda record: record.update(config_path=record["config_path"] + HOSTILE),
        2,
        CONTROL_REFUSED,
    ),
    "override key": (
        lambda record: record.update(overrides={SETTING + HOSTILE: "/data"}),
        2,
        CONTROL_REFUSED,
    ),
    "override value": (
        lambda record: record.update(overrides={SETTING: f"/data{HOSTILE}"}),
        2,
        CONTROL_REFUSED,
    ),
    "enabled_steps": (
        lambda record: record.update(enabled_steps=["local_import", HOSTILE]),
        2,
        "was started with pipeline.enabled_steps [local_import, run",
    ),
    "created_at": (
        lambda record: record.update(created_at=HOSTILE),
        2,
        "is no job record (created_at",
    ),
    # read by the run: Prefect's own console line tells its task's failure
    "job_input and facts": (hostile_input_and_facts, 1, "- failed: import directory"),
}


def assert_plain_job_log(job_dir: Path) -> None:
    """``cat job.log`` shows no escape sequence either (read as bytes: as text, CR ends a line)."""
    log = job_dir / "job.log"
    assert not log.exists() or NOT_PLAIN.search(log.read_bytes().decode()) is None, log.read_bytes()


@pytest.mark.slow  # a Prefect server, and a flow run in a process of its own
@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("field", CONTINUED_FIELDS)
def test_continue_shows_each_damaged_field_of_job_json_plain(tmp_path, write_config, field):
    """Each field of a damaged ``job.json``, refused as read or taken by the flow run: every line
    plain, the failure line Prefect's console writes of a task's exception too, and the job log."""
    damage, exit_code, said = CONTINUED_FIELDS[field]
    config = str(write_config({"pipeline": {"enabled_steps": ["local_import"]}}))
    local = {"config_path": config, "job_input": str(tmp_path / "in"), "steps": {}}
    job_id = damaged_job(tmp_path / "jobs", damage, state="Failed", **local)
    continued = run_cli("continue", job_id, "--jobs-dir", str(tmp_path / "jobs"), "--no-progress")
    output = continued.stdout + continued.stderr
    assert continued.returncode == exit_code and said in output, output
    assert_plain(output)
    assert_plain_job_log(tmp_path / "jobs" / job_id)


@pytest.mark.slow  # a flow run against a Prefect server, in a process of its own (its log lines as on a terminal)
@pytest.mark.usefixtures("prefect_api")
def test_continue_re_attaching_names_the_extraction_job_of_its_status_url_never_a_damaged_id(tmp_path, write_config):
    with start_extraction_server() as torch:
        job = torch.state.submit(parse_crtdl(CRTDL.read_bytes()), [])
        config = str(write_config(extraction_tree(torch.base_url)))
        facts = {"extraction_status_url": f"{torch.base_url}/fhir/__status/{job.id}", "extraction_job_id": HOSTILE}
        following = {"config_path": config, "job_input": str(CRTDL), "enabled_steps": ["extractor"], "steps": {}}
        job_id = damaged_job(tmp_path / "jobs", lambda record: record.update(facts=facts), state="Failed", **following)
        continued = run_cli("continue", job_id, "--jobs-dir", str(tmp_path / "jobs"), "--no-progress")
    output = continued.stdout + continued.stderr
    assert continued.returncode == 0 and f"re-attaching to extraction job {job.id}" in output, output
    assert NOT_PLAIN.search(output) is None, output


@pytest.mark.slow  # a flow run against a Prefect server, in a process of its own (its log lines as on a terminal)
@pytest.mark.usefixtures("prefect_api")
def test_continue_resubmitting_names_a_damaged_replaced_extraction_id_plain(tmp_path, write_config):
    """``--resubmit`` cancels the extraction the record names, and says what became of it."""
    with start_extraction_server() as torch:
        config = str(write_config(extraction_tree(torch.base_url)))
        facts = {"extraction_job_id": HOSTILE, "crtdl_path": str(CRTDL)}
        following = {"config_path": config, "job_input": str(CRTDL), "enabled_steps": ["extractor"], "steps": {}}
        job_id = damaged_job(tmp_path / "jobs", lambda record: record.update(facts=facts), state="Failed", **following)
        continued = run_cli("continue", job_id, "--jobs-dir", str(tmp_path / "jobs"), "--resubmit", "--no-progress")
    output = continued.stdout + continued.stderr
    assert "the extraction server answered 404 for the replaced extraction job" in output, output
    assert NOT_PLAIN.search(output) is None, output


@pytest.mark.slow  # a flow run against a Prefect server, in a process of its own
@pytest.mark.usefixtures("prefect_api")
def test_start_on_a_folder_named_with_escapes_tells_its_failure_plain(tmp_path, write_config):
    (folder := tmp_path / f"in{HOSTILE}").mkdir()
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    started = run_cli("start", str(config), str(folder), "--no-progress")
    output = started.stdout + started.stderr
    assert started.returncode == 1 and "- failed: no .ndjson or .ndjson.zst files" in output, output
    assert_plain(output)
    (job_dir,) = (tmp_path / "jobs").iterdir()
    assert_plain_job_log(job_dir)


def test_start_refusing_a_missing_folder_named_with_escapes_names_it_plain(capsys, write_config):
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    code, output = cli(capsys, "start", str(config), f"/no/such/in{HOSTILE}")
    assert code == 2 and "(the job input) does not exist" in output, output
    assert_plain(output)


@pytest.mark.slow  # a flow run against a Prefect server, in a process of its own
@pytest.mark.usefixtures("prefect_api")
def test_an_extraction_servers_failure_text_with_escapes_is_shown_plain(tmp_path, write_config):
    """The service's own words (an OperationOutcome's diagnostics): the task's failure line, the
    outcome, the job log."""
    diagnostics = f"Cohort query failed: {HOSTILE}"
    with start_extraction_server(fail_jobs=True, failure_diagnostics=diagnostics) as torch:
        config = str(write_config(extraction_tree(torch.base_url)))
        started = run_cli("start", config, str(CRTDL), "--no-progress")
    output = started.stdout + started.stderr
    assert started.returncode == 1 and "- failed: extraction job" in output, output
    assert "on the extraction server (HTTP 500): Cohort query failed: run" in output, output
    assert_plain(output)
    (job_dir,) = (tmp_path / "jobs").iterdir()
    assert_plain_job_log(job_dir)
