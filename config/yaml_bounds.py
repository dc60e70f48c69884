"""The bounds of every YAML text parsed: the configuration file, a list as text.

A document that would cost more than a configuration ever needs is refused from parser events
alone, before anything is built, so memory and time stay proportional to the text. Imports
nothing of ours: ``config.fields`` uses it.
"""

import re
from typing import Any

import yaml

MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000
MAX_NUMBER_CHARS = 100
_NUMBER_LIKE = re.compile(r"[-+]?[0-9][0-9_.eExXoObB:+-]*|[-+]?\.[0-9][0-9_eE+-]*")
YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TOO_DEEP = (
    f"nested more than {MAX_YAML_DEPTH} levels deep; a configuration needs far fewer, check the "
    "value"
)
_TOO_MANY = (
    f"more than {MAX_YAML_NODES:,} values once YAML aliases (*name) are expanded; write the "
    "values out or use fewer aliases"
)


def yaml_shape_problem(text: str) -> tuple[str, yaml.Mark] | None:
    """What makes ``text`` cost more than a configuration needs, and where; or None.

    Note: nesting deeper than MAX_YAML_DEPTH, more than MAX_YAML_NODES values once aliases are
    expanded (an "alias bomb" of a few hundred bytes expands to billions), a number longer than
    MAX_NUMBER_CHARS. A syntax error raises yaml's own.
    """
    anchors: dict[str, int] = {}
    # [anchor, expanded size] per open collection; [0] is the root
    open_nodes: list[list[Any]] = [[None, 0]]
    for event in yaml.parse(text, Loader=YamlLoader):
        anchor, size, problem = None, 0, None
        if isinstance(event, yaml.CollectionStartEvent):  # a mapping or a sequence
            open_nodes.append([event.anchor, 1])
            problem = _TOO_DEEP if len(open_nodes) - 1 > MAX_YAML_DEPTH else None
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
            if (
                event.implicit[0]
                and len(event.value) > MAX_NUMBER_CHARS
                and _NUMBER_LIKE.fullmatch(event.value)
            ):
                problem = (
                    f"a number {len(event.value):,} characters long; no setting takes such a "
                    "number, shorten it (quote it if it is meant as text)"
                )
        elif isinstance(event, yaml.AliasEvent):
            size = anchors.get(event.anchor, 1)
        if anchor is not None:
            anchors[anchor] = size
        open_nodes[-1][1] += size
        if problem is None and open_nodes[-1][1] > MAX_YAML_NODES:
            problem = _TOO_MANY
        if problem is not None:
            return problem, event.start_mark
    return None
