"""The elements a CRTDL filter reads, by its ``type``, ``name``, the group's type.

A filter whose name and type are not here cannot be applied (``tasks.sof.selection`` says so). The
tables are data, in ``search_elements.json``. See docs/development.md, "The SQL-on-FHIR engine".
"""

from pathlib import Path

import orjson

Paths = tuple[tuple[str, ...], ...]

SEARCH_ELEMENTS: dict[str, dict[str, dict[str, Paths]]] = {
    kind: {
        name: {
            resource_type: tuple(tuple(path.split(".")) for path in dotted)
            for resource_type, dotted in by_type.items()
        }
        for name, by_type in table.items()
    }
    for kind, table in orjson.loads(
        Path(__file__).with_name("search_elements.json").read_bytes()
    ).items()
}
"""Search parameter type → name → resource type → paths of JSON keys.

Note: ``token``: the elements (CodeableConcept or Coding) whose codings a ``system|code``
matches; ``date``: those (date, dateTime, instant or Period) whose time a ``ge``/``le`` bound
compares."""
