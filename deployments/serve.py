"""Serve the dupflow flow as a Prefect deployment from this process, optionally on a schedule.

    PREFECT_API_URL=http://127.0.0.1:4200/api uv run python -m deployments.serve CONFIG [INPUT] \\
        [--name dupflow] [--cron "0 2 * * *" --timezone Europe/Berlin]

Each run is a job of its own (its job id is the run's id, and the run's name from the flow's first log line) with
CONFIG and INPUT as parameters; relative paths in CONFIG resolve against CONFIG's directory. Secrets come from this
process's environment (``${VAR}`` / ``APP_*``), never from the parameters. A run at a ``wait`` step is suspended;
Resume in the UI continues it. Work pool and workers instead: ``deployments/prefect.yaml``. A dead
``PREFECT_API_URL``: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from config.runtime import apply_prefect_defaults, prefect_api_url
from flows.prefect_server import ApiUnreachableError, require_answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="configuration YAML")
    parser.add_argument("input", nargs="?", help="job input (directory, CRTDL file or URL)")
    parser.add_argument("--name", default="dupflow", help="deployment name")
    parser.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *'")
    parser.add_argument("--timezone", default="UTC", help="time zone of the cron schedule, e.g. Europe/Berlin")
    args = parser.parse_args()
    apply_prefect_defaults()
    if api_url := prefect_api_url():
        try:
            require_answer(api_url)
        except ApiUnreachableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
    from prefect.schedules import Cron

    from flows.pipeline import pipeline

    job_input = args.input if args.input is None or "://" in args.input else str(Path(args.input).resolve())
    pipeline.serve(
        name=args.name,
        schedules=[Cron(args.cron, timezone=args.timezone)] if args.cron else None,
        parameters={"config_path": str(Path(args.config).resolve()), "job_input": job_input},
        description="dupflow: one job per run (extract, pseudonymize, inspect, validate, flatten, send)",
        pause_on_shutdown=False,
    )


if __name__ == "__main__":
    main()
