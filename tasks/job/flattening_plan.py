"""What every piece of a ``flattening`` step shares: its views and their plan.

Note: the CRTDL's attribute groups as ViewDefinitions (``plan_views``) and their ``StepPlan``, kept
per process by digest, so piece tasks need not read the CRTDL again.
"""

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tasks.core.kept import KeptByDigest
from tasks.core.names import name_key
from tasks.job.contract import StepInput, digest, settings_of
from tasks.job.flattening_outcome import FlatteningError, engine_errors_as_step_errors
from tasks.sof.crtdl_views import (
    AttributeGroup,
    GroupView,
    attribute_groups,
    build_view,
    csv_file_name,
)
from tasks.sof.flatten import GroupPlan
from tasks.sof.lookup import load_lookup

log = logging.getLogger("dupflow.flattening")

# the groups' views, the groups without a lookup table
PlannedViews = tuple[list[GroupView], list[AttributeGroup]]


def plan_views(crtdl_path: Path, lookup_path: Path, *, warn: bool = True) -> PlannedViews:
    """A ViewDefinition per attribute group with a lookup table; the groups without.

    Note: ``warn`` logs what is left out (the step does, once; its piece tasks do not).
    """
    try:
        groups = attribute_groups(json.loads(Path(crtdl_path).read_bytes()))
    except (OSError, ValueError) as exc:
        raise FlatteningError(f"cannot read the CRTDL {crtdl_path}: {exc}") from exc
    views, skipped = [], []
    with engine_errors_as_step_errors():
        tables = load_lookup(lookup_path)
        for group in groups:
            if (table := tables.get(group.profile)) is None:
                if warn:
                    log.warning(
                        "attribute group %r is skipped: the lookup file has no table for "
                        "profile %s",
                        group.name,
                        group.profile,
                    )
                skipped.append(group)
                continue
            built = build_view(group, table)
            if built.skipped_attributes and warn:
                log.warning(
                    "attribute group %r: no lookup element for %s (left out of its CSV)",
                    group.name,
                    ", ".join(built.skipped_attributes),
                )
            views.append(built)
    if warn:
        warn_shared_names(groups)
    names = Counter(name_key(view.group.csv_name) for view in views)
    if clashes := [name for name, count in names.items() if count > 1]:
        raise FlatteningError(
            f"several attribute groups would write the same CSV ({', '.join(clashes)}); rename them"
        )
    return views, skipped


def warn_shared_names(groups: list[AttributeGroup]) -> None:
    """Warn once per name several groups share, naming the groups and each one's file."""
    sharing: dict[str, list[AttributeGroup]] = {}
    for group in groups:
        if group.csv_name != csv_file_name(group.name):
            sharing.setdefault(name_key(csv_file_name(group.name)), []).append(group)
    for same in sharing.values():
        log.warning(
            "attribute groups %s share the name %r: their files are %s",
            " and ".join(repr(group.id) for group in same),
            same[0].name,
            " and ".join(repr(group.csv_name) for group in same),
        )


@dataclass(frozen=True)
class StepPlan:
    """The groups' views, the skipped groups, the views a worker gets, and a digest."""

    views: list[GroupView]
    skipped: list[AttributeGroup]
    groups: tuple[GroupPlan, ...]
    skipped_ids: tuple[str, ...]
    digest: str


_plans: KeptByDigest[StepPlan] = KeptByDigest()


def remember_plan(views: list[GroupView], skipped: list[AttributeGroup]) -> StepPlan:
    """The step's plan, kept in this process for its pieces (``KeptByDigest``)."""
    groups = tuple(
        GroupPlan(v.group.id, v.group.csv_name, v.resource_type, json.dumps(v.view), v.selection)
        for v in views
    )
    plan_digest = digest([[v.group, v.view] for v in views] + [g.id for g in skipped])
    plan = StepPlan(views, skipped, groups, tuple(group.id for group in skipped), plan_digest)
    _plans.keep(plan_digest, plan)
    return plan


def step_plan(step: StepInput, plan_digest: str) -> StepPlan:
    """The step's plan by its digest, made again where not seen yet (a Dask worker).

    Note: a CRTDL or lookup file changed since is refused (the CSVs would mix two plans).
    """
    if plan := _plans.get(plan_digest):
        return plan
    lookup = settings_of(step).services.flattening.lookup_path
    assert step.crtdl_path is not None
    plan = remember_plan(*plan_views(step.crtdl_path, Path(lookup or ""), warn=False))
    if plan.digest != plan_digest:
        raise FlatteningError(
            f"the CRTDL {step.crtdl_path} or the lookup file {lookup} "
            "(services.flattening.lookup_path) changed while the step ran; keep them unchanged "
            "while a job runs, then continue the job"
        )
    return plan
