"""A bad lookup file is refused by ``config check`` and by ``start`` before any work, naming table and element."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.jobs import check_new_job
from flows.run import EXIT_USAGE, main
from tasks.core.errors import JobError
from tests.conftest import TESTDATA

EXAMPLE_CRTDL = TESTDATA / "flattening" / "example" / "example-crtdl.json"


def broken_lookup(tmp_path: Path) -> tuple[Path, str, str]:
    tables = json.loads((TESTDATA / "flattening" / "flatten-lookup.json").read_text())
    table = tables[0]
    element = next(iter(table["elements"]))
    table["elements"][element].setdefault("children", []).append("Nope.missing")
    path = tmp_path / "lookup.json"
    path.write_text(json.dumps(tables))
    return path, table["url"], element


def local_import_and_flattening(tmp_path: Path, lookup: Path) -> dict:
    """The configuration tree of local_import from tmp_path, then flattening with ``lookup``."""
    return {
        "pipeline": {"enabled_steps": ["local_import", "flattening"]},
        "services": {"local_import": {"dir": tmp_path}, "flattening": {"lookup_path": lookup}},
    }


def test_config_check_names_the_table_and_element_of_a_bad_lookup_file(tmp_path, write_config, capsys):
    lookup, table, element = broken_lookup(tmp_path)
    config = write_config(local_import_and_flattening(tmp_path, lookup))
    assert main(["config", "check", str(config)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "services.flattening.lookup_path" in err and f"table {table} element {element}" in err
    assert "child Nope.missing is not an element of this table" in err and "fix the lookup file" in err


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")  # start asks the jobs' Prefect server first
def test_start_refuses_a_bad_lookup_file_before_creating_the_job(tmp_path, write_config, capsys):
    lookup, table, _ = broken_lookup(tmp_path)
    config = write_config(local_import_and_flattening(tmp_path, lookup))
    assert main(["start", str(config), str(EXAMPLE_CRTDL)]) == EXIT_USAGE
    assert f"table {table}" in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")  # start asks the jobs' Prefect server first
def test_flattening_without_a_crtdl_is_refused_at_start(tmp_path, write_config, capsys):
    tree = local_import_and_flattening(tmp_path, TESTDATA / "flattening" / "flatten-lookup.json")
    config = write_config(tree)
    assert main(["start", str(config)]) == EXIT_USAGE
    assert "the flattening step needs a CRTDL" in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("name", ["query.crtdl", "crtdl.JSON", "crtdl.jsn"])
def test_a_crtdl_given_under_another_suffix_is_named_with_the_reason_it_was_not_taken(tmp_path, write_config, name):
    # The user gave a CRTDL as INPUT; being told "give the CRTDL file as INPUT" sent them round in a circle.
    crtdl = tmp_path / name
    crtdl.write_bytes(EXAMPLE_CRTDL.read_bytes())
    config = write_config(local_import_and_flattening(tmp_path, TESTDATA / "flattening" / "flatten-lookup.json"))
    with pytest.raises(JobError) as refused:
        check_new_job(str(config), str(crtdl), {})
    said = str(refused.value)
    assert said.startswith("the flattening step needs a CRTDL: give the CRTDL file as INPUT"), said
    assert f"INPUT {crtdl} is no CRTDL: a CRTDL file's name ends in .json" in said, said


def test_a_data_directory_given_as_the_only_input_is_named_as_taken_for_the_data(tmp_path, write_config):
    config = write_config(local_import_and_flattening(tmp_path, TESTDATA / "flattening" / "flatten-lookup.json"))
    with pytest.raises(JobError) as refused:
        check_new_job(str(config), str(tmp_path), {})
    said = str(refused.value)
    assert f"INPUT {tmp_path} is a directory, taken as the data to import" in said, said
