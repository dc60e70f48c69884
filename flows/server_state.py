"""Read a job's newest flow-run state from a Prefect server over its REST API (no Prefect import)."""

from __future__ import annotations

import httpx

from config.runtime import prefect_api_url


def latest_flow_run_state(job_id: str, timeout: float = 2.0) -> str | None:
    """``"<state name> (flow run <id>)"`` of the newest flow run tagged ``job-<id>``, or None if unknown."""
    api = prefect_api_url()
    if api is None:
        return None
    body = {"flow_runs": {"tags": {"all_": [f"job-{job_id}"]}}, "sort": "EXPECTED_START_TIME_DESC", "limit": 1}
    try:
        response = httpx.post(f"{api.rstrip('/')}/flow_runs/filter", json=body, timeout=timeout)
        response.raise_for_status()
        runs = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not runs:
        return None
    run = runs[0]
    return f"{run.get('state_name') or run.get('state', {}).get('name')} (flow run {run['id']})"
