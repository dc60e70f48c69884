"""The elements a CRTDL filter reads, by its ``name`` and the group's resource type.

A filter whose name and type are not here cannot be applied (``tasks.sof.selection`` says so). See
docs/development.md, "The SQL-on-FHIR engine".
"""

from __future__ import annotations

Paths = tuple[tuple[str, ...], ...]


def _paths(*dotted: str) -> Paths:
    return tuple(tuple(path.split(".")) for path in dotted)


def _same(dotted: str, *kinds: str) -> dict[str, Paths]:
    return dict.fromkeys(kinds, _paths(dotted))


_MEDICATION = _paths("medicationCodeableConcept")
_EFFECTIVE = _paths("effectiveDateTime", "effectivePeriod", "effectiveInstant")

# Token parameters: the elements (CodeableConcept or Coding) whose codings a ``system|code``
# matches.
TOKEN_ELEMENTS: dict[str, dict[str, Paths]] = {
    "code": {
        **_same(
            "code",
            "Basic",
            "ChargeItem",
            "Condition",
            "DetectedIssue",
            "DiagnosticReport",
            "List",
            "Medication",
        ),
        **_same("code", "Observation", "Procedure", "ServiceRequest", "Task"),
        **dict.fromkeys(
            ("MedicationAdministration", "MedicationDispense", "MedicationRequest"), _MEDICATION
        ),
        "MedicationStatement": _MEDICATION,
        "AllergyIntolerance": _paths("code", "reaction.substance"),
        "DeviceRequest": _paths("codeCodeableConcept"),
        "FamilyMemberHistory": _paths("condition.code"),
        "Substance": _paths("code", "ingredient.substanceCodeableConcept"),
    },
    "category": {
        **_same(
            "category",
            "AdverseEvent",
            "AllergyIntolerance",
            "CarePlan",
            "CareTeam",
            "Communication",
        ),
        **_same(
            "category",
            "Composition",
            "Condition",
            "Consent",
            "DiagnosticReport",
            "DocumentReference",
            "Goal",
        ),
        **_same(
            "category",
            "MedicationRequest",
            "MedicationStatement",
            "Observation",
            "Procedure",
            "ResearchStudy",
        ),
        **_same("category", "ServiceRequest", "Substance", "SupplyRequest"),
    },
    "type": {
        **_same(
            "type",
            "Account",
            "AllergyIntolerance",
            "Composition",
            "Coverage",
            "Device",
            "DocumentReference",
        ),
        **_same(
            "type",
            "Encounter",
            "EpisodeOfCare",
            "Location",
            "Media",
            "MedicationDispense",
            "Organization",
        ),
        **_same("type", "Specimen"),
    },
    "class": {"Encounter": _paths("class")},
    "vaccine-code": {"Immunization": _paths("vaccineCode")},
    "ingredient-code": {"Medication": _paths("ingredient.itemCodeableConcept")},
    "bodysite": {
        "Specimen": _paths("collection.bodySite"),
        "ImagingStudy": _paths("series.bodySite"),
    },
}

# Date parameters: the elements (date, dateTime, instant or Period) whose time a ``ge``/``le`` bound
# compares.
DATE_ELEMENTS: dict[str, dict[str, Paths]] = {
    "date": {
        **_same("date", "AdverseEvent", "ClinicalImpression", "Composition", "DocumentReference"),
        **_same("date", "FamilyMemberHistory", "List"),
        **_same(
            "period", "CarePlan", "CareTeam", "Encounter", "EpisodeOfCare", "Flag", "ResearchStudy"
        ),
        **_same("period", "ResearchSubject"),
        **_same("occurrenceDateTime", "Immunization", "RiskAssessment"),
        **dict.fromkeys(("DiagnosticReport", "Observation"), _EFFECTIVE),
        "AllergyIntolerance": _paths("recordedDate"),
        "Appointment": _paths("start"),
        "Consent": _paths("dateTime"),
        "MedicationRequest": _paths("dosageInstruction.timing.event"),
        "Procedure": _paths("performedDateTime", "performedPeriod"),
        "SupplyRequest": _paths("authoredOn"),
    },
    "onset-date": {"Condition": _paths("onsetDateTime", "onsetPeriod")},
    "recorded-date": {"Condition": _paths("recordedDate")},
    "abatement-date": {"Condition": _paths("abatementDateTime", "abatementPeriod")},
    "effective-time": {"MedicationAdministration": _EFFECTIVE},
    "effective": {"MedicationStatement": _EFFECTIVE},
    "authoredon": {"MedicationRequest": _paths("authoredOn")},
    "collected": {"Specimen": _paths("collection.collectedDateTime", "collection.collectedPeriod")},
    "issued": {"DiagnosticReport": _paths("issued")},
    "location-period": {"Encounter": _paths("location.period")},
    "occurrence": {"ServiceRequest": _paths("occurrenceDateTime", "occurrencePeriod")},
    "period": {
        "Account": _paths("servicePeriod"),
        "Composition": _paths("event.period"),
        "Consent": _paths("provision.period"),
        "DocumentReference": _paths("context.period"),
    },
}


def known_names(table: dict[str, dict[str, Paths]], resource_type: str) -> list[str]:
    return sorted(name for name, by_type in table.items() if resource_type in by_type)
