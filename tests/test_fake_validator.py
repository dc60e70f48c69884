"""The fake validator: real findings from fhir.resources on the shared test data, and its fault switches."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.fakes.validator import FHIR_JSON, VALIDATE_PATH, validate_document
from tests.support.validation import shared_data


def collection(*resources: dict[str, Any], full_urls: bool = True) -> dict[str, Any]:
    entries = [
        {"fullUrl": f"http://localhost/fhir/{r['resourceType']}/{r['id']}", "resource": r}
        if full_urls
        else {"resource": r}
        for r in resources
    ]
    return {"resourceType": "Bundle", "type": "collection", "entry": entries}


def post(server, document: Any, content_type: str = FHIR_JSON, timeout: float = 10) -> httpx.Response:
    body = json.dumps(document).encode()
    return httpx.post(
        server.base_url + VALIDATE_PATH, content=body, headers={"Content-Type": content_type}, timeout=timeout
    )


def errors_of(outcome: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["expression"][0], i["code"]) for i in outcome["issue"] if i["severity"] in ("error", "fatal")]


def test_valid_patients_are_all_ok_with_one_information_issue(validator_fake):
    response = post(validator_fake, collection(*shared_data("Patient.ndjson")))

    assert response.status_code == 200 and response.headers["content-type"] == FHIR_JSON
    assert response.json() == {
        "resourceType": "OperationOutcome",
        "issue": [{"severity": "information", "code": "informational", "details": {"text": "All OK"}}],
    }


def test_invalid_patients_give_one_error_per_bad_element_located_by_fhirpath(validator_fake):
    outcome = post(validator_fake, collection(*shared_data("InvalidPatient.ndjson"))).json()

    assert sorted(errors_of(outcome)) == [
        ("Bundle.entry[0].resource.birthDate", "value"),
        ("Bundle.entry[0].resource.gender", "code-invalid"),
        ("Bundle.entry[1].resource.contact[0].gender", "code-invalid"),
        ("Bundle.entry[1].resource.multipleBirthInteger", "value"),
    ]
    assert all(i["location"] == i["expression"] and i["details"]["text"] for i in outcome["issue"])


def test_the_condition_with_an_unknown_clinical_status_code_is_an_error(validator_fake):
    outcome = post(validator_fake, collection(*shared_data("Condition.ndjson"))).json()

    assert ("Bundle.entry[0].resource.clinicalStatus.coding[0].code", "code-invalid") in errors_of(outcome)
    message = next(i["details"]["text"] for i in outcome["issue"] if "clinicalStatus" in i["expression"][0])
    assert "'bogus-status'" in message and "condition-clinical" in message


def test_nested_bundle_entries_are_validated_as_resources_of_their_own():
    inner = {
        "resourceType": "Bundle",
        "type": "transaction",
        "entry": [{"resource": shared_data("InvalidPatient.ndjson")[0]}],
    }
    issues = validate_document(collection({**inner, "id": "b1"}))

    assert ("Bundle.entry[0].resource.entry[0].resource.birthDate", "value") in errors_of({"issue": issues})


def test_a_reference_resolves_through_full_urls_and_is_a_warning_otherwise():
    patient = {"resourceType": "Patient", "id": "p1"}
    condition = {"resourceType": "Condition", "id": "c1", "subject": {"reference": "Patient/p1"}}

    assert validate_document(collection(patient, condition))[0]["details"]["text"] == "All OK"
    warnings = [
        i for i in validate_document(collection(patient, condition, full_urls=False)) if i["severity"] == "warning"
    ]
    assert [w["expression"] for w in warnings] == [["Bundle.entry[1].resource.subject.reference"]]


def test_an_unknown_resource_type_is_an_error():
    issues = validate_document(collection({"resourceType": "NoSuchThing", "id": "x"}))
    assert errors_of({"issue": issues}) == [("Bundle.entry[0].resource", "structure")]


def test_a_wrong_content_type_is_415_and_a_body_that_is_not_json_is_400(validator_fake):
    assert post(validator_fake, collection(), content_type="application/json").status_code == 415
    response = httpx.post(validator_fake.base_url + VALIDATE_PATH, content=b"{", headers={"Content-Type": FHIR_JSON})
    assert response.status_code == 400 and response.json()["resourceType"] == "OperationOutcome"


def test_a_body_above_the_limit_is_413_with_an_operation_outcome(validator_fake):
    validator_fake.state.reset(max_body_bytes=100)
    response = post(validator_fake, collection(*shared_data("Patient.ndjson")))
    assert response.status_code == 413 and response.json()["issue"][0]["code"] == "too-costly"


def test_a_5xx_storm_answers_the_next_requests_with_a_fatal_outcome_then_recovers(validator_fake):
    validator_fake.state.reset(fail_next=2, fail_status=503)
    statuses = [post(validator_fake, collection()).status_code for _ in range(3)]
    assert statuses == [503, 503, 200]


def test_findings_can_be_answered_with_422_like_older_hapi_servers(validator_fake):
    validator_fake.state.reset(findings_status=422)
    assert post(validator_fake, collection(*shared_data("InvalidPatient.ndjson"))).status_code == 422
    assert post(validator_fake, collection(*shared_data("Patient.ndjson"))).status_code == 200


def test_a_slow_drip_sends_the_answer_in_pieces_over_the_drip_time(validator_fake):
    validator_fake.state.reset(drip_seconds=0.6)
    started = time.monotonic()
    response = post(validator_fake, collection(*shared_data("InvalidPatient.ndjson")))
    assert response.status_code == 200 and len(errors_of(response.json())) == 4
    assert time.monotonic() - started >= 0.5


def test_requests_are_recorded_with_their_entries_and_status(validator_fake):
    post(validator_fake, collection(*shared_data("Patient.ndjson")))
    (recorded,) = validator_fake.state.answered
    assert (recorded.path, recorded.entries, recorded.status, recorded.content_type) == (
        VALIDATE_PATH,
        2,
        200,
        FHIR_JSON,
    )
