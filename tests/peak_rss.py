"""The peak RSS of a command (and of the processes it waited for), measured so that it holds inside a big test process.

A child forked from a large process (a pytest worker that holds Prefect, fakes and what earlier tests left) carries
the parent's resident pages into its own peak: Linux keeps the pre-``exec`` figure in ``ru_maxrss``, so ``os.wait4``
on a command started straight from the test reported the test worker's 500 MB, not the command's. Here the command
is started by a small launcher (``python -m tests.peak_rss REPORT -- COMMAND…``, about 10 MB), whose ``os.wait4``
gives the command's own peak; the launcher writes it to REPORT as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    returncode: int
    peak_mb: float


def run_measured(command: list[str], *, timeout: float, **popen_options) -> Measured:
    """Run ``command`` (``popen_options`` as for ``subprocess.Popen``: cwd, env, stdout, stderr) under the
    launcher; its exit code and peak RSS in MB. Past ``timeout`` seconds the whole process group is killed and the
    test fails."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "peak.json"
        launcher = subprocess.Popen(
            [sys.executable, "-m", "tests.peak_rss", str(report), "--", *command],
            start_new_session=True,
            **popen_options,
        )
        try:
            launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
            raise AssertionError(f"{command[:4]}… still running after {timeout} s: killed") from None
        measured = json.loads(report.read_text())
    return Measured(measured["returncode"], measured["peak_kb"] / 1024)


def main(argv: list[str]) -> int:
    report, separator, *command = argv
    assert separator == "--", "usage: python -m tests.peak_rss REPORT -- COMMAND…"
    child = subprocess.Popen(command)
    _, status, usage = os.wait4(child.pid, 0)
    returncode = os.waitstatus_to_exitcode(status)
    Path(report).write_text(json.dumps({"returncode": returncode, "peak_kb": usage.ru_maxrss}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
