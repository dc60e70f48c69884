"""The elements a CRTDL filter reads, by its ``name`` and the group's resource type.

TORCH turns an attribute group's filter into a FHIR search on its FHIR server: a ``token`` filter into
``<name>=<system>|<code>``, a ``date`` filter into ``<name>=ge<start>&<name>=le<end>``. So ``name`` is a search
parameter, and which element it reads depends on the resource type: ``date`` is ``Encounter.period`` but
``Observation.effective[x]``; a Condition has no ``date`` (its dates are ``onset-date``, ``recorded-date``,
``abatement-date``). These tables hold the FHIR R4 search parameters of type token and date for the resource types
of patient data, as paths of JSON keys (a choice element ``effective[x]`` as each of its date-bearing keys). A
filter whose name and type are not here cannot be applied (``tasks.sof.selection`` says so).
"""

from __future__ import annotations

Paths = tuple[tuple[str, ...], ...]


def _paths(*dotted: str) -> Paths:
    return tuple(tuple(path.split(".")) for path in dotted)


_MEDICATION = _paths("medicationCodeableConcept")
_EFFECTIVE = _paths("effectiveDateTime", "effectivePeriod", "effectiveInstant")

# Token parameters: the elements (CodeableConcept or Coding) whose codings a ``system|code`` matches.
TOKEN_ELEMENTS: dict[str, dict[str, Paths]] = {
    "code": {
        "AllergyIntolerance": _paths("code", "reaction.substance"),
        "Basic": _paths("code"),
        "ChargeItem": _paths("code"),
        "Condition": _paths("code"),
        "DetectedIssue": _paths("code"),
        "DeviceRequest": _paths("codeCodeableConcept"),
        "DiagnosticReport": _paths("code"),
        "FamilyMemberHistory": _paths("condition.code"),
        "List": _paths("code"),
        "Medication": _paths("code"),
        "MedicationAdministration": _MEDICATION,
        "MedicationDispense": _MEDICATION,
        "MedicationRequest": _MEDICATION,
        "MedicationStatement": _MEDICATION,
        "Observation": _paths("code"),
        "Procedure": _paths("code"),
        "ServiceRequest": _paths("code"),
        "Substance": _paths("code", "ingredient.substanceCodeableConcept"),
        "Task": _paths("code"),
    },
    "category": {
        kind: _paths("category")
        for kind in (
            *("AdverseEvent", "AllergyIntolerance", "CarePlan", "CareTeam", "Communication", "Composition"),
            *("Condition", "Consent", "DiagnosticReport", "DocumentReference", "Goal", "MedicationRequest"),
            *("MedicationStatement", "Observation", "Procedure", "ResearchStudy", "ServiceRequest", "Substance"),
            "SupplyRequest",
        )
    },
    "type": {
        kind: _paths("type")
        for kind in (
            *("Account", "AllergyIntolerance", "Composition", "Coverage", "Device", "DocumentReference"),
            *("Encounter", "EpisodeOfCare", "Location", "Media", "MedicationDispense", "Organization"),
            "Specimen",
        )
    },
    "class": {"Encounter": _paths("class")},
    "vaccine-code": {"Immunization": _paths("vaccineCode")},
    "ingredient-code": {"Medication": _paths("ingredient.itemCodeableConcept")},
    "bodysite": {"Specimen": _paths("collection.bodySite"), "ImagingStudy": _paths("series.bodySite")},
}

# Date parameters: the elements (date, dateTime, instant or Period) whose time a ``ge``/``le`` bound compares.
DATE_ELEMENTS: dict[str, dict[str, Paths]] = {
    "date": {
        "AdverseEvent": _paths("date"),
        "AllergyIntolerance": _paths("recordedDate"),
        "Appointment": _paths("start"),
        "CarePlan": _paths("period"),
        "CareTeam": _paths("period"),
        "ClinicalImpression": _paths("date"),
        "Composition": _paths("date"),
        "Consent": _paths("dateTime"),
        "DiagnosticReport": _EFFECTIVE,
        "DocumentReference": _paths("date"),
        "Encounter": _paths("period"),
        "EpisodeOfCare": _paths("period"),
        "FamilyMemberHistory": _paths("date"),
        "Flag": _paths("period"),
        "Immunization": _paths("occurrenceDateTime"),
        "List": _paths("date"),
        "MedicationRequest": _paths("dosageInstruction.timing.event"),
        "Observation": _EFFECTIVE,
        "Procedure": _paths("performedDateTime", "performedPeriod"),
        "ResearchStudy": _paths("period"),
        "ResearchSubject": _paths("period"),
        "RiskAssessment": _paths("occurrenceDateTime"),
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
