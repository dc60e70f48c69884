"""A cached result is taken only while it still tells the truth: its files on disk as recorded, its input as it is
now. Jobs through the command line, against a real (temporary) Prefect API and the pseudonymizer's fake."""

from __future__ import annotations

import os

import pytest

from flows.run import EXIT_FAILED, EXIT_OK, main
from tests.support.jobs import job_file, only_job_dir, resources_in, source_dir
from tests.support.ndjson import read_output, write_lines
from tests.support.pseudonymization import OVERRIDE_CONFIG, patient, pseudonymizer_job, server_side

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_a_cached_import_whose_files_were_deleted_or_cut_is_made_again_and_the_intact_one_kept(tmp_path, write_config):
    """Files of a finished step deleted or cut short while the job waited: the cached result named them as they
    were, so continue went on with 4 lost records (cut) or failed on every try (deleted)."""
    source = source_dir(tmp_path, {"a.ndjson": 3, "b.ndjson": 5, "c.ndjson": 4})
    pipeline = {"enabled_steps": ["local_import", "wait"], "file_batches": {"max_files": 1}}  # a task run a file
    config = write_config({"pipeline": pipeline, "compression": {"enabled": False}})
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    imported = job_dir / "import"
    (imported / "a.ndjson").unlink()
    with open(imported / "b.ndjson", "r+b") as cut:
        cut.truncate(len(cut.readline()))
    intact = (imported / "c.ndjson").stat().st_mtime_ns

    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK

    assert job_file(job_dir)["state"] == "Completed"
    assert [resources_in(imported / name) for name in ("a.ndjson", "b.ndjson", "c.ndjson")] == [3, 5, 4]
    assert (imported / "c.ndjson").stat().st_mtime_ns == intact
    assert (imported / "b.ndjson").read_bytes() == (source / "b.ndjson").read_bytes()


def test_a_corrected_file_corrected_again_to_the_same_size_is_pseudonymized_anew(
    pseudonymizer_fake, tmp_path, write_config
):
    """a.ndjson corrected and pseudonymized, b.ndjson refused by the service; a corrected again to the same size:
    the cached a (keyed by name, size and counts) was kept, and the job ended with a's first correction."""
    source = tmp_path / "in"
    source.mkdir()
    write_lines(source / "a.ndjson", [patient(1), patient(2)])
    tree = pseudonymizer_job(pseudonymizer_fake)
    tree["pipeline"]["enabled_steps"] = ["local_import", "wait", "pseudonymizer"]
    config = write_config(tree)
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    corrected = job_dir / "import_wait"
    write_lines(corrected / "a.ndjson", [patient(1, birthDate="1972-02-02"), patient(2)])
    write_lines(corrected / "b.ndjson", [patient(3)])
    state = pseudonymizer_fake.state
    state.reset(status_hook=lambda _: 400 if len(state.requests) > 2 else None)  # a's two pass, b's is refused
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_FAILED
    first = (job_dir / "pseudonymizer" / "a.ndjson.zst").stat().st_mtime_ns

    size = (corrected / "a.ndjson").stat().st_size
    write_lines(corrected / "a.ndjson", [patient(1, birthDate="1972-02-03"), patient(2)])
    os.utime(corrected / "a.ndjson", ns=(first + 10**9, first + 10**9))  # a coarse clock must not hide the change
    assert (corrected / "a.ndjson").stat().st_size == size
    state.reset()
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK

    assert job_file(job_dir)["state"] == "Completed"
    assert [request.status for request in state.requests] == [200] * 3  # a's two again, then b's
    again = [server_side(p, pseudonymizer_fake) for p in (patient(1, birthDate="1972-02-03"), patient(2))]
    assert read_output(job_dir / "pseudonymizer" / "a.ndjson.zst") == again


def test_continue_with_a_setting_that_shapes_a_finished_steps_output_runs_that_step_again(
    pseudonymizer_fake, tmp_path, write_config
):
    """``continue --set services.pseudonymizer.anonymization_config=…`` on a completed job: the cached pseudonymizer
    step was taken as it was, no request went out, and the job said Completed with the old config's output."""
    source = tmp_path / "in"
    source.mkdir()
    write_lines(source / "a.ndjson", [patient(1), patient(2)])
    config = write_config(pseudonymizer_job(pseudonymizer_fake))
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    imported = (job_dir / "import" / "a.ndjson.zst").stat().st_mtime_ns
    state = pseudonymizer_fake.state
    state.reset()

    changed = f"services.pseudonymizer.anonymization_config={OVERRIDE_CONFIG}"
    assert main(["continue", str(job_dir), "--set", changed, "--no-progress"]) == EXIT_OK

    assert [r.parameter_names for r in state.requests] == [["config", "resource"]] * 2  # sent with the new config
    assert (job_dir / "import" / "a.ndjson.zst").stat().st_mtime_ns == imported  # the import is as it was
    state.reset()
    assert main(["continue", str(job_dir), "--set", changed, "--no-progress"]) == EXIT_OK
    assert state.requests == []  # the same settings again: nothing to redo


def test_a_file_fixed_at_the_source_is_done_again_alone_and_its_unchanged_siblings_kept(
    pseudonymizer_fake, tmp_path, write_config
):
    """The service refused b; the operator fixed b at the source, deleted import/b and continued: a, done and its
    input unchanged, was pseudonymized again and its output rewritten (so sent again whole), as every file task's
    key held a digest of the step's whole file list."""
    source = tmp_path / "in"
    source.mkdir()
    for name, base in (("a", 0), ("b", 10), ("c", 20)):
        write_lines(source / f"{name}.ndjson", [patient(base + 1), patient(base + 2)])
    tree = pseudonymizer_job(pseudonymizer_fake)
    tree["pipeline"]["file_batches"] = {"max_files": 1}  # a cached task run per file
    config = write_config(tree)
    state = pseudonymizer_fake.state
    state.reset(status_hook=lambda _: 400 if len(state.requests) > 2 else None)  # a's two pass, b's is refused
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_FAILED
    job_dir = only_job_dir(tmp_path / "jobs")
    done = (job_dir / "pseudonymizer" / "a.ndjson.zst").stat().st_mtime_ns

    write_lines(source / "b.ndjson", [patient(11, gender="male"), patient(12)])
    (job_dir / "import" / "b.ndjson.zst").unlink()  # imported again, alone
    state.reset()
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK

    assert len(state.requests) == 4  # b's two and c's
    assert (job_dir / "pseudonymizer" / "a.ndjson.zst").stat().st_mtime_ns == done
    fixed = [server_side(p, pseudonymizer_fake) for p in (patient(11, gender="male"), patient(12))]
    assert read_output(job_dir / "pseudonymizer" / "b.ndjson.zst") == fixed
