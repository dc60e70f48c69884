"""``view run VIEW.json RESOURCES.ndjson``: run a SQL-on-FHIR view by hand.

See docs/development.md#view-run.
"""

import argparse
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from config.runtime import CLI
from flows.terminal import Commands, command_group, print_stderr
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import as_object, JsonObject
from tasks.core.jsonfile import JsonFileError, MB, read_json_file
from tasks.core.readable import plain_multiline
from tasks.streams.ndjson import NdjsonError, iter_lines
from tasks.sof.errors import ResourceLineError, ViewDefinitionError, ViewError
from tasks.sof.view import CompiledView, compile_view
from tasks.sof.output import CsvWriter, json_bytes
from tasks.sof.resources import csv_parts, read_rows

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
MAX_LINE_BYTES = 1024 * MB
# a ViewDefinition is a few KB; more is the wrong file (or /dev/zero)
MAX_VIEW_BYTES = 16 * MB


def main(argv: Sequence[str]) -> int:
    """Run ``view …`` as the whole command, with the command line's parser and exits."""
    parser = argparse.ArgumentParser(prog=CLI)
    register(parser.add_subparsers(required=True, metavar="COMMAND"))
    return dispatch(parser.parse_args(argv))


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command with the command line's exits (also ``flows.run``'s)."""
    try:
        code: int = args.command(args)
        return code
    except DupflowError as exc:
        print_stderr(f"error: {plain_multiline(str(exc))}")  # it may quote a job.json
        return EXIT_USAGE
    # the reader went away (``list | head``): stop quietly, and keep Python from complaining
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    # outside a job's run or before a row was read (waiting for a server, a listing)
    except KeyboardInterrupt:
        print_stderr("interrupted")
        return EXIT_INTERRUPTED


def register(commands: Commands) -> None:
    view_commands = command_group(commands, "view", "SQL-on-FHIR ViewDefinition commands")
    run = view_commands.add_parser(
        "run", help="run a ViewDefinition over NDJSON resources and print the rows"
    )
    run.add_argument("view", metavar="VIEW.json", help="the ViewDefinition (JSON)")
    run.add_argument(
        "resources", metavar="RESOURCES.ndjson", help="resources, plain or zstd NDJSON"
    )
    formats = "output format (default ndjson; parquet goes to a file or pipe: > rows.parquet)"
    run.add_argument(
        "--format", choices=("ndjson", "csv", "parquet"), default="ndjson", help=formats
    )
    run.set_defaults(command=cmd_view_run)


def cmd_view_run(args: argparse.Namespace) -> int:
    if args.format == "parquet" and sys.stdout.isatty():
        print_stderr("view run: Parquet is binary; send it to a file (> rows.parquet) or a pipe")
        return EXIT_USAGE
    try:
        definition = read_json_file(Path(args.view), MAX_VIEW_BYTES, args.view)
        view = compile_view(definition)
    except JsonFileError as exc:
        print_stderr(f"view run: {exc}")
        return EXIT_USAGE
    except ViewDefinitionError as exc:
        print_stderr(f"invalid ViewDefinition {args.view}: {exc}")
        return EXIT_USAGE
    resources = Path(args.resources)
    try:
        if args.format == "parquet":
            print_parquet(view, as_object(definition), resources)  # a dict: compile_view took it
        elif args.format == "csv":
            write_csv(view, resources, sys.stdout)
        else:
            # lines with no resource of the view's type go unparsed
            for row in read_rows(view, resources, iter_lines(resources, MAX_LINE_BYTES)):
                sys.stdout.write(
                    json_bytes(dict(zip(view.columns, row, strict=True))).decode() + "\n"
                )
    # the reader went away (``view run … | head``): ``dispatch`` stops quietly
    except BrokenPipeError:
        raise
    except (OSError, NdjsonError, ResourceLineError, ViewError) as exc:
        sys.stdout.flush()
        print_stderr(f"view run failed: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stdout.flush()  # rows are written whole, so the output ends after the last complete one
        written = (
            "no Parquet was written" if args.format == "parquet" else "the rows above are complete"
        )
        print_stderr(f"view run interrupted (Ctrl+C); {written}")
        return EXIT_INTERRUPTED
    return EXIT_OK


def write_csv(view: CompiledView, resources: Path, out: IO[str]) -> None:
    """Write the view's rows over the file as CSV, the cyclic garbage collector paused.

    Why: parsed JSON and its rows hold no reference cycles, yet the collector's passes over a
    block's new rows took a tenth to a third of the time (a full pass walks every object).
    """
    writer = CsvWriter(out)
    writer.writerow(view.columns)
    collecting = gc.isenabled()
    gc.disable()
    try:
        for part in csv_parts(view, resources, MAX_LINE_BYTES):
            writer.write_lines(part) if isinstance(part, bytes) else writer.writerows(part)
    finally:
        if collecting:
            gc.enable()


def print_parquet(view: CompiledView, definition: JsonObject, resources: Path) -> None:
    # pyarrow costs every other command 0.1-0.3 s and 33 MB
    from tasks.sof.parquet import write_parquet

    with tempfile.TemporaryDirectory(prefix="dupflow-view-") as folder:
        csv_path, parquet_path = Path(folder) / "rows.csv", Path(folder) / "rows.parquet"
        with open(csv_path, "w", encoding="utf-8", newline="") as csv_out:
            write_csv(view, resources, csv_out)
        write_parquet(csv_path, definition, parquet_path)
        with open(parquet_path, "rb") as parquet:
            shutil.copyfileobj(parquet, sys.stdout.buffer)
