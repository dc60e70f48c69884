"""Read jobs' newest flow-run states from a Prefect server over its REST API (no Prefect import)."""

from __future__ import annotations

import httpx

from config.runtime import prefect_api_url
from tasks.job.layout import job_of_tag, job_tag

PAGE = 200  # the most flow runs the API returns at once


def latest_states(job_ids: list[str], timeout: float = 2.0) -> dict[str, str]:
    """The newest flow run's state name per job, in one request per ``PAGE`` jobs; jobs the server does not know
    (or whose request failed) are left out."""
    api = prefect_api_url()
    states: dict[str, str] = {}
    for start in range(0, len(job_ids) if api else 0, PAGE):
        page = job_ids[start : start + PAGE]
        tags = [job_tag(job_id) for job_id in page]
        body = {"flow_runs": {"tags": {"any_": tags}}, "sort": "EXPECTED_START_TIME_DESC", "limit": PAGE}
        try:
            response = httpx.post(f"{api.rstrip('/')}/flow_runs/filter", json=body, timeout=timeout)
            runs = response.raise_for_status().json()
        except (httpx.HTTPError, ValueError):
            continue
        for run in runs:  # newest first: the first run naming a job is its newest
            name = run.get("state_name") or (run.get("state") or {}).get("name")
            for job_id in map(job_of_tag, run.get("tags") or []):
                if job_id in page and job_id not in states:
                    states[job_id] = name
    return states
