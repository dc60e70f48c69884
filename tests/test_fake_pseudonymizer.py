"""The pseudonymizer fake honours the wire contract other tests rely on (spec/protocols.md)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTDATA
from tests.fakes._server import LoopbackServer

REPO_ROOT = Path(__file__).resolve().parents[1]
PSEUDONYMIZER_DATA = TESTDATA / "pseudonymizer"
SERVER_SIDE_CONFIG = (PSEUDONYMIZER_DATA / "anonymization.yaml").read_bytes()
REQUEST_OVERRIDE_CONFIG = (PSEUDONYMIZER_DATA / "request-override" / "anonymization.yaml").read_bytes()
OVERRIDE_PATIENTS = [
    json.loads(line) for line in (PSEUDONYMIZER_DATA / "request-override" / "Patient.ndjson").read_text().splitlines()
]
FHIR_JSON = {"Content-Type": "application/fhir+json", "Accept": "application/fhir+json"}
HASH_IDS_CONFIG = b"fhirPathRules:\n  - path: Resource.id\n    method: cryptoHash\n"


def de_identify(server: LoopbackServer, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}/fhir/$de-identify", content=json.dumps(body), headers=headers or FHIR_JSON)


def with_config(config: bytes, resource: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceType": "Parameters",
        "parameter": [
            {
                "name": "config",
                "valueAttachment": {"contentType": "application/yaml", "data": base64.b64encode(config).decode()},
            },
            {"name": "resource", "resource": resource},
        ],
    }


def patient_bundle() -> dict[str, Any]:
    return {
        "resourceType": "Bundle",
        "id": "batch-1",
        "type": "transaction",
        "entry": [
            {
                "fullUrl": "http://torch.example/fhir/Patient/p1",
                "resource": {
                    "resourceType": "Patient",
                    "id": "p1",
                    "identifier": [{"system": "urn:mrn", "value": "MRN-1"}],
                },
                "request": {"method": "PUT", "url": "Patient/p1"},
            },
            {
                "fullUrl": "http://torch.example/fhir/Observation/o1",
                "resource": {
                    "resourceType": "Observation",
                    "id": "o1",
                    "status": "final",
                    "subject": {"reference": "Patient/p1"},
                },
                "request": {"method": "PUT", "url": "Observation/o1"},
            },
        ],
    }


def test_bare_resource_is_answered_with_the_de_identified_resource_using_the_server_config(
    pseudonymizer_fake: LoopbackServer,
) -> None:
    response = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0])

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/fhir+json"
    patient = response.json()
    assert patient["resourceType"] == "Patient"
    assert patient["id"] != "anon-patient-1" and len(patient["id"]) == 64
    assert "name" not in patient  # the built-in server config redacts HumanName
    assert patient["gender"] == "male"
    assert pseudonymizer_fake.state.requests[0].body_kind == "resource"


def test_parameters_with_config_applies_the_request_rules_and_returns_the_bare_resource(
    pseudonymizer_fake: LoopbackServer,
) -> None:
    response = de_identify(pseudonymizer_fake, with_config(REQUEST_OVERRIDE_CONFIG, OVERRIDE_PATIENTS[1]))

    assert response.status_code == 200
    patient = response.json()
    assert patient["resourceType"] == "Patient"
    assert patient["id"] == "anon-patient-2"  # Resource.id: keep
    assert patient["name"] == [{"family": "Roe", "given": ["Jane"]}]  # HumanName: keep
    assert "gender" not in patient  # Patient.gender: redact
    recorded = pseudonymizer_fake.state.requests[0]
    assert (recorded.body_kind, recorded.resource_type, recorded.parameter_names) == (
        "parameters",
        "Patient",
        ["config", "resource"],
    )


def test_same_config_gives_same_pseudonyms_and_parses_the_config_once(pseudonymizer_fake: LoopbackServer) -> None:
    first = de_identify(pseudonymizer_fake, with_config(HASH_IDS_CONFIG, OVERRIDE_PATIENTS[0])).json()
    second = de_identify(pseudonymizer_fake, with_config(HASH_IDS_CONFIG, OVERRIDE_PATIENTS[0])).json()

    assert first == second
    assert first["id"] != "anon-patient-1"
    assert pseudonymizer_fake.state.config_parses == 1


def test_different_configs_give_different_pseudonyms_unless_they_share_a_key_derivation_context(
    pseudonymizer_fake: LoopbackServer,
) -> None:
    other_rules = HASH_IDS_CONFIG + b"  - path: Patient.gender\n    method: redact\n"
    project_a = HASH_IDS_CONFIG + b"parameters:\n  keyDerivationContext: project-a\n"
    project_a_other_rules = other_rules + b"parameters:\n  keyDerivationContext: project-a\n"

    ids = {
        name: de_identify(pseudonymizer_fake, with_config(config, OVERRIDE_PATIENTS[0])).json()["id"]
        for name, config in [
            ("plain", HASH_IDS_CONFIG),
            ("other", other_rules),
            ("a", project_a),
            ("a2", project_a_other_rules),
        ]
    }

    assert len({ids["plain"], ids["other"], ids["a"]}) == 3
    assert ids["a"] == ids["a2"]


def test_bundle_entries_keep_order_and_references_still_resolve(pseudonymizer_fake: LoopbackServer) -> None:
    bundle = de_identify(pseudonymizer_fake, patient_bundle()).json()

    patient_entry, observation_entry = bundle["entry"]
    patient, observation = patient_entry["resource"], observation_entry["resource"]
    assert [patient["resourceType"], observation["resourceType"]] == ["Patient", "Observation"]
    assert patient["id"] != "p1"
    assert observation["subject"]["reference"] == f"Patient/{patient['id']}"
    assert patient_entry["fullUrl"] == f"http://torch.example/fhir/Patient/{patient['id']}"
    assert patient_entry["request"] == {"method": "PUT", "url": f"Patient/{patient['id']}"}
    assert observation_entry["request"]["url"] == f"Observation/{observation['id']}"
    assert patient["identifier"][0]["value"] not in ("MRN-1", "")
    assert bundle["type"] == "transaction"


def test_upstream_server_config_hashes_with_truncation_and_reports_rules_it_does_not_implement(
    pseudonymizer_fake: LoopbackServer,
) -> None:
    bundle = de_identify(pseudonymizer_fake, with_config(SERVER_SIDE_CONFIG, patient_bundle())).json()

    patient, observation = (entry["resource"] for entry in bundle["entry"])
    assert len(patient["id"]) == 32
    assert observation["subject"]["reference"] == f"Patient/{patient['id']}"
    assert "Patient.birthDate (generalize)" in pseudonymizer_fake.state.unsupported_rules
    assert any(
        rule.startswith("nodesByType('Identifier').where(") for rule in pseudonymizer_fake.state.unsupported_rules
    )


def test_body_over_the_size_limit_is_rejected_with_413(pseudonymizer_fake: LoopbackServer) -> None:
    pseudonymizer_fake.state.reset(max_body_bytes=1000)
    big = dict(OVERRIDE_PATIENTS[0], text={"status": "generated", "div": "<div>" + "x" * 2000 + "</div>"})

    response = de_identify(pseudonymizer_fake, big)
    small = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0])

    assert response.status_code == 413
    assert response.json()["resourceType"] == "OperationOutcome"
    assert small.status_code == 200


def test_wrong_content_type_is_rejected_with_415(pseudonymizer_fake: LoopbackServer) -> None:
    response = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0], headers={"Content-Type": "text/plain"})

    assert response.status_code == 415
    assert response.json()["issue"][0]["code"] == "not-supported"


def test_plain_json_content_type_is_accepted_like_the_real_service(pseudonymizer_fake: LoopbackServer) -> None:
    response = de_identify(
        pseudonymizer_fake, OVERRIDE_PATIENTS[0], headers={"Content-Type": "application/json; charset=utf-8"}
    )

    assert response.status_code == 200
    assert response.json()["resourceType"] == "Patient"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(with_config(b"fhirPathRules: [unclosed", OVERRIDE_PATIENTS[0]), id="bad-yaml"),
        pytest.param(
            {"resourceType": "Parameters", "parameter": [with_config(b"", {})["parameter"][0]]}, id="missing-resource"
        ),
    ],
)
def test_bad_config_or_missing_resource_part_is_rejected_with_400(
    pseudonymizer_fake: LoopbackServer, body: dict[str, Any]
) -> None:
    response = de_identify(pseudonymizer_fake, body)

    assert response.status_code == 400
    assert response.json()["issue"][0]["severity"] == "error"


def test_configured_api_key_is_required(pseudonymizer_fake: LoopbackServer) -> None:
    pseudonymizer_fake.state.reset(api_key="sesame")

    without_key = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0])
    with_key = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0], headers={**FHIR_JSON, "X-Api-Key": "sesame"})

    assert (without_key.status_code, with_key.status_code) == (401, 200)


def test_failure_switches_fail_then_recover(pseudonymizer_fake: LoopbackServer) -> None:
    pseudonymizer_fake.state.reset_next = 1
    pseudonymizer_fake.state.fail_next, pseudonymizer_fake.state.fail_status = 1, 503

    with pytest.raises(httpx.TransportError):
        de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0])
    failed = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0])
    recovered = de_identify(pseudonymizer_fake, OVERRIDE_PATIENTS[0])

    assert failed.status_code == 503
    assert failed.json()["issue"][0]["severity"] == "fatal"
    assert recovered.status_code == 200
    assert [request.status for request in pseudonymizer_fake.state.requests] == [0, 503, 200]


@pytest.mark.slow  # a subprocess
def test_runs_alone_from_the_command_line_with_a_latency(unused_tcp_port: int) -> None:
    command = [sys.executable, "-m", "tests.fakes.pseudonymizer", "--port", str(unused_tcp_port), "--latency", "0.3"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in process.stdout.readline()
        started = time.monotonic()
        answer = httpx.post(
            f"http://127.0.0.1:{unused_tcp_port}/fhir/$de-identify",
            content=json.dumps(patient_bundle()),
            headers=FHIR_JSON,
        )
        assert answer.status_code == 200 and time.monotonic() - started >= 0.3
    finally:
        process.terminate()
        process.wait(timeout=10)
