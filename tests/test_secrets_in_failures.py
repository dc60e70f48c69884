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

from flows.run_logging import keep_one_trace_per_failure
from tasks.core.redaction import register_basic_credentials, register_secret
from tasks.job.contract import StepResult, step_task
from tests.steps import step_input
from tests.support.filesystem import files_under
from tests.support.leaks import database_texts, forms

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

API_KEY = "key-5e0b7d-echoed-in-a-401"
USER, PASSWORD = "researcher", "pw-1c2f9a-echoed"


LEAKS = [*forms(API_KEY), *forms(PASSWORD), *forms(f"{USER}:{PASSWORD}")]


@step_task("echoing")
def echoing(step) -> StepResult:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    raise RuntimeError(f"401 from the server: {{'x-api-key': '{API_KEY}', 'authorization': 'Basic {basic}'}}")


@flow
def failing(step) -> StepResult:
    keep_one_trace_per_failure()
    return echoing(step)


def test_a_secret_in_an_exception_text_reaches_no_row_of_the_prefect_database_and_no_file(tmp_path, prefect_api):
    register_secret(API_KEY)
    register_basic_credentials(USER, PASSWORD)
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
