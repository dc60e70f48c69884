"""Client of the MII flattening service (fhir-flattener, SQL-on-FHIR v2): ``$run`` and the health check.

Wire contract (spec/protocols.md, "Flattening service"):

- ``GET {service_url}/fhir/metadata``: a CapabilityStatement listing operation ``$run`` on ``ViewDefinition``;
  anything else is "not a flattening service".
- ``POST {service_url}/fhir/ViewDefinition/$run?_format=ndjson`` with ``Content-Type: application/fhir+json`` and
  ``Accept: application/x-ndjson``; the body is a ``Parameters`` with a ``viewDefinition`` part and one
  ``resources`` part per resource. The answer is NDJSON, one object per row keyed by column name.

``$run`` computes rows and changes nothing on the server, so it is retried like a read. Numbers in the answer are
read as ``Decimal`` so that they reach the CSV as written. Plain Python: no Prefect in here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from tasks.clients.http import ServiceClient
from tasks.errors import StepError

METADATA_PATH = "/fhir/metadata"
RUN_PATH = "/fhir/ViewDefinition/$run"
RUN_HEADERS = {"Content-Type": "application/fhir+json", "Accept": "application/x-ndjson"}


class FlattenerError(StepError):
    """The flattening service cannot be used or gave an answer that cannot be read."""


class Flattener:
    """The flattening service behind ``client`` (a ``ServiceClient`` rooted at ``service_url``)."""

    def __init__(self, client: ServiceClient):
        self.client = client

    def check(self) -> None:
        """Raise ``FlattenerError`` unless the service's CapabilityStatement lists ``$run`` on ViewDefinition."""
        response = self.client.request("GET", METADATA_PATH, operation="read the flattening service's metadata")
        try:
            statement = response.json()
        except ValueError:
            statement = None
        if not lists_view_run(statement):
            raise FlattenerError(
                f"{self.client.endpoint.base_url} is not a flattening service: its {METADATA_PATH} lists no $run "
                "operation on ViewDefinition (check services.flattening.service_url)"
            )

    def run(self, view: bytes, resources: list[bytes]) -> Iterator[dict[str, Any]]:
        """The rows of ``view`` (compact JSON) over ``resources`` (each compact JSON), as the service answers."""
        body = run_parameters(view, resources)
        response = self.client.request(
            "POST",
            RUN_PATH,
            operation=f"$run over {len(resources)} resources",
            params={"_format": "ndjson"},
            headers=RUN_HEADERS,
            content=body,
        )
        for number, line in enumerate(response.text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_float=Decimal)
            except ValueError as exc:
                raise FlattenerError(f"the flattening service's $run answer line {number} is not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise FlattenerError(f"the flattening service's $run answer line {number} is not a JSON object")
            yield row


def run_parameters(view: bytes, resources: list[bytes]) -> bytes:
    """The ``$run`` body: a Parameters with the viewDefinition part, then one resources part per resource."""
    parts = [b'{"name":"viewDefinition","resource":' + view + b"}"]
    parts += [b'{"name":"resources","resource":' + resource + b"}" for resource in resources]
    return b'{"resourceType":"Parameters","parameter":[' + b",".join(parts) + b"]}"


def lists_view_run(statement: Any) -> bool:
    """Does this CapabilityStatement list operation ``$run`` on ViewDefinition (per resource or system-wide)?"""
    if not isinstance(statement, dict) or statement.get("resourceType") != "CapabilityStatement":
        return False
    for rest in statement.get("rest") or []:
        for resource in rest.get("resource") or []:
            if resource.get("type") == "ViewDefinition" and _has_run(resource.get("operation")):
                return True
        for operation in rest.get("operation") or []:
            if _is_run(operation) and "ViewDefinition" in str(operation.get("definition", "")):
                return True
    return False


def _has_run(operations: Any) -> bool:
    return any(_is_run(operation) for operation in operations or [])


def _is_run(operation: Any) -> bool:
    return isinstance(operation, dict) and str(operation.get("name", "")).lstrip("$") == "run"
