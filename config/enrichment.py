"""services.crtdl_preprocessing: CRTDL enrichment rules, inline or in a JSON file.

Inline in the configuration they are snake_case; the file writes them in camelCase, as the
ecosystem's other tools do. One set of models serves both: the configuration validates them by
name, the file by alias.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from config.fields import (
    ConfigModel,
    OptionalPath,
    StrList,
    list_from_text,
    loc_path,
    raise_problems,
)
from tasks.core.jsonfile import MAX_SETTINGS_FILE_BYTES, JsonFileError, read_json_file


class _RuleModel(ConfigModel):
    """snake_case names; the file's camelCase aliases only where asked for (by_alias)."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=False
    )


class CreateIfNotExists(_RuleModel):
    group_name: str = Field(min_length=1)


class AttributeToAdd(_RuleModel):
    attribute_ref: str = Field(min_length=1)
    must_have: bool = False
    linked_groups: StrList = []


class _RuleBase(_RuleModel):
    """The fields of a rule in both spellings but its attributes (``_FileAttribute``)."""

    group_reference: str = Field(min_length=1)
    create_if_not_exists: CreateIfNotExists | None = None


class EnrichmentRule(_RuleBase):
    """One CRTDL enrichment: attributes for the group of profile group_reference."""

    attributes_to_add: list[AttributeToAdd] = []


class _FileAttribute(AttributeToAdd):
    # a JSON list, never the configuration's "a,b" text
    linked_groups: list[str] = []


class _FileRule(_RuleBase):
    """A rule of the file, which may also ask for a group named after the profile.

    Note: ``addGroupIfNotExists``.
    """

    attributes_to_add: list[_FileAttribute] = []
    add_group_if_not_exists: bool = False

    @model_validator(mode="after")
    def _one_way_to_create(self) -> _FileRule:
        if {"create_if_not_exists", "add_group_if_not_exists"} <= self.model_fields_set:
            raise ValueError(
                "addGroupIfNotExists and createIfNotExists are mutually exclusive; keep one "
                "(addGroupIfNotExists names the group after the profile URL's last path segment)",
            )
        return self

    def to_rule(self) -> EnrichmentRule:
        create = self.create_if_not_exists
        if self.add_group_if_not_exists:
            # The short form's group name: the profile URL's last path segment, without a |version.
            create = CreateIfNotExists(
                group_name=self.group_reference.split("|", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            )
        return EnrichmentRule(
            group_reference=self.group_reference,
            create_if_not_exists=create,
            attributes_to_add=list(self.attributes_to_add),
        )


_ENRICHMENT_FILE = TypeAdapter(list[_FileRule])


def _file_error_text(error: ErrorDetails) -> str:
    loc = error["loc"]
    where = f"rule [{loc[0]}]" if loc and isinstance(loc[0], int) else "top level"
    field = loc_path(loc[1:])
    if error["type"] == "extra_forbidden":
        return (
            f"{where}: unknown field {field}; remove it (allowed: groupReference, "
            "createIfNotExists, addGroupIfNotExists, attributesToAdd with attributeRef, "
            "mustHave, linkedGroups)"
        )
    if error["type"] == "missing":
        return f"{where}: {field} is required; add it"
    if error["type"] == "list_type" and not field:
        return "the file must contain a JSON list of enrichment rules"
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {field + ': ' if field else ''}{message}"


class CrtdlPreprocessingSettings(ConfigModel):
    """services.crtdl_preprocessing; ``rules``: those in effect, inline or the file's."""

    enabled: bool = False
    enrichments_path: OptionalPath = None
    enrichments: Annotated[list[EnrichmentRule] | None, BeforeValidator(list_from_text)] = None
    _file_rules: list[EnrichmentRule] | None = PrivateAttr(default=None)

    @property
    def rules(self) -> list[EnrichmentRule]:
        """Inline enrichments, or the rules of enrichments_path (read at validation)."""
        return self.enrichments or self._file_rules or []

    @model_validator(mode="after")
    def _load_rules(self) -> CrtdlPreprocessingSettings:
        if self.enrichments is not None and self.enrichments_path is not None:
            raise ValueError(
                "enrichments and enrichments_path are both set; keep either the inline rules "
                "(enrichments) or the external file (enrichments_path)"
            )
        if path := self.enrichments_path:
            # written relative in the configuration file, it is absolute against its folder now
            try:
                # the rules for every MII profile fit in a few KB
                raw = read_json_file(Path(path), MAX_SETTINGS_FILE_BYTES, path)
                entries = _ENRICHMENT_FILE.validate_python(raw, by_alias=True, by_name=False)
            except JsonFileError as error:
                problems = [str(error)]
            except ValidationError as error:
                errors = error.errors(include_url=False, include_input=False)
                problems = [f"{path}: {_file_error_text(e)}" for e in errors]
            else:
                problems = []
                self._file_rules = [entry.to_rule() for entry in entries]
            raise_problems([("enrichments_path", problem) for problem in problems])
        return self
