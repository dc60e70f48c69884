"""The settings own the step names; the flow's table of step tasks names exactly those, with matching kinds."""

from __future__ import annotations

from prefect import Task

from config.settings import IMPORT_STEPS, REPEATABLE_STEPS, STEP_NAMES
from flows.pipeline import STEPS, step_module
from tasks.job.contract import StepKind
from tasks.job.layout import step_folder


def steps_of_kind(kind: StepKind) -> set[str]:
    return {name for name, step_kind in STEPS.items() if step_kind == kind}


def test_the_flow_runs_exactly_the_steps_the_settings_accept():
    assert sorted(STEPS) == sorted(STEP_NAMES)
    assert len(STEP_NAMES) == len(set(STEP_NAMES))


def test_the_import_steps_of_the_settings_are_the_flows_import_steps():
    assert steps_of_kind(StepKind.IMPORT) == set(IMPORT_STEPS)


def test_only_the_gate_may_be_listed_more_than_once():
    assert steps_of_kind(StepKind.GATE) == set(REPEATABLE_STEPS)


def test_every_import_step_writes_the_import_folder_and_no_other_step_does():
    assert {name for name in STEP_NAMES if step_folder(name) == "import"} == set(IMPORT_STEPS)


def test_every_step_has_a_module_of_its_name_holding_its_task():
    for name in STEPS:
        assert isinstance(getattr(step_module(name), name), Task)
