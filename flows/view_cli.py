"""``view run VIEW.json RESOURCES.ndjson [--format ndjson|csv]``: run one SQL-on-FHIR ViewDefinition by hand.

For people who write or check views (for example the ones a flattening job saves in ``viewdefinitions/``): the
embedded engine runs over the resources (plain or zstd NDJSON; Bundles are opened into their entries) and the
rows are printed, as NDJSON (one object per row keyed by column name, values as the engine produced them) or as
the flattening step's CSV. An invalid ViewDefinition exits 2 with the reason. Prefect is not started (or imported).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tasks.ndjson import NdjsonError, iter_lines
from tasks.sof import ViewDefinitionError, ViewError, compile_view
from tasks.sof.output import csv_cells, csv_writer, json_bytes
from tasks.sof.resources import ResourceLineError, line_resources, parse_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_LINE_BYTES = 1024 * 1024 * 1024


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``python -m flows.run`` parser."""
    view = commands.add_parser("view", help="SQL-on-FHIR ViewDefinition commands")
    view_commands = view.add_subparsers(required=True, metavar="SUBCOMMAND")
    run = view_commands.add_parser("run", help="run a ViewDefinition over NDJSON resources and print the rows")
    run.add_argument("view", metavar="VIEW.json", help="the ViewDefinition (JSON)")
    run.add_argument("resources", metavar="RESOURCES.ndjson", help="resources, plain or zstd NDJSON")
    run.add_argument("--format", choices=("ndjson", "csv"), default="ndjson", help="output format (default ndjson)")
    run.set_defaults(command=cmd_view_run)


def cmd_view_run(args: argparse.Namespace) -> int:
    try:
        view = compile_view(json.loads(Path(args.view).read_bytes()))
    except OSError as exc:
        print(f"cannot read {args.view}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # JSONDecodeError and ViewDefinitionError
        reason = str(exc) if isinstance(exc, ViewDefinitionError) else f"not valid JSON ({exc})"
        print(f"invalid ViewDefinition {args.view}: {reason}", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stdout
    try:
        if args.format == "csv":
            writer = csv_writer(out)
            writer.writerow(view.columns)
            for row in view_rows(view, Path(args.resources)):
                writer.writerow(csv_cells(row))
        else:
            for row in view_rows(view, Path(args.resources)):
                out.write(json_bytes(dict(zip(view.columns, row, strict=True))).decode() + "\n")
    except (OSError, NdjsonError, ResourceLineError, ViewError) as exc:
        out.flush()
        print(f"view run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def view_rows(view, resources: Path):
    for number, line in iter_lines(resources, MAX_LINE_BYTES):
        for resource in line_resources(parse_line(resources, number, line)):
            yield from view.rows(resource)
