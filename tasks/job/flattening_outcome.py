"""What the ``flattening`` step did, by group: counts, refusals, logs, artifact.

Note: below the step module so that both engines fill one ``FlattenOutcome``.
"""

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.job.contract import DataFile, StepInput
from tasks.job.layout import artifact_key
from tasks.sof.crtdl_views import AttributeGroup, GroupView
from tasks.sof.errors import SofError
from tasks.sof.flatten import RouteCounts

log = logging.getLogger("dupflow.flattening")

LISTED_IDS = 10
BY_TYPE = "resource type"


class FlatteningError(StepError):
    """The step cannot flatten its input; the message says what is wrong and the fix."""


@contextmanager
def engine_errors_as_step_errors() -> Iterator[None]:
    """Raise the engine's errors as the step's ``FlatteningError``, same message."""
    try:
        yield
    except SofError as exc:
        raise FlatteningError(str(exc)) from exc


@dataclass
class GroupCounts:
    group: AttributeGroup
    csv: str
    resource_type: str
    resources: int = 0
    rows: int = 0
    not_applied: tuple[str, ...] = ()
    """Without Provenance: the group's CRTDL restrictions that could not be applied
(``Selection.not_applied``)."""

    def row(self) -> JsonObject:
        group = self.group
        return {
            "group": group.name,
            "id": group.id,
            "csv": self.csv,
            "resources": self.resources,
            "rows": self.rows,
        }


@dataclass
class FlattenOutcome(RouteCounts):
    groups: list[GroupCounts]
    skipped: list[AttributeGroup]
    routing: str
    engine: str
    files: list[DataFile] = field(default_factory=list)

    def summary(self) -> JsonObject:
        # without Provenance: what the groups' profiles and filters left out, what was not applied
        selection = {
            "other_profile": dict(sorted(self.other_profile.items())),
            "filtered_out": dict(sorted(self.filtered_out.items())),
            "not_applied": {
                g.group.name: list(g.not_applied) for g in self.groups if g.not_applied
            },
        }
        return {
            "engine": self.engine,
            "routing": self.routing,
            "groups": [g.row() for g in self.groups],
            "skipped_groups": [{"group": g.name, "profile": g.profile} for g in self.skipped],
            "unrouted": dict(sorted(self.unrouted.items())),
            "unrouted_total": sum(self.unrouted.values()),
            "resources_of_skipped_groups": dict(sorted(self.skipped_resources.items())),
            **(selection if self.routing == BY_TYPE else {}),
        }


def new_outcome(
    views: list[GroupView], skipped: list[AttributeGroup], by_provenance: bool, engine: str
) -> FlattenOutcome:
    return FlattenOutcome(
        groups=[
            GroupCounts(
                view.group,
                view.group.csv_name,
                view.resource_type,
                not_applied=view.selection.not_applied,
            )
            for view in views
        ],
        skipped=skipped,
        routing="provenance" if by_provenance else BY_TYPE,
        engine=engine,
    )


def refuse_empty_result(outcome: FlattenOutcome) -> None:
    """Fail when the input had resources and no CSV has a row (step module doc, 6)."""
    if any(group.rows for group in outcome.groups):
        return
    skipped = (
        " for lack of a lookup table: "
        + _listed([f"{g.name!r} (profile {g.profile})" for g in outcome.skipped])
        if outcome.skipped
        else ""
    )
    if not outcome.skipped_resources and not any(group.resources for group in outcome.groups):
        if outcome.unrouted or outcome.other_profile:
            _refuse_nothing_routed(outcome, skipped)
        return  # an empty input, or the filters took nothing: every CSV has its header only
    taken = _counted(outcome.skipped_resources)
    reasons = (
        [f"the input's {taken} went to attribute groups that were skipped{skipped}"]
        if taken
        else []
    )
    if took := [g for g in outcome.groups if g.resources]:
        listed = _listed([f"{g.group.name!r} ({g.resources} resources)" for g in took])
        reasons.append(f"the views of {listed} gave no row")
    raise FlatteningError(
        f"no CSV has a row: {'; '.join(reasons)}. Add a table for each skipped group's profile to "
        "the lookup file (services.flattening.lookup_path), or check that the CRTDL's attributes "
        "are in the data"
    )


def _refuse_nothing_routed(outcome: FlattenOutcome, skipped: str) -> None:
    """Refuse an input whose resources no group takes: the CRTDL is not the data's."""
    found = _counted(outcome.unrouted + outcome.other_profile)
    note = f" (groups skipped{skipped})" if skipped else ""
    if outcome.routing == BY_TYPE:
        wanted = (
            _listed(sorted({f"{g.group.name!r} reads {g.resource_type}" for g in outcome.groups}))
            or "none"
        )
        if outcome.other_profile:
            profiles = _listed(sorted({g.group.profile for g in outcome.groups}))
            wanted += (
                f"; no meta.profile of the input's {_counted(outcome.other_profile)} is theirs "
                f"({profiles})"
            )
        raise FlatteningError(
            f"no input resource was routed to any attribute group: the input holds {found} (and "
            "no attribute-group Provenance to route by), but the CRTDL's groups read other types "
            f"or profiles ({wanted}){note}. Check that the input is the data this CRTDL "
            "extracted, or give the CRTDL of that data"
        )
    expected = _listed([f"{g.group.id} ({g.group.name})" for g in outcome.groups]) or "none"
    seen = _listed(sorted(outcome.unknown_groups)) or "none"
    raise FlatteningError(
        "no input resource was routed to any attribute group: the CRTDL's groups are "
        f"{expected}{note}, but the Provenance names the groups {seen}, so {found} would be in no "
        "CSV. Give the job the CRTDL the extraction ran with (its attributeGroups' ids are the "
        "ones in the Provenance), or set those ids in this one"
    )


def _counted(counts: Counter[str]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))


def _listed(ids: list[str]) -> str:
    return ", ".join(ids[:LISTED_IDS]) + (
        f" and {len(ids) - LISTED_IDS} more" if len(ids) > LISTED_IDS else ""
    )


def report(outcome: FlattenOutcome, step: StepInput) -> None:
    """Log what was written and what was not routed; publish the step's table artifact."""
    if outcome.routing == BY_TYPE:
        report_selection(outcome)
    for counts in outcome.groups:
        log.info("%s: %d resources, %d rows", counts.csv, counts.resources, counts.rows)
    if outcome.unrouted:
        log.warning(
            "resources no attribute group routes (not in any CSV): %s", _counted(outcome.unrouted)
        )
    if outcome.skipped_resources:
        listed = _counted(outcome.skipped_resources)
        log.warning(
            "resources of attribute groups skipped for lack of a lookup table (not in any CSV): %s",
            listed,
        )
    if outcome.unknown_groups:
        listed = ", ".join(sorted(outcome.unknown_groups))
        log.warning("Provenance names attribute groups that are not in the CRTDL: %s", listed)
    from prefect.artifacts import create_table_artifact  # the step's table artifact

    table = [c.row() for c in outcome.groups]
    table += [
        GroupCounts(g, f"(skipped: no lookup table for {g.profile})", "").row()
        for g in outcome.skipped
    ]
    for label, by_kind in (
        ("(unrouted)", outcome.unrouted),
        ("(of no group's profile)", outcome.other_profile),
        ("(left out by the filters)", outcome.filtered_out),
    ):
        table += [
            {"group": label, "id": "", "csv": kind, "resources": count, "rows": 0}
            for kind, count in sorted(by_kind.items())
        ]
    create_table_artifact(
        key=artifact_key(step.job_id, "flattening"),
        table=table,
        description=f"Flattening ({outcome.engine} engine, routed by {outcome.routing})",
    )


def report_selection(outcome: FlattenOutcome) -> None:
    """Log, without Provenance, how resources were routed and what was left out.

    Note: also what of the CRTDL was not applied.
    """
    log.warning(
        "the input holds no attribute-group Provenance (a plain import): each attribute group "
        "takes the resources of its type and profile that pass its CRTDL filters, as the "
        "extraction selects them (docs/steps.md)"
    )
    for counts in outcome.groups:
        if counts.not_applied:
            log.warning(
                "attribute group %r: not applied: %s",
                counts.group.name,
                "; ".join(counts.not_applied),
            )
    if outcome.other_profile:
        listed = _counted(outcome.other_profile)
        log.warning(
            "resources of no attribute group's profile (meta.profile; not in any CSV): %s", listed
        )
    if outcome.filtered_out:
        listed = _counted(outcome.filtered_out)
        log.info(
            "resources the attribute groups' CRTDL filters leave out (not in any CSV): %s", listed
        )
