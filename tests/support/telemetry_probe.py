"""Run an entry point as ``python -m MODULE ARGS`` does, then write what Prefect's SDK telemetry did in this process
to the JSON file ``$TELEMETRY_PROBE_REPORT``: ``python -m tests.support.telemetry_probe MODULE ARGS...``.

The report is read from Prefect's own analytics state, not guessed: ``DO_NOT_TRACK`` as it was when Prefect was
first imported (when ``prefect/__init__`` initializes its analytics), whether its analytics service started its
sending thread, and whether telemetry counts as enabled at the end."""

from __future__ import annotations

import importlib.abc
import json
import os
import runpy
import sys

seen: dict[str, object] = {"prefect_imported": False}


class FirstPrefectImport(importlib.abc.MetaPathFinder):
    """Records the environment at the moment ``prefect`` is first imported, then steps aside."""

    def find_spec(self, name, path, target=None):
        if name == "prefect":
            sys.meta_path.remove(self)
            seen.update(prefect_imported=True, do_not_track_at_import=os.environ.get("DO_NOT_TRACK"))
        return None


def report() -> dict[str, object]:
    if "prefect._internal.analytics" not in sys.modules:
        return seen
    from prefect._internal import analytics
    from prefect._internal.analytics.service import AnalyticsService

    service = AnalyticsService._instance
    return seen | {
        "enabled": analytics.is_telemetry_enabled(),
        "service_thread_started": bool(service is not None and service._started),
        "threads": sorted({thread.name for thread in __import__("threading").enumerate()}),
    }


def main() -> None:
    module, sys.argv = sys.argv[1], sys.argv[1:]
    sys.meta_path.insert(0, FirstPrefectImport())
    code: object = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        with open(os.environ["TELEMETRY_PROBE_REPORT"], "w") as out:
            json.dump(report() | {"exit": code}, out)
    sys.exit(code)


if __name__ == "__main__":
    main()
