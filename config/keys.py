"""The configuration's key paths, enumerated from the models.

Every settable leaf, the secret ones, the APP_* variable of each, and the model or value at a
path.
"""

from collections.abc import Iterator
from functools import cache, reduce
from typing import get_args

from pydantic import BaseModel, SecretStr

from config.fields import Loc, env_var_name, join_key_path
from config.services import LEGACY_KEY_PATHS
from config.settings import Settings

ENRICHMENTS_KEY = "services.crtdl_preprocessing.enrichments"


def _direct_model(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _nested_model(annotation: object) -> type[BaseModel] | None:
    """The model class a field annotation holds, directly or in list/Optional, if any."""
    inner = filter(None, map(_nested_model, get_args(annotation)))
    return _direct_model(annotation) or next(inner, None)


def _leaves(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, object]]:
    """(path, annotation) of each leaf below ``model``; a list is one leaf."""
    for name, info in model.model_fields.items():
        path = join_key_path(prefix, name)
        inner = _direct_model(info.annotation)
        yield from _leaves(inner, path) if inner else [(path, info.annotation)]


@cache
def leaf_paths() -> tuple[str, ...]:
    """Every settable key as a dotted path, in model order; a list is one leaf."""
    return tuple(path for path, _ in _leaves(Settings, ""))


def _holds_secret(annotation: object) -> bool:
    arguments = get_args(annotation)
    return annotation is SecretStr or any(_holds_secret(argument) for argument in arguments)


@cache
def secret_key_paths() -> frozenset[str]:
    """Dotted paths of every secret key (SecretStr), deprecated flat keys included."""
    secrets = {path for path, annotation in _leaves(Settings, "") if _holds_secret(annotation)}
    deprecated = {old for old, current in LEGACY_KEY_PATHS.items() if current in secrets}
    return frozenset(secrets | deprecated)


@cache
def settable_paths() -> frozenset[str]:
    return frozenset(leaf_paths()) | frozenset(LEGACY_KEY_PATHS)


@cache
def env_var_index() -> dict[str, str]:
    """APP_* variable name -> dotted key path, of the current and deprecated keys."""
    return {env_var_name(path): path for path in sorted(settable_paths())}


def model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class that validates the value at ``loc`` (list indices are skipped)."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if model else None
        model = _nested_model(info.annotation) if info else None
    return model


def value_at(settings: Settings, path: str) -> object:
    """The settings' value of a current key; of the enrichments, the effective rules."""
    if path == ENRICHMENTS_KEY:
        return settings.services.crtdl_preprocessing.rules or None
    return reduce(getattr, path.split("."), settings)
