"""Serve the dupflow flow as a Prefect deployment from here, maybe on a schedule.

    uv run python -m deployments.serve CONFIG [INPUT] [--name N] [--cron C --timezone Z]

Each run is a job with CONFIG and INPUT as parameters (docs/operations.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from config.loader import load_settings
from config.runtime import apply_process_defaults
from config.yaml_file import names_secret_blocks
from flows.jobs import check_new_job, frozen_input
from flows.prefect_server import use_server
from tasks.core.errors import DupflowError

DESCRIPTION = "dupflow: one job per run (extract, pseudonymize, inspect, validate, flatten, send)"

if TYPE_CHECKING:
    from prefect.schedules import Schedule


def main() -> None:
    apply_process_defaults()  # before anything imports Prefect: it decides telemetry at import
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("config", help="configuration YAML")
    parser.add_argument("input", nargs="?", help="job input (directory, CRTDL file or URL)")
    parser.add_argument("--name", default="dupflow", help="deployment name")
    parser.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *'")
    parser.add_argument(
        "--timezone", default="UTC", help="time zone of the cron schedule, e.g. Europe/Berlin"
    )
    args = parser.parse_args()
    from prefect.client.schemas.objects import ConcurrencyLimitConfig

    schedule = checked_schedule(args)
    from flows.heartbeats import ensure_crash_detection
    from flows.pipeline import pipeline

    ensure_crash_detection()  # before a run's first heartbeat; if it cannot, each run says why
    job_input = args.input and frozen_input(args.input)
    parameters = {"config_path": str(Path(args.config).resolve()), "job_input": job_input}
    # One job at a time: a restart's missed run and the current one are queued (the config's
    # default collision strategy, ENQUEUE), never two extractions at once.
    one_at_a_time = ConcurrencyLimitConfig(limit=1)
    pipeline.serve(  # stopped, it pauses its schedules (Prefect's pause_on_shutdown)
        name=args.name,
        schedules=[schedule] if schedule else None,
        parameters=parameters,
        description=DESCRIPTION,
        global_limit=one_at_a_time,
    )


def checked_schedule(args: argparse.Namespace) -> Schedule | None:
    """The schedule, once configuration, input and schedule are checked; else exit 2.

    Why: checked before they become the deployment's parameters, as every scheduled run would
    fail on them. Then the jobs' server is used, as ``start`` finds or starts it (a temporary one
    would schedule nothing).
    """
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron

    try:
        if names_secret_blocks(args.config):
            use_server()  # its Secret blocks are read from the jobs' server
        load_settings(args.config)
        if args.input is not None:  # else each run gives its input in the form
            check_new_job(args.config, args.input, {})  # a missing CRTDL or folder, credentials
        if schedule := Cron(args.cron, timezone=args.timezone) if args.cron else None:
            CronSchedule(cron=args.cron, timezone=args.timezone)  # Cron is read at the start
        use_server()
    except (DupflowError, ValueError) as exc:  # ValueError: a cron or time zone Prefect refuses
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        cron = f"--cron {args.cron!r} --timezone {args.timezone!r}: {reason}"
        print(f"error: {exc if isinstance(exc, DupflowError) else cron}", file=sys.stderr)
        sys.exit(2)
    return schedule


if __name__ == "__main__":
    main()
