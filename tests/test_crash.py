"""Kill -9 at every step boundary and inside each step, then ``continue``: the outputs are those of a clean run,
nothing is sent twice, and no process is left behind.

The pipeline is ``local_import → pseudonymizer → validation → flattening`` on the flattening example (Bundles with
Provenance) plus generated patients, against the fake pseudonymizer and validator (with a little latency, so a kill
inside a step finds it working). The extractor's kill points (during the submission, while polling, during
downloads) are covered in test_job_hardening.py and test_extractor_step.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import yaml
import zstandard

from flows.run import EXIT_OK
from tests.conftest import TESTDATA, plain, run_cli, run_cli_here
from tests.fakes.pseudonymizer import start_pseudonymizer
from tests.fakes.validator import start_validator
from tests.support.jobs import flow_run_state, job_file, only_job_dir, start_cli_process, step_results, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

EXAMPLE = TESTDATA / "flattening" / "example"
STEPS = ["local_import", "pseudonymizer", "validation", "flattening"]


@pytest.fixture(scope="module")
def services():
    pseudonymizer = start_pseudonymizer(latency_seconds=0.01)
    validator = start_validator(latency_seconds=0.01)
    yield pseudonymizer, validator
    pseudonymizer.stop()
    validator.stop()


def make_input(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "a-example.ndjson").write_bytes((EXAMPLE / "input" / "fhir-data.ndjson").read_bytes())
    patients = b"".join(
        orjson.dumps({"resourceType": "Patient", "id": f"p{i}", "gender": "female", "birthDate": "1970-01-01"}) + b"\n"
        for i in range(300)
    )
    (folder / "b-patients.ndjson").write_bytes(patients)
    return folder


def job_tree(tmp_path: Path, services) -> dict:
    """The configuration (a dict tree for ``write_config``) of the pipeline, importing from ``tmp_path/in``."""
    pseudonymizer, validator = services
    return {
        "pipeline": {"enabled_steps": STEPS},
        "compression": {"level": "fastest"},
        "retry": {"initial_backoff_ms": 1, "max_backoff_ms": 5},
        "services": {
            "local_import": {"dir": tmp_path / "in"},
            "pseudonymizer": {"url": pseudonymizer.base_url, "max_concurrent_requests": 2},
            "validation": {"url": validator.base_url, "fail_on_error": False, "bundle_chunk_size_mb": 1},
            "flattening": {"lookup_path": TESTDATA / "flattening" / "flatten-lookup.json"},
        },
        "jobs_dir": tmp_path / "jobs",
    }


def outputs(job_dir: Path) -> dict[str, bytes]:
    """Every data file of every step, decompressed, by path in the job."""
    found = {}
    for folder in ("import", "pseudonymizer", "validation", "flattening"):
        for path in sorted((job_dir / folder).iterdir()):
            data = path.read_bytes()
            if path.name.endswith(".zst"):
                data = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True).decompress(data)
            found[f"{folder}/{path.name}"] = data
    return found


def run_clean(tmp_path: Path, services) -> dict[str, bytes]:
    make_input(tmp_path / "in")
    # Module-scoped (one clean run for every kill point), so not the function-scoped write_config fixture: the
    # same YAML dump of the same tree.
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(plain(job_tree(tmp_path, services)), sort_keys=False), encoding="utf-8")
    result = run_cli("start", str(config), str(EXAMPLE / "example-crtdl.json"))
    assert result.returncode == EXIT_OK, result.stderr
    return outputs(only_job_dir(tmp_path / "jobs"))


def finished(position: int) -> Callable[[Path], object]:
    """The job's record shows the step at ``position`` finished."""
    return lambda jobs: next((d for d in jobs.glob("*") if position in step_results(d)), None)


def working_in(folder: str) -> Callable[[Path], object]:
    return lambda jobs: next(jobs.glob(f"*/{folder}/.*.part"), None)


KILL_POINTS = {
    "after-import": finished(0),
    "inside-pseudonymizer": working_in("pseudonymizer"),
    "after-pseudonymizer": finished(1),
    "inside-validation": working_in("validation"),
    "after-validation": finished(2),
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory, services) -> dict[str, bytes]:
    return run_clean(tmp_path_factory.mktemp("clean"), services)


# Which services a continue after each kill point may call again: a finished step's work is never redone.
NOT_CALLED_AGAIN = {
    "after-import": (),
    "inside-pseudonymizer": (),
    "after-pseudonymizer": ("pseudonymizer",),
    "inside-validation": ("pseudonymizer",),
    "after-validation": ("pseudonymizer", "validator"),
}


@pytest.mark.parametrize("kill_point", list(KILL_POINTS))
def test_killed_then_continued_gives_the_outputs_of_a_clean_run(tmp_path, write_config, services, clean, kill_point):
    make_input(tmp_path / "in")
    jobs = tmp_path / "jobs"
    config = write_config(job_tree(tmp_path, services))
    process = start_cli_process("start", str(config), str(EXAMPLE / "example-crtdl.json"), "--no-progress")
    wait_for(lambda: KILL_POINTS[kill_point](jobs), process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert no_child_of(process.pid)
    job_dir = only_job_dir(jobs)
    imported = {p.name: p.stat().st_mtime_ns for p in (job_dir / "import").glob("*.zst")}
    calls_before = {name: len(fake.state.requests) for name, fake in named(services)}
    if kill_point == "inside-validation":  # the views read the server, the same whatever step was killed
        assert every_view_says_as_the_server(job_dir)

    result = run_cli("continue", str(job_dir), "--no-progress")
    assert result.returncode == EXIT_OK, result.stderr
    assert job_file(job_dir)["state"] == "Completed"
    (job_run,) = job_file(job_dir)["flow_run_ids"]  # continue goes on in the killed job's own flow run
    assert flow_run_state(job_run) == ("COMPLETED", "Completed")
    assert outputs(job_dir) == clean
    assert not list(job_dir.glob("*/.*.part"))
    assert {p.name: p.stat().st_mtime_ns for p in (job_dir / "import").glob("*.zst")} == imported
    for name, fake in named(services):
        if name in NOT_CALLED_AGAIN[kill_point]:
            assert len(fake.state.requests) == calls_before[name], f"{name} was called again"


def every_view_says_as_the_server(job_dir: Path) -> bool:
    """``status`` and ``list`` give the state the UI shows: the run a killed process left ``Running``, until the
    server misses its heartbeats (then ``Crashed``, everywhere at once)."""
    (run_id,) = job_file(job_dir)["flow_run_ids"]
    server = flow_run_state(run_id)[1]
    status = run_cli_here("status", str(job_dir)).stdout
    listed = run_cli_here("list", "--jobs-dir", str(job_dir.parent)).stdout
    assert server in ("Running", "Crashed") and f"state:     {server}" in status, status
    assert f"{job_dir.name}  {server}" in listed, listed
    return True


def named(services) -> list:
    return list(zip(("pseudonymizer", "validator"), services, strict=True))


def no_child_of(pid: int) -> bool:
    """No process left whose parent was the killed command (a server it used is not its child)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                return False
    return True
