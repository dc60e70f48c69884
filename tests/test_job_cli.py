"""Jobs end to end through the command line, against a real (temporary) Prefect API."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from flows.job_state import current_states, newest_run
from tasks.job.layout import JobPaths, directory_tag, job_tag
from tasks.job.record import SUSPENDED, JobRecord, changing_record, read_record
from config.runtime import CLI
from tasks.core.readable import counted, duration_text, size_text
from flows.run import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, main
from tests.conftest import REPO_ROOT, complete_results, run_cli
from tests.support.deployments import api
from tests.support.prefect_servers import stop_runner_of
from tests.support.jobs import (
    flow_run_state,
    job_file,
    job_record_card,
    only_job_dir,
    read_artifacts,
    read_flow_run_state,
    resources_in,
    source_dir,
    start_cli_process,
    step_results,
    wait_for,
    write_ndjson,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


@pytest.fixture
def job_config(write_config):
    """``job_config(steps)``: a configuration running ``steps`` into ``tmp_path/jobs``, compressing fast."""

    def write(steps: list[str], level: str = "fastest") -> Path:
        return write_config({"pipeline": {"enabled_steps": steps}, "compression": {"level": level}})

    return write


def test_the_embedded_default_job_imports_and_flattens_the_sample_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["start", "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    run_lines = job_log_lines_of(job_dir, ("prefect.task_runs", "prefect.flow_runs", "dupflow."))
    batch = "import[b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson.zst … fhir-data.ndjson.zst (2 files)]"
    assert f"Task run '{batch}' - Finished in state Completed()" in "\n".join(run_lines)
    assert any("dupflow.flattening: Task run 'flattening[2]' - " in line for line in run_lines), run_lines
    # The sample's two lines are TORCH transaction Bundles of 12 and 7 resources: Bundles and resources apart.
    assert any("step 1 local_import: 2 files, 2 Bundles holding 19 resources in import" in line for line in run_lines)
    unnamed = [line for line in run_lines if not re.search(r": (Task|Flow) run '[^']+' - ", line)]
    assert unnamed == [], "every line of a run names its run, as Prefect's console does"
    imported = sorted(p.name for p in (job_dir / "import").iterdir())
    assert imported == ["b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson.zst", "fhir-data.ndjson.zst"]
    csvs = sorted(p.name for p in (job_dir / "flattening").glob("*.csv"))
    assert csvs == [
        "Diagnosis.csv",
        "Encounter.csv",
        "MII PR Person Patient (Pseudonymisiert).csv",
        "Procedure one.csv",
        "Procedure two.csv",
    ]
    assert str(job_dir / "flattening") in capsys.readouterr().out
    assert job_file(job_dir)["state"] == "Completed"
    assert (job_dir / "crtdl.json").read_bytes() == (REPO_ROOT / "config" / "sample-data" / "crtdl.json").read_bytes()

    artifacts = read_artifacts(f"job-{job_dir.name}")
    assert "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson.zst" in artifacts[f"job-{job_dir.name}-01-local-import"]
    assert (
        "| 1 | local_import | done | `import` | 2 | 2 Bundles holding 19 resources |"
        in artifacts[f"job-{job_dir.name}"]
    )
    assert main(["status", str(job_dir)]) == EXIT_OK
    status = capsys.readouterr().out
    assert re.search(r"b4a838f8-\S+\.ndjson\.zst  \S+ \S?B  1 Bundle holding 12 resources\n", status), status
    assert re.search(r"fhir-data\.ndjson\.zst  \S+ \S?B  1 Bundle holding 7 resources\n", status), status


JOB_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ (\S+): ")


def job_log_lines_of(job_dir: Path, loggers: tuple[str, ...]) -> list[str]:
    """The job log's record lines (not their tracebacks) from loggers whose names start with one of ``loggers``."""
    lines = (job_dir / "job.log").read_text().splitlines()
    return [line for line in lines if (m := JOB_LOG_LINE.match(line)) and m.group(1).startswith(loggers)]


def test_import_then_wait_pauses_and_continue_completes_with_corrected_files(tmp_path, job_config, capsys):
    source = source_dir(tmp_path, {"a.ndjson": 3})
    config = job_config(["local_import", "wait"])

    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    record = job_file(job_dir)
    assert record["state"] == "Suspended"
    assert (job_dir / "import_wait").is_dir()
    assert f"continue {job_dir}" in record["state_message"]  # outside the default jobs directory: the path
    (job_run,) = record["flow_run_ids"]
    assert flow_run_state(job_run) == ("PAUSED", "Suspended")  # never a green Completed run

    write_ndjson(job_dir / "import_wait" / "a.ndjson", 2)
    assert main(["continue", str(job_dir), "--no-progress", "--note", "checked a.ndjson"]) == EXIT_OK
    record = job_file(job_dir)
    assert record["state"] == "Completed"
    assert record["state_message"].endswith("import_wait")
    assert step_results(job_dir)[1]["summary"] == {"inspection note": "checked a.ndjson"}
    # continue goes on in the job's one flow run: resumed with the form's answers, its history shows both parts
    assert record["flow_run_ids"] == [job_run]
    assert flow_run_history(job_run)[-4:] == ["Suspended", "AwaitingRetry", "Running", "Completed"]
    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "2. wait: done, 1 file" in out and "in import_wait" in out and "inspection note: checked a.ndjson" in out
    assert "step 2 (wait): released: checked a.ndjson" in job_record_card(job_dir.name, job_run)


def test_a_job_whose_run_the_server_lost_goes_on_in_a_new_run_that_says_so(tmp_path, job_config, capsys):
    """A job whose run this server lost (a lost database): ``continue`` makes a new run of the job, says so, takes
    the finished step from the job folder and passes the gate that had paused the job with the note."""
    source = source_dir(tmp_path, {"a.ndjson": 3})
    assert main(["start", str(job_config(["local_import", "wait"])), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    (lost_run,) = job_file(job_dir)["flow_run_ids"]
    with get_client(sync_client=True) as client:
        client.delete_flow_run(uuid.UUID(lost_run))
    capsys.readouterr()

    assert main(["continue", str(job_dir), "--no-progress", "--note", "from before"]) == EXIT_OK
    said = capsys.readouterr().out
    assert "its flow run is not on this Prefect server" in said and "a new run" in said, said
    record = job_file(job_dir)
    assert record["state"] == "Completed"
    steps = step_results(job_dir)
    assert steps[1]["summary"] == {"inspection note": "from before"}  # the gate had paused the job: passed
    assert steps[0]["cached"] is True  # the import was not done again
    (new_run,) = record["flow_run_ids"]
    assert new_run != lost_run and flow_run_state(new_run) == ("COMPLETED", "Completed")


def test_status_json_and_the_job_card_show_a_done_job_without_secrets(tmp_path, job_config, capsys):
    """The job-record artifact copies the job's facts into Prefect's database: a status URL recorded
    before ``?bearer=`` was refused (the job's only handle to its extraction, kept in job.json)
    shows redacted there and in ``status --json``, which gives the finished step's files and counts
    as the text does."""
    secret = "older-record-secret-5e1a"
    job_dir = tmp_path / "jobs" / str(uuid.uuid4())
    record = JobRecord(
        job_id=job_dir.name,
        config_path=str(job_config(["local_import"])),
        job_input=str(source_dir(tmp_path, {"a.ndjson": 3})),
        enabled_steps=["local_import"],
    )
    status_url = f"https://t:{secret}@torch.example/fhir/__status/1?bearer={secret}"
    with changing_record(job_dir, new=record) as changed:
        changed.facts = {"extraction_status_url": status_url}

    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK

    (run,) = job_file(job_dir)["flow_run_ids"]
    card = job_record_card(job_dir.name, run)
    assert secret not in card, card
    assert "`https://***@torch.example/fhir/__status/1?bearer=***`" in card, card
    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    text = capsys.readouterr().out
    assert main(["status", str(job_dir), "--json"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert secret not in json.dumps(document) and secret not in text
    shown_url = "https://***@torch.example/fhir/__status/1?bearer=***"
    assert document["facts"] == {"extraction_status_url": shown_url}
    assert (document["state"], document["flow_run_id"]) == ("Completed", run)
    assert f"   updated: {document['updated_at']}\n" in text
    (step,) = document["steps"]
    assert step["position"] == 1 and step["name"] == "local_import" and step["status"] == "done"
    (file,) = step["files"]
    assert step["folder"] == "import" and file["name"] == "a.ndjson.zst"
    assert file["counts"] == {"resources": 3, "Bundles": 0, "bundled": 0}
    assert f"       a.ndjson.zst  {size_text(file['size'])}  3 resources\n" in text
    assert f"took {duration_text(step['seconds'])}" in text and step["cached"] is False


@pytest.mark.parametrize(
    ("names", "said"),
    [
        (["core\u202etxt.ndjson"], "the corrected file 'core\\u202etxt.ndjson' contains a bidirectional text control"),
        (["Patient.ndjson", "patient.ndjson.zst"], "'Patient.ndjson' and 'patient.ndjson.zst' would become one file"),
        (["a.ndjson", "b.NDJSON"], "'b.NDJSON' is no corrected file the next step reads (a file ending in .ndjson or"),
        (["c.json"], "'c.json' is no corrected file the next step reads"),
    ],
    ids=["bidi", "one-file-twice", "upper-case-suffix", "another-suffix"],
)
def test_a_corrected_file_whose_name_would_not_show_as_it_is_fails_the_wait_step_naming_it(
    tmp_path, job_config, capsys, names, said
):
    """The corrected files' names become the next steps' file names, S3 keys and transfer entries: the rule for names
    from data holds for them as for imported ones, and two of them that the next step would write as one file (the
    data of one lost, the other sent twice) are refused too."""
    source = source_dir(tmp_path, {"a.ndjson": 3})
    assert main(["start", str(job_config(["local_import", "wait"])), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    for name in names:
        write_ndjson(job_dir / "import_wait" / name, 2)

    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert said in err and job_file(job_dir)["state"] == "Failed"


def test_a_corrected_csv_after_flattening_is_what_the_next_step_reads(tmp_path, write_config, capsys):
    """A wait after the flattening: its corrected files are tables, not NDJSON (they were passed over without a
    word, and the uncorrected CSV went on)."""
    sample = REPO_ROOT / "config" / "sample-data"
    steps = {"enabled_steps": ["local_import", "flattening", "wait"]}
    services = {"local_import": {"dir": sample}, "flattening": {"lookup_path": sample / "flatten-lookup.json"}}
    config = write_config({"pipeline": steps, "services": services})
    assert main(["start", str(config), str(sample / "crtdl.json"), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    assert "(each ending in .csv or .parquet)" in (job_dir / "job.log").read_text()
    original = (job_dir / "flattening" / "Encounter.csv").read_text().splitlines(keepends=True)
    (job_dir / "flattening_wait" / "Encounter.csv").write_text("".join(original[:-1]))  # a row removed

    assert main(["continue", str(job_dir), "--no-progress", "--note", "one row less"]) == EXIT_OK
    record = job_file(job_dir)
    assert record["state"] == "Completed" and record["state_message"].endswith("flattening_wait")
    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "3. wait: done, 1 file" in out and "in flattening_wait" in out
    assert f"Encounter.csv  {len(''.join(original[:-1]))} B  {counted(len(original) - 2, 'row')}" in out


def flow_run_history(flow_run_id: str) -> list[str]:
    """The names of the run's states, oldest first."""
    with get_client(sync_client=True) as client:
        return [state.name for state in client.read_flow_run_states(flow_run_id)]


def test_continue_from_another_directory_works_on_the_same_job_and_files(tmp_path, write_config):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    elsewhere.mkdir()
    source_dir(first, {"a.ndjson": 2})
    write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}, "jobs_dir": "./jobs"}, first / "c.yaml")
    started = run_cli("start", "c.yaml", "in", "--no-progress", cwd=first)
    assert started.returncode == EXIT_OK, started.stderr
    job_dir = only_job_dir(first / "jobs")

    resumed = run_cli("continue", str(job_dir), "--no-progress", cwd=elsewhere)
    assert resumed.returncode == EXIT_OK, resumed.stderr
    assert job_file(job_dir)["state"] == "Completed"
    assert list(elsewhere.iterdir()) == []


def test_a_failing_import_exits_1_names_the_problem_and_the_continue_that_fixes_it(tmp_path, job_config, capsys):
    config = job_config(["local_import"])
    nested = tmp_path / "nested"
    (nested / "sub").mkdir(parents=True)
    write_ndjson(nested / "sub" / "a.ndjson", 2)
    assert main(["start", str(config), str(nested), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    job_dir = only_job_dir(tmp_path / "jobs")
    assert "no .ndjson or .ndjson.zst files" in err and "services.local_import.recursive" in err
    assert job_file(job_dir)["state"] == "Failed"
    fix = f"continue {job_dir} --set services.local_import.recursive=VALUE"
    assert fix in err, err

    assert main(["continue", str(job_dir), "--set", "services.local_import.recursive=true", "--no-progress"]) == EXIT_OK
    assert job_file(job_dir)["state"] == "Completed"


def test_a_failing_file_is_told_once_on_the_terminal_and_in_full_in_the_job_log(tmp_path, job_config):
    source = source_dir(tmp_path, {"a.ndjson": 2})
    (source / "bad.ndjson").write_text('{"resourceType":"Patient","id":"p1"}\n[1, 2]\n')
    config = job_config(["local_import"])

    done = run_cli("start", str(config), str(source), "--no-progress")

    assert done.returncode == EXIT_FAILED, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, done.stderr
    batch = "import[a.ndjson.zst … bad.ndjson.zst (2 files)]"  # the run of the batch, the message naming the file
    assert f"Task run '{batch}'" in errors[0] and "/bad.ndjson" in errors[0] and "Traceback" not in done.stderr
    assert "Finished in state Failed" not in done.stderr
    job_dir = only_job_dir(tmp_path / "jobs")
    assert f"full log: {job_dir / 'job.log'}" in done.stderr
    log = (job_dir / "job.log").read_text()
    assert log.count("Traceback (most recent call last)") == 1
    failed_runs = [line for line in job_log_lines_of(job_dir, ("prefect.",)) if "Finished in state Failed" in line]
    assert any(f"Task run '{batch}'" in line for line in failed_runs), log
    assert any(f"Flow run '{job_dir.name}'" in line for line in failed_runs), log


def test_a_crtdl_that_is_not_there_is_not_found_and_makes_no_job(tmp_path, write_config, capsys):
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    missing = tmp_path / "crtdl.json"

    assert main(["start", str(config), str(missing), "--dir", str(source_dir(tmp_path, {"a.ndjson": 1}))]) == EXIT_USAGE

    err = capsys.readouterr().err
    assert "not found" in err and str(missing) in err
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("given_as", ["--dir", "INPUT"])
def test_a_missing_import_directory_is_refused_at_start_naming_the_fix(tmp_path, job_config, capsys, given_as):
    missing = tmp_path / "no-such-folder"
    config = job_config(["local_import"])
    args = ["start", str(config), *(["--dir", str(missing)] if given_as == "--dir" else [str(missing)])]

    assert main(args) == EXIT_USAGE

    err = capsys.readouterr().err
    assert str(missing) in err and "no job was made" in err
    assert ("--dir DIR" in err and "services.local_import.dir" in err) if given_as == "--dir" else "as the job" in err
    assert err.count("give the folder") == 1, err
    assert not (tmp_path / "jobs").exists()


def test_a_local_import_without_a_directory_says_how_to_give_one_once(tmp_path, job_config, capsys):
    config = job_config(["local_import"])

    assert main(["start", str(config)]) == EXIT_USAGE

    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "has no directory" in line and "no job was made" in line
    assert line.count("--dir") == 1 and line.count("services.local_import.dir") == 1, line
    assert not (tmp_path / "jobs").exists()


def test_a_start_refused_for_its_input_starts_no_prefect_server(tmp_path, write_config):
    """A typo in the CRTDL's path cost a server start (seconds, and a server left running) before the refusal."""
    home = tmp_path / "fresh-home"
    sample = REPO_ROOT / "config" / "sample-data"
    services = {"local_import": {"dir": sample}, "flattening": {"lookup_path": sample / "flatten-lookup.json"}}
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "flattening"]}, "services": services})
    refused = run_cli(
        "start", str(config), str(tmp_path / "typo.json"), env={"PREFECT_HOME": str(home), "PREFECT_API_URL": ""}
    )
    assert refused.returncode == EXIT_USAGE and "typo.json not found" in refused.stderr, refused.stderr
    assert not (home / "prefect.db").exists() and not (tmp_path / "jobs").exists()


def test_status_and_list_read_the_job_without_importing_prefect(tmp_path, job_config):
    source = source_dir(tmp_path, {"a.ndjson": 4})
    config = job_config(["local_import", "wait"])
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")

    probe = (
        "import sys, flows.run as r\n"
        f"r.main(['status', {job_dir.name!r}, '--jobs-dir', {str(tmp_path / 'jobs')!r}])\n"
        f"r.main(['list', '--jobs-dir', {str(tmp_path / 'jobs')!r}])\n"
        "print('prefect imported:', 'prefect' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "prefect imported: False" in out
    assert "1. local_import: done, 1 file" in out and "a.ndjson.zst" in out and "4 resources" in out
    assert "2. wait: awaiting inspection" in out
    assert f"{job_dir.name}  Suspended" in out


def test_a_ui_resume_of_a_local_job_waits_visibly_until_continue_goes_on_in_the_same_run(
    tmp_path, job_config, prefect_api, capsys
):
    """The command line's job at a gate is a suspended deployment run, as a worker's is, with the same form. Resumed
    in the UI (or the API) on a server with no runner of the home (``PREFECT_API_URL`` set), it waits as Scheduled,
    every view saying so; ``continue`` then runs it with the form's note, no automation made."""
    stop_runner_of(Path(prefect_api["database"]).parent)  # one an earlier module's command started would take it
    source = source_dir(tmp_path, {"a.ndjson": 2})
    assert main(["start", str(job_config(["local_import", "wait"])), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    (job_run,) = job_file(job_dir)["flow_run_ids"]
    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    assert "state:     Suspended" in (shown := capsys.readouterr().out) and "2. wait: awaiting inspection" in shown
    assert "| 2 | wait | awaiting inspection |" in job_record_card(job_dir.name, job_run)

    refused = {"run_input": {"confirmed": False, "note": "not yet"}}
    assert api(prefect_api["api_url"], "POST", f"/flow_runs/{job_run}/resume", json=refused)["status"] == "REJECT"
    form = {"run_input": {"confirmed": True, "note": "looked at in the UI"}}
    assert api(prefect_api["api_url"], "POST", f"/flow_runs/{job_run}/resume", json=form)["status"] == "ACCEPT"
    assert flow_run_state(job_run) == ("SCHEDULED", "Resuming")
    assert main(["status", str(job_dir)]) == EXIT_OK
    shown = capsys.readouterr().out
    assert "state:     Resuming" in shown and f"takes it up (or: {CLI} continue {job_dir})" in shown
    assert main(["list", "--jobs-dir", str(tmp_path / "jobs")]) == EXIT_OK
    assert f"{job_dir.name}  Resuming" in capsys.readouterr().out

    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK
    record = job_file(job_dir)
    assert record["flow_run_ids"] == [job_run] and flow_run_state(job_run) == ("COMPLETED", "Completed")
    assert step_results(job_dir)[1]["summary"] == {"inspection note": "looked at in the UI"}  # not continue's default
    automations = json.dumps(api(prefect_api["api_url"], "POST", "/automations/filter", json={}))
    assert job_run not in automations and job_dir.name not in automations  # none made for the job
    capsys.readouterr()
    assert main(["list", "--jobs-dir", str(tmp_path / "jobs")]) == EXIT_OK
    assert f"{job_dir.name}  Completed" in capsys.readouterr().out
    assert "| 2 | wait | done |" in job_record_card(job_dir.name, job_run)


@pytest.mark.slow
def test_killed_multi_file_import_redoes_only_unfinished_files_on_continue(tmp_path, job_config):
    # c is ~170 MB: long enough to be killed in the middle of it
    source = source_dir(tmp_path, {"a.ndjson": 10, "b.ndjson": 20, "c.ndjson": 400_000}, pad=400)
    jobs = tmp_path / "jobs"
    config = job_config(["local_import"], level="best")

    process = start_cli_process("start", str(config), str(source), "--no-progress")
    # a and b are one batch, c (over 32 MB) one of its own, imported in parallel: kill once c is being written and
    # the result of a and b's batch is recorded.
    partial = wait_for(lambda: next(jobs.glob("*/import/.c.ndjson.zst.part"), None), process)
    wait_for(lambda: complete_results(jobs, "00-local_import-import-files") == 1 or None, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    job_dir = partial.parent.parent
    finished = {p.name: p.stat().st_mtime_ns for p in (job_dir / "import").glob("[ab].ndjson.zst")}
    assert set(finished) == {"a.ndjson.zst", "b.ndjson.zst"}

    result = run_cli("continue", str(job_dir), "--no-progress")
    assert result.returncode == EXIT_OK, result.stderr
    import_dir = job_dir / "import"
    assert {p.name: p.stat().st_mtime_ns for p in import_dir.glob("[ab].ndjson.zst")} == finished
    assert resources_in(import_dir / "c.ndjson.zst") == 400_000
    assert not list(import_dir.glob(".*.part"))


@pytest.mark.slow
def test_sigterm_ends_the_run_cleanly_and_continue_finishes_it(tmp_path, job_config):
    """(SIGHUP, a closed terminal or SSH session, in test_extractor_step.py's signals during stalled downloads.)"""
    source = source_dir(tmp_path, {"c.ndjson": 400_000}, pad=400)
    jobs = tmp_path / "jobs"
    config = job_config(["local_import"], level="best")

    process = start_cli_process("start", str(config), str(source), "--no-progress")
    partial = wait_for(lambda: next(jobs.glob("*/import/.c.ndjson.zst.part"), None), process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_INTERRUPTED, err
    job_dir = partial.parent.parent
    assert not partial.exists() and not (job_dir / "import" / "c.ndjson.zst").exists()
    record = job_file(job_dir)
    assert record["state"] == "Cancelled" and "interrupted (Ctrl+C or SIGTERM)" in record["state_message"]

    assert run_cli("continue", str(job_dir), "--no-progress").returncode == EXIT_OK
    assert resources_in(job_dir / "import" / "c.ndjson.zst") == 400_000


def test_list_without_jobs_says_so_with_the_absolute_directory(tmp_path, capsys):
    assert main(["list", "--jobs-dir", str(tmp_path / "none")]) == EXIT_OK
    assert capsys.readouterr().out == f"no jobs in {tmp_path / 'none'}\n"


@pytest.mark.parametrize("command", ["list", "prune"])
def test_a_file_given_as_the_jobs_directory_is_a_usage_error_not_an_empty_list(tmp_path, capsys, command):
    """It said "no jobs in …" (prune: after starting the local Prefect server for nothing) and exited 0."""
    (not_a_directory := tmp_path / "jobs.yaml").write_text("jobs_dir: /data/jobs\n")
    assert main([command, "--jobs-dir", str(not_a_directory)]) == EXIT_USAGE
    said = capsys.readouterr().err
    assert f"--jobs-dir {not_a_directory} is a file, not a directory; give the directory that holds the jobs" in said


def test_an_unknown_job_names_the_absolute_jobs_directory_and_the_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["status", "nope", "--jobs-dir", "jobs"]) == EXIT_USAGE
    assert f"no job nope in {tmp_path / 'jobs'}; pass --jobs-dir" in capsys.readouterr().err


def test_list_piped_into_head_ends_quietly(tmp_path, empty_prefect_api):
    """On an API that knows no job (every job Unknown): the module's server, asked for the states of
    3,000 jobs, spent tens of seconds of CPU on an answer this test does not read."""
    from tasks.job.record import JobRecord, changing_record

    for number in range(3000):  # more than a pipe holds, so head goes away while list is still writing
        job_id = f"00000000-0000-0000-0000-{number:012d}"
        job = JobRecord(job_id=job_id, job_input=f"/data/{number}", enabled_steps=["local_import"])
        with changing_record(tmp_path / "jobs" / job_id, new=job):
            pass
    piped = subprocess.run(
        f"{sys.executable} -m flows.run list --jobs-dir {tmp_path / 'jobs'} | head -2",
        shell=True,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert piped.stdout.startswith("JOB") and len(piped.stdout.splitlines()) == 2
    assert piped.stderr == ""


def test_continue_on_a_completed_job_says_so_and_runs_nothing(tmp_path, job_config, capsys):
    source = source_dir(tmp_path, {"a.ndjson": 1})
    config = job_config(["local_import"])
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    runs = job_file(job_dir)["flow_run_ids"]
    capsys.readouterr()
    assert main(["continue", str(job_dir)]) == EXIT_OK
    assert "is already completed; nothing to do" in capsys.readouterr().out
    assert job_file(job_dir)["flow_run_ids"] == runs


def test_continue_refuses_a_job_of_an_earlier_version_naming_what_to_do(tmp_path, job_config, capsys):
    """An earlier dupflow's job (its job.json of no version, its facts in facts.json): continuing it would lose
    its extraction handle."""
    source = source_dir(tmp_path, {"a.ndjson": 1})
    assert main(["start", str(job_config(["local_import", "wait"])), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    runs = job_file(job_dir)["flow_run_ids"]
    earlier = {k: v for k, v in json.loads((job_dir / "job.json").read_text()).items() if k not in ("version", "facts")}
    (job_dir / "job.json").write_text(json.dumps(earlier))
    (job_dir / "facts.json").write_text('{"extraction_status_url": "https://torch.example.org/fhir/__status/1"}')
    capsys.readouterr()
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "has version 1; this dupflow reads version 3 only: finish the job with the dupflow" in error, error
    assert job_file(job_dir)["flow_run_ids"] == runs


def test_start_reads_the_configuration_file_once(tmp_path, job_config, capsys):
    """One ``start`` opens the configuration file once: the command's check, the job's preparation, the settings
    as the job froze them (absolute paths, jobs_dir) and the flow's steps all share that read."""
    config = job_config(["local_import"])
    source = source_dir(tmp_path, {"a.ndjson": 1})
    opened: list[str] = []

    def count_opens(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str | os.PathLike) and os.fspath(args[0]) == str(config):
            opened.append(event)

    sys.addaudithook(count_opens)  # a hook cannot be removed: it only counts this test's file
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    assert len(opened) == 1, opened


def test_a_suspended_jobs_state_comes_from_its_own_directorys_runs_never_a_copys(tmp_path):
    """A copy of a job (a backup, a second jobs dir) has its id but another directory: its run's Completed made the
    original, still Suspended, read Completed, and continue said "nothing to do"."""
    from prefect import flow
    from prefect.states import Completed, Suspended

    @flow(name="dupflow-copy-of-a-job")
    def copy_probe() -> None:
        pass

    job_id = str(uuid.uuid4())
    original, copy = (JobPaths(tmp_path / folder / job_id) for folder in ("jobs-a", "jobs-b"))
    for paths in (original, copy):
        with changing_record(paths.job_dir, new=JobRecord(job_id=job_id)):
            pass
    with get_client(sync_client=True) as client:
        client.create_flow_run(copy_probe, tags=[job_tag(job_id), directory_tag(original.job_dir)], state=Suspended())
        client.create_flow_run(copy_probe, tags=[job_tag(job_id), directory_tag(copy.job_dir)], state=Completed())
    assert current_states([original]) == {original: SUSPENDED}
    assert current_states([copy]) == {copy: "Completed"}


def job_with_a_probe_run(tmp_path: Path, state: Any) -> tuple[str, JobPaths, Any]:
    """A job id, its paths under ``tmp_path / "jobs"`` and a flow run of a probe flow in ``state``, tagged as the
    job's (as a deployment run of the job would be)."""
    from prefect import flow

    @flow(name="dupflow-probe")
    def probe() -> None:
        pass

    job_id = str(uuid.uuid4())
    paths = JobPaths(tmp_path / "jobs" / job_id)
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe, tags=[job_tag(job_id), directory_tag(paths.job_dir)], state=state)
    return job_id, paths, run


def test_list_shows_every_jobs_state_from_its_flow_run_past_a_page_of_the_api(tmp_path, capsys):
    """Two hundred and one jobs: the server answers 200 rows a page, and each job's state is its run's there (the
    records hold no state; a Failed run of another directory, a copy's, does not count)."""
    from prefect import flow
    from prefect.states import Completed, Failed

    @flow(name="dupflow-probe")
    def probe() -> None:
        pass

    job_ids = sorted(str(uuid.uuid4()) for _ in range(201))
    with get_client(sync_client=True) as client:
        for number, job_id in enumerate(job_ids):
            paths = JobPaths(tmp_path / "jobs" / job_id)
            state = Failed() if number == 200 else Completed()
            client.create_flow_run(probe, tags=[job_tag(job_id), directory_tag(paths.job_dir)], state=state)
            copy = JobPaths(tmp_path / "copy" / job_id)
            client.create_flow_run(probe, tags=[job_tag(job_id), directory_tag(copy.job_dir)], state=Failed())
            with changing_record(paths.job_dir, new=JobRecord(job_id=job_id)):
                pass
    capsys.readouterr()

    assert main(["list", "--jobs-dir", str(tmp_path / "jobs")]) == EXIT_OK
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert sorted(rows) == job_ids
    assert sorted(rows.values()) == ["Completed"] * 200 + ["Failed"], rows


def test_continue_of_a_suspended_run_goes_on_with_its_flags_applied(tmp_path, write_config, capsys):
    """A suspended run went on with the parameters it was started with: a flag was dropped without a word, so
    continue refused it; continue now runs the job's run with its job.json's inputs, the flag's change in them."""
    source = source_dir(tmp_path, {"a.ndjson": 2})
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")

    changed = ["--set", "retry.max_attempts=2", "--no-progress"]
    assert main(["continue", str(job_dir), *changed]) == EXIT_OK

    run = newest_run(JobPaths(job_dir))
    assert run is not None and run["parameters"]["overrides"]["retry.max_attempts"] == "2"
    assert read_record(job_dir).overrides["retry.max_attempts"] == "2"
    assert read_flow_run_state(str(run["id"])).name == "Completed"


def test_status_of_a_suspended_job_whose_run_was_cancelled_gives_no_stale_advice(tmp_path, capsys):
    """A deployment run suspended at a wait step, then cancelled in the UI: status said "Cancelled — awaiting
    inspection ...; resume in the UI with the confirmation turned on", which a cancelled run no longer offers."""
    from prefect.states import Cancelled

    job_id, paths, run = job_with_a_probe_run(tmp_path, Cancelled())
    with changing_record(paths.job_dir, new=JobRecord(job_id=job_id)):
        pass

    assert main(["status", job_id, "--jobs-dir", str(tmp_path / "jobs")]) == EXIT_OK
    state_line = next(line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("state:"))
    assert "Cancelled" in state_line and "resume in the UI" not in state_line, state_line
    assert f"{CLI} continue {paths.job_dir}" in state_line, state_line
