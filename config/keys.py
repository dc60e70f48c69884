"""The key paths of the configuration, enumerated from the models: every settable leaf, the secret ones, the APP_*
variable of each, and the model or value at a path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import Any, get_args

from pydantic import BaseModel, SecretStr

from config.fields import env_var_name, join_key_path
from config.services import LEGACY_KEY_PATHS
from config.settings import Settings

ENRICHMENTS_KEY = "services.crtdl_preprocessing.enrichments"


def _direct_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model class a field annotation holds directly or inside list/Optional, if any."""
    return _direct_model(annotation) or next(filter(None, map(_nested_model, get_args(annotation))), None)


def _leaves(model: type[BaseModel], prefix: str, nested: Callable[[Any], Any]) -> Iterator[tuple[str, Any]]:
    """(dotted path, annotation) of every field below ``model`` in which ``nested`` finds no model to go into."""
    for name, info in model.model_fields.items():
        path = join_key_path(prefix, name)
        inner = nested(info.annotation)
        yield from _leaves(inner, path, nested) if inner else [(path, info.annotation)]


@cache
def leaf_paths() -> tuple[str, ...]:
    """Every settable key as a dotted path, in model order. Lists (also of rules) are single leaves."""
    return tuple(path for path, _ in _leaves(Settings, "", _direct_model))


def _holds_secret(annotation: Any) -> bool:
    return annotation is SecretStr or any(_holds_secret(argument) for argument in get_args(annotation))


@cache
def secret_key_paths() -> frozenset[str]:
    """Dotted paths of every secret key (SecretStr fields), including the deprecated flat extractor keys."""
    secrets = {path for path, annotation in _leaves(Settings, "", _nested_model) if _holds_secret(annotation)}
    deprecated = {old for old, current in LEGACY_KEY_PATHS.items() if current in secrets}
    return frozenset(secrets | deprecated)


@cache
def settable_paths() -> frozenset[str]:
    return frozenset(leaf_paths()) | frozenset(LEGACY_KEY_PATHS)


@cache
def env_var_index() -> dict[str, str]:
    """APP_* variable name -> dotted key path, built from the models (current and deprecated keys)."""
    index: dict[str, str] = {}
    for path in sorted(settable_paths()):
        name = env_var_name(path)
        if name in index:
            raise RuntimeError(f"keys {index[name]} and {path} share the variable {name}")
        index[name] = path
    return index


def model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the value at ``loc`` (list indices are skipped)."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if model else None
        model = _nested_model(info.annotation) if info else None
    return model


def value_at(settings: Settings, path: str) -> Any:
    """The settings' value of a current key; for the enrichments, the effective rules (inline or from the file)."""
    if path == ENRICHMENTS_KEY:
        return settings.services.crtdl_preprocessing.rules or None
    node: Any = settings
    for part in path.split("."):
        node = getattr(node, part)
    return node
