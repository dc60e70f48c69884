"""Result content of the fake extraction server: FHIR bundles, NDJSON files and diagnostics reports.

Shapes follow the real TORCH example result: one ``transaction`` Bundle per patient, entries with
``request: {method: PUT, url: Type/id}``, one Patient, resources per CRTDL attribute group (meta.profile =
the group's profile, referencing the patient), and one Provenance per group that produced something
(``entity[].what.identifier`` = attribute_group system + group id, ``target[]`` = what it produced).

Files are written once, line by line, into the state's temporary directory the first time they are
asked for, so a benchmark can ask for gigabytes without holding them in memory. In directory mode
(``serve_dir``) the files are an existing directory's NDJSON files instead, served as they are.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from tests.fakes.extraction_crtdl import AttributeGroup, Crtdl

if TYPE_CHECKING:
    from tests.fakes.extraction_state import ExtractionServerState, Job

ATTRIBUTE_GROUP_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/attribute_group"
EXTRACTION_ID_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/extraction_id"
PROGRAM_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/program"
PATIENT_ID_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/sid/fake-patient-id"
CORE_FILE = "core.ndjson"
SUMMARY_FILE = "reports/job-summary.json"
RESOURCE_EXCLUSIONS_FILE = "reports/resource-exclusions.csv"
PATIENT_EXCLUSIONS_FILE = "reports/patient-exclusions.csv"
_CSV_HEADERS = {
    RESOURCE_EXCLUSIONS_FILE: '"Batch-ID","Reason","Group","Attribute","Resource-ID","Patient-ID"\n',
    PATIENT_EXCLUSIONS_FILE: '"Batch-ID","Stage","Patient-ID"\n',
}
_AUDIT_FIELDS = {
    "Consent": ("id", "meta", "patient", "provision", "dateTime", "status"),
    "Encounter": ("id", "meta", "subject", "period"),
}
_FILE_LOCK = threading.Lock()
SERVED_SUFFIXES = (".ndjson", ".ndjson.zst")


@dataclass(frozen=True)
class ContentPlan:
    """Content settings captured when a job is submitted, so files and manifest agree."""

    resources_per_patient: int
    core_resources_per_group: int
    default_core_types: tuple[str, ...]


# --- counts --------------------------------------------------------------------------------------
def resources_per_group(crtdl: Crtdl, plan: ContentPlan) -> dict[str, int]:
    """Resources each patient gets per patient resource group: ``resources_per_patient`` round-robin."""
    groups = crtdl.patient_resource_groups
    if not groups:
        return {}
    base, extra = divmod(plan.resources_per_patient, len(groups))
    return {g.id: base + (1 if i < extra else 0) for i, g in enumerate(groups)}


def has_consent_audit(job: Job) -> bool:
    """Whether batches get a consent audit file (the CRTDL fetches Consent or Encounter data)."""
    counts = resources_per_group(job.crtdl, job.plan)
    return any(counts.get(g.id) for g in job.crtdl.patient_resource_groups if g.resource_type in _AUDIT_FIELDS)


def diagnostics_summary(job: Job) -> dict:
    """The diagnostics summary object (manifest extension and reports/job-summary.json)."""
    counts = resources_per_group(job.crtdl, job.plan)
    inclusions = {}
    for group in job.crtdl.groups:
        if group.is_patient:
            inclusions[group.name] = job.cohort_size
        elif group.is_core:
            inclusions[group.name] = job.plan.core_resources_per_group
        else:
            inclusions[group.name] = counts.get(group.id, 0) * job.cohort_size
    return {
        "Num-Cohort-Patients": job.cohort_size,
        "Num-Final-Patients": job.cohort_size,
        "Duration-Measurements": {
            stage: {"medianNanos": 10_000 * (i + 1), "averageNanos": 12_000 * (i + 1)}
            for i, stage in enumerate(
                ("CONSENT_FETCH", "DIRECT_LOAD", "REFERENCE_RESOLVE", "CASCADING_DELETE", "COPY_REDACT")
            )
        },
        "Patient-Exclusions": {"CASCADING_DELETE": 0, "DIRECT_LOAD": 0, "CONSENT": 0},
        "Resource-Exclusions": {
            group.name: {
                "Must-Have": {ref: 0 for ref in group.must_have},
                "Consent": 0,
                "Reference-Not-Found": 0,
                "Resource-Outside-Batch": 0,
                "Cascading-Delete": 0,
            }
            for group in job.crtdl.groups
        },
        "Resource-Inclusions": inclusions,
    }


# --- bundles -------------------------------------------------------------------------------------
def patient_bundle(job: Job, patient_id: str, recorded: str) -> dict:
    crtdl = job.crtdl
    patient = _patient(patient_id, crtdl.patient_group.profile)
    produced: list[tuple[AttributeGroup, list[dict]]] = [(crtdl.patient_group, [patient])]
    context = _PatientContext(patient_id, _core_medication_ref(job))
    counts = resources_per_group(crtdl, job.plan)
    for index, group in enumerate(crtdl.patient_resource_groups):
        ids = (f"{patient_id}-{group.resource_type.lower()}-{index}-{k}" for k in range(counts[group.id]))
        produced.append((group, [context.resource(group, resource_id) for resource_id in ids]))
    resources = [r for _, rs in produced for r in rs]
    provenances = [_provenance(job, group, rs, patient_id, recorded) for group, rs in produced if rs]
    return _transaction(str(uuid.uuid5(_namespace(job.id), patient_id)), resources + provenances)


def core_bundle(job: Job, recorded: str) -> dict:
    """One transaction Bundle of non-patient resources: those of the CRTDL's core groups (with their
    Provenance), or, when the CRTDL has none, ``default_core_types`` resources without Provenance."""
    resources, provenances = [], []
    for group_index, group in enumerate(job.crtdl.core_groups):
        produced = [
            _core_resource(group.resource_type, _core_id(job, group.resource_type, group_index, k), group.profile)
            for k in range(job.plan.core_resources_per_group)
        ]
        resources += produced
        if produced:
            provenances.append(_provenance(job, group, produced, "core", recorded))
    if not job.crtdl.core_groups:
        resources = [
            _core_resource(rtype, _core_id(job, rtype, i, k), None)
            for i, rtype in enumerate(job.plan.default_core_types)
            for k in range(job.plan.core_resources_per_group)
        ]
    return _transaction(str(uuid.uuid5(_namespace(job.id), "core")), resources + provenances)


def consent_audit_bundle(patient_bundle_: dict) -> dict:
    """The consent audit line of one patient: minimized Consent and Encounter resources."""
    entries = []
    for entry in patient_bundle_["entry"]:
        resource = entry["resource"]
        keep = _AUDIT_FIELDS.get(resource["resourceType"])
        if keep:
            minimized = {"resourceType": resource["resourceType"], **{k: resource[k] for k in keep if k in resource}}
            entries.append({"resource": minimized})
    return {"resourceType": "Bundle", "id": patient_bundle_["id"] + "-consent", "type": "collection", "entry": entries}


def _transaction(bundle_id: str, resources: list[dict]) -> dict:
    return {
        "resourceType": "Bundle",
        "id": bundle_id,
        "type": "transaction",
        "entry": [
            {"resource": r, "request": {"method": "PUT", "url": f"{r['resourceType']}/{r['id']}"}} for r in resources
        ],
    }


def _provenance(job: Job, group: AttributeGroup, targets: list[dict], scope: str, recorded: str) -> dict:
    provenance_id = uuid.uuid5(_namespace(job.id), f"provenance/{scope}/{group.id}")
    return {
        "resourceType": "Provenance",
        "id": f"torch-{provenance_id}",
        "target": [{"reference": f"{r['resourceType']}/{r['id']}"} for r in targets],
        "occurredPeriod": {"start": recorded},
        "recorded": recorded,
        "agent": [{"who": {"identifier": {"system": PROGRAM_SYSTEM, "value": "torch"}}}],
        "entity": [
            {"role": "source", "what": {"identifier": {"system": ATTRIBUTE_GROUP_SYSTEM, "value": group.id}}},
            {"role": "source", "what": {"identifier": {"system": EXTRACTION_ID_SYSTEM, "value": job.id}}},
        ],
    }


@lru_cache(maxsize=64)
def _namespace(job_id: str) -> uuid.UUID:
    return uuid.UUID(job_id)


def _number(text: str, modulo: int) -> int:
    return int(hashlib.blake2s(text.encode(), digest_size=4).hexdigest(), 16) % modulo


def _patient(patient_id: str, profile: str) -> dict:
    n = _number(patient_id, 36500)
    return {
        "resourceType": "Patient",
        "id": patient_id,
        "meta": {"profile": [profile]},
        "identifier": [
            {
                "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203", "code": "MR"}]},
                "system": PATIENT_ID_SYSTEM,
                "value": patient_id,
            },
            {
                "use": "official",
                "type": {"coding": [{"system": "http://fhir.de/CodeSystem/identifier-type-de-basis", "code": "GKV"}]},
                "system": "http://fhir.de/sid/gkv/kvid-10",
                "value": f"A{n:09d}",
            },
        ],
        "gender": "female" if n % 2 else "male",
        "birthDate": f"{1930 + n % 80}-{1 + n % 12:02d}-{1 + n % 28:02d}",
    }


def _core_id(job: Job, resource_type: str, group_index: int, k: int) -> str:
    return f"{resource_type.lower()}-{job.crtdl.digest}-{group_index}-{k}"


def _core_medication_ref(job: Job) -> str | None:
    for index, group in enumerate(job.crtdl.core_groups):
        if group.resource_type == "Medication" and job.plan.core_resources_per_group:
            return f"Medication/{_core_id(job, 'Medication', index, 0)}"
    return None


def _core_resource(resource_type: str, resource_id: str, profile: str | None) -> dict:
    resource: dict = {"resourceType": resource_type, "id": resource_id}
    if profile:
        resource["meta"] = {"profile": [profile]}
    if resource_type == "Medication":
        resource["code"] = {"coding": [{"system": "http://fhir.de/CodeSystem/bfarm/atc", "code": "B01AC06"}]}
    elif resource_type == "Substance":
        resource["code"] = {"coding": [{"system": "http://snomed.info/sct", "code": "387458008"}]}
    else:
        resource["name"] = f"{resource_type} {resource_id}"
    return resource


class _PatientContext:
    """Builds the patient's resources; later ones reference the patient's first Encounter."""

    def __init__(self, patient_id: str, medication_ref: str | None):
        self.subject = {"reference": f"Patient/{patient_id}"}
        self.medication_ref = medication_ref
        self.encounter: dict | None = None

    def resource(self, group: AttributeGroup, resource_id: str) -> dict:
        rtype = group.resource_type
        resource: dict = {"resourceType": rtype, "id": resource_id, "meta": {"profile": [group.profile]}}
        n = _number(resource_id, 1000)
        date = f"2024-{1 + n % 12:02d}-{1 + n % 28:02d}"
        if rtype == "Encounter":
            resource |= {
                "identifier": [{"system": "https://fake.example.org/fhir/sid/Aufnahmenummern", "value": resource_id}],
                "status": "finished",
                "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "IMP"},
                "subject": self.subject,
                "period": {"start": f"{date}T08:00:00+01:00", "end": f"{date}T16:00:00+01:00"},
            }
            self.encounter = self.encounter or {"reference": f"Encounter/{resource_id}"}
            return resource
        if rtype == "Consent":
            return resource | {
                "status": "active",
                "scope": {
                    "coding": [{"system": "http://terminology.hl7.org/CodeSystem/consentscope", "code": "research"}]
                },
                "category": [{"coding": [{"system": "http://loinc.org", "code": "57016-8"}]}],
                "patient": self.subject,
                "dateTime": date,
                "provision": {"type": "deny", "period": {"start": date}},
            }
        resource |= {"subject": self.subject}
        if self.encounter and rtype in ("Condition", "Observation", "Procedure"):
            resource["encounter"] = self.encounter
        if rtype == "Condition":
            code = ("E11.9", "I10", "J45.9", "B05.3")[n % 4]
            resource |= {
                "clinicalStatus": {
                    "coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical", "code": "active"}]
                },
                "code": {
                    "coding": [{"system": "http://fhir.de/CodeSystem/bfarm/icd-10-gm", "version": "2023", "code": code}]
                },
                "recordedDate": date,
            }
        elif rtype == "Observation":
            resource |= {
                "status": "final",
                "category": [
                    {
                        "coding": [
                            {
                                "system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                "code": "laboratory",
                            }
                        ]
                    }
                ],
                "code": {"coding": [{"system": "http://loinc.org", "code": "718-7", "display": "Hemoglobin"}]},
                "effectiveDateTime": f"{date}T09:30:00+01:00",
                "valueQuantity": {
                    "value": 10 + n % 80 / 10,
                    "unit": "g/dL",
                    "system": "http://unitsofmeasure.org",
                    "code": "g/dL",
                },
            }
        elif rtype == "Procedure":
            resource |= {
                "status": "completed",
                "code": {
                    "coding": [{"system": "http://fhir.de/CodeSystem/bfarm/ops", "version": "2023", "code": "5-323.51"}]
                },
                "performedDateTime": f"{date}T10:14:00+01:00",
            }
        elif rtype.startswith("Medication"):
            resource["status"] = "completed"
            if self.medication_ref:
                resource["medicationReference"] = {"reference": self.medication_ref}
            else:
                resource["medicationCodeableConcept"] = {
                    "coding": [{"system": "http://fhir.de/CodeSystem/bfarm/atc", "code": "B01AC06"}]
                }
        return resource


# --- files ---------------------------------------------------------------------------------------
def batch_file(batch_id: str) -> str:
    return f"{batch_id}.ndjson"


def consent_file(batch_id: str) -> str:
    return f"{batch_id}_consent.ndjson"


def served_files(directory: Path) -> list[str]:
    """Directory mode: the NDJSON files (plain or zstd) under ``directory`` as relative paths, core last."""
    names = sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name.endswith(SERVED_SUFFIXES) and not path.name.startswith(".")
    )
    return sorted(names, key=lambda name: Path(name).name.startswith(CORE_FILE))


def materialize(state: ExtractionServerState, job: Job, name: str) -> Path:
    """The file on disk: in directory mode the served file itself, otherwise generated on first use (to a
    temporary name, then renamed)."""
    if state.serve_dir is not None:
        return Path(state.serve_dir) / name
    path = state.workdir / job.id / name
    if path.exists():
        return path
    with _FILE_LOCK:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            with partial.open("wb") as out:
                for chunk in _file_chunks(state, job, name):
                    out.write(chunk)
            os.replace(partial, path)
    return path


def _file_chunks(state: ExtractionServerState, job: Job, name: str) -> Iterator[bytes]:
    recorded = state.wall(job.submitted_at).isoformat(timespec="milliseconds")
    if name == CORE_FILE:
        yield orjson.dumps(core_bundle(job, recorded)) + b"\n"
    elif name == SUMMARY_FILE:
        yield orjson.dumps(diagnostics_summary(job), option=orjson.OPT_INDENT_2)
    elif name in _CSV_HEADERS:
        yield _CSV_HEADERS[name].encode()
    elif name.endswith("_consent.ndjson"):
        for patient_id in job.batch_patients(name.removesuffix("_consent.ndjson")):
            yield orjson.dumps(consent_audit_bundle(patient_bundle(job, patient_id, recorded))) + b"\n"
    else:
        for patient_id in job.batch_patients(name.removesuffix(".ndjson")):
            yield orjson.dumps(patient_bundle(job, patient_id, recorded)) + b"\n"


def remove_job_files(state: ExtractionServerState, job_id: str) -> None:
    shutil.rmtree(state.workdir / job_id, ignore_errors=True)
