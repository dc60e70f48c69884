"""What the run's stop watch takes for a Suspend in the UI (``flows.job_stop``)."""

from prefect._flow_run_suspension import FlowRunSuspensionRequest
from prefect.states import Suspended

from flows.job_stop import suspension_from_the_ui


def requested(state) -> FlowRunSuspensionRequest:
    request = FlowRunSuspensionRequest()
    request.mark_requested(state)
    return request


def test_a_wait_steps_own_suspension_is_no_suspend_from_the_ui():
    """Prefect's observer tells the wait step's own suspension too: taken for a Suspend, the job ended
    "suspended on the Prefect server" instead of "awaiting inspection" (seen once in a loaded CI run)."""
    for key in ("wait-02-1", "wait-02-3", "wait-02"):  # its run count (a Retry's new key); an earlier version's
        assert suspension_from_the_ui(requested(Suspended(pause_key=key))) is None, key
    assert suspension_from_the_ui(FlowRunSuspensionRequest()) is None
    assert suspension_from_the_ui(None) is None


def test_a_suspension_under_any_other_key_or_none_is_a_suspend_from_the_ui():
    for key in (None, "ui-suspend", "wait-02-extra", "await-02"):
        state = Suspended(pause_key=key)
        assert suspension_from_the_ui(requested(state)) is state, key
