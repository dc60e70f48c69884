"""Nothing phones home: Prefect's SDK telemetry (``DO_NOT_TRACK``) is off before Prefect is first imported, in every
entry point of this repository, unless the user set it. Prefect decides at its import (``prefect/__init__`` →
``initialize_analytics``), and only in a terminal: so each command runs here in a pseudo-terminal, in a fresh
PREFECT_HOME, without ``DO_NOT_TRACK`` or a CI variable (which also turns it off), and Prefect's own analytics state
is read at its end (``tests/support/telemetry_probe.py``)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prefect._internal.analytics.ci_detection import CI_ENV_VARS
from prefect._internal.analytics.notice import NOTICE_TEXT

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

ENTRY_MODULES = ("flows.run", "deployments.serve", "deployments.automations.apply")
NOTICE = NOTICE_TEXT.strip().splitlines()[0]  # "Prefect collects anonymous usage data to improve the product."


def in_a_terminal(args: list[str], env: dict[str, str], timeout: float = 240.0) -> tuple[int, str]:
    """``args`` run with a pseudo-terminal as stdin, stdout and stderr, as typed in one; its exit code and output."""
    main, terminal = pty.openpty()
    process = subprocess.Popen(args, stdin=terminal, stdout=terminal, stderr=terminal, cwd=REPO_ROOT, env=env)
    os.close(terminal)
    output, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([main], [], [], 0.1)[0]:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: the terminal's last writer ended
                    break
                output += chunk
                if not chunk:
                    break
            elif process.poll() is not None:
                break
        else:
            process.kill()
            raise AssertionError(f"{args[3:]} did not end within {timeout} s: {output.decode(errors='replace')}")
    finally:
        os.close(main)
    return process.wait(30), output.decode(errors="replace")


def untracked_environment(tmp_path: Path, prefect_api: dict) -> dict[str, str]:
    """The caller's environment without what turns Prefect's telemetry off (DO_NOT_TRACK, CI variables), a fresh
    PREFECT_HOME, and the test run's Prefect server."""
    cleared = {"DO_NOT_TRACK", *CI_ENV_VARS}
    env = {name: value for name, value in os.environ.items() if name not in cleared}
    return env | {
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_API_URL": prefect_api["api_url"],
        "PYTHONPATH": str(REPO_ROOT),
        "TELEMETRY_PROBE_REPORT": str(tmp_path / "telemetry.json"),
    }


def missing_block_automation(tmp_path: Path) -> str:
    action = {"type": "send-notification", "block_document_id": "no-such-block", "subject": "s", "body": "b"}
    automation = {"name": "telemetry probe", "trigger": {"type": "event", "expect": ["x"]}, "actions": [action]}
    path = tmp_path / "automations.yaml"
    path.write_text(yaml.safe_dump({"automations": [automation]}))
    return str(path)


@pytest.mark.parametrize(
    ("module", "arguments", "exit_code"),
    [
        ("flows.run", lambda tmp: ["start", "--set", f"jobs_dir={tmp / 'jobs'}"], 0),
        ("deployments.serve", lambda tmp: [str(REPO_ROOT / "config" / "default.yaml"), "--cron", "bogus"], 2),
        ("deployments.automations.apply", lambda tmp: [missing_block_automation(tmp)], 1),
    ],
    ids=["start", "serve", "automations-apply"],
)
def test_no_entry_point_starts_prefects_telemetry(prefect_api, tmp_path, module, arguments, exit_code):
    """An interactive start showed Prefect's telemetry notice and started its sending thread: Prefect was imported
    (by the step registry, checking the job's input) before DO_NOT_TRACK was set, when a job's logging began."""
    env = untracked_environment(tmp_path, prefect_api)
    probe = [sys.executable, "-m", "tests.support.telemetry_probe", module]
    code, output = in_a_terminal([*probe, *arguments(tmp_path)], env)

    report = json.loads((tmp_path / "telemetry.json").read_text())
    assert code == exit_code, output
    assert report["prefect_imported"] and report["do_not_track_at_import"] == "1", report
    assert report["enabled"] is False and report["service_thread_started"] is False, report
    assert "prefect-analytics" not in report["threads"], report
    assert NOTICE not in output, output
    assert not (tmp_path / "prefect-home" / ".sdk_telemetry" / "notice_shown").exists()


def test_a_users_own_do_not_track_wins(prefect_api, tmp_path):
    env = untracked_environment(tmp_path, prefect_api) | {"DO_NOT_TRACK": "0"}
    probe = [sys.executable, "-m", "tests.support.telemetry_probe", "deployments.serve"]
    code, output = in_a_terminal([*probe, str(REPO_ROOT / "config" / "default.yaml"), "--cron", "bogus"], env)

    assert code == 2, output
    assert json.loads((tmp_path / "telemetry.json").read_text())["do_not_track_at_import"] == "0"


def test_no_entry_module_imports_prefect_before_its_main_turns_telemetry_off():
    """The class: an entry point's ``main`` turns telemetry off first (``apply_process_defaults``), so nothing that is
    imported with its module may import Prefect."""
    listed = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))"
    done = subprocess.run(
        [sys.executable, "-c", f"import {', '.join(ENTRY_MODULES)}; {listed}"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)
