"""One ViewDefinition per CRTDL attribute group, built from the lookup file (spec/protocols.md, "Flattening").

The group's table is the lookup table whose ``url`` is the group's ``groupReference``. The view starts with the
fixed columns ``id`` and ``patient`` (the resource's patient reference; none for resources outside the patient
compartment such as Patient or Medication), then one select per selected attribute in CRTDL order: the attribute's
snippet with its children nested inside it (depth first, in ``children`` order), wrapped in the iteration
(``forEach`` / ``forEachOrNull``) of each of its ancestors. An attribute whose ancestor is also selected is covered
by that ancestor and skipped.

Sibling slices of one element (``Condition.code.coding:icd10-gm``, ``…:sct``) are sibling selects inside their
parent, each a ``forEachOrNull``: a slice that matches nothing gives nulls, so a coding yields one row with its
slice's columns filled (the expected CSVs of shared/testdata/flattening/example show this shape).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from tasks.sof.lookup import LookupTable
from tasks.sof.view import compile_view

# The reference to the patient a resource belongs to, by resource type (FHIR R4 patient compartment).
PATIENT_REFERENCE_PATHS: dict[str, str | None] = {
    "Patient": None,
    "Medication": None,
    "Organization": None,
    "Substance": None,
    "Location": None,
    "Practitioner": None,
    "PractitionerRole": None,
    "Device": "patient.reference",
    "Consent": "patient.reference",
    "AllergyIntolerance": "patient.reference",
    "Immunization": "patient.reference",
    "Account": "subject.reference",
    "Coverage": "beneficiary.reference",
    "Claim": "patient.reference",
    "ExplanationOfBenefit": "patient.reference",
    "Appointment": "participant.actor.where(reference.startsWith('Patient/')).reference.first()",
    "ResearchSubject": "individual.reference",
}
DEFAULT_PATIENT_REFERENCE = "subject.reference"
_UNSAFE_FILE_CHARACTERS = re.compile(r'[/\\:*?"<>|]')


@dataclass(frozen=True)
class AttributeGroup:
    """A CRTDL attribute group: what flattening needs of it."""

    id: str
    name: str
    profile: str
    attributes: list[str] = field(default_factory=list)

    @property
    def csv_name(self) -> str:
        return csv_file_name(self.name)


@dataclass(frozen=True)
class GroupView:
    group: AttributeGroup
    resource_type: str
    view: dict[str, Any]
    skipped_attributes: list[str] = field(default_factory=list)


def csv_file_name(group_name: str) -> str:
    """``<group name>.csv`` with the characters ``/ \\ : * ? " < > |`` replaced by ``_``."""
    return _UNSAFE_FILE_CHARACTERS.sub("_", group_name) + ".csv"


def attribute_groups(crtdl: dict[str, Any]) -> list[AttributeGroup]:
    """The CRTDL's attribute groups in order; a group without a name is named by its id."""
    groups = []
    extraction = crtdl.get("dataExtraction") if isinstance(crtdl, dict) else None
    if not isinstance(extraction, dict):
        raise ValueError("the CRTDL has no dataExtraction (a top-level object with attributeGroups)")
    for index, group in enumerate(extraction.get("attributeGroups") or []):
        if not isinstance(group, dict) or not isinstance(group.get("groupReference"), str):
            raise ValueError(f"attribute group {index + 1} of the CRTDL has no groupReference")
        group_id = str(group.get("id") or f"group-{index + 1}")
        refs = [a["attributeRef"] for a in group.get("attributes") or [] if isinstance(a, dict) and "attributeRef" in a]
        groups.append(AttributeGroup(group_id, str(group.get("name") or group_id), group["groupReference"], refs))
    return groups


def build_view(group: AttributeGroup, table: LookupTable) -> GroupView:
    """The group's ViewDefinition (validated: an invalid one raises ``ViewDefinitionError``)."""
    fixed = [{"name": "id", "path": "id"}]
    patient_path = PATIENT_REFERENCE_PATHS.get(table.resource_type, DEFAULT_PATIENT_REFERENCE)
    if patient_path is not None:
        fixed.append({"name": "patient", "path": patient_path})
    selects: list[dict[str, Any]] = [{"column": fixed}]
    selected = [a for a in group.attributes if a in table.elements]
    skipped = [a for a in group.attributes if a not in table.elements]
    for attribute in selected:
        ancestors = table.ancestors(attribute)
        if any(ancestor in selected for ancestor in ancestors):
            continue
        selects.append(_wrapped_in_ancestors(table, attribute, ancestors))
    view = {
        "resourceType": "ViewDefinition",
        "name": _view_name(group.name),
        "title": group.name,
        "status": "active",
        "resource": table.resource_type,
        "description": f"CRTDL attribute group {group.id} ({group.profile})",
        "select": selects,
    }
    compile_view(view)
    return GroupView(group, table.resource_type, view, skipped)


def _expanded(table: LookupTable, element_id: str) -> dict[str, Any]:
    snippet = copy.deepcopy(table.snippet(element_id))
    children = [_expanded(table, child) for child in table.children(element_id)]
    if children:
        snippet["select"] = list(snippet.get("select", [])) + children
    return snippet


def _wrapped_in_ancestors(table: LookupTable, element_id: str, ancestors: list[str]) -> dict[str, Any]:
    select = _expanded(table, element_id)
    for ancestor in reversed(ancestors):
        iteration = {k: v for k, v in table.snippet(ancestor).items() if k in ("forEach", "forEachOrNull")}
        if iteration:
            select = {**iteration, "select": [select]}
    return select


def _view_name(group_name: str) -> str:
    """A ViewDefinition name (letters, digits, _; starting with a letter) from the group's name."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", group_name).strip("_")
    return name if name[:1].isalpha() else f"group_{name}"
