"""Serve the dupflow flow as a Prefect deployment from this process, optionally on a schedule.

    uv run python -m deployments.serve CONFIG [INPUT] [--name dupflow] [--cron "0 2 * * *" --timezone Europe/Berlin]

Each run is a job of its own (its job id the run's id) with CONFIG and INPUT as parameters; secrets come from this
process's environment (``${VAR}`` / ``APP_*``). A run at a ``wait`` step is suspended; Resume in the UI continues it.
Work pool and workers instead: ``deployments/prefect.yaml``. It serves on the jobs' server, as ``start`` finds it (a
temporary one would schedule nothing). What ``start`` would refuse, or an unreadable schedule: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from config.loader import load_settings
from config.runtime import apply_process_defaults
from config.yaml_file import names_secret_blocks
from flows.jobs import check_new_job
from flows.prefect_server import use_server
from tasks.core.errors import DupflowError


def main() -> None:
    apply_process_defaults()  # before anything imports Prefect: its telemetry is decided at its import
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="configuration YAML")
    parser.add_argument("input", nargs="?", help="job input (directory, CRTDL file or URL)")
    parser.add_argument("--name", default="dupflow", help="deployment name")
    parser.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *'")
    parser.add_argument("--timezone", default="UTC", help="time zone of the cron schedule, e.g. Europe/Berlin")
    args = parser.parse_args()
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron

    try:
        if names_secret_blocks(args.config):
            use_server()  # its Secret blocks are read from the jobs' server
        # Checked before they become the deployment's parameters: every scheduled run would fail on them.
        load_settings(args.config)
        if args.input is not None:  # else each run gives its input in the form
            check_new_job(args.config, args.input, {})  # a missing CRTDL or data folder, an INPUT with credentials
        if schedule := Cron(args.cron, timezone=args.timezone) if args.cron else None:
            CronSchedule(cron=args.cron, timezone=args.timezone)  # read now: Cron is read when the runner starts
        use_server()  # the jobs' server, as start finds or starts it: a temporary one schedules nothing
    except (DupflowError, ValueError) as exc:  # a ValueError: a cron expression or time zone Prefect cannot read
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        said = exc if isinstance(exc, DupflowError) else f"--cron {args.cron!r} --timezone {args.timezone!r}: {reason}"
        print(f"error: {said}", file=sys.stderr)
        sys.exit(2)
    from flows.heartbeats import ensure_crash_detection
    from flows.pipeline import pipeline

    ensure_crash_detection()  # before a run's first heartbeat; if it cannot, each run's own try says why

    job_input = args.input if args.input is None or "://" in args.input else str(Path(args.input).resolve())
    parameters = {"config_path": str(Path(args.config).resolve()), "job_input": job_input}
    description = "dupflow: one job per run (extract, pseudonymize, inspect, validate, flatten, send)"
    schedules = [schedule] if schedule else None
    # One job at a time: a restart's missed run and the current one are queued, never two extractions at once.
    one_at_a_time = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
    pipeline.serve(  # stopped, it pauses its schedules (Prefect's pause_on_shutdown)
        name=args.name,
        schedules=schedules,
        parameters=parameters,
        description=description,
        global_limit=one_at_a_time,
    )


if __name__ == "__main__":
    main()
