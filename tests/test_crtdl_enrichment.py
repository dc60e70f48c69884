"""CRTDL enrichment adds the attributes pseudonymization needs, on the real CRTDLs from TORCH and aether."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from config.enrichment import AttributeToAdd, CreateIfNotExists, EnrichmentRule
from tasks.job.crtdl_enrichment import EnrichmentError, UnresolvedLinkError, enrich_crtdl
from tests.conftest import TESTDATA

CRTDL_DIR = TESTDATA / "crtdl"
PATIENT_PSEUDONYMISIERT = (
    "https://www.medizininformatik-initiative.de/fhir/core/modul-person/StructureDefinition/PatientPseudonymisiert"
)
PATIENT = "https://www.medizininformatik-initiative.de/fhir/core/modul-person/StructureDefinition/Patient"
DIAGNOSE = "https://www.medizininformatik-initiative.de/fhir/core/modul-diagnose/StructureDefinition/Diagnose"
ENCOUNTER = (
    "https://www.medizininformatik-initiative.de/fhir/core/modul-fall/StructureDefinition/KontaktGesundheitseinrichtung"
)
OBSERVATION_LAB = "https://www.medizininformatik-initiative.de/fhir/core/modul-labor/StructureDefinition/ObservationLab"


def load(name: str) -> dict[str, Any]:
    return json.loads((CRTDL_DIR / name).read_text())


def rule(group_reference: str, *attributes: AttributeToAdd, create_as: str | None = None) -> EnrichmentRule:
    return EnrichmentRule(
        group_reference=group_reference,
        create_if_not_exists=CreateIfNotExists(group_name=create_as) if create_as else None,
        attributes_to_add=list(attributes),
    )


def groups(crtdl: dict[str, Any]) -> list[dict[str, Any]]:
    return crtdl["dataExtraction"]["attributeGroups"]


def group_with_id(crtdl: dict[str, Any], group_id: str) -> dict[str, Any]:
    return next(group for group in groups(crtdl) if group.get("id") == group_id)


def test_patient_identifier_is_added_to_the_patient_group() -> None:
    crtdl = load("CRTDL_diagnosis_basic.json")

    enriched, warnings = enrich_crtdl(
        crtdl, [rule(PATIENT_PSEUDONYMISIERT, AttributeToAdd(attribute_ref="Patient.identifier", must_have=True))]
    )

    assert group_with_id(enriched, "Patient")["attributes"] == [
        {"attributeRef": "Patient.identifier", "mustHave": True}
    ]
    assert group_with_id(enriched, "diagnosis basic") == group_with_id(crtdl, "diagnosis basic")
    assert warnings == []


def test_existing_attribute_is_upgraded_to_must_have_but_never_downgraded() -> None:
    crtdl = load("aether-example-crtdl.json")  # pat: Patient.identifier and Patient.birthDate, both mustHave false
    crtdl["dataExtraction"]["attributeGroups"][0]["attributes"][1]["mustHave"] = True

    enriched, _ = enrich_crtdl(
        crtdl,
        [
            rule(
                PATIENT,
                AttributeToAdd(attribute_ref="Patient.identifier", must_have=True),
                AttributeToAdd(attribute_ref="Patient.birthDate", must_have=False),
            )
        ],
    )

    assert group_with_id(enriched, "pat")["attributes"] == [
        {"attributeRef": "Patient.identifier", "mustHave": True},
        {"attributeRef": "Patient.birthDate", "mustHave": True},
    ]


def test_every_group_with_the_reference_is_enriched() -> None:
    crtdl = load("CRTDL_observation_linked_encounter.json")  # two ObservationLab groups

    enriched, _ = enrich_crtdl(crtdl, [rule(OBSERVATION_LAB, AttributeToAdd(attribute_ref="Observation.subject"))])

    for group_id in ("1234", "Observation2"):
        assert {"attributeRef": "Observation.subject", "mustHave": False} in group_with_id(enriched, group_id)[
            "attributes"
        ]


def test_missing_group_is_created_when_the_rule_asks_with_an_id_from_its_name() -> None:
    crtdl = load("CRTDL_test_consent-ext.json")
    assert not any(group["groupReference"] == PATIENT for group in groups(crtdl))

    enriched, warnings = enrich_crtdl(
        crtdl,
        [
            rule(
                PATIENT,
                AttributeToAdd(attribute_ref="Patient.identifier", must_have=True),
                create_as="Patient Identifiers",
            )
        ],
    )

    assert groups(enriched)[: len(groups(crtdl))] == groups(crtdl)
    assert groups(enriched)[-1] == {
        "id": "patient-identifiers",
        "name": "Patient Identifiers",
        "groupReference": PATIENT,
        "attributes": [{"attributeRef": "Patient.identifier", "mustHave": True}],
    }
    assert warnings == []


def test_created_group_id_avoids_existing_ids() -> None:
    crtdl = load("aether-example-crtdl.json")  # has a group with id "pat"

    enriched, _ = enrich_crtdl(
        crtdl, [rule(PATIENT_PSEUDONYMISIERT, create_as="pat"), rule(ENCOUNTER, create_as="pat")]
    )

    assert [group["id"] for group in groups(enriched)] == ["pat", "diags", "pat-2", "pat-3"]


def test_crtdl_without_data_extraction_gets_one_when_a_group_must_be_created() -> None:
    crtdl = load("invalid-dataExtraction-inside-cohortDefinition.json")
    assert "dataExtraction" not in crtdl

    enriched, _ = enrich_crtdl(
        crtdl, [rule(PATIENT, AttributeToAdd(attribute_ref="Patient.identifier"), create_as="Patient")]
    )

    assert list(enriched) == [*crtdl, "dataExtraction"]
    assert [group["groupReference"] for group in groups(enriched)] == [PATIENT]


def test_missing_group_without_create_option_skips_the_rule_with_a_warning() -> None:
    crtdl = load("CRTDL_patient.json")

    enriched, warnings = enrich_crtdl(crtdl, [rule(DIAGNOSE, AttributeToAdd(attribute_ref="Condition.code"))])

    assert enriched == crtdl
    assert len(warnings) == 1 and DIAGNOSE in warnings[0]


def test_linked_groups_are_resolved_to_group_ids_after_all_rules_ran() -> None:
    crtdl = load("CRTDL_diagnosis_basic.json")
    link_to_encounter = AttributeToAdd(attribute_ref="Condition.encounter", must_have=False, linked_groups=[ENCOUNTER])

    enriched, _ = enrich_crtdl(crtdl, [rule(DIAGNOSE, link_to_encounter), rule(ENCOUNTER, create_as="Encounter")])

    assert group_with_id(enriched, "diagnosis basic")["attributes"][-1] == {
        "attributeRef": "Condition.encounter",
        "mustHave": False,
        "linkedGroups": ["encounter"],
    }


def test_linked_group_ids_are_added_to_existing_links_without_duplicates() -> None:
    crtdl = load("CRTDL_observation_linked_encounter.json")  # 1234 Observation.encounter already links to "985"
    link = AttributeToAdd(
        attribute_ref="Observation.encounter", must_have=True, linked_groups=[ENCOUNTER, PATIENT_PSEUDONYMISIERT]
    )

    enriched, _ = enrich_crtdl(crtdl, [rule(OBSERVATION_LAB, link)])

    assert group_with_id(enriched, "1234")["attributes"][0]["linkedGroups"] == ["985", "Patient"]
    assert group_with_id(enriched, "Observation2")["attributes"][-1]["linkedGroups"] == ["985", "Patient"]


def test_linking_to_a_group_without_id_gives_that_group_an_id() -> None:
    crtdl = load("CRTDL_patient.json")  # the only group has no id and no name

    enriched, _ = enrich_crtdl(
        crtdl,
        [
            rule(
                ENCOUNTER,
                AttributeToAdd(attribute_ref="Encounter.subject", linked_groups=[PATIENT_PSEUDONYMISIERT]),
                create_as="Encounter",
            )
        ],
    )

    patient_group, encounter_group = groups(enriched)
    assert patient_group["id"] == "patientpseudonymisiert"
    assert encounter_group["attributes"][0]["linkedGroups"] == ["patientpseudonymisiert"]


def test_unresolved_linked_group_is_an_error_naming_rule_attribute_and_url() -> None:
    crtdl = load("CRTDL_diagnosis_basic.json")
    link = AttributeToAdd(attribute_ref="Condition.encounter", linked_groups=[ENCOUNTER])

    with pytest.raises(UnresolvedLinkError) as raised:
        enrich_crtdl(crtdl, [rule(DIAGNOSE, link)])

    message = str(raised.value)
    assert DIAGNOSE in message and "Condition.encounter" in message and ENCOUNTER in message
    assert isinstance(raised.value, EnrichmentError)


def test_unknown_fields_and_key_order_are_preserved() -> None:
    crtdl = load("CRTDL_observation_linked_encounter.json")
    crtdl["futureField"] = {"x": 1}
    group_with_id(crtdl, "Patient")["customHint"] = "keep me"

    enriched, _ = enrich_crtdl(
        crtdl, [rule(PATIENT_PSEUDONYMISIERT, AttributeToAdd(attribute_ref="Patient.identifier"))]
    )

    assert list(enriched) == list(crtdl)
    assert enriched["futureField"] == {"x": 1}
    patient_group = group_with_id(enriched, "Patient")
    assert list(patient_group) == ["id", "groupReference", "attributes", "filter", "customHint"]
    assert patient_group["customHint"] == "keep me"
    assert enriched["cohortDefinition"] == crtdl["cohortDefinition"]


def test_input_crtdl_is_not_mutated() -> None:
    crtdl = load("CRTDL_test_it-kds-perf-w-ref.json")
    before = copy.deepcopy(crtdl)

    enrich_crtdl(
        crtdl,
        [
            rule(
                PATIENT_PSEUDONYMISIERT,
                AttributeToAdd(attribute_ref="Patient.identifier", must_have=True),
                create_as="Patient",
            ),
            rule(
                DIAGNOSE, AttributeToAdd(attribute_ref="Condition.encounter", linked_groups=[PATIENT_PSEUDONYMISIERT])
            ),
        ],
    )

    assert crtdl == before


def test_applying_the_same_rules_twice_changes_nothing_more() -> None:
    rules = [
        rule(
            PATIENT,
            AttributeToAdd(attribute_ref="Patient.identifier", must_have=True, linked_groups=[DIAGNOSE]),
            create_as="Patient",
        )
    ]

    once, _ = enrich_crtdl(load("aether-example-crtdl.json"), rules)
    twice, _ = enrich_crtdl(once, rules)

    assert twice == once


def test_malformed_data_extraction_is_an_error() -> None:
    crtdl = load("CRTDL_patient.json")
    crtdl["dataExtraction"] = ["not", "an", "object"]

    with pytest.raises(EnrichmentError, match="dataExtraction"):
        enrich_crtdl(crtdl, [rule(PATIENT, create_as="Patient")])
