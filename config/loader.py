"""The one configuration loader: YAML file + ${VAR} + APP_* environment + command-line overrides -> Settings.

A secret key's value in the file may also be ``${prefect-secret:NAME}``: the text of the Prefect Secret block
NAME, read from the Prefect API when the file is loaded (inside the run, for a run's steps), never a parameter.

Precedence, highest first: overrides (command-line flags), APP_* environment variables, the file, defaults.

Environment variables: the name of every key is ``APP_`` + its dotted path upper-cased with ``.`` -> ``_``
(APP_SERVICES_EXTRACTOR_BASE_URL, APP_RETRY_MAX_ATTEMPTS, ...). Names are resolved by enumerating the known
leaf keys of the models (plus the deprecated extractor keys), never by splitting on ``_``, so BASE_URL is never
mistaken for nesting. Decisions:

* APP_* variables that match no key are ignored silently: other tools may share the prefix.
* A variable set to the empty string counts as unset (``APP_X=`` in compose files), like an unset variable.
* Lists accept ``a,b`` or a JSON/YAML flow list ``[a, b]``.

The value source of every leaf key is recorded in ``LoadedConfig.sources``: "default", "file",
"env APP_...", or "flag <label>" (label ``--set <key>`` unless ``override_labels`` names the real flag).
All problems found are raised together as one ConfigError. No message ever contains a configured value
of a secret; pydantic's own errors are reworded (dotted path, no input, no documentation URL).
"""

from __future__ import annotations

import copy
import difflib
import json
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, get_args

import annotated_types
import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from config.durations import format_duration
from tasks.core.errors import DupflowError
from tasks.core.redaction import register_basic_credentials, register_secret
from config.settings import ENV_PREFIX, Problem, Settings, env_var_name, join_key_path, legacy_key_paths

ENRICHMENTS_KEY = "services.crtdl_preprocessing.enrichments"


class ConfigError(DupflowError):
    """The configuration was rejected. ``problems`` holds one message per problem (key path, cause, fix)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"invalid configuration ({count} problem{'s' if count != 1 else ''}):\n{lines}")


@dataclass(frozen=True)
class LoadedConfig:
    settings: Settings
    sources: dict[str, str]
    warnings: list[str] = field(default_factory=list)


# --- key paths ------------------------------------------------------------------------------------------


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model class a field annotation holds directly or inside list/Optional, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        model = _nested_model(argument)
        if model is not None:
            return model
    return None


def _leaf_paths_of(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        path = join_key_path(prefix, name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaf_paths_of(annotation, path)
        else:
            yield path


@cache
def leaf_paths() -> tuple[str, ...]:
    """Every settable key as a dotted path, in model order. Lists (also of rules) are single leaves."""
    return tuple(_leaf_paths_of(Settings, ""))


def _holds_secret(annotation: Any) -> bool:
    return annotation is SecretStr or any(_holds_secret(argument) for argument in get_args(annotation))


def _secret_paths_of(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        path = join_key_path(prefix, name)
        nested = _nested_model(info.annotation)
        if nested is not None:
            yield from _secret_paths_of(nested, path)
        elif _holds_secret(info.annotation):
            yield path


@cache
def secret_key_paths() -> frozenset[str]:
    """Dotted paths of every secret key (SecretStr fields), including the deprecated flat extractor keys."""
    secrets = set(_secret_paths_of(Settings, ""))
    deprecated = {old for old, current in legacy_key_paths().items() if current in secrets}
    return frozenset(secrets | deprecated)


@cache
def _settable_paths() -> frozenset[str]:
    return frozenset(leaf_paths()) | frozenset(legacy_key_paths())


@cache
def env_var_index() -> dict[str, str]:
    """APP_* variable name -> dotted key path, built from the models (current and deprecated keys)."""
    index: dict[str, str] = {}
    for path in sorted(_settable_paths()):
        name = env_var_name(path)
        if name in index:
            raise RuntimeError(f"keys {index[name]} and {path} share the variable {name}")
        index[name] = path
    return index


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the value at ``loc`` (list indices are skipped)."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if model else None
        model = _nested_model(info.annotation) if info else None
    return model


# --- reading the file -----------------------------------------------------------------------------------

_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ${prefect-secret:NAME}: the text of the Prefect Secret block NAME. "-" and ":" never occur in a variable name.
SECRET_BLOCK_PREFIX = "prefect-secret:"
_BLOCK_NAME = re.compile(r"[a-z0-9-]+")  # Prefect's rule for block names


MAX_CONFIG_BYTES = 1_000_000
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000
MAX_NUMBER_CHARS = 100
_NUMBER_LIKE = re.compile(r"[-+]?[0-9][0-9_.eExXoObB:+-]*|[-+]?\.[0-9][0-9_eE+-]*")
_YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKeyError(yaml.MarkedYAMLError):
    """Two entries of one mapping with the same key (PyYAML would silently keep the last)."""


class _StrictLoader(_YamlLoader):  # type: ignore[misc, valid-type]
    """YAML's safe loader that refuses duplicate keys instead of keeping the last value."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _DuplicateKeyError(problem=f"key {key!r} appears twice", problem_mark=key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_text(config_path: Path) -> str:
    """The file as text: at most MAX_CONFIG_BYTES, UTF-8."""
    try:
        with open(config_path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(
            [f"{config_path}: cannot read the configuration file ({error.strerror}); check the path"]
        ) from error
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            [f"{config_path}: larger than {MAX_CONFIG_BYTES // 1_000_000} MB, more than any configuration needs"]
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(
            [f"{config_path}: not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); save the file as UTF-8"]
        ) from None


def _check_yaml_shape(text: str, config_path: Path) -> None:
    """Refuse, before building anything, documents that would cost more than a configuration ever needs:
    nesting deeper than MAX_YAML_DEPTH, more than MAX_YAML_NODES values once aliases are expanded (an
    "alias bomb" of a few hundred bytes expands to billions), and numbers longer than MAX_NUMBER_CHARS.
    Reads parser events only, so memory and time stay proportional to the text."""
    anchors: dict[str, int] = {}
    open_nodes: list[list[Any]] = [[None, 0]]  # [anchor, expanded size] per open collection; [0] is the root

    def add(size: int, where: yaml.Mark) -> None:
        open_nodes[-1][1] += size
        if open_nodes[-1][1] > MAX_YAML_NODES:
            raise ConfigError(
                [
                    f"{config_path}: line {where.line + 1}: more than {MAX_YAML_NODES:,} values once YAML aliases "
                    "(*name) are expanded; write the values out or use fewer aliases"
                ]
            )

    for event in yaml.parse(text, Loader=_YamlLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_nodes.append([event.anchor, 1])
            if len(open_nodes) - 1 > MAX_YAML_DEPTH:
                raise ConfigError(
                    [
                        f"{config_path}: line {event.start_mark.line + 1}: nested more than {MAX_YAML_DEPTH} levels "
                        "deep; a configuration needs far fewer, check the file"
                    ]
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, size = open_nodes.pop()
            if anchor is not None:
                anchors[anchor] = size
            add(size, event.start_mark)
        elif isinstance(event, yaml.ScalarEvent):
            _check_scalar(event, config_path)
            if event.anchor is not None:
                anchors[event.anchor] = 1
            add(1, event.start_mark)
        elif isinstance(event, yaml.AliasEvent):
            add(anchors.get(event.anchor, 1), event.start_mark)


def _check_scalar(event: yaml.ScalarEvent, config_path: Path) -> None:
    plain = event.implicit[0]
    if plain and len(event.value) > MAX_NUMBER_CHARS and _NUMBER_LIKE.fullmatch(event.value):
        raise ConfigError(
            [
                f"{config_path}: line {event.start_mark.line + 1}: a number {len(event.value):,} characters long; "
                "no setting takes such a number, shorten it (quote it if it is meant as text)"
            ]
        )


def _read_yaml(config_path: Path) -> dict[str, Any]:
    """The file's YAML tree (``${VAR}`` not yet expanded), read and parsed once per path, modification time and
    size in this process: the command, the job's preparation and its steps share one read of the file."""
    return copy.deepcopy(_parsed_yaml(config_path, file_identity(str(config_path))))


@lru_cache(maxsize=8)
def _parsed_yaml(config_path: Path, identity: tuple[int, int] | None) -> dict[str, Any]:
    text = _read_text(config_path)
    try:
        _check_yaml_shape(text, config_path)
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a safe loader that also refuses duplicate keys
    except _DuplicateKeyError as error:
        line = error.problem_mark.line + 1 if error.problem_mark else 0
        raise ConfigError(
            [f"{config_path}: line {line}: {error.problem} in the same block; keep only one of them"]
        ) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError([f"{config_path}: invalid YAML at {where} ({error.problem}); fix the syntax"]) from None
    except (yaml.YAMLError, ValueError, RecursionError) as error:
        raise ConfigError([f"{config_path}: invalid YAML ({type(error).__name__}); fix the syntax"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{config_path}: the top level must be a mapping of keys (services, pipeline, ...)"])
    return data


def drop_empty_keys(node: Any) -> Any:
    """A key written with no value (``auth:`` with every line commented out) is the same as the key absent."""
    if isinstance(node, dict):
        return {key: drop_empty_keys(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [drop_empty_keys(item) for item in node]
    return node


def _substitute_text(text: str, path: str, env: Mapping[str, str], problems: list[Problem]) -> str:
    """Expand ${VAR} and ${prefect-secret:NAME} in one string; $${X} stays the literal ${X}."""

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if name.startswith(SECRET_BLOCK_PREFIX):
            value = _secret_block_value(name.removeprefix(SECRET_BLOCK_PREFIX), path, problems)
            return match.group(0) if value is None else value
        if not _VARIABLE_NAME.fullmatch(name):
            problems.append(
                (
                    path,
                    f"'${{{name}}}' is not a valid variable reference; write ${{NAME}} "
                    "(letters, digits, _) or $${...} for a literal ${...}",
                )
            )
        elif name not in env:
            problems.append(
                (
                    path,
                    f"environment variable {name} (referenced as ${{{name}}}) is not set; "
                    f"set {name} or change the value",
                )
            )
        else:
            return env[name]
        return match.group(0)

    return _REFERENCE.sub(expand, text)


def _secret_block_value(block: str, path: str, problems: list[Problem]) -> str | None:
    """The text held by the Prefect Secret block ``block`` for the secret key ``path``, registered for redaction;
    None (and a problem naming the key, the block and the fix) when it cannot be used."""
    reference = f"${{{SECRET_BLOCK_PREFIX}{block}}}"
    if path not in secret_key_paths():
        problems.append(
            (
                path,
                f"is not a secret key, so it cannot name a Prefect Secret block ({reference}); only passwords, "
                "client secrets, API keys and S3 keys can: write the value itself or use ${VAR}",
            )
        )
        return None
    if not _BLOCK_NAME.fullmatch(block):
        problems.append(
            (
                path,
                f"'{reference}' does not name a Prefect block (lowercase letters, digits and -); "
                f"write ${{{SECRET_BLOCK_PREFIX}my-block-name}}",
            )
        )
        return None
    try:
        value = _load_secret_block(block)
    except ConfigError as error:
        problems.extend((path, f"{reference}: {problem}") for problem in error.problems)
        return None
    register_secret(value)
    return value


def _load_secret_block(block: str) -> str:
    """The text of the Prefect Secret block ``block``, read from the Prefect API this process uses; a ConfigError
    (never carrying the value) when the block is missing, the API does not answer or the block holds no text."""
    import httpx
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:  # Prefect would start a temporary server of its own: slow, and not the jobs' server
        raise ConfigError(
            [
                f"PREFECT_API_URL is not set, so no Prefect server is known to read the Secret block {block} from; "
                "set it to the API address of the server holding the block (uv run python -m flows.run server start "
                "prints the local server's)"
            ]
        )
    try:
        value = Secret.load(block, _sync=True).get()
    except ValueError:
        raise ConfigError(
            [
                f"the Prefect API {api} has no Secret block named {block}; create it (the UI's Blocks page, "
                "or Secret(value=...).save(name) in Python) or correct the name"
            ]
        ) from None
    except httpx.HTTPError as error:
        raise ConfigError(
            [
                f"the Prefect API {api} did not answer the request for the Secret block {block} "
                f"({type(error).__name__}); start that server or set PREFECT_API_URL to the one holding the block"
            ]
        ) from None
    if not isinstance(value, str):
        raise ConfigError(
            [f"the Secret block {block} holds a {type(value).__name__}, not a text; store the secret as a single value"]
        )
    return value


def substitute_variables(node: Any, env: Mapping[str, str], problems: list[Problem], path: str = "") -> Any:
    """Expand ${VAR} and ${prefect-secret:NAME} in every string value of a parsed YAML tree (mappings and lists,
    recursively)."""
    if isinstance(node, dict):
        return {
            key: substitute_variables(value, env, problems, join_key_path(path, str(key)))
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [substitute_variables(item, env, problems, f"{path}[{index}]") for index, item in enumerate(node)]
    if isinstance(node, str):
        return _substitute_text(node, path, env, problems)
    return node


def names_secret_blocks(config_path: str | None) -> bool:
    """Whether the file takes a value from a Prefect Secret block (``${prefect-secret:NAME}``, not escaped): the
    command must then know the jobs' Prefect server before it loads the settings."""
    if config_path is None:
        return False
    reference = re.compile(r"(?<!\$)\$\{" + re.escape(SECRET_BLOCK_PREFIX))
    return any(reference.search(text) for text in _strings_of(_read_yaml(Path(config_path))))


def _strings_of(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings_of(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings_of(item)
    elif isinstance(node, str):
        yield node


# --- merging env and flags ------------------------------------------------------------------------------


def _has_path(tree: Mapping[str, Any], path: str) -> bool:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def _apply_env(tree: dict[str, Any], env: Mapping[str, str], sources: dict[str, str]) -> None:
    index = env_var_index()
    for name in sorted(name for name in env if name in index and env[name] != ""):
        _set_path(tree, index[name], env[name])
        sources[index[name]] = f"env {name}"


def _apply_overrides(
    tree: dict[str, Any],
    overrides: Mapping[str, str],
    labels: Mapping[str, str],
    sources: dict[str, str],
    problems: list[str],
) -> None:
    for key, value in overrides.items():
        label = labels.get(key, f"--set {key}")
        if key not in _settable_paths():
            close = difflib.get_close_matches(key, leaf_paths(), n=1)
            hint = f"did you mean {close[0]}?" if close else "run config check to list the keys"
            problems.append(f"{label}: unknown configuration key {key}; {hint}")
            continue
        _set_path(tree, key, value)
        sources[key] = f"flag {label}"


# --- turning validation errors into problems ------------------------------------------------------------


def _format_loc(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _range_text(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    info = model.model_fields.get(loc[-1]) if model else None
    bounds = {type(item).__name__: item for item in (info.metadata if info else [])}
    low, high = bounds.get("Ge"), bounds.get("Le")
    if isinstance(low, annotated_types.Ge) and isinstance(high, annotated_types.Le):
        return f"must be between {low.ge} and {high.le}; set a value in that range"
    if isinstance(low, annotated_types.Ge):
        return f"must be at least {low.ge}; raise it"
    if isinstance(high, annotated_types.Le):
        return f"must be at most {high.le}; lower it"
    return "is out of range; fix the value"


def _unknown_key_text(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    valid = list(model.model_fields) if model else []
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown key; {hint}remove or rename it (valid keys here: {', '.join(valid)})"


_FIXED_TEXTS = {
    "missing": "is required; add it",
    "int_parsing": "must be a whole number (e.g. 5)",
    "int_type": "must be a whole number (e.g. 5)",
    "int_from_float": "must be a whole number (e.g. 5)",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": 'must be a text value; quote it in YAML (e.g. "123")',
    "list_type": "must be a list; write [a, b] in YAML or a,b in an environment variable or flag",
    "model_type": "must be a block of keys (a YAML mapping)",
    "model_attributes_type": "must be a block of keys (a YAML mapping)",
    "dict_type": "must be a block of keys (a YAML mapping)",
    "string_too_short": "must not be empty; set a value",
}
_RANGE_TYPES = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


def _describe(error: Mapping[str, Any]) -> str:
    """Our wording for one pydantic error (never its input value or documentation URL)."""
    kind, loc = error["type"], error["loc"]
    if kind == "extra_forbidden":
        return _unknown_key_text(loc)
    if kind in _RANGE_TYPES:
        return _range_text(loc)
    if kind == "literal_error":
        return f"must be one of {error['ctx']['expected']}; set one of those"
    if kind == "value_error":
        return f"{error['ctx']['error']}"
    return _FIXED_TEXTS.get(kind, error["msg"])


def _origin_note(path: str, sources: Mapping[str, str]) -> str:
    """' (from APP_X)' when the offending value came from the environment or a flag."""
    for key, source in sources.items():
        if (path == key or path.startswith((key + ".", key + "["))) and source.startswith(("env ", "flag ")):
            return f" (from {source.split(' ', 1)[1]})"
    return ""


def _problems_of(error: ValidationError, sources: Mapping[str, str], skip: set[str]) -> list[str]:
    problems: list[str] = []
    for item in error.errors(include_url=False, include_input=False):
        base = _format_loc(item["loc"])
        entries = item["ctx"]["problems"] if item["type"] == "config_rule" else [("", _describe(item))]
        for relative, message in entries:
            path = join_key_path(base, relative)
            if not any(path == s or path.startswith((s + ".", s + "[")) for s in skip):
                problems.append(f"{path or '(top level)'}{_origin_note(path, sources)}: {message}")
    return problems


# --- public API -----------------------------------------------------------------------------------------


def _final_sources(raw_sources: Mapping[str, str]) -> dict[str, str]:
    legacy = legacy_key_paths()
    sources = dict.fromkeys(leaf_paths(), "default")
    for path, source in raw_sources.items():
        if path in legacy:
            source = f"{source} (deprecated key {path})" if source == "file" else source
        sources[legacy.get(path, path)] = source
    return sources


def load_settings(
    config_path: str | Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
    override_labels: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Load and validate the configuration; raise ConfigError listing every problem found.

    ``env`` defaults to os.environ (for ${VAR} and APP_*). ``overrides`` maps dotted keys to raw strings from
    the command line; ``override_labels`` maps a key to the flag that set it (e.g. "--dir") for the sources.
    ``config_path`` None means defaults + environment + overrides only.
    """
    env = os.environ if env is None else env
    unresolved: list[Problem] = []
    tree: dict[str, Any] = {}
    if config_path is not None:
        tree = drop_empty_keys(substitute_variables(_read_yaml(Path(config_path)), env, unresolved))
        resolve_file_paths(tree, Path(config_path).expanduser().resolve().parent)
    raw_sources = {path: "file" for path in sorted(_settable_paths()) if _has_path(tree, path)}
    _apply_env(tree, env, raw_sources)
    flag_problems: list[str] = []
    _apply_overrides(tree, overrides or {}, override_labels or {}, raw_sources, flag_problems)
    # A ${VAR} in a file value that the environment or a flag replaces does no harm.
    unresolved = [(path, message) for path, message in unresolved if raw_sources.get(path, "file") == "file"]
    problems = [f"{path}: {message}" for path, message in unresolved] + flag_problems
    warnings: list[str] = []
    settings = None
    try:
        settings = Settings.model_validate(copy.deepcopy(tree), context={"warnings": warnings})
    except ValidationError as error:
        problems += _problems_of(error, raw_sources, {path for path, _ in unresolved})
    if problems or settings is None:
        raise ConfigError(problems)
    register_secrets(settings)
    sources = _final_sources(raw_sources)
    enrichments_path = settings.services.crtdl_preprocessing.enrichments_path
    if enrichments_path is not None:
        sources[ENRICHMENTS_KEY] = f"enrichment file {enrichments_path}"
    return LoadedConfig(settings=settings, sources=sources, warnings=warnings)


SettingsIdentity = tuple[str | None, tuple[int, int] | None, tuple[tuple[str, str], ...], str]


def cached_settings(config_path: str | None, overrides: Mapping[str, str]) -> Settings:
    """The settings of ``config_path`` plus ``overrides``, loaded once per process and identity.

    The identity is secret-free: the file's path, its modification time and size, the sorted (non-secret)
    overrides and a digest of the APP_* environment, so an edited file, ``continue --set`` or another APP_* value
    is loaded afresh, in the flow's process and on a Dask worker alike. Secrets come from the file's ``${VAR}``
    and the APP_* environment, read when the settings are loaded, and from Prefect Secret blocks the file names
    (read when the file is first loaded in the process: a changed block value needs a new process or an edit of
    the file).
    """
    return _settings_of_identity(*settings_identity(config_path, overrides))


def settings_identity(config_path: str | None, overrides: Mapping[str, str]) -> SettingsIdentity:
    """What the settings of ``config_path`` plus ``overrides`` depend on, without a secret: a key for caches of
    the settings and of what is built from them (clients)."""
    return config_path, file_identity(config_path), tuple(sorted(overrides.items())), app_environment_digest()


def app_environment_digest() -> str:
    """A digest of this process's APP_* variables (names and values): it tells that they changed, not what they
    are."""
    variables = sorted((name, value) for name, value in os.environ.items() if name.startswith(ENV_PREFIX))
    return hashlib.sha256(repr(variables).encode()).hexdigest()[:16]


@lru_cache(maxsize=16)
def _settings_of_identity(
    config_path: str | None, file: tuple[int, int] | None, overrides: tuple[tuple[str, str], ...], environment: str
) -> Settings:
    return load_settings(config_path, overrides=dict(overrides)).settings


def file_identity(path: str | None) -> tuple[int, int] | None:
    """The file's modification time (ns) and size; None for no file (the loader reports a missing one clearly)."""
    try:
        status = Path(path).stat() if path else None
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size) if status else None


def _display(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, SecretStr):
        return "********"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"), separators=(",", ":"))
    if isinstance(value, list):
        return "[" + ", ".join(_display(item) for item in value) + "]"
    return str(value)


def _value_at(settings: Settings, path: str) -> Any:
    if path == ENRICHMENTS_KEY:
        return settings.services.crtdl_preprocessing.rules or None
    node: Any = settings
    for part in path.split("."):
        node = getattr(node, part)
    return node


def effective_config_rows(loaded: LoadedConfig) -> list[tuple[str, str, str]]:
    """(dotted key, display value, source) for every leaf key; secrets show as ******** when set.

    The enrichments row shows the effective rules, inline or read from enrichments_path.
    """
    return [
        (path, _display(_value_at(loaded.settings, path)), loaded.sources.get(path, "default")) for path in leaf_paths()
    ]


# Keys that name files or directories. A relative path in the configuration file is relative to the file's
# directory; one from a flag, --set, an APP_* variable or the default is relative to the current directory.
# A job freezes them as absolute paths when it starts, so that ``continue`` from another working directory
# (or a deployment worker) reads the same files.
PATH_KEYS = (
    "jobs_dir",
    "services.local_import.dir",
    "services.pseudonymizer.anonymization_config",
    "services.crtdl_preprocessing.enrichments_path",
    "services.flattening.lookup_path",
    "tls.ca_cert_path",
)


def resolve_file_paths(tree: dict[str, Any], config_dir: Path) -> None:
    """Make the relative path keys of a parsed configuration file absolute against ``config_dir``, in place."""
    for key in PATH_KEYS:
        *parents, leaf = key.split(".")
        node: Any = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        value = node.get(leaf) if isinstance(node, dict) else None
        if isinstance(value, str) and value.strip() and not Path(value).expanduser().is_absolute():
            node[leaf] = str(config_dir / value)


def absolute_path_overrides(settings: Settings) -> dict[str, str]:
    """Every path key that is set, as an absolute path: file values are already absolute against the file's
    directory (``load_settings``); the others are made absolute against the current directory here."""
    paths = {key: _value_at(settings, key) for key in PATH_KEYS}
    return {key: str(Path(value).expanduser().resolve()) for key, value in paths.items() if value}


def refuse_secret_overrides(overrides: Mapping[str, str], source: str) -> None:
    """Refuse secret keys among parameter overrides, which are stored with the job (job.json, Prefect's
    flow-run parameters); ``source`` names where they came from ("--set", "the deployment's overrides
    parameter"). Call it before anything else looks at the overrides."""
    secret = sorted(key for key in overrides if key in secret_key_paths())
    if secret:
        raise ConfigError(
            [
                f"{key} (in {source}): is a secret and cannot be given in {source}, which is stored with the job; "
                f"set it with ${{VAR}} or ${{{SECRET_BLOCK_PREFIX}BLOCK}} in the configuration file or the "
                f"environment variable {env_var_name(key)}"
                for key in secret
            ]
        )


def register_secrets(settings: Settings) -> None:
    """Hand every configured secret to the redaction (``tasks.core.redaction.redact``, below this module), so a
    service that echoes one back in an error never gets it into a message, log line or record."""
    for path in secret_key_paths():
        if path not in legacy_key_paths():
            value = _value_at(settings, path)
            if isinstance(value, SecretStr):
                register_secret(value.get_secret_value())
    services = settings.services
    for auth in (services.extractor.auth, services.pseudonymizer.auth, services.send.auth):
        if auth.username is not None and auth.password is not None:
            register_basic_credentials(auth.username, auth.password.get_secret_value())
