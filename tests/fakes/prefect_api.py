"""A Prefect API with an empty database, for the fast tier's ``status``, ``list`` and ``prune`` (which need a server
that answers, and read it over REST): what a fresh ``prefect server start`` answers to the calls they make. Its
``/health`` says ``true``, ``/admin/version`` names the installed Prefect, every ``…/filter`` finds nothing, and any
other path is the server's 404. The requests are kept (``state.requests``: method and path)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from importlib.metadata import version

from tests.fakes._server import LoopbackServer, ResettableState

NOT_FOUND = {"detail": "Not Found"}


@dataclass
class EmptyPrefectState(ResettableState):
    requests: list[tuple[str, str]] = field(default_factory=list)


class EmptyPrefectHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.state.requests.append(("GET", self.path))
        if self.path == "/api/health":
            self.answer(200, True)
        elif self.path == "/api/admin/version":
            self.answer(200, version("prefect"))
        else:
            self.answer(404, NOT_FOUND)

    def do_POST(self) -> None:
        self.server.state.requests.append(("POST", self.path))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(200, []) if self.path.endswith("/filter") else self.answer(404, NOT_FOUND)

    def answer(self, status: int, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def start_empty_prefect_api() -> LoopbackServer:
    return LoopbackServer(EmptyPrefectHandler, EmptyPrefectState()).start()
