"""Serve the dupflow flow as a Prefect deployment, optionally on a schedule.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.serve CONFIG [INPUT] [--cron "0 2 * * *"]

Each scheduled run is a new job (a new job id) with CONFIG and INPUT as parameters; secrets come from the
serving process's environment (``${VAR}`` / ``APP_*``), never from the deployment's parameters. A run that
reaches a ``wait`` step pauses; press Resume in the UI to continue it. Scheduling needs a real Prefect server.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from config.runtime import apply_prefect_defaults
from flows.pipeline import pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="configuration YAML")
    parser.add_argument("input", nargs="?", help="job input (directory, CRTDL file or URL)")
    parser.add_argument("--name", default="dupflow", help="deployment name")
    parser.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *'")
    args = parser.parse_args()
    apply_prefect_defaults()
    job_input = args.input if args.input is None or "://" in args.input else str(Path(args.input).resolve())
    pipeline.serve(
        name=args.name,
        cron=args.cron,
        parameters={"config_path": str(Path(args.config).resolve()), "job_input": job_input},
    )


if __name__ == "__main__":
    main()
