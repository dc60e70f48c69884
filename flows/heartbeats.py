"""Crash detection: a job whose process dies shows Crashed on the server by itself.

See docs/development.md#crash-detection.
"""

from typing import Final

import httpx
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore

from config.runtime import CLI

AUTOMATION_NAME = "dupflow: a job's flow run whose heartbeats stopped is Crashed"
CRASHED_AFTER_SECONDS = 90  # three heartbeats: one late beat on a loaded machine is no crash
# a run that sends no more beats
ENDS = ("Completed", "Failed", "Cancelled", "Crashed", "Paused", "Suspended")
CRASH_DETECTION = {
    "name": AUTOMATION_NAME,
    "description": (
        "Prefect's zombie-run recipe for the flow dupflow: a killed job's run shows Crashed."
    ),
    "trigger": {
        "type": "event",
        "posture": "Proactive",
        "after": ["prefect.flow-run.heartbeat"],
        "expect": ["prefect.flow-run.heartbeat", *(f"prefect.flow-run.{state}" for state in ENDS)],
        "match": {"prefect.resource.id": "prefect.flow-run.*"},
        "match_related": {"prefect.resource.role": "flow", "prefect.resource.name": "dupflow"},
        "for_each": ["prefect.resource.id"],
        "threshold": 1,
        "within": CRASHED_AFTER_SECONDS,
    },
    "actions": [
        {
            "type": "change-flow-run-state",
            "state": "CRASHED",
            "message": f"no heartbeat from the job's process for {CRASHED_AFTER_SECONDS} s "
            f"(killed, or its machine stopped); resume it with: {CLI} continue JOB (the job id is "
            "this flow run's name)",
        }
    ],
}
_ensured_on: Final[set[str]] = set()  # the API URLs this process found holding the automation


def ensure_crash_detection() -> str | None:
    """Make the automation unless the server has it; return why it could not.

    Note:
    - Of two made at once, the newer goes.
    - Where dupflow starts a job's run (``start``, ``continue``, ``serve``) it is made before the
      run exists: the engine sends the first heartbeat before the flow's first line, a beat the
      server saw before the automation starts no watch, and a job killed before its second beat
      would stay Running. The flow makes it too, for a worker's run.
    """
    try:
        with get_client(sync_client=True) as client:
            api_url = str(client.api_url)  # asked once: by the command line, then by its flow
            if api_url not in _ensured_on and not client.read_automations_by_name(AUTOMATION_NAME):
                client.create_automation(AutomationCore.model_validate(CRASH_DETECTION))
                for extra in client.read_automations_by_name(AUTOMATION_NAME)[:-1]:  # newest first
                    client.delete_automation(extra.id)
    except (OSError, httpx.HTTPError) as exc:
        return str(exc)
    _ensured_on.add(api_url)
    return None
