"""A Prefect API for the fast tier's ``status``, ``list`` and ``prune`` (which need a server that answers, and read
it over REST): what ``prefect server start`` answers to the calls they make. Empty, as a fresh server is, unless a
test puts flow runs and task runs in it (``state.flow_runs``, ``state.task_runs``: rows as the real server returns
them, newest first). Its ``/health`` says ``true``, ``/admin/version`` names the installed Prefect; the ``…/filter``
endpoints of flow runs (by ``tags.any_``, ``tags.all_`` and ``id.any_``) and task runs (by ``flow_runs.id.any_``
and ``task_runs.name.any_``) filter those rows with ``limit`` and ``offset``, any other filter finds nothing; a
flow run is deleted as the server does it (204, then 404); any other path is the server's 404. The requests are
kept (``state.requests``: method and path)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from importlib.metadata import version
from typing import Any

from tests.fakes._server import LoopbackServer, ResettableState

NOT_FOUND = {"detail": "Not Found"}


@dataclass
class PrefectApiState(ResettableState):
    requests: list[tuple[str, str]] = field(default_factory=list)
    flow_runs: list[dict[str, Any]] = field(default_factory=list)
    task_runs: list[dict[str, Any]] = field(default_factory=list)


def any_of(filters: dict[str, Any], name: str, sub: str = "any_") -> list[Any] | None:
    return (filters.get(name) or {}).get(sub)


def matching_flow_runs(state: PrefectApiState, body: dict[str, Any]) -> list[dict[str, Any]]:
    filters = body.get("flow_runs") or {}
    tags, all_tags, ids = any_of(filters, "tags"), any_of(filters, "tags", "all_"), any_of(filters, "id")
    return [
        run
        for run in state.flow_runs
        if (tags is None or set(tags) & set(run["tags"]))
        and set(all_tags or []) <= set(run["tags"])
        and (ids is None or run["id"] in ids)
    ]


def matching_task_runs(state: PrefectApiState, body: dict[str, Any]) -> list[dict[str, Any]]:
    runs, names = any_of(body.get("flow_runs") or {}, "id"), any_of(body.get("task_runs") or {}, "name")
    return [
        task_run
        for task_run in state.task_runs
        if (runs is None or task_run["flow_run_id"] in runs) and (names is None or task_run["name"] in names)
    ]


class PrefectApiHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.state.requests.append(("GET", self.path))
        if self.path == "/api/health":
            self.answer(200, True)
        elif self.path == "/api/admin/version":
            self.answer(200, version("prefect"))
        else:
            self.answer(404, NOT_FOUND)

    def do_POST(self) -> None:
        state: PrefectApiState = self.server.state
        state.requests.append(("POST", self.path))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/api/flow_runs/filter":
            rows = matching_flow_runs(state, body)
        elif self.path == "/api/task_runs/filter":
            rows = matching_task_runs(state, body)
        elif self.path.endswith("/filter"):
            rows = []
        else:
            return self.answer(404, NOT_FOUND)
        offset = body.get("offset") or 0
        self.answer(200, rows[offset : offset + (body.get("limit") or 200)])

    def do_DELETE(self) -> None:
        state: PrefectApiState = self.server.state
        state.requests.append(("DELETE", self.path))
        gone = [run for run in state.flow_runs if self.path == f"/api/flow_runs/{run['id']}"]
        for run in gone:
            state.flow_runs.remove(run)
        self.send_response(204) if gone else self.answer(404, NOT_FOUND)
        if gone:
            self.send_header("Content-Length", "0")
            self.end_headers()

    def answer(self, status: int, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def start_prefect_api() -> LoopbackServer:
    return LoopbackServer(PrefectApiHandler, PrefectApiState()).start()
