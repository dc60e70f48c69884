"""The real ``sekmet-fhir`` FHIR server (PyPI; FastAPI + SQLite, transactions with rollback, Basic auth), started
on loopback for the send tests.

It runs in its own environment through ``uvx --from sekmet-fhir==<version> sekmet serve --config <yaml>`` (its
dependencies, e.g. fhir.resources 8, would clash with ours), with a fresh database per server, Basic auth, strict
structural validation of incoming resources (``warn`` by default), its workflow simulator and traffic log off.
Tests assert on what the server stores by searching it (``SekmetServer.search`` / ``read``), not on what the client
thinks it sent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port

SEKMET_VERSION = "0.1.1"
STARTUP_SECONDS = 180.0  # the first start installs the package into uv's cache
USERNAME = "dupflow"
PASSWORD = "sekmet-password-42"


class SekmetServer:
    """One running sekmet server; ``url`` is the root (the client appends ``/fhir``)."""

    def __init__(self, workdir: Path, *, basic_auth: bool = True, validation: str = "warn"):
        self.workdir = workdir
        self.validation = validation
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.basic_auth = basic_auth
        self._process: subprocess.Popen | None = None
        self._reader: httpx.Client | None = None

    def start(self) -> SekmetServer:
        uvx = shutil.which("uvx")
        if uvx is None:
            pytest.skip("uvx is not installed; the send tests start the real sekmet-fhir server through it")
        config = self.workdir / "sekmet.yaml"
        auth = (
            f"server_auth: {{types: [basic], users: {{{USERNAME}: {PASSWORD}}}}}"
            if self.basic_auth
            else "server_auth: {types: [none]}"
        )
        config.write_text(
            f"base_url: {self.url}/fhir\nhost: 127.0.0.1\nport: {self.port}\n"
            f"data_dir: {self.workdir}\ndb_path: {self.workdir / 'sekmet.db'}\n"
            "log_inbound: false\nsimulator: {enabled: false}\n"
            f"validation: {{inbound: {self.validation}}}\n{auth}\n"
        )
        env = {key: value for key, value in os.environ.items() if not key.startswith(("APP_", "SEKMET_"))}
        with open(self.workdir / "sekmet.log", "wb") as log:
            self._process = subprocess.Popen(
                [uvx, "--from", f"sekmet-fhir=={SEKMET_VERSION}", "sekmet", "serve", "--config", str(config)],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._wait_until_up()
        return self

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"sekmet exited with {self._process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/fhir/metadata", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"sekmet did not answer within {STARTUP_SECONDS} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return (self.workdir / "sekmet.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=10)
        if self._reader is not None:
            self._reader.close()
        self._process = self._reader = None

    # --- reading what the server stores --------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        """One client for all reads (making an httpx client costs a TLS context, ~0.1 s)."""
        if self._reader is None:
            auth = (USERNAME, PASSWORD) if self.basic_auth else None
            self._reader = httpx.Client(base_url=f"{self.url}/fhir", auth=auth, timeout=60)
        return self._reader

    def read(self, resource_type: str, resource_id: str) -> dict | None:
        response = self._client().get(f"/{resource_type}/{resource_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def search(self, resource_type: str, **params: str) -> list[dict]:
        """Every match of a search, across pages."""
        return list(self._search_pages(resource_type, params))

    def _search_pages(self, resource_type: str, params: dict[str, str]) -> Iterator[dict]:
        client = self._client()
        response = client.get(f"/{resource_type}", params={**params, "_count": "1000"})
        while True:
            response.raise_for_status()
            bundle = response.json()
            yield from (entry["resource"] for entry in bundle.get("entry") or [])
            following = next((link["url"] for link in bundle.get("link") or [] if link["relation"] == "next"), None)
            if following is None:
                return
            response = client.get(following)

    def stored(self, resources: list[dict]) -> dict[str, dict]:
        """What the server holds for these resources (by ``Type/id``), searched by ``_id`` in chunks."""
        found: dict[str, dict] = {}
        by_type: dict[str, list[str]] = {}
        for resource in resources:
            by_type.setdefault(resource["resourceType"], []).append(resource["id"])
        for resource_type, ids in by_type.items():
            for start in range(0, len(ids), 200):
                for hit in self.search(resource_type, _id=",".join(ids[start : start + 200])):
                    found[f"{resource_type}/{hit['id']}"] = hit
        return found

    def count(self, resource_type: str, **params: str) -> int:
        response = self._client().get(f"/{resource_type}", params={**params, "_summary": "count"})
        response.raise_for_status()
        return response.json()["total"]


def start_sekmet(workdir: Path, *, basic_auth: bool = True, validation: str = "warn") -> SekmetServer:
    """``validation``: sekmet's inbound structural validation, ``warn`` (log only) or ``strict`` (reject). The
    real TORCH test data is not valid for its R4B models (an Encounter without ``class``), hence ``warn``."""
    workdir.mkdir(parents=True, exist_ok=True)
    return SekmetServer(workdir, basic_auth=basic_auth, validation=validation).start()


def without_meta(resource: dict) -> dict:
    """A resource as sent: the server adds ``meta.versionId`` and ``meta.lastUpdated``."""
    meta = {k: v for k, v in (resource.get("meta") or {}).items() if k not in ("versionId", "lastUpdated")}
    stripped = {k: v for k, v in resource.items() if k != "meta"}
    return {**stripped, "meta": meta} if meta else stripped
