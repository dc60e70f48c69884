"""The http_import step through the command line, against a scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from flows.run import EXIT_FAILED, EXIT_OK, main
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.support.jobs import job_file, only_job_dir, step_results

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

NDJSON = b"".join(b'{"resourceType":"Patient","id":"p%d"}\n' % i for i in range(3))
NDJSON_TYPE = {"Content-Type": "application/fhir+ndjson"}


def serve(*replies: Reply) -> tuple[LoopbackServer, EchoState]:
    state = EchoState(replies=list(replies))
    return LoopbackServer(EchoHandler, state), state


def http_import_config(compression: dict) -> dict:
    """The configuration tree of an http_import-only pipeline with quick retries."""
    return {
        "pipeline": {"enabled_steps": ["http_import"]},
        "compression": compression,
        "retry": {"max_attempts": 3, "initial_backoff_ms": 10, "max_backoff_ms": 50},
    }


def start(write_config, url: str, compression: dict | None = None) -> int:
    """``dupflow start`` of ``url``; compression at level fastest unless given."""
    config = write_config(http_import_config(compression or {"level": "fastest"}))
    return main(["start", str(config), url, "--no-progress"])


def import_dir(tmp_path: Path) -> Path:
    return only_job_dir(tmp_path / "jobs") / "import"


def test_a_url_is_imported_named_after_its_last_segment_compressed_and_counted(tmp_path, write_config):
    server, state = serve(Reply(200, NDJSON_TYPE, NDJSON))
    with server:
        assert start(write_config, f"{server.base_url}/export/patients?part=1") == EXIT_OK
        job_dir = only_job_dir(tmp_path / "jobs")
        assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK
    (request,) = state.requests  # continue did not fetch again
    assert request.path == "/export/patients?part=1" and "authorization" not in request.headers
    stored = job_dir / "import" / "patients.ndjson.zst"
    assert zstandard.ZstdDecompressor().decompressobj().decompress(stored.read_bytes()) == NDJSON
    result = step_results(job_dir)[0]
    size = stored.stat().st_size
    assert result["files"] == [
        {"name": "patients.ndjson.zst", "size": size, "resources": 3, "bundles": 0, "bundled": 0}
    ]
    assert result["summary"]["source"] == f"{server.base_url}/export/patients"  # no query: it may hold a token


def test_a_zstd_body_is_stored_plain_when_compression_is_off(tmp_path, write_config):
    server, _ = serve(Reply(200, NDJSON_TYPE, zstandard.ZstdCompressor().compress(NDJSON)))
    with server:
        assert start(write_config, f"{server.base_url}/data.ndjson.zst", compression={"enabled": False}) == EXIT_OK
    assert (import_dir(tmp_path) / "data.ndjson").read_bytes() == NDJSON


def test_a_transient_answer_is_retried(write_config):
    server, state = serve(Reply(503), Reply(200, NDJSON_TYPE, NDJSON))
    with server:
        assert start(write_config, f"{server.base_url}/a.ndjson") == EXIT_OK
    assert len(state.requests) == 2


@pytest.mark.parametrize(
    "reply, message",
    [
        (Reply(404, {"Content-Type": "text/html"}, b"<h1>no</h1>"), "HTTP 404"),
        (Reply(204, {}, b""), "expected HTTP 200"),
        (Reply(200, {"Content-Type": "text/html; charset=utf-8"}, b"<html>login</html>"), "HTML page"),
        (Reply(200, {"Content-Type": "text/plain"}, b"  <!doctype html><html></html>"), "HTML or XML page"),
        (Reply(200, NDJSON_TYPE, b"hello world\n" + NDJSON), "first line is not a JSON object"),
        (Reply(200, NDJSON_TYPE, json.dumps([1, 2]).encode()), "first line is not a JSON object"),
    ],
)
def test_an_answer_that_is_not_an_ndjson_file_fails_the_job_and_leaves_no_file(
    tmp_path, write_config, capsys, reply, message
):
    server, _ = serve(reply)
    with server:
        assert start(write_config, f"{server.base_url}/a.ndjson") == EXIT_FAILED
    assert message in capsys.readouterr().err
    assert not import_dir(tmp_path).exists() or list(import_dir(tmp_path).iterdir()) == []
    assert job_file(only_job_dir(tmp_path / "jobs"))["state"] == "Failed"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/files/", "http://127.0.0.1:9/files/..%2F..%2Fetc"])
def test_a_url_without_a_safe_file_name_is_refused_before_fetching(write_config, capsys, url):
    assert start(write_config, url) == EXIT_FAILED
    assert "cannot use" in capsys.readouterr().err


def test_an_input_that_is_not_an_http_url_is_refused(write_config, capsys):
    assert start(write_config, "ftp://example.org/a.ndjson") == EXIT_FAILED
    assert "is not an http(s) URL" in capsys.readouterr().err
