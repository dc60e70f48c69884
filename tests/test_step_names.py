"""The settings own the step names and kinds: each step a module holding its task; the kinds rule a job's steps."""

from __future__ import annotations

import importlib
import pkgutil

from prefect import Task
from pydantic import ValidationError

import tasks
from config.settings import GATE_STEPS, IMPORT_STEPS, STEP_NAMES, PipelineSettings
from flows.pipeline import step_module
from tasks.job.layout import step_folder


def accepted(steps: list[str]) -> bool:
    try:
        PipelineSettings(enabled_steps=steps)
    except ValidationError:
        return False
    return True


def test_the_flow_runs_exactly_the_steps_the_settings_accept():
    modules = [module.name for module in pkgutil.iter_modules(tasks.__path__)]
    holding_a_step_task = {
        name for name in modules if isinstance(getattr(importlib.import_module(f"tasks.{name}"), name, None), Task)
    }
    assert holding_a_step_task == set(STEP_NAMES)
    assert len(STEP_NAMES) == len(set(STEP_NAMES))


def test_the_import_steps_of_the_settings_are_the_ones_a_job_starts_with():
    assert {name for name in STEP_NAMES if accepted([name])} == set(IMPORT_STEPS)


def test_only_the_gate_may_be_listed_more_than_once():
    others = [name for name in STEP_NAMES if name not in IMPORT_STEPS]
    assert {name for name in others if accepted(["local_import", name, "send", name])} == set(GATE_STEPS)


def test_every_import_step_writes_the_import_folder_and_no_other_step_does():
    assert {name for name in STEP_NAMES if step_folder(name) == "import"} == set(IMPORT_STEPS)


def test_every_step_has_a_module_of_its_name_holding_its_task():
    for name in STEP_NAMES:
        assert isinstance(getattr(step_module(name), name), Task)
