"""Client of the MII flattening service: ``$run`` and the health check.

Note: no Prefect. See docs/development.md#service-clients.
"""

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import orjson

from tasks.core.json_shapes import as_object, as_objects, JsonObject
from tasks.clients.bounds import MB, Deadline, answer_within, read_answer
from tasks.clients.errors import Call, json_or_none, network_error, raise_for_service_status
from tasks.core.exact_json import loads_exact
from tasks.core.redaction import redact
from tasks.clients.http import ServiceClient
from tasks.clients.retry import call_with_retry
from tasks.core.errors import StepError

METADATA_PATH = "/fhir/metadata"
RUN_PATH = "/fhir/ViewDefinition/$run"
RUN_HEADERS = {"Content-Type": "application/fhir+json", "Accept": "application/x-ndjson"}
MAX_ROW_BYTES = 16 * MB
"""The longest line of a ``$run`` answer that is read: one row, one CSV line."""
MAX_METADATA_BYTES = 16 * MB
"""The most of a CapabilityStatement that is read (a full FHIR server's runs to a few hundred
KB)."""
DEADLINE_SETTING = "services.flattening.timeout"
NOT_A_SERVICE_HINT = "is services.flattening.service_url the flattening service's root?"


class Flattener:
    """The flattening service behind ``client``.

    Note: ``deadline`` bounds each whole request, rows included; by default the client's read
    timeout, ``services.flattening.timeout``.
    """

    def __init__(self, client: ServiceClient, *, deadline: timedelta | None = None):
        self.client, self._service = client, client.endpoint.name
        self._deadline = client.endpoint.timeout if deadline is None else deadline

    def check(self) -> None:
        """Raise ``StepError`` unless the service lists ``$run`` on ViewDefinition.

        Note: read from its CapabilityStatement.
        """
        operation = "read the flattening service's metadata"
        with self._answer("GET", METADATA_PATH, operation) as (response, _):
            content = read_answer(
                response,
                MAX_METADATA_BYTES,
                operation=operation,
                service=self._service,
                hint=NOT_A_SERVICE_HINT,
            )
        if not lists_view_run(json_or_none(content)):
            raise StepError(
                f"{redact(self.client.endpoint.base_url)} is not a flattening service: its "
                f"{METADATA_PATH} lists no $run operation on ViewDefinition (check "
                "services.flattening.service_url)"
            )

    def run(self, view: bytes, resources: list[bytes]) -> Iterator[JsonObject]:
        """Yield the rows of ``view`` over ``resources`` (compact JSON each) as they come."""
        operation = f"$run over {len(resources)} resources"
        with self._answer(
            "POST",
            RUN_PATH,
            operation,
            params={"_format": "ndjson"},
            headers=RUN_HEADERS,
            body=run_parameters(view, resources),
        ) as (response, deadline):
            lines = answer_lines(response, deadline, operation, self._service)
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    yield parse_row(line, number)

    @contextlib.contextmanager
    def _answer(
        self, method: str, path: str, operation: str, **request: Any
    ) -> Iterator[tuple[httpx.Response, Deadline]]:
        """Return a 2xx answer whose body is still to be read, and its reading's deadline.

        Why: failures before the answer starts are retried; a failure while it is read is not (rows
        were taken).
        """
        where: Call = {"operation": operation, "service": self._service}

        def attempt() -> tuple[contextlib.ExitStack, httpx.Response, Deadline]:
            deadline = Deadline(self._deadline, DEADLINE_SETTING)
            with contextlib.ExitStack() as stack:
                response = stack.enter_context(
                    answer_within(self.client.http, deadline, method, path, **where, **request)
                )
                raise_for_service_status(response, **where)
                return stack.pop_all(), response, deadline

        answer, response, deadline = call_with_retry(
            attempt, self.client.retry, **where, sleep=self.client.sleep
        )
        with answer:
            yield response, deadline


def answer_lines(
    response: httpx.Response, deadline: Deadline, operation: str, service: str
) -> Iterator[bytes]:
    """Yield the answer's lines as they arrive (no newline), ``MAX_ROW_BYTES`` at most."""
    line = bytearray()
    try:
        for piece in response.iter_bytes():
            start = 0
            while (end := piece.find(b"\n", start)) >= 0:
                line += piece[start:end]
                yield bytes(line)
                line.clear()
                start = end + 1
            line += piece[start:]
            if len(line) > MAX_ROW_BYTES:
                raise StepError(
                    "a row of the flattening service's $run answer is longer than "
                    f"{MAX_ROW_BYTES // MB} MB (MAX_ROW_BYTES); the service's answer is not "
                    "NDJSON rows"
                )
    except httpx.TransportError as exc:
        deadline.check(operation, service)  # the deadline shut the connection down
        raise network_error(exc, operation=operation, service=service) from exc
    if line:
        yield bytes(line)


def parse_row(line: bytes, number: int) -> JsonObject:
    """Parse one row of the answer, numbers exact.

    Why: orjson checks the line first, strictly: no lone surrogate (no UTF-8 CSV could hold it),
    nesting bounded (``json`` would raise RecursionError).
    """
    try:
        orjson.loads(line)
        row = loads_exact(line)
    except (ValueError, RecursionError) as exc:
        raise StepError(
            f"the flattening service's $run answer line {number} is not JSON ({exc})"
        ) from exc
    if not isinstance(row, dict):
        raise StepError(f"the flattening service's $run answer line {number} is not a JSON object")
    return row


def run_parameters(view: bytes, resources: list[bytes]) -> bytes:
    parts = [b'{"name":"viewDefinition","resource":' + view + b"}"]
    parts += [b'{"name":"resources","resource":' + resource + b"}" for resource in resources]
    return b'{"resourceType":"Parameters","parameter":[' + b",".join(parts) + b"]}"


def lists_view_run(statement: Any) -> bool:
    """Tell whether a CapabilityStatement lists ``$run`` on ViewDefinition.

    Note: per resource or system-wide.
    """
    if as_object(statement).get("resourceType") != "CapabilityStatement":
        return False
    for rest in as_objects(statement.get("rest")):
        for resource in as_objects(rest.get("resource")):
            operations = as_objects(resource.get("operation"))
            if resource.get("type") == "ViewDefinition" and any(_is_run(op) for op in operations):
                return True
        for operation in as_objects(rest.get("operation")):
            if _is_run(operation) and "ViewDefinition" in str(operation.get("definition", "")):
                return True
    return False


def _is_run(operation: JsonObject) -> bool:
    return str(operation.get("name", "")).lstrip("$") == "run"
