"""The elements a CRTDL filter reads, by its ``name`` and the group's type.

A filter whose name and type are not here cannot be applied (``tasks.sof.selection`` says so). The
tables are data, in ``search_elements.json``. See docs/development.md, "The SQL-on-FHIR engine".
"""

from __future__ import annotations

from pathlib import Path

import orjson

Paths = tuple[tuple[str, ...], ...]
_TABLES = orjson.loads(Path(__file__).with_name("search_elements.json").read_bytes())


def _paths_of(kind: str) -> dict[str, dict[str, Paths]]:
    """A table of the file: search parameter → resource type → paths of JSON keys."""
    return {
        name: {
            resource_type: tuple(tuple(path.split(".")) for path in dotted)
            for resource_type, dotted in by_type.items()
        }
        for name, by_type in _TABLES[kind].items()
    }


# Token parameters: the elements (CodeableConcept or Coding) whose codings a ``system|code``
# matches.
TOKEN_ELEMENTS = _paths_of("token")
# Date parameters: the elements (date, dateTime, instant or Period) whose time a ``ge``/``le`` bound
# compares.
DATE_ELEMENTS = _paths_of("date")


def known_names(table: dict[str, dict[str, Paths]], resource_type: str) -> list[str]:
    return sorted(name for name, by_type in table.items() if resource_type in by_type)
