"""Every command the README shows exists as typed: its module, its sub-command and its flags.

The README's commands are taken from its code blocks and its inline code (everything that starts with
``uv run``). Each is checked without side effects: ``python -m flows.run …`` through the command line's own parser,
other ``python -m`` modules by import spec, ``prefect …`` and ``dask …`` by asking that sub-command for ``--help``
(all at once, in parallel processes), ``python -c`` by compiling its code. A README command of a new shape fails
here until this test learns to check it. Running the commands for real is the other tests' work (the Quick start
is ``test_flattening_sample``, the servers and deployments ``test_prefect_server`` and ``test_deployments``).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from flows.run import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"
BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"
UV_RUN_FLAGS = {"--locked", "--no-dev"}
JOB_ID = "3f2b9c1e-0000-4000-8000-000000000000"
# README placeholders and what stands in for them when a command is parsed.
PLACEHOLDERS = {"JOB": JOB_ID, "<job id>": JOB_ID, "CONFIG": "job.yaml", "FILE": "notify.yaml", "TEXT": "checked"}
OPTIONAL = re.compile(r"\s\[[^\]]*\]")


def readme_commands() -> list[str]:
    """Every ``uv run …`` command of the README, from its shell blocks and its inline code, each once."""
    text = README.read_text(encoding="utf-8")
    found: list[str] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        found += [part.strip() for line in block.splitlines() for part in line.split("&&")]
    found += [span.strip() for span in re.findall(r"`([^`\n]*uv run[^`\n]*)`", text)]
    commands = [_from_uv_run(command) for command in found if "uv run" in command]
    return list(dict.fromkeys(command for command in commands if command and "…" not in command))


def _from_uv_run(command: str) -> str:
    """What follows ``uv run`` and its own flags, environment assignments before it dropped."""
    words = command.split("uv run", 1)[1].split()
    while words and words[0] in UV_RUN_FLAGS:
        words.pop(0)
    return " ".join(words)


def arguments(command: str) -> list[str]:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    return shlex.split(OPTIONAL.sub("", command))


def test_the_readme_shows_commands_of_every_kind() -> None:
    commands = readme_commands()
    assert any(c.startswith("python -m flows.run start") for c in commands)
    assert any(c.startswith("prefect ") for c in commands)
    assert any(c.startswith("pytest") for c in commands)


@pytest.mark.parametrize("command", [c for c in readme_commands() if c.startswith(("python -m flows.run", "dupflow"))])
def test_every_command_line_call_parses(command: str) -> None:
    words = arguments(command)
    words = words[3:] if words[0] == "python" else words[1:]
    try:
        parsed = build_parser().parse_args(words or ["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0, f"the README's `uv run {command}` does not parse: exit {exit_.code}"
        return
    assert callable(parsed.command)


@pytest.mark.parametrize(
    "command",
    [c for c in readme_commands() if c.startswith("python -m") and not c.startswith("python -m flows.run")],
)
def test_every_other_module_exists(command: str) -> None:
    module = arguments(command)[2]
    if module == "tests.benchmarks.bench_<name>":
        assert sorted(BENCHMARKS.glob("bench_*.py")), "the README names benchmarks, tests/benchmarks has none"
        return
    assert importlib.util.find_spec(module) is not None, f"the README's `uv run {command}`: no module {module}"


@pytest.mark.parametrize("command", [c for c in readme_commands() if c.startswith("python -c")])
def test_every_inline_program_compiles(command: str) -> None:
    compile(arguments(command)[2], "<README>", "exec")


def test_every_prefect_and_dask_sub_command_exists() -> None:
    calls = {_sub_command(command) for command in readme_commands() if command.startswith(("prefect ", "dask "))}
    assert calls, "the README shows no prefect or dask command"
    running = {call: _help_process(call) for call in sorted(calls)}
    failed = {" ".join(call): _failure(process) for call, process in running.items()}
    assert not {call: why for call, why in failed.items() if why}


def _sub_command(command: str) -> tuple[str, ...]:
    """The program and its sub-command words (up to the first flag, argument or placeholder)."""
    words = arguments(command)
    return tuple([words[0]] + [w for w in words[1:3] if re.fullmatch(r"[a-z][a-z-]*", w)][:2])


def _help_process(call: tuple[str, ...]) -> subprocess.Popen[str]:
    program = [sys.executable, "-m", "prefect"] if call[0] == "prefect" else [str(Path(sys.executable).parent / "dask")]
    return subprocess.Popen(
        [*program, *call[1:], "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _failure(process: subprocess.Popen[str]) -> str:
    output, _ = process.communicate(timeout=180)
    return "" if process.returncode == 0 else f"exit {process.returncode}: {output[-300:]}"
