"""A server that is no Prefect API but answers ``GET /health`` with ``true``, as many services' health checks do;
every other path gets ``elsewhere`` (by default a web page). ``python -m tests.fakes.foreign_api --port N``."""

from __future__ import annotations

from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from tests.fakes._server import ResettableState, serve_forever_cli

WEB_PAGE = b"<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>It works.</body></html>\n"


@dataclass
class ForeignState(ResettableState):
    elsewhere: bytes = WEB_PAGE
    content_type: str = "text/html"


class ForeignHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        state: ForeignState = self.server.state
        healthy = self.path.rstrip("/").endswith("/health")
        body, kind = (b"true", "application/json") if healthy else (state.elsewhere, state.content_type)
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    serve_forever_cli(ForeignHandler, ForeignState(), "a non-Prefect server whose /health answers true")
