"""A secret in an exception's text (a service quoting a credential back, a library quoting a header) reaches no
record sent to Prefect's API: not Prefect's own "Task run failed with exception" log record with its traceback,
not the failed state's message, not the failure's result record in the job directory."""

from __future__ import annotations

import base64
import time

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from config.settings import TaskRunnerSettings
from flows.run_logging import keep_one_trace_per_failure
from tasks.core.redaction import basic_token, register_secret
from tasks.job.contract import DataFile, StepInput, StepResult, file_task, settings_of, step_task
from tasks.job.filework import file_runner, map_files
from tests.steps import step_input
from tests.support.filesystem import files_under
from tests.support.leaks import database_texts, forms

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

API_KEY = "key-5e0b7d-echoed-in-a-401"
USER, PASSWORD = "researcher", "pw-1c2f9a-echoed"


LEAKS = [*forms(API_KEY), *forms(PASSWORD), *forms(f"{USER}:{PASSWORD}")]
WORKER_KEY = "key-93c4e1-quoted-on-a-worker"


@step_task("echoing")
def echoing(step) -> StepResult:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    raise RuntimeError(f"401 from the server: {{'x-api-key': '{API_KEY}', 'authorization': 'Basic {basic}'}}")


@flow
def failing(step) -> StepResult:
    keep_one_trace_per_failure()
    return echoing(step)


def failure_records_arrived(flow_run_id, *words: str) -> None:
    """Wait until the API holds a log record of ``flow_run_id`` (its task runs' included) naming all ``words``: the
    session's server holds other tests' logs too, and records arrive in batches."""
    this_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 30
        while not any(all(w in log.message for w in words) for log in client.read_logs(log_filter=this_run)):
            assert time.monotonic() < deadline, "Prefect's failure record never arrived"
            time.sleep(0.2)


def test_a_secret_in_an_exception_text_reaches_no_row_of_the_prefect_database_and_no_file(tmp_path, prefect_api):
    register_secret(API_KEY)
    register_secret(PASSWORD)
    register_secret(basic_token(f"{USER}:{PASSWORD}"))
    state = failing(step_input(tmp_path / "job", "echoing"), return_state=True)
    assert state.is_failed()
    # the API has this run's failure records before we look (the session's server holds other tests' logs too)
    this_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 30
        while not any("failed" in log.message for log in client.read_logs(log_filter=this_run)):
            assert time.monotonic() < deadline, "Prefect's failure record never arrived"
            time.sleep(0.2)
    rows = database_texts(prefect_api["database"])
    assert b"Task run failed with exception" in rows or b"encountered an exception" in rows
    home = prefect_api["database"].parent
    stores = {p: p.read_bytes() for p in [*files_under(tmp_path / "job"), *files_under(home)] if p.is_file()}
    for leak in LEAKS:
        assert leak not in rows, f"{leak!r} in the Prefect database"
        for path, content in stores.items():
            assert leak not in content, f"{leak!r} in {path}"


@file_task("quoting-on-a-worker", "quoting[{name}]")
def quoting_on_a_worker(step: StepInput, name: str) -> DataFile:
    """A file task on a Dask worker: the step's settings, loaded there, register the API key; a library quotes the
    key in the error beneath the step's own (h11 refusing a header value), so only the traceback shows it."""
    key = settings_of(step).services.pseudonymizer.auth.api_key.get_secret_value()
    try:
        raise ValueError(f"Illegal header value b'{key}'")
    except ValueError as exc:
        raise RuntimeError(f"{name}: the request could not be sent") from exc


def test_a_secret_in_the_cause_of_a_failure_on_a_dask_worker_reaches_no_row_of_the_prefect_database(
    tmp_path, write_config, prefect_api
):
    """A Dask worker is a process of its own: the records Prefect sends from there (a failure with its traceback,
    the cause's text in it) are redacted as the flow process's are."""
    from prefect import flow

    tree = {
        "pipeline": {"enabled_steps": ["local_import"]},
        "services": {"pseudonymizer": {"auth": {"api_key": WORKER_KEY}}},
    }
    job_dir = tmp_path / "jobs" / "dask-job"
    step = StepInput(
        job_id=job_dir.name, job_dir=str(job_dir), position=0, step="local_import", config_path=str(write_config(tree))
    )

    @flow(persist_result=False)
    def fan_out() -> list:
        keep_one_trace_per_failure()
        with file_runner(TaskRunnerSettings(kind="dask", dask_workers=1), tmp_path / "job.log"):
            return map_files(quoting_on_a_worker, [(step, "a.ndjson")], workers=1)

    state = fan_out(return_state=True)
    (outcome,) = state.result()
    assert isinstance(outcome, RuntimeError), outcome
    failure_records_arrived(state.state_details.flow_run_id, "Task run failed with exception", "could not be sent")
    rows = database_texts(prefect_api["database"])
    assert b"Illegal header value" in rows  # the traceback with its cause was sent
    assert b"Illegal header value" in (tmp_path / "job.log").read_bytes()
    written = [tmp_path / "job.log", *files_under(tmp_path / "jobs")]  # all but the configuration file
    stores = {p: p.read_bytes() for p in written if p.is_file()}
    for leak in forms(WORKER_KEY):
        assert leak not in rows, f"{leak!r} in the Prefect database"
        for path, content in stores.items():
            assert leak not in content, f"{leak!r} in {path}"
