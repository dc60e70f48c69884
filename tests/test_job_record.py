"""The job record in the UI: step times (kept from the cache and marked on ``continue``), links to the artifacts of
each step, the cause of a failed step; one progress artifact per step run, throttled; the inspection note once.

Against the suite's temporary Prefect API, read back as the UI reads it; the pseudonymizer fake's latency makes
the pseudonymizer step last a few seconds of known work.
"""

from __future__ import annotations

import json
import re
import time
from itertools import pairwise
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from prefect import flow, task
from prefect.context import FlowRunContext, TaskRunContext

from flows.job_card import markdown_text
from flows.run import EXIT_FAILED, EXIT_OK, main
from tasks.streams.progress import StepWork, step_progress, track
from tasks.core.readable import size_text
from tasks.job.record import record_facts
from tasks.wait import wait
from tests.conftest import REPO_ROOT
from tests.steps import step_input
from tests.support.jobs import job_file, step_results

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

RESOURCES = 40  # per file; one request per resource, two at once, LATENCY each: about 2 s for the step
LATENCY = 0.05
LINK = re.compile(r"\[([a-z]+)\]\(([^)]*)/artifacts/artifact/([0-9a-f-]+)\)")


@pytest.fixture
def write_job(tmp_path: Path, write_config):
    """``write_job(pseudonymizer_url)``: (configuration, import folder) of a local_import → pseudonymizer job."""

    def write(pseudonymizer_url: str) -> tuple[Path, Path]:
        source = tmp_path / "in"
        source.mkdir()
        for name in ("a.ndjson", "b.ndjson"):
            (source / name).write_text(
                "".join(json.dumps({"resourceType": "Patient", "id": f"{name}-{i}"}) + "\n" for i in range(RESOURCES))
            )
        config = write_config(
            {
                "pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]},
                "retry": {"max_attempts": 1},
                "services": {"pseudonymizer": {"url": pseudonymizer_url, "max_concurrent_requests": 2}},
            }
        )
        return config, source

    return write


def test_a_failed_step_is_named_and_continue_marks_cached_steps_with_the_time_they_took(
    pseudonymizer_fake, tmp_path, write_job
):
    config, source = write_job(pseudonymizer_fake.base_url)
    pseudonymizer_fake.state.reset(fail_next=1000, fail_status=400)

    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_FAILED

    (job_dir,) = (tmp_path / "jobs").iterdir()
    record = latest(f"job-{job_dir.name}")["data"]
    first_import = row(record, "local_import")
    assert first_import["state"] == "done" and first_import["time"].endswith(" s")
    failed = row(record, "pseudonymizer")["state"]
    assert failed.startswith("failed: ") and "400" in failed, record
    assert record.splitlines()[2].startswith("**State: Failed** — "), "the job's state on top, as job.json has it"
    log = (job_dir / "job.log").read_text()
    first_trace = log.index("Traceback (most recent call last)")
    assert "Traceback" not in log[log.index("ERROR", first_trace) :], "the trace is logged once, by the first run"
    assert "Encountered exception during execution: StepError" in log

    pseudonymizer_fake.state.reset()
    record_facts(job_dir, extraction_submission={"generation": 2, "started_at": "2026-11-23T04:00:00+00:00"})
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK

    record = latest(f"job-{job_dir.name}")["data"]
    outputs = markdown_text(f"outputs in {job_dir / 'pseudonymizer'}")  # shown as itself: its _ are no emphasis
    assert record.splitlines()[2] == f"**State: Completed** — {outputs}"
    facts = record[record.index("## Facts") :]
    assert "- **extraction\\_submission**\n  - **generation**: `2`\n" in facts, facts  # labels as text
    assert not re.search(r"[{\[]'", facts), "facts as text, never a Python dict or list"
    cached = row(record, "local_import")
    assert cached["state"] == "done (cached)" and cached["time"] == first_import["time"], record
    assert row(record, "pseudonymizer")["state"] == "done"
    assert "served from the cache" in record
    # One "Job record" card per flow run (its Artifacts tab), though the record changed at every step boundary,
    # and one card for the job on the Artifacts page (latest per key; ``latest`` finds exactly one).
    cards = versions(f"job-{job_dir.name}")
    runs = job_file(job_dir)["flow_run_ids"]
    assert sorted(str(card.flow_run_id) for card in cards) == sorted(runs), cards
    assert latest(f"job-{job_dir.name}")["id"] == str(max(cards, key=lambda card: card.created).id)


def test_the_record_links_every_artifact_and_a_step_has_one_progress_artifact_updated_at_most_once_a_second(
    pseudonymizer_fake, tmp_path, prefect_api, write_job
):
    config, source = write_job(pseudonymizer_fake.base_url)
    pseudonymizer_fake.state.reset(latency_seconds=LATENCY)

    started = time.monotonic()
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    elapsed = time.monotonic() - started

    (job_dir,) = (tmp_path / "jobs").iterdir()
    progress = latest(f"job-{job_dir.name}-02-pseudonymizer-progress")
    assert progress["type"] == "progress" and progress["data"] == 100.0
    assert progress["description"].startswith("pseudonymizer done: 2 / 2 files, 80 lines"), progress
    assert len(versions(progress["key"])) == 1, "one artifact per step run, updated in place"
    updates = artifact_updates(prefect_api["api_url"], progress["id"], until=lambda event: event["data"] == 100.0)
    # Throttled: at most one update a second while the step runs, then the final 100 at once.
    assert len(updates) - 1 <= elapsed + 1, (len(updates), elapsed)
    # Events are stamped after each request, whose time varies on a loaded machine: a margin below the second.
    times = [datetime.fromisoformat(event["occurred"]) for event in updates[:-1]]
    assert all((later - earlier).total_seconds() >= 0.5 for earlier, later in pairwise(times)), times
    assert len(updates) >= 2, "the step lasts seconds: at least one update before the final one"
    assert [event["data"] for event in updates] == sorted(event["data"] for event in updates), "never goes back"

    record = latest(f"job-{job_dir.name}")["data"]
    pseudonymized = row(record, "pseudonymizer")
    assert float(pseudonymized["time"].removesuffix(" s")) >= 40 * LATENCY, "two requests at once, 80 in all"
    files = step_results(job_dir)[1]["files"]
    assert pseudonymized["size"] == size_text(sum(f["size"] for f in files)), "sizes in KB/MB/GB"
    links = {(label, artifact_key_of(found)) for label, _, found in LINK.findall(pseudonymized["artifacts"])}
    prefix = f"job-{job_dir.name}-02-pseudonymizer"
    assert links == {("files", prefix), ("report", f"{prefix}-report"), ("progress", f"{prefix}-progress")}
    from prefect.settings import get_current_settings

    ui_url = (get_current_settings().ui_url or "").rstrip("/")
    for _, base, artifact_id in LINK.findall(record):
        key = artifact_key_of(artifact_id)
        assert base == ui_url and latest(key)["id"] == artifact_id, f"{key}: the link must open its latest version"
    assert re.search(r"\*\*Step time so far\*\*: \d+\.\d s", record), record


def test_what_to_inspect_is_published_when_the_gate_pauses_and_not_when_it_is_released(tmp_path):
    step = step_input(
        tmp_path / "gate-job", "wait", folder="import", position=1, pipeline__enabled_steps="local_import,wait"
    )

    @flow
    def pause_then_release() -> list[bool]:
        return [wait(step).awaiting, wait(step, note="checked").awaiting]

    assert pause_then_release() == [True, False]
    assert len(versions(f"job-{step.job_id}-inspection")) == 1


def test_progress_outside_a_prefect_run_publishes_nothing():
    with step_progress("job-x-00-local-import-progress", "local_import", StepWork(files=1, size=10)) as aggregate:
        with track("import a", 10) as progress:
            progress.advance(10)
    assert aggregate is None


def test_a_steps_progress_artifact_is_of_its_task_run_though_a_files_task_run_makes_it():
    key = f"job-{uuid4().hex[:8]}-01-local-import-progress"

    @task
    def import_file() -> None:
        with track("import a", 10) as progress:  # the first count: the artifact is made here
            progress.advance(10)

    @task
    def local_import() -> UUID:
        with step_progress(key, "local_import", StepWork(files=1, size=10)):
            import_file()
        return TaskRunContext.get().task_run.id

    @flow
    def job() -> tuple[UUID, UUID]:
        return local_import(), FlowRunContext.get().flow_run.id

    step_run, flow_run = job()
    (artifact,) = versions(key)
    assert (artifact.task_run_id, artifact.flow_run_id) == (step_run, flow_run)
    assert artifact.type == "progress" and artifact.data == 100.0
    assert artifact.description.startswith("local_import done: 1 / 1 files, 10 B, at "), artifact.description


def test_a_refused_progress_artifact_stops_its_updates_never_the_steps_work(caplog, monkeypatch):
    """The key is refused (no capitals): tried at the first count, not again until the step's end."""
    monkeypatch.setattr("tasks.streams.progress.ARTIFACT_EVERY_SECONDS", 0.0)  # else counts are skipped
    key = "Job-X-01-Local-Import-Progress"

    @task
    def local_import() -> int:
        with step_progress(key, "local_import", StepWork(files=3, size=30)):
            for name in "abc":
                with track(f"import {name}", 10) as progress:
                    progress.advance(10)
        return 3

    @flow
    def job() -> int:
        return local_import()

    with caplog.at_level("WARNING", logger="dupflow.progress"):
        assert job() == 3
    refusals = [r.getMessage() for r in caplog.records if r.name == "dupflow.progress"]
    assert len(refusals) == 2, refusals  # at the first count, then once more at the step's end
    assert all(r.startswith(f"progress artifact {key} not updated any more: ") for r in refusals)
    assert not versions(key)


def test_the_sample_job_runs_without_warnings_and_counts_csv_rows_as_rows(tmp_path, write_config, capsys):
    sample = REPO_ROOT / "config" / "sample-data"
    services = {"local_import": {"dir": sample}, "flattening": {"lookup_path": sample / "flatten-lookup.json"}}
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "flattening"]}, "services": services})

    assert main(["start", str(config), str(sample / "crtdl.json"), "--no-progress"]) == EXIT_OK

    (job_dir,) = (tmp_path / "jobs").iterdir()
    log = (job_dir / "job.log").read_text()
    assert " WARNING " not in log, log
    assert "step 2 flattening: 5 files, 14 rows in flattening" in log, log
    record = latest(f"job-{job_dir.name}")["data"]
    assert row(record, "flattening")["contents"] == "14 rows", record
    table = latest(f"job-{job_dir.name}-02-flattening")["data"]
    assert '"contents": "2 rows"' in table and '"name": "Encounter.csv"' in table, table
    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    status = capsys.readouterr().out
    assert re.search(r"\n {7}Encounter\.csv  \S+ \S+  2 rows\n", status), status


# --- helpers ---------------------------------------------------------------------------------------------------


def row(record: str, step: str) -> dict[str, str]:
    """The job record's table row of ``step``, by column name."""
    lines = record.splitlines()
    header = next(line for line in lines if line.startswith("| # |"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    (line,) = [line for line in lines if line.startswith("| ") and f"| {step} |" in line]
    return dict(zip(names, [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))], strict=True))


def latest(key: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    with get_client(sync_client=True) as client:
        (found,) = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key]))
        )
    fields = {"key": found.key, "id": str(found.latest_id), "type": found.type, "data": found.data}
    return fields | {"description": found.description}


def artifact_key_of(artifact_id: str) -> str:
    """The key of one artifact version."""
    from prefect.client.orchestration import get_client

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    with get_client(sync_client=True) as client:
        (found,) = client.read_artifacts(artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[artifact_id])))
    return found.key


def versions(key: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def artifact_updates(api_url: str, artifact_id: str, until, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The ``prefect.artifact.updated`` events of an artifact, oldest first (occurred, data), once ``until`` holds
    for the newest (events reach the server's store asynchronously)."""
    deadline = time.monotonic() + timeout
    body = {
        "filter": {
            "event": {"name": ["prefect.artifact.updated"]},
            "resource": {"id": [f"prefect.artifact.{artifact_id}"]},
            "order": "ASC",
        },
        "limit": 50,
    }
    while True:
        response = httpx.post(f"{api_url}/events/filter", json=body, timeout=10)
        response.raise_for_status()
        events = [{"occurred": e["occurred"], "data": e["payload"].get("data")} for e in response.json()["events"]]
        if events and until(events[-1]):
            return events
        assert time.monotonic() < deadline, f"no final update event of artifact {artifact_id}: {events}"
        time.sleep(0.2)


def test_a_failure_cause_in_the_record_is_one_line_with_secrets_redacted():
    from flows.job_card import one_line
    from tasks.core.redaction import register_secret

    register_secret("record-secret-4711")
    cause = one_line(RuntimeError("token record-secret-4711 was refused | try again\nsecond line"))

    assert "record-secret-4711" not in cause and "\n" not in cause and "\\|" in cause


def test_a_failure_cause_is_shown_whole_up_to_a_few_kilobytes_then_cut_at_a_word():
    """The card cut a cause at its first line and 300 characters (mid-word, no mark) where the terminal showed it
    whole: the hint at its end, the fix, was lost."""
    from flows.job_card import one_line_text
    from tasks.core.readable import CAUSE_CHARS

    cause = "services.send.url answered HTTP 413\n" + "the body is too large " * 40 + "; set services.send.batch_size"
    shown = one_line_text(cause)
    assert shown.endswith("set services.send.batch\\_size") and "\n" not in shown and len(shown) > 900

    long = one_line_text("word " * CAUSE_CHARS)
    assert long.endswith("word…") and len(long) <= CAUSE_CHARS
