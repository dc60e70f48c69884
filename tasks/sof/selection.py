"""Which resources of its type a group takes without a TORCH Provenance.

``compile_selection`` builds TORCH's search as a test (profile, token and date filters); what it
cannot apply is listed in ``Selection.not_applied``. See docs/development.md, "The SQL-on-FHIR
engine".
"""

import datetime
from dataclasses import dataclass
from typing import Any

from tasks.core.json_shapes import as_array, as_object, JsonObject
from tasks.core.names import show_name
from tasks.sof.search_elements import SEARCH_ELEMENTS, Paths


PATIENT = "Patient"
# Code systems whose codes begin with their parent's code (ICD-10-GM, OPS, ATC): a descendant is a
# longer code.
PREFIX_HIERARCHY_SYSTEMS = frozenset(
    {
        "http://fhir.de/CodeSystem/bfarm/icd-10-gm",
        "http://fhir.de/CodeSystem/bfarm/ops",
        "http://fhir.de/CodeSystem/bfarm/atc",
        "http://www.whocc.no/atc",
    }
)
CODING = ("system", "code")
_NO_START, _NO_END = "", "~"  # below and above every date written as digits

TAKEN, OTHER_PROFILE, FILTERED_OUT = 0, 1, 2


@dataclass(frozen=True)
class DateBounds:
    """A date filter's elements and bounds: a start, an end or both (else none)."""

    paths: Paths
    start: str | None
    end: str | None


@dataclass(frozen=True)
class Selection:
    """A group's test of a resource of its type (``check``); picklable, for workers."""

    profile: str | None = None
    token_paths: Paths = ()
    codes: frozenset[tuple[str, str]] = frozenset()
    code_prefixes: tuple[str, ...] = ()
    """``system|code`` of the codes of systems whose codes extend their parent's."""
    date: DateBounds | None = None
    not_applied: tuple[str, ...] = ()

    def check(self, resource: JsonObject) -> int:
        """TAKEN, or why not: OTHER_PROFILE, FILTERED_OUT."""
        if self.profile is not None and not _has_profile(resource, self.profile):
            return OTHER_PROFILE
        if self.token_paths and not self._coded(resource):
            return FILTERED_OUT
        if self.date is not None and not _dated(resource, self.date):
            return FILTERED_OUT
        return TAKEN

    def _coded(self, resource: JsonObject) -> bool:
        for coding in _codings(values(resource, self.token_paths)):
            system, code = coding.get("system"), coding.get("code")
            if type(system) is not str or type(code) is not str:
                continue  # no coding a search could match (and a list would not hash)
            if (system, code) in self.codes:
                return True
            # taken by each code of its system it begins with (no such system's URL holds a "|")
            if system in PREFIX_HIERARCHY_SYSTEMS and f"{system}|{code}".startswith(
                self.code_prefixes
            ):
                return True
        return False


def compile_selection(
    resource_type: str, profile: str, filters: list[Any], reference_only: bool, must_have: list[str]
) -> Selection:
    """The group's test; a Patient group takes every Patient, as TORCH's search does."""
    if resource_type == PATIENT:
        return Selection()
    named = [f for f in filters if isinstance(as_object(f).get("name"), str)]
    notes = [
        f"a filter that is no object with a name ({show_name(str(f))})"
        for f in filters
        if f not in named
    ]
    tokens = [f for f in named if f.get("type") == "token"]
    token_paths, codes, token_note = _token_test(resource_type, tokens)
    dates = [f for f in named if f.get("type") == "date"]
    date, date_note = _date_test(resource_type, dates[0]) if dates else (None, None)
    notes += [note for note in (token_note, date_note) if note]
    if reference_only:
        notes.append(
            f"includeReferenceOnly (the group takes every {resource_type} of its profile, not "
            "only those other groups reference)"
        )
    if must_have:
        notes.append(f"mustHave of {', '.join(must_have)} (patients without them are not left out)")
    prefixes = tuple(
        f"{system}|{code}" for system, code in sorted(codes) if system in PREFIX_HIERARCHY_SYSTEMS
    )
    return Selection(profile, token_paths, frozenset(codes), prefixes, date, tuple(notes))


def _token_test(
    resource_type: str, tokens: list[JsonObject]
) -> tuple[Paths, set[tuple[str, str]], str | None]:
    """The token filters' elements and ``(system, code)`` pairs, or nothing and why."""
    paths: list[tuple[str, ...]] = []
    codes: set[tuple[str, str]] = set()
    for token in tokens:
        if not token.get("codes"):
            continue  # no code: TORCH searches without one
        name = token["name"]
        found = SEARCH_ELEMENTS["token"].get(name, {}).get(resource_type)
        listed = as_array(token["codes"])
        valid = [c for c in listed if all(isinstance(as_object(c).get(k), str) for k in CODING)]
        if found is None or not valid or len(valid) < len(listed):
            why = "a code without its system or code"
            if found is None:
                why = _unknown_parameter("token", name, resource_type)
            shown = f"{show_name(name)} ({', '.join(_shown_codes(token['codes']))})"
            return (
                (),
                set(),
                f"the token filter {shown}: {why}; the group takes its {resource_type}s of "
                "any code",
            )
        paths += [p for p in found if p not in paths]
        codes |= {(c["system"], c["code"]) for c in valid}
    return tuple(paths), codes, None


def _shown_codes(codes: Any) -> list[str]:
    listed = codes if isinstance(codes, list) else [codes]
    shown = [show_name(f"{as_object(c).get('system')}|{as_object(c).get('code')}") for c in listed]
    return shown[:5] + ([f"{len(shown) - 5} more"] if len(shown) > 5 else [])


def _date_test(resource_type: str, spec: JsonObject) -> tuple[DateBounds | None, str | None]:
    """The bounds of the first date filter on its elements, or None and why not."""
    name, start, end = spec["name"], spec.get("start"), spec.get("end")
    first, last = (show_name(str(day)) if day is not None else "…" for day in (start, end))
    shown = f"{show_name(name)} ({first} to {last})"
    found = SEARCH_ELEMENTS["date"].get(name, {}).get(resource_type)
    if (
        bad := next((d for d in (start, end) if d is not None and not _is_date(d)), None)
    ) is not None:
        why = f"{show_name(str(bad))} is no date (YYYY-MM-DD)"
    elif found is None:
        why = _unknown_parameter("date", name, resource_type)
    else:
        return (
            DateBounds(found, start, end) if start is not None or end is not None else None
        ), None
    return None, f"the date filter {shown}: {why}; the group takes its {resource_type}s of any date"


def _unknown_parameter(kind: str, name: str, resource_type: str) -> str:
    known = sorted(
        parameter
        for parameter, by_type in SEARCH_ELEMENTS[kind].items()
        if resource_type in by_type
    )
    listed = f" (known: {', '.join(known)})" if known else ""
    return (
        f"{show_name(name)} is no {kind} search parameter of {resource_type} dupflow knows{listed}"
    )


def _is_date(value: Any) -> bool:
    try:
        return (
            isinstance(value, str) and len(value) == 10 and bool(datetime.date.fromisoformat(value))
        )
    except ValueError:
        return False


def values(node: Any, paths: Paths) -> list[Any]:
    """Every value at each path of JSON keys (arrays on the way are walked through)."""
    # the usual case (``code``, ``period``), the fast way
    if len(paths) == 1 and len(paths[0]) == 1:
        value = node.get(paths[0][0])
        return value if type(value) is list else [] if value is None else [value]
    found: list[Any] = []
    for path in paths:
        level = [node]
        for key in path:
            nxt: list[Any] = []
            for item in level:
                value = item.get(key) if isinstance(item, dict) else None
                if isinstance(value, list):
                    nxt += value
                elif value is not None:
                    nxt.append(value)
            level = nxt
        found += level
    return found


def _codings(elements: list[Any]) -> list[JsonObject]:
    """The codings of CodeableConcepts, and Codings themselves."""
    codings: list[JsonObject] = []
    for element in elements:
        if isinstance(element, dict):
            inner = element.get("coding")
            codings += (
                [c for c in inner if isinstance(c, dict)] if isinstance(inner, list) else [element]
            )
    return codings


def _has_profile(resource: JsonObject, wanted: str) -> bool:
    """Whether some ``meta.profile`` is ``wanted`` or its version (``_profile:below``)."""
    meta = resource.get("meta")
    profiles = meta.get("profile") if type(meta) is dict else None
    if type(profiles) is not list:
        return False
    if wanted in profiles:
        return True
    url, _, version = wanted.partition("|")
    for profile in profiles:
        if isinstance(profile, str):
            base, _, own = profile.partition("|")
            if base == url and (not version or own == version or own.startswith(version + ".")):
                return True
    return False


def _dated(resource: JsonObject, bounds: DateBounds) -> bool:
    """Whether some value ends on or after the start, and some begins by the end.

    Why: each bound is its own search parameter, as TORCH sends them."""
    ranges = [r for value in values(resource, bounds.paths) if (r := _range(value)) is not None]
    after = bounds.start is None or any(last >= bounds.start for _, last in ranges)
    return after and (bounds.end is None or any(first <= bounds.end for first, _ in ranges))


def _range(value: Any) -> tuple[str, str] | None:
    """The first and last day (``YYYY-MM-DD``) of a date, dateTime, instant or Period."""
    if not isinstance(value, dict):
        return _day_range(value)
    first, last = _day_range(value.get("start")), _day_range(value.get("end"))
    if first is None and last is None:
        return None
    return (first[0] if first else _NO_START), (last[1] if last else _NO_END)


def _day_range(text: Any) -> tuple[str, str] | None:
    if not isinstance(text, str) or not text[:4].isdigit():
        return None
    if len(text) >= 10:
        return text[:10], text[:10]
    if len(text) == 7:
        return text + "-01", text + "-31"
    if len(text) == 4:
        return text + "-01-01", text + "-12-31"
    return None
