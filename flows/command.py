"""The ``dupflow`` console script.

Note: ``view`` runs with the SQL-on-FHIR engine alone (``flows.view_cli``), as ``python -m flows.run
view`` does; every other command is ``flows.run``'s, with the pipeline it imports.
"""

import sys


def main() -> int:
    if sys.argv[1:2] == ["view"]:
        from flows.view_cli import main as view_main

        return view_main(sys.argv[1:])
    from flows.run import run_as_program

    return run_as_program()
