"""CRTDL preprocessing: add the attributes pseudonymization needs to a CRTDL.

Spec: services.crtdl_preprocessing. See docs/development.md#crtdl-enrichment.
"""

import copy
import re
from collections.abc import Iterable

from config.enrichment import AttributeToAdd, EnrichmentRule
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject


class EnrichmentError(StepError, ValueError):
    """The CRTDL cannot be enriched as the rules ask.

    Note: an unresolvable linked group, a malformed dataExtraction.
    """


class UnresolvedLinkError(EnrichmentError):
    """A linked profile URL that no attribute group has as its groupReference."""


def enrich_crtdl(
    crtdl: JsonObject, rules: Iterable[EnrichmentRule]
) -> tuple[JsonObject, list[str]]:
    """Apply ``rules`` in order to a copy of ``crtdl``; warn once per skipped rule."""
    enriched = copy.deepcopy(crtdl)
    warnings: list[str] = []
    # (the rule's group_reference, the attribute, a linked profile URL)
    links: list[tuple[str, JsonObject, str]] = []
    for rule in rules:
        for group in _groups_for(enriched, rule, warnings):
            for wanted in rule.attributes_to_add:
                attribute = _ensure_attribute(group, wanted)
                links.extend(
                    (rule.group_reference, attribute, url) for url in wanted.linked_groups or []
                )
    _resolve_links(enriched, links)
    return enriched, warnings


def _groups_for(crtdl: JsonObject, rule: EnrichmentRule, warnings: list[str]) -> list[JsonObject]:
    """The groups a rule enriches: the existing ones, a newly created one, or none.

    Note: none comes with a warning.
    """
    groups = _existing_groups(crtdl)
    if found := [group for group in groups if group.get("groupReference") == rule.group_reference]:
        return found
    if rule.create_if_not_exists is None:
        warnings.append(
            "CRTDL enrichment skipped a rule: no attribute group has groupReference "
            f"{rule.group_reference!r} and the rule does not ask to create it "
            "(create_if_not_exists)"
        )
        return []
    name = rule.create_if_not_exists.group_name
    group = {
        "id": _unique_id(name, groups),
        "name": name,
        "groupReference": rule.group_reference,
        "attributes": [],
    }
    if crtdl.get("dataExtraction") is None:
        crtdl["dataExtraction"] = {}
    crtdl["dataExtraction"].setdefault("attributeGroups", groups).append(group)
    return [group]


def _existing_groups(crtdl: JsonObject) -> list[JsonObject]:
    if (data_extraction := crtdl.get("dataExtraction")) is None:
        return []
    if not isinstance(data_extraction, dict):
        raise EnrichmentError("CRTDL dataExtraction is not a JSON object")
    groups = data_extraction.get("attributeGroups", [])
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        raise EnrichmentError("CRTDL dataExtraction.attributeGroups is not a list of objects")
    return groups


def _unique_id(name: str, groups: list[JsonObject]) -> str:
    taken = {group.get("id") for group in groups}
    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "group"
    candidate, counter = base, 1
    while candidate in taken:
        counter += 1
        candidate = f"{base}-{counter}"
    return candidate


def _ensure_attribute(group: JsonObject, wanted: AttributeToAdd) -> JsonObject:
    """Append the group's attribute for ``wanted.attribute_ref`` if missing.

    Note: mustHave is only ever raised.
    """
    attributes = group.setdefault("attributes", [])
    if not isinstance(attributes, list):
        raise EnrichmentError(f"attributes of attribute group {group.get('id')!r} is not a list")
    for attribute in attributes:
        if isinstance(attribute, dict) and attribute.get("attributeRef") == wanted.attribute_ref:
            attribute["mustHave"] = bool(attribute.get("mustHave")) or wanted.must_have
            return attribute
    attribute = {"attributeRef": wanted.attribute_ref, "mustHave": wanted.must_have}
    attributes.append(attribute)
    return attribute


def _resolve_links(crtdl: JsonObject, links: list[tuple[str, JsonObject, str]]) -> None:
    groups = _existing_groups(crtdl)
    for group_reference, attribute, url in links:
        if not (targets := [group for group in groups if group.get("groupReference") == url]):
            raise UnresolvedLinkError(
                f"enrichment rule for group {group_reference!r}: attribute "
                f"{attribute['attributeRef']!r} links to {url!r}, but no attribute group has that "
                "groupReference"
            )
        linked_ids = attribute.setdefault("linkedGroups", [])
        for target in targets:
            if (target_id := _id_of(target, groups)) not in linked_ids:
                linked_ids.append(target_id)


def _id_of(group: JsonObject, groups: list[JsonObject]) -> str:
    """The group's id; an id-less group gets one from its name or profile's last part."""
    if not group.get("id"):
        name = (
            group.get("name") or str(group.get("groupReference", "")).rstrip("/").rsplit("/", 1)[-1]
        )
        group["id"] = _unique_id(name, groups)
    return str(group["id"])
