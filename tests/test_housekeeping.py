"""``prune``: old and finished jobs listed (dry run), then removed with their flow runs and artifacts, against the
real test Prefect API; running and awaiting jobs, symbolic links and other entries stay."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from flows.job_state import job_lock
from flows.run import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from tasks.job.layout import JobPaths, directory_tag
from tasks.job.record import JobRecord, changing_record
from tests.conftest import run_cli, run_cli_here
from tests.support.jobs import made_old, put_flow_run

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


@pytest.fixture
def start_job(tmp_path, write_config):
    """``start_job(steps)``: a real job of ``steps`` (local_import first) run to its end; its directory."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.ndjson").write_text('{"resourceType":"Patient","id":"p1"}\n')

    def start(steps: list[str]) -> Path:
        before = set(jobs_in(tmp_path / "jobs"))
        config = write_config({"pipeline": {"enabled_steps": steps}, "compression": {"level": "fastest"}})
        assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
        (job_dir,) = set(jobs_in(tmp_path / "jobs")) - before
        return job_dir

    return start


def jobs_in(jobs_dir: Path) -> list[Path]:
    return [entry for entry in jobs_dir.iterdir() if entry.is_dir()] if jobs_dir.is_dir() else []


def recorded_job(jobs_dir: Path, job_id: str) -> Path:
    """A job known only by its record, last changed long ago (no flow runs)."""
    paths = JobPaths(jobs_dir / job_id)
    with changing_record(paths.job_dir, new=JobRecord(job_id=job_id, enabled_steps=["local_import"])):
        pass
    return made_old(paths.job_dir)


def forced_state(api_url: str, job_dir: Path, state_type: str) -> None:
    """The job's flow run put in a state by hand, as an API client (the UI) can."""
    (run,) = flow_runs_of(api_url, job_dir.name)
    body = {"state": {"type": state_type, "name": state_type.title()}, "force": True}
    httpx.post(f"{api_url}/flow_runs/{run}/set_state", json=body).raise_for_status()


def flow_runs_of(api_url: str, job_id: str) -> list[str]:
    body = {"flow_runs": {"tags": {"all_": [f"job-{job_id}"]}}}
    response = httpx.post(f"{api_url}/flow_runs/filter", json=body)
    response.raise_for_status()
    return [run["id"] for run in response.json()]


def artifact_keys_of(api_url: str, job_id: str) -> list[str]:
    response = httpx.post(f"{api_url}/artifacts/filter", json={"artifacts": {"key": {"like_": f"job-{job_id}"}}})
    response.raise_for_status()
    return [artifact["key"] for artifact in response.json()]


def prune(jobs_dir: Path, *options: str):
    """``prune`` as a user runs it, in this process (``run_cli_here``): where the test holds a job's lock, the
    command is ``run_cli``'s process, so that the lock is another process's."""
    return run_cli_here("prune", "--jobs-dir", str(jobs_dir), *options)


def test_a_dry_run_lists_the_old_finished_jobs_with_their_runs_and_artifacts_and_removes_nothing(
    tmp_path, start_job, prefect_api
):
    old = made_old(start_job(["local_import"]))
    recent = start_job(["local_import"])
    api = prefect_api["api_url"]

    listed = prune(tmp_path / "jobs", "--older-than", "P30D")

    assert listed.returncode == EXIT_OK, listed.stderr
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith(old.name)]
    assert line.split()[1] == "Completed"
    runs, artifacts = (int(count) for count in line.split()[-2:])
    assert runs == 1 and artifacts == len(artifact_keys_of(api, old.name)) >= 2
    assert recent.name not in listed.stdout and "kept 1 other job(s)" in listed.stdout
    assert "nothing was removed" in listed.stdout
    assert f"prune --older-than P30D --jobs-dir {tmp_path / 'jobs'} --yes" in listed.stdout
    assert old.is_dir() and recent.is_dir()
    assert flow_runs_of(api, old.name) and artifact_keys_of(api, old.name)


def test_yes_removes_exactly_the_old_finished_jobs_and_their_runs_and_artifacts(tmp_path, start_job, prefect_api):
    jobs, api = tmp_path / "jobs", prefect_api["api_url"]
    completed = made_old(start_job(["local_import"]))
    awaiting = made_old(start_job(["local_import", "wait"]))
    recent = start_job(["local_import"])
    running, taken = made_old(start_job(["local_import"])), made_old(start_job(["local_import"]))
    forced_state(api, running, "RUNNING")  # a process (this test) holds it, below
    others = {
        job: (flow_runs_of(api, job.name), artifact_keys_of(api, job.name)) for job in (awaiting, recent, running)
    }
    assert all(runs and keys for runs, keys in others.values())

    with job_lock(JobPaths(running)), job_lock(JobPaths(taken)):
        removed = run_cli("prune", "--jobs-dir", str(jobs), "--older-than", "30d", "--yes")

    assert removed.returncode == EXIT_OK, removed.stderr
    assert not completed.exists()
    assert flow_runs_of(api, completed.name) == [] and artifact_keys_of(api, completed.name) == []
    assert f"kept {running.name}: Running" in removed.stdout
    assert f"kept {awaiting.name}: Suspended (remove it with --state Suspended)" in removed.stdout
    assert f"skipped {taken.name}: a process took it meanwhile" in removed.stdout
    assert "removed 1 of 2 job(s)" in removed.stdout, removed.stdout
    assert sorted(jobs_in(jobs)) == sorted([awaiting, recent, running, taken])
    for job, (runs, keys) in others.items():
        assert (flow_runs_of(api, job.name), artifact_keys_of(api, job.name)) == (runs, keys)

    named = prune(jobs, "--state", "suspended", "--yes")
    assert named.returncode == EXIT_OK, named.stderr
    assert not awaiting.exists() and flow_runs_of(api, awaiting.name) == [] == artifact_keys_of(api, awaiting.name)
    assert recent.is_dir() and flow_runs_of(api, recent.name)


def test_symbolic_links_and_entries_not_named_by_a_job_id_are_never_touched(tmp_path):
    jobs, outside = tmp_path / "jobs", tmp_path / "outside"
    elsewhere = recorded_job(outside, "00000000-0000-4000-8000-00000000000a")
    linked = jobs / "00000000-0000-4000-8000-00000000000b"
    jobs.mkdir()
    linked.symlink_to(elsewhere, target_is_directory=True)
    not_a_job = recorded_job(jobs, "00000000-0000-4000-8000-00000000000c").rename(jobs / "notes")
    upper_case = recorded_job(jobs, "00000000-0000-4000-8000-00000000000D")

    removed = prune(jobs, "--yes")

    assert removed.returncode == EXIT_OK, removed.stderr
    assert f"kept {linked.name}: a symbolic link (never followed)" in removed.stdout
    assert linked.is_symlink() and (elsewhere / "job.json").is_file()
    assert (not_a_job / "job.json").is_file() and (upper_case / "job.json").is_file()
    assert "removed 0 of 0 job(s)" in removed.stdout


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--older-than", "30"], "has no unit"),
        (["--older-than", "P1M"], "is not a duration"),
        (["--state", "Running"], "a running job is never removed"),
        (["--state", "Done"], "'Done' is no job state"),
    ],
)
def test_a_wrong_age_or_state_is_a_usage_error(tmp_path, capsys, options, said):
    assert exit_code(["prune", "--jobs-dir", str(tmp_path), *options]) == EXIT_USAGE
    assert said in capsys.readouterr().err


def exit_code(argv: list[str]) -> int:
    """``main``'s exit code, also when argparse refuses an argument (it exits)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_without_a_prefect_server_no_job_is_removed_and_each_says_why(tmp_path):
    """Without a server nobody can tell a job's state: a job may still be running, or awaiting inspection."""
    jobs = tmp_path / "jobs"
    old = recorded_job(jobs, "00000000-0000-4000-8000-000000000010")
    no_server = {"PREFECT_API_URL": "", "PREFECT_HOME": str(tmp_path / "empty-home")}

    removed = run_cli_here("prune", "--jobs-dir", str(jobs), "--older-than", "1h", "--yes", env=no_server)

    assert removed.returncode == EXIT_OK, removed.stderr
    assert "no Prefect server" in removed.stdout and "removed 0 of 0 job(s)" in removed.stdout
    assert f"kept {old.name}: no flow run of it on this Prefect server" in removed.stdout
    assert old.is_dir() and not (tmp_path / "empty-home" / "prefect.db").exists()


def test_a_removal_an_interrupted_prune_began_is_told_and_finished_by_the_next(tmp_path):
    """rmtree removes in the file system's order: stopped after job.json, a job's data stayed on disk in a directory
    no later prune, list or status found. A job is renamed out of the jobs' names before it is removed."""
    jobs = tmp_path / "jobs"
    job_id = "00000000-0000-4000-8000-000000000011"
    recorded_job(jobs, job_id).rename(begun := jobs / f".pruning-{job_id}")  # as a killed prune left it
    (begun / "send").mkdir()
    (begun / "send" / "Patient-0.ndjson").write_text('{"resourceType":"Patient","id":"p1"}\n')
    no_server = {"PREFECT_API_URL": "", "PREFECT_HOME": str(tmp_path / "empty-home")}

    listed = run_cli_here("prune", "--jobs-dir", str(jobs), env=no_server)
    assert listed.returncode == EXIT_OK and "1 job(s) an interrupted prune began to remove" in listed.stdout
    assert begun.is_dir()
    removed = run_cli_here("prune", "--jobs-dir", str(jobs), "--yes", env=no_server)
    assert removed.returncode == EXIT_OK, removed.stderr
    assert f"removed {job_id} (an interrupted prune had begun it)" in removed.stdout and list(jobs.iterdir()) == []


def test_a_removal_that_cannot_be_finished_is_said_with_its_path_and_stops_no_other(tmp_path, empty_prefect_api):
    """A file the user may not remove (another owner, an immutable one; here a file where the folder belongs) kept
    every later prune from removing anything, with a traceback; and list showed the half-removed job as whole."""
    jobs = tmp_path / "jobs"
    stuck = jobs / ".pruning-00000000-0000-4000-8000-000000000012"
    old = recorded_job(jobs, "00000000-0000-4000-8000-000000000013")
    put_flow_run(empty_prefect_api, old, "COMPLETED", "Completed")
    stuck.write_text("not removable as a folder\n")
    half = recorded_job(jobs, "00000000-0000-4000-8000-000000000014")
    half.rename(jobs / f".pruning-{half.name}")  # as a killed prune left it
    listed = run_cli_here("list", "--jobs-dir", str(jobs)).stdout
    assert old.name in listed and half.name not in listed

    removed = run_cli_here("prune", "--jobs-dir", str(jobs), "--yes")

    assert removed.returncode == EXIT_FAILED and "Traceback" not in removed.stderr, removed.stderr
    assert f"error: could not finish removing {stuck}: Not a directory" in removed.stderr
    assert "then run prune --yes again" in removed.stderr
    assert f"removed {half.name} (an interrupted prune had begun it)" in removed.stdout
    assert f"removed {old.name}" in removed.stdout and sorted(jobs.iterdir()) == [stuck]


def test_prune_keeps_a_flow_run_tagged_with_two_job_directories(tmp_path, empty_prefect_api):
    """A run tagged with the job's directory and another's is neither directory's, as ``status`` sees it: prune
    removed it with the job's own runs."""
    jobs = tmp_path / "jobs"
    old = recorded_job(jobs, "00000000-0000-4000-8000-000000000016")
    put_flow_run(empty_prefect_api, old, "COMPLETED", "Completed")
    shared = put_flow_run(empty_prefect_api, old, "COMPLETED", "Completed")
    empty_prefect_api.state.flow_runs[0]["tags"].append(directory_tag(tmp_path / "elsewhere"))

    removed = prune(jobs, "--yes")

    assert removed.returncode == EXIT_OK and f"removed {old.name} (" in removed.stdout, removed.stderr
    assert [run["id"] for run in empty_prefect_api.state.flow_runs] == [shared]


def test_list_and_status_show_a_job_input_with_escape_sequences_made_plain(tmp_path, empty_prefect_api):
    """A deployment's input comes from a form: terminal escapes and bidi marks were printed as they were."""
    jobs, job_id = tmp_path / "jobs", "00000000-0000-4000-8000-000000000015"
    forged = "/data/in\x1b]0;pwned\x07\x1b[2J\u202eput"
    with changing_record(jobs / job_id, new=JobRecord(job_id=job_id, enabled_steps=["local_import"], job_input=forged)):
        pass
    for command in (["list", "--jobs-dir", str(jobs)], ["status", str(jobs / job_id)]):
        shown = run_cli_here(*command)  # on an API that knows no job
        assert shown.returncode == EXIT_OK and "/data/in" in shown.stdout, shown.stderr
        assert not any(c in shown.stdout for c in "\x1b\x07\u202e"), shown.stdout


def test_pruning_a_copy_of_job_directories_leaves_the_copies_and_the_originals_runs(tmp_path, start_job, prefect_api):
    """A copy (a backup) has no flow run of its own: its state is nobody's to tell, so it stays, and the originals'
    runs and artifacts with it."""
    api = prefect_api["api_url"]
    originals = [made_old(start_job(["local_import"])), made_old(start_job(["local_import", "wait"]))]
    records = {job.name: (flow_runs_of(api, job.name), artifact_keys_of(api, job.name)) for job in originals}
    backup = tmp_path / "backup"
    for job in originals:
        shutil.copytree(job, backup / job.name)

    pruned = prune(backup, "--state", "Completed", "--state", "Suspended", "--yes")

    assert pruned.returncode == EXIT_OK, pruned.stderr
    assert "removed 0 of 0 job(s)" in pruned.stdout and len(jobs_in(backup)) == 2
    assert all(f"kept {job.name}: no flow run of it on this Prefect server" in pruned.stdout for job in originals)
    assert all(job.is_dir() for job in originals)
    assert {job.name: (flow_runs_of(api, job.name), artifact_keys_of(api, job.name)) for job in originals} == records


def test_a_job_whose_flow_run_awaits_inspection_on_the_server_is_never_pruned(tmp_path, start_job, prefect_api):
    awaiting = made_old(start_job(["local_import", "wait"]))
    runs = flow_runs_of(prefect_api["api_url"], awaiting.name)

    pruned = prune(tmp_path / "jobs", "--yes")

    assert pruned.returncode == EXIT_OK, pruned.stderr
    assert f"kept {awaiting.name}: Suspended (remove it with --state Suspended)" in pruned.stdout  # the run's state
    assert awaiting.is_dir() and flow_runs_of(prefect_api["api_url"], awaiting.name) == runs


def test_jobs_of_another_homes_server_sharing_the_jobs_directory_are_kept(tmp_path, start_job, prefect_api):
    """Two homes, one jobs directory: prune under the second home removed the first home's job folders (its dry run
    said "0 flow runs, 0 artifacts" for them), leaving their runs and artifacts on the first home's server. A job
    of which the pruning home's server has no flow run stays."""
    jobs = tmp_path / "jobs"
    ours = made_old(start_job(["local_import"]))
    theirs = recorded_job(jobs, "00000000-0000-4000-8000-000000000020")

    here = prune(jobs, "--yes")
    second_home = {"PREFECT_API_URL": "", "PREFECT_HOME": str(tmp_path / "second-home")}
    elsewhere = run_cli_here("prune", "--jobs-dir", str(jobs), "--yes", env=second_home)

    assert here.returncode == EXIT_OK and f"removed {ours.name} (" in here.stdout, here.stdout + here.stderr
    kept = f"kept {theirs.name}: no flow run of it on this Prefect server (another home's, or a lost database)"
    assert kept in here.stdout and theirs.is_dir(), here.stdout
    assert elsewhere.returncode == EXIT_OK and kept in elsewhere.stdout and theirs.is_dir(), elsewhere.stdout
    assert not (tmp_path / "second-home" / "prefect.db").exists()  # no server was started for it
