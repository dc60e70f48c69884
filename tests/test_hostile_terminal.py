"""Foreign text on a terminal is plain: a hostile extraction server's Task fields (``extraction list``, ``show``,
``pause``, ``cohort preview --ids``) reach it with no escape sequence (an OSC title, a screen clear), carriage
return, C1 control, bidi control or line separator, and still recognisable (escaped, or the controls made spaces).

Against the fake extraction server (its ``edit_task`` and ``cohort_ids`` switches); commands run in-process
through the real argument parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.run import main
from tests.conftest import TESTDATA
from tests.fakes.extraction_crtdl import parse_crtdl
from tests.fakes.extraction_server import ExtractionServer, start_extraction_server
from tests.fakes.extraction_state import ManualClock

CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
CONSENT_AUDIT = "Consent audit NDJSON"
HOSTILE = "run\x1b[2J\x1b]0;owned\x07\rx\x9b31m\u202eexe.gnp\u2066\u2028y\u2029z"
# Every control but the line feed (C0, DEL, C1), the bidi embeddings, overrides and isolates, the line and
# paragraph separators.
NOT_PLAIN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def assert_plain(output: str) -> None:
    found = NOT_PLAIN.search(output)
    assert found is None, f"U+{ord(found.group()):04X} reached the terminal: {output!r}"
    assert "owned" in output and "exe.gnp" in output, output  # the text is still there to read


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# --- a hostile extraction server ----------------------------------------------------------------------------------


def set_active_batch(part: str) -> Callable[[dict], None]:
    """An edit of the Task's progress: each active batch's ``part`` (batchId or stage) hostile."""

    def edit(task: dict) -> None:
        for extension in task["extension"][0]["extension"]:
            if extension["url"] == "activeBatch":
                for sub in extension["extension"]:
                    if sub["url"] == part:
                        sub["valueString"] = HOSTILE

    return edit


TASK_EDITS: dict[str, Callable[[dict], None]] = {
    "id": lambda task: task.update(id=HOSTILE),
    "status": lambda task: task["businessStatus"]["coding"][0].update(code=HOSTILE),
    "version": lambda task: task["meta"].update(versionId=HOSTILE),
    "last updated": lambda task: task["meta"].update(lastUpdated=HOSTILE),
    "authored on": lambda task: task.update(authoredOn=HOSTILE),
    "batch id": set_active_batch("batchId"),
    "batch stage": set_active_batch("stage"),
    "consent audit URL": lambda task: task.update(
        output=[{"type": {"text": CONSENT_AUDIT}, "valueUrl": f"https://torch.example/files/{HOSTILE}"}]
    ),
}
SHOWN_BY = {
    "list": ("id", "status"),
    "show": tuple(TASK_EDITS),
    "pause": ("id", "status"),
}


@pytest.fixture
def torch():
    clock = ManualClock()
    with start_extraction_server(clock=clock, cohort_size=6, batch_size=2, max_concurrency=2) as server:
        server.state.submit(parse_crtdl(CRTDL.read_bytes()), [])
        clock.tick(0.11)  # the cohort is known, two batches are being processed
        yield server


@pytest.fixture
def config(write_config, torch: ExtractionServer) -> Path:
    tree = {"pipeline": {"enabled_steps": ["extractor"]}, "services": {"extractor": {"base_url": torch.base_url}}}
    return write_config({**tree, "retry": {"max_attempts": 1}}, jobs_dir=None)


@pytest.mark.parametrize(
    ("command", "field"), [(command, field) for command, fields in SHOWN_BY.items() for field in fields]
)
def test_a_hostile_task_field_reaches_the_terminal_plain(capsys, torch, config, command, field):
    [job_id] = torch.state.jobs
    torch.state.edit_task = TASK_EDITS[field]
    code, output = cli(capsys, "extraction", command, str(config), *([] if command == "list" else [job_id]))
    assert code == 0, output
    assert_plain(output)


def test_json_output_keeps_the_servers_text_as_sent_and_escaped(capsys, torch, config):
    [job_id] = torch.state.jobs
    torch.state.edit_task = TASK_EDITS["status"]
    code, output = cli(capsys, "extraction", "show", str(config), job_id, "--json")
    assert code == 0 and NOT_PLAIN.search(output) is None
    assert json.loads(output)["status"] == HOSTILE


def test_hostile_patient_ids_of_a_cohort_preview_reach_the_terminal_plain(capsys, torch, config):
    torch.state.cohort_ids = ("pat-1", HOSTILE)
    code, output = cli(capsys, "cohort", "preview", str(config), str(CRTDL), "--ids")
    assert code == 0 and output.splitlines()[:2] == ["cohort size: 2 patients", "pat-1"]
    assert_plain(output)


def test_a_task_whose_dates_are_no_text_shows_no_age(capsys, torch, config):
    [job_id] = torch.state.jobs
    torch.state.edit_task = lambda task: task.update(authoredOn=20260101, meta={"lastUpdated": ["x"]})
    for command in (["list"], ["show", job_id]):
        code, output = cli(capsys, "extraction", command[0], str(config), *command[1:])
        assert code == 0 and "Traceback" not in output, output
