"""The commands dupflow prints (``continue``, ``status``) work where the user typed the command that printed them:
in the clone (``uv run python -m flows.run``), from another folder (``uv run --project CLONE …``), and with the
project's environment active (``dupflow``, ``python -m flows.run``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO_ROOT, plain

pytestmark = pytest.mark.slow  # subprocesses, and a Prefect server for the job
PRINT_CLI = "import sys; sys.argv[0] = sys.argv[1]; from config.runtime import CLI; print(CLI)"
CLONE = shlex.quote(str(REPO_ROOT))


def uv() -> str:
    return os.environ.get("UV", "uv")  # the uv that runs this suite (uv run sets UV)


def environment(**changes: str | None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    for name, value in changes.items():
        env.pop(name, None) if value is None else env.__setitem__(name, value)
    return env


@pytest.mark.parametrize(
    ("folder", "through_uv", "program", "printed"),
    [
        ("clone", True, "/clone/.venv/bin/flows/run.py", "uv run python -m flows.run"),
        ("clone", True, "/clone/.venv/bin/dupflow", "uv run dupflow"),
        ("elsewhere", True, "/clone/flows/run.py", f"uv run --project {CLONE} python -m flows.run"),
        ("elsewhere", True, "/clone/.venv/bin/dupflow", f"uv run --project {CLONE} dupflow"),
        ("elsewhere", False, "/clone/.venv/bin/dupflow", "dupflow"),
        ("elsewhere", False, "/clone/flows/run.py", "python -m flows.run"),
    ],
)
def test_the_printed_command_is_the_one_that_ran(tmp_path, folder, through_uv, program, printed):
    cwd = REPO_ROOT / "tests" if folder == "clone" else tmp_path
    env = environment(UV_RUN_RECURSION_DEPTH="1" if through_uv else None)
    shown = subprocess.run(
        [sys.executable, "-c", PRINT_CLI, program], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.stdout.strip() == printed, shown.stderr


def test_a_continue_printed_in_another_folder_runs_there_as_typed(tmp_path, prefect_api):
    """A job started from another folder with ``uv run --project CLONE``: its wait step prints how to continue,
    and that line, typed in the same folder, completes the job (``uv run python -m flows.run`` finds no project
    there)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.ndjson").write_text('{"resourceType":"Patient","id":"p1"}\n')
    tree = {"jobs_dir": tmp_path / "jobs", "pipeline": {"enabled_steps": ["local_import", "wait"]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(plain(tree)))
    env = environment()
    started = subprocess.run(
        [uv(), "run", "--project", str(REPO_ROOT), "python", "-m", "flows.run", "start", "job.yaml", "in"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr
    said = started.stdout + started.stderr
    typed = said.split("to go on: Resume in the Prefect UI, or run: ", 1)[1].split("\n", 1)[0]
    assert typed.startswith(f"uv run --project {CLONE} python -m flows.run continue "), said
    continued = subprocess.run(
        typed.replace("uv run", shlex.quote(uv()) + " run", 1),
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert continued.returncode == 0 and "Completed" in continued.stdout + continued.stderr, continued.stderr
