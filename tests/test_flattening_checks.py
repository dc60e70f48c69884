"""A bad lookup file is refused by ``config check`` and by ``start`` before any work, naming table and element."""

from __future__ import annotations

import json
from pathlib import Path

from flows.run import EXIT_USAGE, main
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


def write_config(tmp_path: Path, lookup: Path) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        "pipeline:\n  enabled_steps: [local_import, flattening]\n"
        f"jobs_dir: {tmp_path / 'jobs'}\n"
        f"services:\n  local_import:\n    dir: {tmp_path}\n  flattening:\n    lookup_path: {lookup}\n"
    )
    return config


def test_config_check_names_the_table_and_element_of_a_bad_lookup_file(tmp_path, capsys):
    lookup, table, element = broken_lookup(tmp_path)
    assert main(["config", "check", str(write_config(tmp_path, lookup))]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "services.flattening.lookup_path" in err and f"table {table} element {element}" in err
    assert "child Nope.missing is not an element of this table" in err and "fix the lookup file" in err


def test_start_refuses_a_bad_lookup_file_before_creating_the_job(tmp_path, capsys):
    lookup, table, _ = broken_lookup(tmp_path)
    assert main(["start", str(write_config(tmp_path, lookup)), str(EXAMPLE_CRTDL)]) == EXIT_USAGE
    assert f"table {table}" in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists()


def test_flattening_without_a_crtdl_is_refused_at_start(tmp_path, capsys):
    config = write_config(tmp_path, TESTDATA / "flattening" / "flatten-lookup.json")
    assert main(["start", str(config)]) == EXIT_USAGE
    assert "the flattening step needs a CRTDL" in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists()
