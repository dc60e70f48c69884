"""One ViewDefinition per CRTDL attribute group, from its profile's lookup table.

Its columns, and how groups get their ids and file names: docs/development.md, "The SQL-on-FHIR
engine".
"""

import copy
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from tasks.core.json_shapes import as_array, as_object, as_objects, JsonObject
from tasks.core.names import name_from_data_problem, name_key, show_name
from tasks.sof.errors import SofError, ViewError
from tasks.sof.fhirpath_shared import MODEL
from tasks.sof.lookup import LookupTable
from tasks.sof.selection import Selection, compile_selection
from tasks.sof.view import compile_view


# The reference to the patient a resource belongs to, by resource type (FHIR R4 patient compartment;
# None: outside). The types with an element ``patient`` (in the R4 model) refer by it; those not
# listed (Account too) by ``subject``.
PATIENT_REFERENCE_PATHS: dict[str, str | None] = {
    **dict.fromkeys(
        (
            "Patient",
            "Medication",
            "Organization",
            "Substance",
            "Location",
            "Practitioner",
            "PractitionerRole",
        ),
        None,
    ),
    **{
        path.removesuffix(".patient"): "patient.reference"
        for path in MODEL["path2Type"]
        if re.fullmatch(r"[A-Za-z]+\.patient", path)
    },
    "Coverage": "beneficiary.reference",
    "Appointment": "participant.actor.where(reference.startsWith('Patient/')).reference.first()",
    "AppointmentResponse": "actor.where(reference.startsWith('Patient/')).reference.first()",
    "EnrollmentRequest": "candidate.reference",
    "ResearchSubject": "individual.reference",
}
DEFAULT_PATIENT_REFERENCE = "subject.reference"
_UNSAFE_FILE_CHARACTERS = re.compile(r'[/\\:*?"<>|]')
GENERATED_ID_PREFIX = "generated-"
GENERATED_ID_HEX_DIGITS = 8
_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,36}")  # a UUID fits


@dataclass(frozen=True)
class AttributeGroup:
    id: str
    name: str
    profile: str
    file_stem: str
    """What its CSV and ViewDefinition are named (see docs/development.md)."""
    attributes: list[str] = field(default_factory=list)
    filters: list[Any] = field(default_factory=list)
    """Its CRTDL ``filter`` list as written, with ``reference_only`` and ``must_have``.

    Note: ``must_have``: the attributeRefs marked mustHave; ``tasks.sof.selection`` applies
    them to data without Provenance."""
    reference_only: bool = False
    must_have: list[str] = field(default_factory=list)

    @property
    def csv_name(self) -> str:
        return self.file_stem + ".csv"

    @property
    def view_file_name(self) -> str:
        """The name its ViewDefinition is saved under (``viewdefinitions/``)."""
        return self.file_stem + ".json"


@dataclass(frozen=True)
class GroupView:
    group: AttributeGroup
    resource_type: str
    view: JsonObject
    skipped_attributes: list[str]
    selection: Selection
    """Which resources of its type it takes from data without Provenance."""


def csv_file_name(group_name: str) -> str:
    return _UNSAFE_FILE_CHARACTERS.sub("_", group_name) + ".csv"


def short_group_id(group_id: str) -> str:
    """The group id as it ends a shared name's file name.

    Note: itself when short and plain (letters, digits, ``-``, ``_``), else the first
    GENERATED_ID_HEX_DIGITS hex digits of its SHA-256."""
    if _PLAIN_ID.fullmatch(group_id):
        return group_id
    return hashlib.sha256(group_id.encode()).hexdigest()[:GENERATED_ID_HEX_DIGITS]


def attribute_groups(crtdl: JsonObject) -> list[AttributeGroup]:
    """The CRTDL's attribute groups in order, named as docs/development.md says."""
    groups = []
    extraction = as_object(crtdl).get("dataExtraction")
    if not isinstance(extraction, dict):
        raise SofError("the CRTDL has no dataExtraction (a top-level object with attributeGroups)")
    for index, group in enumerate(as_array(extraction.get("attributeGroups"))):
        if not isinstance(group, dict) or not isinstance(group.get("groupReference"), str):
            raise SofError(f"attribute group {index + 1} of the CRTDL has no groupReference")
        group_id = str(group.get("id") or generated_group_id(group))
        name, refs = str(group.get("name") or group_id), _attribute_refs(group, group_id)
        must_have = [
            a["attributeRef"]
            for a in as_array(group.get("attributes"))
            if as_object(a).get("mustHave") is True
        ]
        groups.append(
            AttributeGroup(
                group_id,
                name,
                group["groupReference"],
                _UNSAFE_FILE_CHARACTERS.sub("_", name),
                refs,
                as_array(group.get("filter")),
                group.get("includeReferenceOnly") is True,
                must_have,
            )
        )
    _refuse_shared_ids(groups)
    stems = Counter(name_key(made.file_stem) for made in groups)
    return [
        replace(made, file_stem=f"{made.file_stem}-{short_group_id(made.id)}")
        if stems[name_key(made.file_stem)] > 1
        else made
        for made in groups
    ]


def with_group_ids(crtdl: JsonObject) -> JsonObject:
    """``crtdl``, or a copy giving each group without an id its ``generated_group_id``."""
    groups = as_object(crtdl.get("dataExtraction")).get("attributeGroups")
    if all(group.get("id") for group in as_objects(groups)):
        return crtdl
    completed = copy.deepcopy(crtdl)
    for group in as_objects(completed["dataExtraction"]["attributeGroups"]):
        if not group.get("id"):
            group["id"] = generated_group_id(group)
    return completed


def generated_group_id(group: JsonObject) -> str:
    """The id a group without one gets in the job's CRTDL (and so in the Provenance)."""
    digest = hashlib.sha256(json.dumps(group, sort_keys=True).encode()).hexdigest()
    return GENERATED_ID_PREFIX + digest[:GENERATED_ID_HEX_DIGITS]


def _attribute_refs(group: JsonObject, group_id: str) -> list[str]:
    """The group's ``attributeRef``s in order, each once (else its columns came twice)."""
    attributes = group.get("attributes") or []
    if not isinstance(attributes, list) or not all(
        isinstance(as_object(a).get("attributeRef"), str) for a in attributes
    ):
        raise SofError(
            f"attribute group {show_name(group_id)}: its attributes must be a list of objects "
            "with a string attributeRef; fix the CRTDL"
        )
    return list(dict.fromkeys(a["attributeRef"] for a in attributes))


def _refuse_shared_ids(groups: list[AttributeGroup]) -> None:
    """Refuse two groups of one id, naming each by position (from 1) and name.

    Why: resources reach a group by its id (the Provenance names it): two groups of one id
    cannot both get theirs; a copied group shares its name as well."""
    first_at: dict[str, int] = {}
    for index, group in enumerate(groups):
        if (first := first_at.setdefault(group.id, index)) != index:
            raise SofError(
                f"attribute groups {first + 1} ({show_name(groups[first].name)}) and {index + 1} "
                f"({show_name(group.name)}) of the CRTDL's attributeGroups share the id "
                f"{show_name(group.id)}; resources are routed to a group by its id: give group "
                f"{index + 1} an id of its own in the CRTDL"
            )


def group_name_problems(crtdl: JsonObject) -> list[str]:
    """Every group whose name cannot name its files, and every two whose files collide.

    Note: each names the group and the fix; ``SofError`` as ``attribute_groups``."""
    problems = []
    owners: dict[str, AttributeGroup] = {}
    for group in attribute_groups(crtdl):
        if problem := name_from_data_problem(group.view_file_name):
            problems.append(
                f"attribute group {show_name(group.id)}: its name {show_name(group.name)} cannot "
                f"name its CSV file: the file name {problem}; rename the group in the CRTDL"
            )
        elif (owner := owners.setdefault(name_key(group.csv_name), group)) is not group:
            problems.append(
                f"attribute groups {show_name(owner.id)} and {show_name(group.id)} would both "
                f"write {show_name(group.csv_name)}; give each group its own id and name in the "
                "CRTDL"
            )
    return problems


def build_view(group: AttributeGroup, table: LookupTable) -> GroupView:
    """The group's ViewDefinition, validated: else a ``ViewError`` naming the group."""
    fixed = [{"name": "id", "path": "id"}]
    if (
        patient_path := PATIENT_REFERENCE_PATHS.get(table.resource_type, DEFAULT_PATIENT_REFERENCE)
    ) is not None:
        fixed.append({"name": "patient", "path": patient_path})
    selects: list[JsonObject] = [{"column": fixed}]
    selected = [a for a in group.attributes if a in table.elements]
    skipped = [a for a in group.attributes if a not in table.elements]
    for attribute in selected:
        if any(ancestor in selected for ancestor in table.ancestors(attribute)):
            continue
        selects.append(table.in_iterations(attribute, _expanded(table, attribute)))
    view = {
        "resourceType": "ViewDefinition",
        "name": _view_name(group.name),
        "title": group.name,
        "status": "active",
        "resource": table.resource_type,
        "description": f"CRTDL attribute group {group.id} ({group.profile})",
        "select": selects,
    }
    try:
        compile_view(view)
    except ViewError as exc:
        raise ViewError(
            f"attribute group {group.name!r} ({group.profile}): invalid ViewDefinition: {exc}"
        ) from exc
    selection = compile_selection(
        table.resource_type, group.profile, group.filters, group.reference_only, group.must_have
    )
    return GroupView(group, table.resource_type, view, skipped, selection)


def _expanded(table: LookupTable, element_id: str) -> JsonObject:
    element = table.elements[element_id]
    snippet: JsonObject = copy.deepcopy(element["viewDefinition"])
    if children := [_expanded(table, child) for child in element.get("children", [])]:
        snippet["select"] = snippet.get("select", []) + children  # a list: LOOKUP_SCHEMA
    return snippet


def _view_name(group_name: str) -> str:
    """A ViewDefinition name (a letter, then letters, digits, _) from the group's name."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", group_name).strip("_")
    return name if name[:1].isalpha() else f"group_{name}"
