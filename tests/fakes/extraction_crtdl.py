"""Kick-off parsing for the fake extraction server: Parameters -> CRTDL -> attribute groups.

The fake does not evaluate cohorts. It only needs to know which groups a CRTDL asks for, which resource
type each group produces and whether that type belongs to a patient (batch files) or to the shared core
(core.ndjson). Validation mirrors the real server's 400 texts (``Input is not a valid Parameters
Resource``, ``No Patient Attribute Group``, ``Unknown Profile: <url>``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

# Profile (last URL segment) -> resource type, for groups whose attributes do not name the type.
_PROFILE_TYPES = {
    "Patient": "Patient",
    "PatientPseudonymisiert": "Patient",
    "Diagnose": "Condition",
    "ObservationLab": "Observation",
    "KontaktGesundheitseinrichtung": "Encounter",
    "Procedure": "Procedure",
    "Medication": "Medication",
    "MedicationAdministration": "MedicationAdministration",
    "MedicationRequest": "MedicationRequest",
    "MedicationStatement": "MedicationStatement",
    "mii-pr-consent-einwilligung": "Consent",
    "Organization": "Organization",
    "Substance": "Substance",
    "Specimen": "Specimen",
}

# Resource types outside the patient compartment: they go to core.ndjson.
CORE_TYPES = frozenset({"Medication", "Organization", "Substance", "Location", "Practitioner", "Device"})


class KickoffError(ValueError):
    """A rejected kick-off; ``str(error)`` is the OperationOutcome diagnostics text."""


@dataclass(frozen=True)
class AttributeGroup:
    id: str
    name: str
    profile: str
    resource_type: str
    must_have: tuple[str, ...]

    @property
    def is_patient(self) -> bool:
        return self.resource_type == "Patient"

    @property
    def is_core(self) -> bool:
        return self.resource_type in CORE_TYPES


@dataclass(frozen=True)
class Crtdl:
    data: dict
    digest: str  # short hash of the CRTDL bytes; seeds patient ids so equal CRTDLs give equal cohorts
    groups: tuple[AttributeGroup, ...]

    @property
    def patient_group(self) -> AttributeGroup:
        return next(g for g in self.groups if g.is_patient)

    @property
    def patient_resource_groups(self) -> tuple[AttributeGroup, ...]:
        """Patient-compartment groups other than the Patient group itself."""
        return tuple(g for g in self.groups if not g.is_patient and not g.is_core)

    @property
    def core_groups(self) -> tuple[AttributeGroup, ...]:
        return tuple(g for g in self.groups if g.is_core)

    def has_type(self, *resource_types: str) -> bool:
        return any(g.resource_type in resource_types for g in self.groups)


def parse_kickoff(body: bytes) -> tuple[Crtdl, list[str]]:
    """Return the CRTDL and the explicit patient ids of a $extract-data body, or raise KickoffError."""
    try:
        parameters = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise KickoffError("Input is not a valid Parameters Resource") from None
    if not isinstance(parameters, dict) or parameters.get("resourceType") != "Parameters":
        raise KickoffError("Input is not a valid Parameters Resource")
    entries = [p for p in parameters.get("parameter") or [] if isinstance(p, dict)]
    crtdl_entries = [p for p in entries if p.get("name") == "crtdl"]
    if not crtdl_entries:
        raise KickoffError("Missing parameter 'crtdl'")
    raw = _decode_base64(crtdl_entries[0].get("valueBase64Binary"))
    patients = [_bare_patient_id(p.get("valueString")) for p in entries if p.get("name") == "patient"]
    return parse_crtdl(raw), [p for p in patients if p]


def parse_crtdl(raw: bytes) -> Crtdl:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KickoffError(f"CRTDL is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cohortDefinition"), dict):
        raise KickoffError("CRTDL has no cohortDefinition")
    extraction = data.get("dataExtraction") if isinstance(data.get("dataExtraction"), dict) else {}
    groups = tuple(_attribute_group(g) for g in extraction.get("attributeGroups") or [] if isinstance(g, dict))
    if not any(g.is_patient for g in groups):
        raise KickoffError("No Patient Attribute Group")
    return Crtdl(data=data, digest=hashlib.sha256(raw).hexdigest()[:8], groups=groups)


def _decode_base64(value: object) -> bytes:
    if not isinstance(value, str) or not value:
        raise KickoffError("Parameter 'crtdl' has no valueBase64Binary")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise KickoffError("Parameter 'crtdl' is not valid Base64") from None


def _bare_patient_id(value: object) -> str:
    text = value.strip() if isinstance(value, str) else ""
    return text.removeprefix("Patient/")


def _attribute_group(group: dict) -> AttributeGroup:
    profile = str(group.get("groupReference") or "")
    attributes = [a for a in group.get("attributes") or [] if isinstance(a, dict)]
    group_id = (
        group.get("id") or "generated-" + hashlib.sha256(json.dumps(group, sort_keys=True).encode()).hexdigest()[:8]
    )
    return AttributeGroup(
        id=str(group_id),
        name=str(group.get("name") or group_id),
        profile=profile,
        resource_type=_resource_type(profile, [str(a.get("attributeRef", "")) for a in attributes]),
        must_have=tuple(str(a["attributeRef"]) for a in attributes if a.get("mustHave") and a.get("attributeRef")),
    )


def _resource_type(profile: str, attribute_refs: list[str]) -> str:
    """The type named by the attributes (``Condition.code`` -> Condition), else by the known profile."""
    for ref in attribute_refs:
        head = ref.split(".", 1)[0]
        if head[:1].isupper() and head.isalpha():
            return head
    resource_type = _PROFILE_TYPES.get(profile.rstrip("/").rsplit("/", 1)[-1])
    if resource_type is None:
        raise KickoffError(f"Unknown Profile: {profile}")
    return resource_type
