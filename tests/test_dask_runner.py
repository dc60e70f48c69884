"""pipeline.task_runner: the per-file work of a job on a Dask cluster gives the same files as the default runner;
the setting's errors name the key and the fix; the cluster's worker processes end with the run."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from config.errors import ConfigError
from config.loader import load_settings
from config.settings import TaskRunnerSettings
from flows.run import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, main
from tasks.job.contract import DataFile, StepInput, file_task, settings_of
from tasks.core.errors import DupflowError
from tasks.job.filework import file_runner, map_files
from tasks.core.readable import counted
from tests.conftest import complete_results, run_cli, run_cli_here
from tests.support.dask_cluster import external_cluster, scheduler_address
from tests.support.ndjson import write_lines
from tests.support.validation import step_input as validation_step_input
from tests.support.validation import validation_overrides
from tests.support.jobs import (
    flow_run_state,
    job_file,
    job_record_card,
    only_job_dir,
    resources_in,
    source_dir,
    start_cli_process,
    step_results,
    wait_for,
)

SAMPLE = Path(__file__).resolve().parent.parent / "config" / "sample-data"
DASK = ["--set", "pipeline.task_runner.kind=dask", "--set", "pipeline.task_runner.dask_workers=2"]


@pytest.fixture
def sample_config(write_config):
    """``sample_config(path, jobs_dir)``: import and flatten the sample data into ``jobs_dir``."""

    def write(path: Path, jobs_dir: Path) -> Path:
        services = {"local_import": {"dir": SAMPLE}, "flattening": {"lookup_path": SAMPLE / "flatten-lookup.json"}}
        tree = {
            "pipeline": {"enabled_steps": ["local_import", "flattening"]},
            "services": services,
            "compression": {"level": "best"},
        }
        return write_config(tree, path, jobs_dir=jobs_dir)

    return write


def data_files(job_dir: Path) -> dict[str, bytes]:
    """Every output data file of the job (import and flattening), by path relative to the job directory."""
    found = [*job_dir.glob("import/*.ndjson*"), *job_dir.glob("flattening/*.csv")]
    return {str(path.relative_to(job_dir)): path.read_bytes() for path in found}


class WorkerWatch(threading.Thread):
    """Watches the Dask worker processes (multiprocessing spawn children) of a command this process runs
    (``python -m flows.run``), while it goes on: a pool an earlier test left in this process is not theirs.
    ``most``: the most alive at once (a nanny may replace a worker that a loaded machine made miss its start)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[int, psutil.Process] = {}
        self.most = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            alive = [worker for worker in workers() if of_a_command(worker)]
            self.most = max(self.most, len(alive))
            self.seen.update((worker.pid, worker) for worker in alive)


def of_a_command(process: psutil.Process) -> bool:
    try:
        return any("flows.run" in " ".join(parent.cmdline()) for parent in process.parents())
    except psutil.Error:
        return False


def workers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_job_on_a_two_process_local_cluster_writes_the_same_bytes_as_the_default_runner(
    tmp_path, capsys, sample_config
):
    """Run from the command line: the same files, two worker processes that end with the run, the cluster's own
    INFO in job.log and not on the terminal."""
    crtdl = str(SAMPLE / "crtdl.json")
    default_config = sample_config(tmp_path / "default.yaml", tmp_path / "default-jobs")
    assert main(["start", str(default_config), crtdl, "--no-progress"]) == EXIT_OK, capsys.readouterr().err
    expected = data_files(only_job_dir(tmp_path / "default-jobs"))

    watch = WorkerWatch()
    watch.start()
    dask_config = sample_config(tmp_path / "dask.yaml", tmp_path / "jobs")
    done = run_cli("start", str(dask_config), crtdl, "--no-progress", *DASK, timeout=300)
    watch.stop.set()
    watch.join()
    assert done.returncode == EXIT_OK, done.stderr
    log = (only_job_dir(tmp_path / "jobs") / "job.log").read_text()
    nannies = [line for line in log.splitlines() if "distributed.nanny" in line or "Register worker" in line]
    assert watch.most == 2 and len(watch.seen) >= 2, nannies
    _, alive = psutil.wait_procs(list(watch.seen.values()), timeout=30)
    assert not alive, "worker processes outlived the run"

    job_dir = only_job_dir(tmp_path / "jobs")
    produced = data_files(job_dir)
    assert len(expected) == 7 and sorted(produced) == sorted(expected)
    assert all(produced[name] == expected[name] for name in expected)
    terminal = done.stdout + done.stderr
    assert "distributed." not in terminal and "prefect.task_runner.dask" not in terminal, terminal
    assert "INFO distributed.scheduler: " in log and "INFO prefect.task_runner.dask: " in log, log[-3000:]
    assert "step 1 local_import: " in log, log[-3000:]  # the cluster's silencing of its loggers spares the job log
    default_log = (only_job_dir(tmp_path / "default-jobs") / "job.log").read_text()
    name = "import[b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson.zst … fhir-data.ndjson.zst (2 files)]"  # one batch
    finished = f"INFO prefect.task_runs: Task run '{name}' - Finished in state Completed()"
    assert finished in default_log and finished in log, log[-3000:]  # the workers' file tasks log there too
    assert "Task run 'import[" not in terminal, terminal
    status_list_record_and_server_agree(job_dir, capsys)


def status_list_record_and_server_agree(job_dir: Path, capsys) -> None:
    """After a Dask run: ``status`` (with and without the server), ``list``, the job record card and the flow run
    all say Completed with each step's files."""
    record = job_file(job_dir)
    (flow_run,) = record["flow_run_ids"]
    steps = step_results(job_dir)
    assert record["state"] == "Completed" and sorted(steps) == [0, 1]
    files = {position: len(result["files"]) for position, result in steps.items()}
    assert files == {0: 2, 1: 5}  # the sample's two data files, flattened into five CSVs

    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    with_server = capsys.readouterr().out
    without_server = run_cli_here("status", str(job_dir), env={"PREFECT_API_URL": ""}).stdout
    assert main(["list", "--jobs-dir", str(job_dir.parent)]) == EXIT_OK
    listed = capsys.readouterr().out
    card = job_record_card(job_dir.name, flow_run)
    for shown in (with_server, without_server):
        assert f"state:     Completed (flow run {flow_run})" in shown, shown
        assert (
            f"1. local_import: done, {counted(files[0], 'file')}" in shown
            and f"2. flattening: done, {counted(files[1], 'file')}" in shown
        )
    assert f"{job_dir.name}  Completed" in listed
    assert "**State: Completed**" in card
    for position, step in enumerate(["local_import", "flattening"]):
        assert f"| {position + 1} | {step} | done | `{steps[position]['folder']}` | {files[position]} |" in card, card
    assert flow_run_state(flow_run) == ("COMPLETED", "Completed")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_an_address_where_no_scheduler_answers_fails_the_run_naming_the_key(tmp_path, capsys, sample_config):
    config = sample_config(tmp_path / "c.yaml", tmp_path / "jobs")
    address = "tcp://127.0.0.1:9"
    started = time.monotonic()
    code = main(
        ["start", str(config), str(SAMPLE / "crtdl.json"), "--no-progress", "--set", "pipeline.task_runner.kind=dask"]
        + ["--set", f"pipeline.task_runner.dask_address={address}"]
    )
    assert code == EXIT_FAILED
    assert time.monotonic() - started < 90  # the connect timeout is 10 s
    message = capsys.readouterr().err
    assert f"pipeline.task_runner.dask_address: no Dask scheduler answers at {address}" in message
    assert not (only_job_dir(tmp_path / "jobs") / "import").exists()


@pytest.mark.parametrize(
    ("overrides", "key_path", "fix"),
    [
        pytest.param(
            {"pipeline.task_runner.dask_workers": "2"},
            "pipeline.task_runner.dask_workers",
            "is set but kind is in_process; set kind: dask",
            id="workers-without-dask",
        ),
        pytest.param(
            {"pipeline.task_runner.dask_address": "tcp://scheduler:8786"},
            "pipeline.task_runner.dask_address",
            "is set but kind is in_process; set kind: dask",
            id="address-without-dask",
        ),
        pytest.param(
            {
                "pipeline.task_runner.kind": "dask",
                "pipeline.task_runner.dask_address": "tcp://scheduler:8786",
                "pipeline.task_runner.dask_workers": "2",
            },
            "pipeline.task_runner.dask_workers",
            "remove dask_workers (or dask_address, for a local cluster)",
            id="address-and-workers",
        ),
        pytest.param(
            {"pipeline.task_runner.kind": "dask", "pipeline.task_runner.dask_address": "scheduler:8786"},
            "pipeline.task_runner.dask_address",
            "write tcp://<host>:<port>",
            id="address-without-scheme",
        ),
        pytest.param(
            {"pipeline.task_runner.kind": "dask", "pipeline.task_runner.dask_address": "http://scheduler"},
            "pipeline.task_runner.dask_address",
            "write tcp://<host>:<port>",
            id="address-without-port",
        ),
        pytest.param(
            {"pipeline.task_runner.kind": "dask", "pipeline.task_runner.dask_address": "tls://u:pw-in-url@sched:8786"},
            "pipeline.task_runner.dask_address",
            "carries a user name or password; a Dask scheduler address is tcp://<host>:<port>",
            id="address-with-a-password",
        ),
        pytest.param(
            {"pipeline.task_runner.kind": "dask", "pipeline.task_runner.dask_workers": "0"},
            "pipeline.task_runner.dask_workers",
            "must be between 1 and 1024",
            id="no-workers",
        ),
        pytest.param(
            {"pipeline.task_runner.kind": "threads"},
            "pipeline.task_runner.kind",
            "must be one of 'in_process' or 'dask'",
            id="unknown-kind",
        ),
    ],
)
def test_a_task_runner_setting_that_does_not_fit_names_the_key_and_the_fix(overrides, key_path, fix):
    with pytest.raises(ConfigError) as error:
        load_settings(None, env={}, overrides={"pipeline.enabled_steps": "local_import", **overrides})
    assert [p for p in error.value.problems if p.startswith(f"{key_path} (") and fix in p], error.value.problems


def test_the_setting_comes_from_the_environment_too():
    env = {"APP_PIPELINE_TASK_RUNNER_KIND": "dask", "APP_PIPELINE_TASK_RUNNER_DASK_ADDRESS": "tcp://10.0.0.5:8786"}
    runner = load_settings(None, env=env, overrides={"pipeline.enabled_steps": "local_import"}).settings
    assert runner.pipeline.task_runner.kind == "dask"
    assert runner.pipeline.task_runner.dask_address == "tcp://10.0.0.5:8786"


def test_the_default_is_the_in_process_runner():
    settings = load_settings(None, env={}, overrides={"pipeline.enabled_steps": "local_import"}).settings
    assert settings.pipeline.task_runner.kind == "in_process"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("prefect_api")
def test_a_killed_dask_run_resumes_with_its_finished_files_and_leaves_no_worker(tmp_path, write_config):
    # a and b are one batch, c (over 32 MB) one of its own. One worker thread runs the batches in the order they
    # were submitted: a and b are finished before c starts (with two workers, Dask may put c first). c is 88 MB of
    # NDJSON, a second or more at zstd best: long enough to be killed in the middle of it.
    source = source_dir(tmp_path, {"a.ndjson": 10, "b.ndjson": 20, "c.ndjson": 200_000}, pad=400)
    jobs = tmp_path / "jobs"
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import"], "task_runner": {"kind": "dask", "dask_workers": 1}},
            "compression": {"level": "best"},
        },
        jobs_dir=jobs,
    )
    process = start_cli_process("start", str(config), str(source), "--no-progress")
    wait_for(lambda: next(jobs.glob("*/import/.c.ndjson.zst.part"), None), process)
    wait_for(lambda: complete_results(jobs, "00-local_import-import-files") == 1 or None, process)
    cluster = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGKILL)
    process.wait()
    _, alive = psutil.wait_procs(cluster, timeout=60)
    assert not alive, "Dask worker processes outlived the killed run"
    job_dir = only_job_dir(jobs)
    finished = {p.name: p.stat().st_mtime_ns for p in (job_dir / "import").glob("[ab].ndjson.zst")}
    assert set(finished) == {"a.ndjson.zst", "b.ndjson.zst"}
    assert not (job_dir / "import" / "c.ndjson.zst").exists(), "c finished before the kill: nothing was interrupted"

    result = run_cli("continue", str(job_dir), "--no-progress", timeout=600)
    assert result.returncode == EXIT_OK, result.stderr
    import_dir = job_dir / "import"
    assert {p.name: p.stat().st_mtime_ns for p in import_dir.glob("[ab].ndjson.zst")} == finished
    assert resources_in(import_dir / "c.ndjson.zst") == 200_000
    assert not list(import_dir.glob(".*.part"))


@file_task("where-it-runs", "where[{number}]")
def where_it_runs(step: StepInput, number: int) -> tuple[int, int]:
    """The process a file task ran in, and the retry.max_attempts of the settings it loaded there."""
    return os.getpid(), settings_of(step).retry.max_attempts


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_file_tasks_run_on_the_workers_load_the_steps_settings_and_log_to_the_job_log_there(tmp_path, write_config):
    from prefect import flow

    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}, "retry": {"max_attempts": 5}})
    job_dir = tmp_path / "jobs" / "dask-job"
    step = StepInput(
        job_id=job_dir.name, job_dir=str(job_dir), position=0, step="local_import", config_path=str(config)
    )

    @flow
    def fan_out() -> list:
        with file_runner(TaskRunnerSettings(kind="dask", dask_workers=1), tmp_path / "job.log"):
            return map_files(where_it_runs, [(step, number) for number in range(3)], workers=1)

    outcomes = fan_out()
    assert [attempts for _, attempts in outcomes] == [5, 5, 5]
    assert os.getpid() not in {pid for pid, _ in outcomes}, "the files ran in the flow's process"
    worker_lines = (tmp_path / "job.log").read_text()
    assert "INFO distributed.worker: Stopping worker at" in worker_lines, "the worker process logs to the job log"


@file_task("written-elsewhere", "elsewhere[{name}]")
def written_on_the_workers_own_disk(step: StepInput, name: str, own_disk: str) -> DataFile:
    """A worker whose jobs directory is a folder of its own machine (not the shared one): it writes its output
    there and reports it as written."""
    (Path(own_disk) / name).write_text("{}\n")
    return DataFile(name=name, size=3, resources=1)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_file_a_worker_wrote_where_the_flow_does_not_see_it_fails_the_step_naming_the_fix(tmp_path, write_config):
    """The job ended Completed with its files on no disk the job could see."""
    from prefect import flow

    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    job_dir = tmp_path / "jobs" / "dask-job"
    step = StepInput(
        job_id=job_dir.name, job_dir=str(job_dir), position=0, step="local_import", config_path=str(config)
    )
    (own_disk := tmp_path / "worker-disk").mkdir()

    @flow(persist_result=False)
    def fan_out() -> list:
        with file_runner(TaskRunnerSettings(kind="dask", dask_workers=1), tmp_path / "job.log"):
            return map_files(written_on_the_workers_own_disk, [(step, "a.ndjson", str(own_disk))], workers=1)

    (outcome,) = fan_out()
    assert isinstance(outcome, DupflowError), outcome
    assert str(outcome).startswith(
        f"a Dask worker wrote a.ndjson where this process does not find it ({job_dir / 'import'})"
    )
    assert "every worker must see the jobs directory at the same path" in str(outcome)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_services_max_concurrent_requests_holds_for_the_step_on_a_dask_cluster(validator_fake, tmp_path):
    """Each Dask worker took a file with its own window: the validator saw workers x max_concurrent_requests."""
    from prefect import flow

    from tasks.job.contract import stored_in_job
    from tasks.validation import validation

    validator_fake.state.reset(latency_seconds=0.3, shallow=True)
    job_dir = tmp_path / "jobs" / "dask-validation"
    (job_dir / "import").mkdir(parents=True)
    for n in range(3):
        patients = [
            {"resourceType": "Patient", "id": f"p{n}-{i}", "name": [{"family": "x" * 300_000}]} for i in range(6)
        ]
        write_lines(job_dir / "import" / f"batch-{n}.ndjson", patients)
    overrides = validation_overrides(validator_fake.base_url, False, chunk_mb=1, concurrency=2)
    step = validation_step_input(job_dir, overrides)

    @flow(persist_result=False)
    def on_dask():
        with file_runner(TaskRunnerSettings(kind="dask", dask_workers=3), tmp_path / "job.log"):
            return stored_in_job(validation, step)(step)

    result = on_dask()
    assert sum(f["chunks"] for f in result.summary["per_file"]) == 6  # two in each file, three files at once before
    assert validator_fake.state.most_in_flight <= 2


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("prefect_api")
def test_a_file_task_on_a_remote_worker_stops_when_its_flow_run_ends(validator_fake, tmp_path, write_config):
    """A worker on another machine went on with a file (validating, sending) after the flow process was stopped,
    while ``continue`` did the file again. Here it stops at its next request once the flow run is over."""
    held, release = threading.Event(), threading.Event()

    def hold_the_second(index: int) -> float:
        if index == 1:
            held.set()
            release.wait(300)
        return 0.5 if index > 1 else 0.0  # 40 chunks: 20 s more to go once released

    validator_fake.state.reset(shallow=True, delay_for=hold_the_second)
    patients = [{"resourceType": "Patient", "id": f"p{i}", "name": [{"family": "x" * 300_000}]} for i in range(120)]
    (source := tmp_path / "source").mkdir()
    write_lines(source / "patients.ndjson", patients)
    jobs = tmp_path / "jobs"
    with external_cluster(tmp_path / "cluster", [[]]) as scheduler_file:
        runner = {"kind": "dask", "dask_address": scheduler_address(scheduler_file, 1)}
        validation = {"url": validator_fake.base_url, "bundle_chunk_size_mb": 1, "max_concurrent_requests": 1}
        tree = {"pipeline": {"enabled_steps": ["local_import", "validation"], "task_runner": runner}}
        config = write_config({**tree, "services": {"validation": validation}}, jobs_dir=jobs)
        process = start_cli_process("start", str(config), str(source), "--no-progress")
        wait_for(lambda: held.is_set() or None, process, timeout=300)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == EXIT_INTERRUPTED
        release.set()
        flow_run_id = job_file(job_dir := only_job_dir(jobs))["flow_run_ids"][-1]
        state = wait_for_task_run_end(flow_run_id, "validate[patients.ndjson.zst]")
    stopped = f"stopped: flow run {flow_run_id} ended (Cancelled" in (state.message or "")
    assert (state.type.value, stopped) in (("FAILED", True), ("CANCELLED", False)), state  # the watch's, Prefect's
    assert len(validator_fake.state.requests) < 40, "the worker validated the whole file"
    assert not list((job_dir / "validation").iterdir())


def wait_for_task_run_end(flow_run_id: str, name: str, timeout: float = 120.0):
    """The final state of the flow run's task run ``name`` (as the worker reported it to the API)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, TaskRunFilter, TaskRunFilterName

    runs = FlowRunFilter(id={"any_": [flow_run_id]})
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            found = client.read_task_runs(
                flow_run_filter=runs, task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name]))
            )
            if found and found[0].state is not None and found[0].state.is_final():
                return found[0].state
            time.sleep(0.2)
    raise AssertionError(f"task run {name} did not end within {timeout} s")
