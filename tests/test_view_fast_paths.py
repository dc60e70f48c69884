"""Member paths (and the functions ending them) walked without the interpreter give exactly what fhirpathpy gives
for them."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from tasks.sof.fhirpath import Item, _interpreted, compile_path, member_steps, values
from tasks.sof.resources import line_resources
from tests.conftest import TESTDATA

INPUTS = [
    TESTDATA / "flattening/example/input/fhir-data.ndjson",
    TESTDATA / "extraction/example-result/b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson",
]
PATHS = [
    "id",
    "subject.reference",
    "code.coding",
    "code.coding.system",
    "name.first().given",
    "name.family.first()",
    "deceased.ofType(boolean)",
    "deceased.ofType(dateTime)",
    "performed.ofType(Period).start",
    "performed.ofType(dateTime)",
    "code.coding.where(system = 'http://fhir.de/CodeSystem/bfarm/icd-10-gm').code",
    "code.coding.where(system='http://snomed.info/sct')",
    "extension.where(url = 'http://hl7.org/fhir/StructureDefinition/condition-assertedDate').value.ofType(dateTime)",
    "meta.profile",
    "clinicalStatus.coding.code",
    "identifier.type.coding.code",
    "address.city",
    "$this.id",
    "name.given.join(',')",
    "name.family.join()",
    "name.exists()",
    "code.coding.where(system = 'http://snomed.info/sct').exists()",
    "getResourceKey()",
    "subject.getReferenceKey()",
    "subject.getReferenceKey(Patient)",
]


def resources() -> list[dict]:
    return [
        r
        for path in INPUTS
        for line in path.read_text().splitlines()
        for r in line_resources(json.loads(line, parse_float=Decimal))
    ]


@pytest.mark.parametrize("path", PATHS)
def test_a_fast_path_agrees_with_the_interpreter(path):
    assert path == "$this.id" or member_steps(path) is not None
    fast, slow = compile_path(path), _interpreted(path)
    for resource in resources():
        focus = Item(resource, resource["resourceType"])
        assert values(fast(focus, {})) == values(slow(focus, {})), (path, resource["id"])


@pytest.mark.parametrize(
    "path", ["Patient.name", "name[0]", "a + b", "where(value > 1)", "name.where(use = %u)", "a.b()", "'x'", "true"]
)
def test_anything_else_goes_to_the_interpreter(path):
    assert member_steps(path) is None
