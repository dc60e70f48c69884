"""Read jobs' newest flow-run states from a Prefect server over its REST API (no Prefect import)."""

from __future__ import annotations

import httpx

from config.runtime import prefect_api_url
from tasks.job.layout import job_of_tag, job_tag

PAGE = 200  # the most flow runs the API returns at once


def latest_states(job_ids: list[str], timeout: float = 2.0) -> dict[str, str]:
    """The newest flow run's state name per job (jobs the server does not know are left out), in one request
    per ``PAGE`` jobs."""
    states: dict[str, str] = {}
    for start in range(0, len(job_ids), PAGE):
        runs = _newest_runs(job_ids[start : start + PAGE], limit=PAGE, timeout=timeout)
        states |= {job_id: run["state_name"] for job_id, run in runs.items()}
    return states


def _newest_runs(job_ids: list[str], limit: int, timeout: float) -> dict[str, dict]:
    api = prefect_api_url()
    if api is None or not job_ids:
        return {}
    body = {
        "flow_runs": {"tags": {"any_": [job_tag(job_id) for job_id in job_ids]}},
        "sort": "EXPECTED_START_TIME_DESC",
        "limit": limit,
    }
    try:
        response = httpx.post(f"{api.rstrip('/')}/flow_runs/filter", json=body, timeout=timeout)
        response.raise_for_status()
        runs = response.json()
    except (httpx.HTTPError, ValueError):
        return {}
    newest: dict[str, dict] = {}
    for run in runs:
        name = run.get("state_name") or (run.get("state") or {}).get("name")
        for tag in run.get("tags") or []:
            job_id = job_of_tag(tag)
            if job_id in job_ids and job_id not in newest:
                newest[job_id] = {"id": run["id"], "state_name": name}
    return newest
