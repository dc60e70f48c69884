"""The fake extraction server follows the extraction-server contract (spec + real-server deviations)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import zstandard

from tests.fakes.extraction_server import JobStatus, start_extraction_server
from tests.fakes.extraction_state import ManualClock
from tests.support.extraction import CRTDL_DIR, kickoff_body, poll_until_done, submit

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTDATA = REPO_ROOT.parent / "shared" / "testdata"
FHIR_JSON = "application/fhir+json"
ATTRIBUTE_GROUP_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/attribute_group"


def job_id(status_url: str) -> str:
    return status_url.rsplit("/", 1)[1]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def client():
    with httpx.Client(timeout=10) as c:
        yield c


@pytest.fixture
def srv():
    with start_extraction_server() as server:
        yield server


@pytest.fixture
def manual(clock):
    """A server whose jobs move only when ``clock.tick`` is called."""
    with start_extraction_server(clock=clock) as server:
        yield server


def finish(clock: ManualClock) -> None:
    clock.tick(10)


# --- kick-off, poll, download ---------------------------------------------------------------------
def test_kickoff_then_polling_reaches_a_manifest_whose_files_hold_patient_bundles_with_provenance(
    manual, clock, client
):
    status_url = submit(client, manual, "CRTDL_MedicationAdministraion_linked_encounter_linked_medication.json")
    assert status_url == f"{manual.base_url}/fhir/__status/{job_id(status_url)}"

    first = client.get(status_url, headers={"Accept": "application/json"})
    assert first.status_code == 202
    assert first.headers["Content-Type"] == "application/json"
    assert first.headers["X-Progress"] == "Pending"
    assert first.json()["issue"][-1]["diagnostics"] == (
        f"Job {job_id(status_url)}\n status: PENDING\n batch progress: 0%\n cohort Size: 0"
    )

    finish(clock)
    done = poll_until_done(client, status_url)
    assert done.status_code == 200
    manifest = done.json()
    assert manifest["request"] == status_url
    assert manifest["requiresAccessToken"] is False
    assert manifest["error"] == []
    assert {o["type"] for o in manifest["output"]} == {"NDJSON Bundle"}
    urls = [o["url"] for o in manifest["output"]]
    assert urls[-1].endswith("/core.ndjson") and len(urls) == 4  # 5 patients in batches of 2, then core
    extensions = {e["url"]: e for e in manifest["extension"]}
    job_record = extensions["https://torch.mii.de/fhir/StructureDefinition/torch-job"]["valueObject"]
    assert (job_record["id"], job_record["status"]) == (job_id(status_url), "COMPLETED")
    summary = extensions["torch-job-diagnostics-summary"]["valueObject"]
    assert summary["Num-Cohort-Patients"] == 5
    assert set(summary["Duration-Measurements"]) == {
        "CONSENT_FETCH",
        "DIRECT_LOAD",
        "REFERENCE_RESOLVE",
        "CASCADING_DELETE",
        "COPY_REDACT",
    }
    for name in ("torch-resource-exclusions", "torch-patient-exclusions", "torch-job-diagnostics-summary"):
        assert client.get(extensions[name]["valueUrl"]).status_code == 200
    assert "torch-job-issues" not in extensions

    crtdl = json.loads(
        (CRTDL_DIR / "CRTDL_MedicationAdministraion_linked_encounter_linked_medication.json").read_text()
    )
    group_ids = {g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]}
    patients = []
    for url in urls[:-1]:
        response = client.get(url, headers={"Accept": "application/fhir+ndjson"})
        assert response.headers["Content-Type"] == "application/fhir+ndjson"
        for line in response.text.splitlines():
            bundle = json.loads(line)
            assert bundle["type"] == "transaction"
            resources = {f"{e['resource']['resourceType']}/{e['resource']['id']}": e for e in bundle["entry"]}
            assert all(e["request"] == {"method": "PUT", "url": ref} for ref, e in resources.items())
            [patient] = [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"]
            patients.append(patient["id"])
            assert patient["identifier"]
            provenances = [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Provenance"]
            routed = set()
            for provenance in provenances:
                [group] = [
                    x["what"]["identifier"]["value"]
                    for x in provenance["entity"]
                    if x["what"]["identifier"]["system"] == ATTRIBUTE_GROUP_SYSTEM
                ]
                assert group in group_ids
                routed |= {t["reference"] for t in provenance["target"]}
            assert routed == {ref for ref in resources if not ref.startswith("Provenance/")}
    assert len(set(patients)) == 5

    core = json.loads(client.get(urls[-1]).text)
    assert core["type"] == "transaction"
    assert {e["resource"]["resourceType"] for e in core["entry"]} == {"Medication", "Provenance"}


def test_patient_parameters_replace_the_cohort(srv, client):
    status_url = submit(client, srv, patients=("Patient/VHF00006", "1"))
    manifest = poll_until_done(client, status_url).json()
    [batch_url, _core] = [o["url"] for o in manifest["output"]]
    bundles = [json.loads(line) for line in client.get(batch_url).text.splitlines()]
    patient_ids = [
        e["resource"]["id"] for b in bundles for e in b["entry"] if e["resource"]["resourceType"] == "Patient"
    ]
    assert patient_ids == ["VHF00006", "1"]
    assert srv.state.submissions[-1].headers["content-type"] == "application/fhir+json"


def _parameters_with_crtdl(value: str) -> bytes:
    return json.dumps(
        {"resourceType": "Parameters", "parameter": [{"name": "crtdl", "valueBase64Binary": value}]}
    ).encode()


@pytest.mark.parametrize(
    ("body", "diagnostics"),
    [
        ((TESTDATA / "extraction/Parameters_invalid_CRTDL.json").read_bytes(), "No Patient Attribute Group"),
        (b"{not json", "Input is not a valid Parameters Resource"),
        (b'{"resourceType": "Parameters", "parameter": []}', "Missing parameter 'crtdl'"),
        (_parameters_with_crtdl("%%% not base64 %%%"), "Parameter 'crtdl' is not valid Base64"),
        (_parameters_with_crtdl(base64.b64encode(b"{oops").decode()), "CRTDL is not valid JSON"),
        (_parameters_with_crtdl(base64.b64encode(b'{"dataExtraction": {}}').decode()), "CRTDL has no cohortDefinition"),
    ],
)
def test_invalid_kickoff_answers_400_with_a_fatal_outcome(srv, client, body, diagnostics):
    response = client.post(
        f"{srv.base_url}/fhir/$extract-data", content=body, headers={"Content-Type": "application/fhir+json"}
    )
    assert response.status_code == 400
    [issue] = response.json()["issue"]
    assert (issue["severity"], issue["code"]) == ("fatal", "invalid")
    assert issue["diagnostics"].startswith(diagnostics)
    assert srv.state.submissions[-1].status == 400 and srv.state.jobs == {}


def test_kickoff_needs_an_acceptable_accept_header(srv, client):
    body = kickoff_body((CRTDL_DIR / "CRTDL_patient.json").read_bytes())
    assert (
        client.post(f"{srv.base_url}/fhir/$extract-data", json=body, headers={"Accept": "text/plain"}).status_code
        == 406
    )
    assert client.post(f"{srv.base_url}/fhir/$extract-data", json=body, headers={"Accept": "*/*"}).status_code == 202


def test_kickoff_switches_answer_200_or_omit_content_location(client):
    body = kickoff_body((CRTDL_DIR / "CRTDL_patient.json").read_bytes())
    with start_extraction_server(kickoff_status=200, omit_content_location=True) as server:
        response = client.post(f"{server.base_url}/fhir/$extract-data", json=body)
    assert response.status_code == 200 and "Content-Location" not in response.headers
    assert len(server.state.jobs) == 1


# --- status rows ------------------------------------------------------------------------------------
def test_progress_moves_through_every_running_state_with_x_progress(client, clock):
    one_second_each = dict.fromkeys(
        ("PENDING", "RUNNING_GET_COHORT", "RUNNING_PROCESS_BATCH", "RUNNING_PROCESS_CORE"), 1.0
    )
    with start_extraction_server(
        clock=clock, durations=one_second_each, cohort_size=8, batch_size=2, max_concurrency=2
    ) as server:
        status_url = submit(client, server)
        seen = []
        for _ in range(6):
            response = client.get(status_url)
            seen.append(response.headers.get("X-Progress"))
            clock.tick(1.0)
        assert seen == [
            "Pending",
            "Getting cohort",
            "Processing batches (0%)",
            "Processing batches (50%)",
            "Processing core resources",
            None,
        ]
        assert response.status_code == 200


def test_status_codes_follow_the_job_state(manual, client, clock):
    base = manual.base_url
    assert client.get(f"{base}/fhir/__status/not-a-uuid").status_code == 400
    assert client.get(f"{base}/fhir/__status/6f1b8ad4-0000-4000-8000-000000000000").status_code == 404

    cancelled = submit(client, manual)
    assert client.post(f"{base}/fhir/Task/{job_id(cancelled)}/$cancel").status_code == 200
    assert client.get(cancelled).status_code == 410

    temp_failed = submit(client, manual)
    manual.state.force_status(job_id(temp_failed), JobStatus.TEMP_FAILED)
    assert client.get(temp_failed).status_code == 503

    paused = submit(client, manual)
    clock.tick(0.06)
    assert client.post(f"{base}/fhir/Task/{job_id(paused)}/$pause").status_code == 200
    response = client.get(paused)
    assert (response.status_code, response.headers["X-Progress"]) == (202, "Paused")

    deleted = submit(client, manual)
    assert client.delete(f"{base}/fhir/Task/{job_id(deleted)}").status_code == 204
    assert client.get(deleted).status_code == 404


def test_failed_job_answers_500_with_its_diagnostics(client, clock):
    with start_extraction_server(clock=clock, fail_jobs=True, failure_diagnostics="cohort exploded") as server:
        status_url = submit(client, server)
        finish(clock)
        response = client.get(status_url)
        assert response.status_code == 500
        assert response.json()["issue"][0] == {
            "severity": "fatal",
            "code": "exception",
            "diagnostics": "cohort exploded",
        }
        task = client.get(f"{server.base_url}/fhir/Task/{job_id(status_url)}").json()
        assert task["status"] == "failed"


def test_fault_switches_on_status_polls(manual, client, clock):
    status_url = submit(client, manual)
    manual.state.status_unavailable_polls = 2
    assert [client.get(status_url).status_code for _ in range(3)] == [503, 503, 202]

    manual.state.fail_next_status = True
    assert client.get(status_url).status_code == 500

    second = submit(client, manual)
    manual.state.forget_jobs()
    assert client.get(second).status_code == 404
    assert manual.state.polls[job_id(status_url)] == 4


def test_102_interim_answer_precedes_the_202(manual, client):
    manual.state.status_102 = "interim"
    response = client.get(submit(client, manual))
    assert response.status_code == 202  # httpx skips the informational 102


# --- manifest variants ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "check"),
    [
        ({"file_url_style": "relative"}, lambda url, base: url.startswith("/files/")),
        (
            {"file_url_style": "host_prefixed"},
            lambda url, base: url.startswith(base.removeprefix("http://") + "/files/"),
        ),
        ({"extension_style": "extractor"}, None),
    ],
)
def test_manifest_url_and_extension_styles(client, clock, options, check):
    with start_extraction_server(clock=clock, **options) as server:
        status_url = submit(client, server)
        finish(clock)
        manifest = client.get(status_url).json()
    if check:
        assert all(check(o["url"], server.base_url) for o in manifest["output"])
    else:
        urls = {e["url"] for e in manifest["extension"]}
        assert "https://torch.mii.de/fhir/StructureDefinition/extractor-job" in urls
        assert "extractor-job-diagnostics-summary" in urls


def test_parameters_result_shape_carries_output_url_parts(client, clock):
    with start_extraction_server(clock=clock, result_shape="parameters") as server:
        status_url = submit(client, server)
        finish(clock)
        result = client.get(status_url).json()
    assert result["resourceType"] == "Parameters"
    urls = [
        p["valueUri"] for o in result["parameter"] if o["name"] == "output" for p in o["part"] if p["name"] == "url"
    ]
    assert len(urls) == 4 and urls[-1].endswith("/core.ndjson")


@pytest.mark.parametrize(("mode", "issues_expected"), [("with_issues", True), ("without_issues", False)])
def test_empty_output_with_and_without_issues(client, clock, mode, issues_expected):
    with start_extraction_server(clock=clock, empty_output=mode) as server:
        status_url = submit(client, server)
        finish(clock)
        manifest = client.get(status_url).json()
    assert manifest["output"] == []
    issues = [e["valueObject"] for e in manifest["extension"] if e["url"] == "torch-job-issues"]
    assert bool(issues) is issues_expected


# --- Task API -------------------------------------------------------------------------------------
def test_task_search_is_lenient_unless_strict_handling_is_preferred(manual, client):
    first, second = job_id(submit(client, manual)), job_id(submit(client, manual))
    search = f"{manual.base_url}/fhir/Task"

    bundle = client.get(search, params={"_id": f"{first},not-a-uuid", "foo": "1"}).json()
    assert (bundle["type"], bundle["total"], bundle["entry"][0]["resource"]["id"]) == ("searchset", 1, first)
    assert client.get(search, params={"status": "PENDING"}).json()["total"] == 2
    assert client.get(search, params={"status": "COMPLETED"}).json()["total"] == 0
    assert {e["resource"]["id"] for e in client.get(search).json()["entry"]} == {first, second}

    strict = client.get(search, params={"_id": "not-a-uuid", "foo": "1"}, headers={"Prefer": "handling=strict"})
    assert strict.status_code == 400
    assert strict.json()["issue"][0]["diagnostics"] == (
        "Unsupported search parameters: [foo]; Invalid _id values: [not-a-uuid]"
    )


def test_task_read_maps_status_and_shows_progress_extension_with_active_batches(client, clock):
    with start_extraction_server(clock=clock, cohort_size=6, batch_size=2, max_concurrency=2) as server:
        task_url = f"{server.base_url}/fhir/Task/{job_id(submit(client, server))}"
        pending = client.get(task_url).json()
        assert (pending["status"], pending["businessStatus"]["coding"][0]["code"]) == ("requested", "PENDING")
        assert "extension" not in pending

        clock.tick(0.11)  # pending 0.05 + cohort 0.05 -> batch phase
        task = client.get(task_url).json()
        assert task["status"] == "in-progress" and task["priority"] == "routine"
        [progress] = task["extension"]
        assert progress["url"] == "https://torch.mii.de/fhir/torch-job-progress"
        values = {e["url"]: e.get("valueInteger") for e in progress["extension"]}
        assert values | {"activeBatch": None} == {
            "cohortSize": 6,
            "batchSize": 2,
            "batchesTotal": 3,
            "batchesCompleted": 0,
            "activeBatch": None,
        }
        active = [e for e in progress["extension"] if e["url"] == "activeBatch"]
        assert len(active) == 2
        assert {p["url"] for p in active[0]["extension"]} == {"batchId", "stage"}

        assert (
            client.get(f"{server.base_url}/fhir/Task/6f1b8ad4-0000-4000-8000-000000000000").json()["issue"][0]["code"]
            == "not-found"
        )


def test_priority_put_needs_a_current_if_match_version(manual, client):
    task_url = f"{manual.base_url}/fhir/Task/{job_id(submit(client, manual))}"
    version = client.get(task_url).json()["meta"]["versionId"]
    body = {"resourceType": "Task", "status": "requested", "intent": "order", "priority": "asap"}

    assert client.put(task_url, json=body).status_code == 428
    stale = client.put(task_url, json=body, headers={"If-Match": 'W/"0"'})
    assert stale.status_code == 409
    assert stale.json()["issue"][0]["diagnostics"] == f"Version mismatch: expected {version}, got 0"

    updated = client.put(task_url, json=body, headers={"If-Match": f'W/"{version}"'})
    assert updated.status_code == 200
    assert updated.json()["priority"] == "asap"
    assert int(updated.json()["meta"]["versionId"]) > int(version)

    manual.state.stale_version_status = 412
    assert client.put(task_url, json=body, headers={"If-Match": f'W/"{version}"'}).status_code == 412


def test_high_priority_jobs_leave_the_queue_first(client, clock):
    with start_extraction_server(clock=clock, max_running_jobs=1) as server:
        running, normal, urgent = (job_id(submit(client, server)) for _ in range(3))
        clock.tick(0.06)
        task_url = f"{server.base_url}/fhir/Task/{urgent}"
        version = client.get(task_url).json()["meta"]["versionId"]
        client.put(task_url, json={"resourceType": "Task", "priority": "stat"}, headers={"If-Match": f'W/"{version}"'})
        clock.tick(0.2)  # the first job completes; one slot frees
        statuses = {j: server.state.job(j).status for j in (running, normal, urgent)}
    assert statuses == {
        running: JobStatus.COMPLETED,
        normal: JobStatus.PENDING,
        urgent: JobStatus.RUNNING_PROCESS_BATCH,
    }


def test_pause_resume_cancel_follow_the_transition_table(manual, client, clock):
    task = f"{manual.base_url}/fhir/Task/{job_id(submit(client, manual))}"
    assert client.post(f"{task}/$pause").status_code == 409  # PENDING is not running
    assert client.post(f"{task}/$resume").status_code == 409
    clock.tick(0.06)
    paused = client.post(f"{task}/$pause").json()
    assert (paused["status"], paused["businessStatus"]["coding"][0]["code"]) == ("on-hold", "PAUSED")
    clock.tick(5)  # paused jobs do not advance
    resumed = client.post(f"{task}/$resume").json()
    assert resumed["businessStatus"]["coding"][0]["code"] == "RUNNING_GET_COHORT"
    cancelled = client.post(f"{task}/$cancel").json()
    assert (cancelled["status"], "end" in cancelled["executionPeriod"]) == ("cancelled", True)
    again = client.post(f"{task}/$cancel")
    assert again.status_code == 409
    assert again.json()["issue"][0]["diagnostics"].endswith("cannot be $cancel: already cancelled")


def test_real_server_transitions_allow_pause_from_pending_and_repeated_cancel(client, clock):
    with start_extraction_server(clock=clock, lenient_transitions=True) as server:
        task = f"{server.base_url}/fhir/Task/{job_id(submit(client, server))}"
        assert client.post(f"{task}/$pause").json()["businessStatus"]["coding"][0]["code"] == "PAUSED"
        assert client.post(f"{task}/$cancel").status_code == 200
        assert client.post(f"{task}/$cancel").status_code == 200


def test_kickoff_and_put_need_a_json_content_type_and_if_match_a_weak_etag(manual, client):
    body = json.dumps(kickoff_body((CRTDL_DIR / "CRTDL_diagnosis_basic.json").read_bytes()))
    kickoff = client.post(f"{manual.base_url}/fhir/$extract-data", content=body, headers={"Content-Type": "text/plain"})
    assert kickoff.status_code == 415 and manual.state.jobs == {}
    task_url = f"{manual.base_url}/fhir/Task/{job_id(submit(client, manual))}"
    version = client.get(task_url).json()["meta"]["versionId"]
    task = json.dumps({"resourceType": "Task", "priority": "asap"})

    strong = client.put(task_url, content=task, headers={"If-Match": f'"{version}"', "Content-Type": FHIR_JSON})
    assert strong.status_code == 400 and "weak ETag" in strong.json()["issue"][0]["diagnostics"]
    plain = client.put(task_url, content=task, headers={"If-Match": f'W/"{version}"', "Content-Type": "text/plain"})
    assert plain.status_code == 415
    assert client.put(
        task_url, content=task, headers={"If-Match": f'W/"{version}"', "Content-Type": FHIR_JSON}
    ).is_success


def test_a_put_can_meet_a_version_that_just_moved_on(manual, client):
    task_url = f"{manual.base_url}/fhir/Task/{job_id(submit(client, manual))}"
    manual.state.move_version_on_put = 1
    body = {"resourceType": "Task", "priority": "asap"}
    version = client.get(task_url).json()["meta"]["versionId"]
    assert client.put(task_url, json=body, headers={"If-Match": f'W/"{version}"'}).status_code == 409
    version = client.get(task_url).json()["meta"]["versionId"]
    assert client.put(task_url, json=body, headers={"If-Match": f'W/"{version}"'}).status_code == 200


def test_delete_removes_the_job_and_its_files(manual, client, clock):
    status_url = submit(client, manual)
    finish(clock)
    file_url = client.get(status_url).json()["output"][0]["url"]
    assert client.get(file_url).status_code == 200
    task_url = f"{manual.base_url}/fhir/Task/{job_id(status_url)}"
    manual.state.delete_fails = True
    assert client.delete(task_url).status_code == 500
    manual.state.delete_fails = False
    assert client.delete(task_url).status_code == 204
    assert client.delete(task_url).status_code == 404
    assert client.get(file_url).status_code == 404


def test_deleted_jobs_files_vanish_later_as_on_the_real_server(client, clock):
    with start_extraction_server(clock=clock, delete_files_after=30) as server:
        status_url = submit(client, server)
        finish(clock)
        file_url = client.get(status_url).json()["output"][0]["url"]
        assert client.delete(f"{server.base_url}/fhir/Task/{job_id(status_url)}").status_code == 204
        assert client.get(status_url).status_code == 404
        task_url = f"{server.base_url}/fhir/Task/{job_id(status_url)}"
        task = client.get(task_url).json()  # as TORCH: DELETED until the files are removed, and left out of a search
        assert (task["status"], task["businessStatus"]["coding"][0]["code"]) == ("cancelled", "DELETED")
        assert client.get(f"{server.base_url}/fhir/Task").json()["total"] == 0
        assert client.get(file_url).status_code == 200  # the job is gone, its files not yet
        clock.tick(30)
        assert client.get(file_url).status_code == 404
        assert client.get(task_url).status_code == 404
        assert not (server.state.workdir / job_id(status_url)).exists()


# --- cohort preview -------------------------------------------------------------------------------
def test_evaluate_cohort_answers_a_list_of_the_matching_patients_without_creating_a_job(srv, client):
    crtdl = (CRTDL_DIR / "CRTDL_diagnosis_basic.json").read_bytes()
    answer = client.post(
        f"{srv.base_url}/fhir/$evaluate-cohort", content=crtdl, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 200
    cohort = answer.json()
    assert (cohort["resourceType"], cohort["mode"]) == ("List", "snapshot")
    references = [e["item"]["reference"] for e in cohort["entry"]]
    assert len(references) == 5 and all(r.startswith("Patient/") for r in references)
    assert srv.state.jobs == {}
    extracted = srv.state.job(job_id(submit(client, srv))).patient_ids
    assert tuple(r.removeprefix("Patient/") for r in references) == extracted

    ccdl = json.dumps(json.loads(crtdl)["cohortDefinition"]).encode()
    bare = client.post(
        f"{srv.base_url}/fhir/$evaluate-cohort", content=ccdl, headers={"Content-Type": "application/json"}
    )
    assert bare.status_code == 200 and len(bare.json()["entry"]) == 5


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [(b'{"foo": 1}', "application/json", 400), (b"{", "application/json", 400), (b"{}", FHIR_JSON, 415)],
)
def test_evaluate_cohort_refuses_what_is_no_cohort_definition(srv, client, content, content_type, status):
    answer = client.post(
        f"{srv.base_url}/fhir/$evaluate-cohort", content=content, headers={"Content-Type": content_type}
    )
    assert answer.status_code == status


def test_older_servers_have_no_cohort_preview(client):
    with start_extraction_server(cohort_preview=False) as server:
        crtdl = (CRTDL_DIR / "CRTDL_diagnosis_basic.json").read_bytes()
        answer = client.post(
            f"{server.base_url}/fhir/$evaluate-cohort", content=crtdl, headers={"Content-Type": "application/json"}
        )
        operations = client.get(f"{server.base_url}/fhir/metadata").json()["rest"][0]["operation"]
    assert answer.status_code == 404
    assert [o["name"] for o in operations] == ["extract-data"]


def test_auth_check_answers_401_to_api_requests_without_the_credentials(client):
    with start_extraction_server(auth_check=lambda headers: headers.get("x-api-key") == "k") as server:
        assert client.get(f"{server.base_url}/fhir/Task").status_code == 401
        assert client.get(f"{server.base_url}/fhir/Task", headers={"X-Api-Key": "k"}).status_code == 200


def test_consent_audit_files_are_linked_from_task_output(manual, client, clock):
    status_url = submit(client, manual, "CRTDL_test_consent-ext.json")
    finish(clock)
    task = client.get(f"{manual.base_url}/fhir/Task/{job_id(status_url)}").json()
    assert len(task["output"]) == 3 and task["output"][0]["type"] == {"text": "Consent audit NDJSON"}
    audit = [json.loads(line) for line in client.get(task["output"][0]["valueUrl"]).text.splitlines()]
    assert {b["type"] for b in audit} == {"collection"}
    assert {e["resource"]["resourceType"] for b in audit for e in b["entry"]} == {"Consent"}
    assert not any("_consent" in o["url"] for o in client.get(status_url).json()["output"])


# --- files: HEAD, Range, faults -------------------------------------------------------------------
@pytest.fixture
def file_url(manual, client, clock) -> str:
    status_url = submit(client, manual)
    finish(clock)
    return client.get(status_url).json()["output"][0]["url"]


def test_head_and_range_probes(manual, client, file_url):
    full = client.get(file_url)
    head = client.head(file_url)
    assert (head.status_code, int(head.headers["Content-Length"])) == (200, len(full.content))
    probe = client.get(file_url, headers={"Range": "bytes=0-0"})
    assert probe.status_code == 206
    assert probe.headers["Content-Range"] == f"bytes 0-0/{len(full.content)}"
    assert probe.content == full.content[:1]
    key = file_url.split("/files/", 1)[1]
    assert (manual.state.file_heads[key], manual.state.range_probes[key], manual.state.file_gets[key]) == (1, 1, 2)

    manual.state.head_status = 405
    assert client.head(file_url).status_code == 405


def test_files_answer_404_until_they_become_visible(manual, client, file_url):
    manual.state.file_not_ready_probes = 2
    assert [client.head(file_url).status_code for _ in range(3)] == [404, 404, 200]


def test_reset_mid_body_breaks_the_download(manual, client, file_url):
    manual.state.reset_downloads, manual.state.reset_after_bytes = 1, 100
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        client.get(file_url)
    assert client.get(file_url).status_code == 200  # only the next download was affected


def test_stall_mid_body_delays_but_completes_the_download(manual, client, file_url):
    expected = client.get(file_url).content
    manual.state.stall_downloads, manual.state.stall_after_bytes, manual.state.stall_seconds = 1, 50, 0.3
    started = time.monotonic()
    assert client.get(file_url).content == expected
    assert time.monotonic() - started >= 0.3


def test_files_on_a_second_origin_see_their_own_requests(client, clock):
    with start_extraction_server(clock=clock, file_origin=True) as server:
        status_url = submit(client, server)
        finish(clock)
        manifest = client.get(status_url, headers={"Authorization": "Bearer api-only"}).json()
        url = manifest["output"][0]["url"]
        assert url.startswith(server.file_server.base_url + "/files/")
        assert client.get(url).status_code == 200
        file_requests = server.state.requests_to("/files/", origin="files")
    assert len(file_requests) == 1 and file_requests[0].header("Authorization") is None
    assert server.state.requests_to("/fhir/__status/", origin="api")[-1].header("Authorization") == "Bearer api-only"


# --- directory mode -------------------------------------------------------------------------------
@pytest.fixture
def result_dir(tmp_path) -> Path:
    """Real TORCH result files: a batch file plain, the same zstd-compressed in a subfolder, and a core file."""
    source = TESTDATA / "extraction" / "example-result" / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"
    (tmp_path / "results" / "more").mkdir(parents=True)
    (tmp_path / "results" / "core.ndjson").write_bytes(b"")
    (tmp_path / "results" / source.name).write_bytes(source.read_bytes())
    compressed = zstandard.ZstdCompressor().compress(source.read_bytes())
    (tmp_path / "results" / "more" / "batch-2.ndjson.zst").write_bytes(compressed)
    (tmp_path / "results" / "notes.txt").write_text("not a result file")
    return tmp_path / "results"


def test_directory_mode_serves_a_directory_as_a_completed_jobs_output(client, result_dir):
    with start_extraction_server(serve_dir=result_dir) as server:
        manifest = client.get(server.served_status_url).json()
        urls = [o["url"] for o in manifest["output"]]
        base = f"{server.base_url}/files/{server.served_job_id}/"
        assert urls == [
            base + "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson",
            base + "more/batch-2.ndjson.zst",
            base + "core.ndjson",
        ]
        original = (result_dir / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson").read_bytes()
        plain = client.get(urls[0])
        assert plain.content == original and plain.headers["Content-Type"] == "application/fhir+ndjson"
        compressed = client.get(urls[1])
        assert zstandard.ZstdDecompressor().decompress(compressed.content) == original
        assert compressed.headers["Content-Type"] == "application/zstd"
        head = client.head(urls[0])
        assert (head.status_code, int(head.headers["Content-Length"])) == (200, len(original))
        probe = client.get(urls[0], headers={"Range": "bytes=10-19"})
        assert (probe.status_code, probe.content) == (206, original[10:20])
        assert client.get(base + "notes.txt").status_code == 404
        assert client.get(base + "../results/notes.txt").status_code == 404


def test_directory_mode_jobs_submitted_later_end_with_the_same_files(client, result_dir):
    with start_extraction_server(serve_dir=result_dir) as server:
        status_url = submit(client, server)
        manifest = poll_until_done(client, status_url).json()
        names = [o["url"].rsplit(job_id(status_url) + "/", 1)[1] for o in manifest["output"]]
    assert names == ["b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson", "more/batch-2.ndjson.zst", "core.ndjson"]


@pytest.mark.slow  # a subprocess
def test_directory_mode_from_the_command_line(client, result_dir):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.extraction_server", "--port", "0", "--serve-dir", str(result_dir)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening" in process.stdout.readline()
        status_url = process.stdout.readline().rsplit(" ", 1)[1].strip()
        manifest = client.get(status_url).json()
        assert len(manifest["output"]) == 3
        assert client.get(manifest["output"][0]["url"]).content.startswith(b'{"resourceType":')
    finally:
        process.terminate()
        process.wait(timeout=5)


def test_response_delay_slows_every_answer(client):
    with start_extraction_server(response_delay=0.2) as server:
        started = time.monotonic()
        assert client.get(f"{server.base_url}/fhir/metadata").status_code == 200
    assert time.monotonic() - started >= 0.2


@pytest.mark.slow  # a subprocess
def test_runs_alone_from_the_command_line(client):
    """On port 0 the system gives a free port at the bind (one chosen before could be taken by then): the fake
    names it in its first line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.extraction_server", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = process.stdout.readline()
        assert "listening on http://127.0.0.1:" in first
        metadata = client.get(f"{first.rsplit(' ', 1)[1].strip()}/fhir/metadata")
        assert metadata.json()["resourceType"] == "CapabilityStatement"
    finally:
        process.terminate()
        process.wait(timeout=5)
