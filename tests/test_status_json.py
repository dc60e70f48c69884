"""Issue 63, item 7: ``status --json`` and ``list --json`` print one JSON document of what the text
shows (docs/operations.md, "status --json"), secrets redacted, for scripts and monitoring.

Against the fast tier's fake Prefect API (``empty_prefect_api``) and job records written by hand; a
finished step's files and counts in ``tests/test_job_cli.py``, a damaged record's texts in
``tests/test_hostile_terminal.py``.
"""

from __future__ import annotations

import json
import uuid

from flows.run import EXIT_OK, main
from tasks.job.record import JobRecord, changing_record
from tests.support.jobs import put_flow_run

SECRET = "json-secret-71c2"
STATUS_URL = f"https://t:{SECRET}@torch.example/fhir/__status/0b6b?_count=5&access_token={SECRET}"
SHOWN_STATUS_URL = "https://***@torch.example/fhir/__status/0b6b?_count=5&access_token=***"


def recorded_job(jobs_dir, job_input: str, **facts) -> str:
    """A job of two steps, none finished, as ``start`` records it; its id."""
    job_id = str(uuid.uuid4())
    steps = ["local_import", "flattening"]
    record = JobRecord(job_id=job_id, job_input=job_input, enabled_steps=steps)
    with changing_record(jobs_dir / job_id, new=record) as job:
        job.facts = facts
    return job_id


def test_status_json_is_one_document_of_what_the_text_shows(tmp_path, capsys, empty_prefect_api):
    jobs_dir = tmp_path / "jobs"
    job_id = recorded_job(jobs_dir, f"https://f.example/P.ndjson?bearer={SECRET}", crtdl_path="/c.json")
    with changing_record(jobs_dir / job_id) as job:
        job.facts |= {"extraction_status_url": STATUS_URL, "extraction_submission": {"generation": 1}}
    said = "pseudonymizer: de-identify failed with HTTP 422"
    run_id = put_flow_run(empty_prefect_api, jobs_dir / job_id, "FAILED", "Failed", said)

    assert main(["status", job_id, "--jobs-dir", str(jobs_dir)]) == EXIT_OK
    text = capsys.readouterr().out
    assert main(["status", job_id, "--jobs-dir", str(jobs_dir), "--json"]) == EXIT_OK
    output = capsys.readouterr().out

    document = json.loads(output)  # the whole of stdout: one document
    assert SECRET not in text and SECRET not in output
    message = document["state_message"]
    assert message.startswith(said) and "continue" in message
    assert f"  state:     Failed (flow run {run_id}) — {message}\n" in text
    assert f"  created:   {document['created_at']}   updated: None\n" in text
    assert f"  input:     {document['input']}\n" in text
    assert f"  extraction_status_url: {SHOWN_STATUS_URL}\n" in text
    assert "  1. local_import: not finished\n  2. flattening: not finished\n" in text
    not_finished = {"status": "not_finished", "progress": None, "problem": None, "folder": None, "files": []}
    not_finished |= {"summary": {}, "seconds": None, "cached": False}
    assert document == {
        "job_id": job_id,
        "directory": str(jobs_dir / job_id),
        "state": "Failed",
        "state_message": message,
        "flow_run_id": run_id,
        "created_at": document["created_at"],
        "updated_at": None,
        "input": "https://f.example/P.ndjson?bearer=***",
        "facts": {
            "crtdl_path": "/c.json",
            "extraction_status_url": SHOWN_STATUS_URL,
            "extraction_submission": {"generation": 1},
        },
        "steps": [
            {"position": 1, "name": "local_import", **not_finished},
            {"position": 2, "name": "flattening", **not_finished},
        ],
    }


def test_list_json_gives_each_job_and_an_unreadable_ones_problem(tmp_path, capsys, empty_prefect_api):
    jobs_dir = tmp_path / "jobs"
    job_id = recorded_job(jobs_dir, f"https://f.example/P.ndjson?api_key={SECRET}")
    put_flow_run(empty_prefect_api, jobs_dir / job_id, "COMPLETED", "Completed")
    (damaged := jobs_dir / str(uuid.uuid4())).mkdir()
    (damaged / "job.json").write_text("{not json")

    assert main(["list", "--jobs-dir", str(jobs_dir), "--json"]) == EXIT_OK

    output = capsys.readouterr().out
    document = json.loads(output)
    assert SECRET not in output and document["jobs_dir"] == str(jobs_dir)
    readable, unreadable = document["jobs"]
    assert readable == {
        "job_id": job_id,
        "directory": str(jobs_dir / job_id),
        "state": "Completed",
        "created_at": readable["created_at"],
        "input": "https://f.example/P.ndjson?api_key=***",
        "problem": None,
    }
    assert unreadable["job_id"] == damaged.name and unreadable["state"] == "unreadable"
    assert unreadable["problem"].startswith(f"the job record {damaged / 'job.json'} ")
    assert (unreadable["created_at"], unreadable["input"]) == (None, None)


def test_list_json_of_no_jobs_is_an_empty_list(tmp_path, capsys):
    """As the text's "no jobs in …": no Prefect server is asked."""
    assert main(["list", "--jobs-dir", str(tmp_path / "none"), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"jobs_dir": str(tmp_path / "none"), "jobs": []}
