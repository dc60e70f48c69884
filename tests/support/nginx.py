"""nginx of Debian's packages as a reverse proxy before the fakes, as hospitals run their services: TLS ends at
nginx (a certificate of a ``trustme`` CA, ``ca_cert_path`` for the clients' ``tls.ca_cert_path``), a body limit of
its own (``client_max_body_size``: a larger body gets nginx's 413 and never reaches the service), and request bodies
passed on as they come in (``proxy_request_buffering off``, HTTP/1.1 to the service), so nginx sends on the framing
the client chose: a chunked body reaches the service chunked.

nginx runs in the foreground (``daemon off``), not as a system service: its configuration, pid file, temporary
folders and logs all in a temporary folder (``-p``, ``-c``, ``-e``: nothing is written under /var/log), each service
on a port of its own on 127.0.0.1; stopped and removed at the end. A test module says what to put behind it with a
module fixture ``nginx_upstreams`` ({name: ``Upstream``}) and asks for ``nginx_front``. Without nginx the tests
fail, naming the package: CI installs it (.ci/run), so a missing nginx is an error, never a skip.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from tests.support.ports import free_port

NGINX = Path("/usr/sbin/nginx")
STARTUP_SECONDS = 30.0


@dataclass(frozen=True)
class Upstream:
    """A service on ``port`` of 127.0.0.1 (plain HTTP) to put behind nginx, and nginx's body limit for it."""

    port: int
    client_max_body_size: str = "1m"


@dataclass(frozen=True)
class NginxFront:
    """A running nginx: ``urls`` the https origin before each upstream (by name), ``ca_cert_path`` the CA to trust."""

    urls: dict[str, str]
    ca_cert_path: str
    folder: Path

    def error_log(self) -> str:
        """The end of nginx's error log, for a failure's message."""
        path = self.folder / "error.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no error log)"


def nginx_binary() -> Path:
    if not NGINX.is_file():
        pytest.fail(
            f"nginx is not installed ({NGINX} is missing): apt-get install nginx (.ci/run does it); "
            "the tests through nginx need it and are not skipped without it",
            pytrace=False,
        )
    return NGINX


def server_block(port: int, upstream: Upstream) -> str:
    return f"""
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate server.pem;
        ssl_certificate_key server.key;
        client_max_body_size {upstream.client_max_body_size};
        location / {{
            proxy_pass http://127.0.0.1:{upstream.port};
            proxy_http_version 1.1;
            proxy_request_buffering off;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header Connection "";
        }}
    }}"""


def configuration(folder: Path, servers: list[str]) -> str:
    """The whole configuration: everything nginx writes in ``folder``; workers as the user running the tests (as
    root, nginx's default user ``nobody`` could not enter the temporary folder)."""
    user = ""
    if os.geteuid() == 0:
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    temp_paths = "\n".join(
        f"    {kind}_temp_path {folder / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""daemon off;
master_process on;
worker_processes 1;
{user}
pid {folder / "nginx.pid"};
error_log {folder / "error.log"} info;
events {{ worker_connections 512; }}
http {{
    access_log {folder / "access.log"};
{temp_paths}
{"".join(servers)}
}}
"""


def write_certificate(folder: Path) -> str:
    """The server's certificate and key for 127.0.0.1 in ``folder``; the path of the CA's certificate."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(folder / "server.pem"))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(folder / "server.pem"), append=True)
    server.private_key_pem.write_to_path(str(folder / "server.key"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return str(folder / "ca.pem")


@contextmanager
def running_nginx(upstreams: dict[str, Upstream]) -> Iterator[NginxFront]:
    """nginx before ``upstreams``, answering on its own ports once this yields; stopped and removed after."""
    binary, folder = nginx_binary(), Path(tempfile.mkdtemp(prefix="dupflow-nginx-"))
    ports = {name: free_port() for name in upstreams}
    front = NginxFront(
        {name: f"https://127.0.0.1:{port}" for name, port in ports.items()}, write_certificate(folder), folder
    )
    servers = [server_block(ports[name], upstream) for name, upstream in upstreams.items()]
    (folder / "nginx.conf").write_text(configuration(folder, servers))
    command = [str(binary), "-p", f"{folder}/", "-c", str(folder / "nginx.conf"), "-e", str(folder / "error.log")]
    with open(folder / "stderr.log", "wb") as stderr:
        process = subprocess.Popen(command, cwd=folder, stdout=stderr, stderr=stderr, start_new_session=True)
    try:
        wait_for_answer(process, front)
        yield front
    finally:
        stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_answer(process: subprocess.Popen, front: NginxFront) -> None:
    """Until nginx answers a TLS request on every port (any status: the service behind need not know the path), or
    exits (a failure saying what it logged); a probe every 20 ms, the answer being the event waited for."""
    context = ssl.create_default_context(cafile=front.ca_cert_path)
    deadline = time.monotonic() + STARTUP_SECONDS
    for url in front.urls.values():
        while not answers(url, context):
            if process.poll() is not None:
                stderr = (front.folder / "stderr.log").read_text(errors="replace")
                pytest.fail(f"nginx exited with {process.returncode}: {stderr}{front.error_log()}", pytrace=False)
            if time.monotonic() > deadline:
                late = f"nginx did not answer at {url} within {STARTUP_SECONDS} s: {front.error_log()}"
                pytest.fail(late, pytrace=False)
            time.sleep(0.02)


def answers(url: str, context: ssl.SSLContext) -> bool:
    try:
        httpx.get(url + "/", verify=context, timeout=5)
    except httpx.TransportError:
        return False
    return True


def stop(process: subprocess.Popen) -> None:
    """SIGTERM: nginx's fast stop; its whole process group is killed if it does not end in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def nginx_front(nginx_upstreams: dict[str, Upstream]) -> Iterator[NginxFront]:
    """nginx before the module's ``nginx_upstreams``, for the module's tests."""
    with running_nginx(nginx_upstreams) as front:
        yield front
