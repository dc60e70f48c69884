"""The one configuration loader: flags, then APP_* variables, the file, defaults.

Every problem is raised together as one ConfigError, never with a secret's value; each leaf's
source is kept (docs/development.md, Configuration).
"""

import difflib
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, SecretStr, ValidationError

from config.durations import format_duration
from config.errors import ConfigError, is_at_or_below, validation_problems
from config.fields import CONFIG_LOGGER, ENV_PREFIX, Problem, env_var_name
from config.keys import (
    ENRICHMENTS_KEY,
    env_var_index,
    leaf_paths,
    secret_key_paths,
    settable_paths,
    value_at,
)
from config.services import LEGACY_KEY_PATHS, LEGACY_TIMING_KEY_PATHS
from config.settings import Settings
from config.yaml_file import SECRET_BLOCK_PREFIX, file_identity, read_yaml, substitute_variables
from tasks.core.json_shapes import JsonObject
from tasks.core.redaction import hide_secret_parameters, register_secret
from tasks.core.url_credentials import (
    CredentialsInUrlError,
    has_user_info,
    query_tokens,
    refuse_credentials_in_url,
)

logger = logging.getLogger(CONFIG_LOGGER)


class LoadedConfig(NamedTuple):
    settings: Settings
    sources: dict[str, str]
    warnings: list[str]


def _parent_of(tree: JsonObject, path: str, create: bool = False) -> tuple[JsonObject, str]:
    """The mapping holding the last key of ``path`` (else an empty one), and that key.

    Note: with ``create``, the mappings on the way are made.
    """
    *parents, leaf = path.split(".")
    node: Any = tree
    for part in parents:
        if create and not isinstance(node.get(part), dict):
            node[part] = {}
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else {}), leaf


def _has_path(tree: JsonObject, path: str) -> bool:
    node, leaf = _parent_of(tree, path)
    return leaf in node


# Each timing key's other shape: polling_interval_seconds and polling_interval
_OTHER_SHAPE = LEGACY_TIMING_KEY_PATHS | {new: old for old, new in LEGACY_TIMING_KEY_PATHS.items()}


def _set_values(
    tree: JsonObject, values: Mapping[str, tuple[str, str]], sources: dict[str, str]
) -> None:
    """Set ``values`` (key: value and source) in ``tree``, over those of lower sources.

    Note: a timing key's other shape from a lower source is dropped (``polling_interval_seconds``
    in the file, APP_SERVICES_EXTRACTOR_POLLING_INTERVAL set); both shapes from one source stay
    the error asking to delete one.
    """
    for key, (value, source) in values.items():
        node, leaf = _parent_of(tree, key, create=True)
        node[leaf] = value
        sources[key] = source
        if (other := _OTHER_SHAPE.get(key)) and other in sources and other not in values:
            node.pop(other.rsplit(".", 1)[1])  # the same block
            del sources[other]


def _unknown_flag_key(key: str, label: str) -> str:
    close = difflib.get_close_matches(key, leaf_paths(), n=1)
    hint = (
        f"did you mean {close[0]}?"
        if close
        else "config/example.yaml lists every key, each under its section"
    )
    return f"{label}: unknown configuration key {key}; {hint}"


def _final_sources(raw_sources: Mapping[str, str]) -> dict[str, str]:
    sources = dict.fromkeys(leaf_paths(), "default")
    for path, source in raw_sources.items():
        deprecated = path in LEGACY_KEY_PATHS and source == "file"
        sources[LEGACY_KEY_PATHS.get(path, path)] = (
            f"{source} (deprecated key {path})" if deprecated else source
        )
    return sources


def load_settings(
    config_path: str | Path | None,
    *,
    env: Mapping[str, str] = os.environ,
    overrides: Mapping[str, str] | None = None,
    override_labels: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Load and validate the configuration; a ConfigError lists every problem.

    Note: ``config_path`` None: no file. ``overrides`` maps dotted keys to raw strings from the
    command line, ``override_labels`` a key to the flag that set it (e.g. "--dir").
    """
    unresolved: list[Problem] = []
    tree: JsonObject = {}
    if config_path is not None:
        tree = substitute_variables(read_yaml(Path(config_path)), env, unresolved)
        resolve_file_paths(tree, Path(config_path).expanduser().resolve().parent)
    raw_sources = {path: "file" for path in sorted(settable_paths()) if _has_path(tree, path)}
    flag_problems = _set_overrides(tree, raw_sources, env, overrides or {}, override_labels or {})
    # A ${VAR} in a file value that the environment or a flag replaces (the value, or a list or
    # block holding it) does no harm.
    replaced = [key for key, source in raw_sources.items() if source != "file"]
    unresolved = [
        (path, said)
        for path, said in unresolved
        if not any(is_at_or_below(path, key) for key in replaced)
    ]
    problems = [f"{path}: {message}" for path, message in unresolved] + flag_problems
    warnings: list[str] = []
    try:
        settings = Settings.model_validate(tree, context={"warnings": warnings})
    except ValidationError as error:
        skip = {path for path, _ in unresolved}
        # a deprecated key's variable named at its own key and at the one it sets
        sources = raw_sources | _final_sources(raw_sources)
        raise ConfigError(problems + validation_problems(error, sources, skip)) from None
    if problems:
        raise ConfigError(problems)
    warnings += register_secrets(settings)
    sources = _final_sources(raw_sources)
    if enrichments_path := settings.services.crtdl_preprocessing.enrichments_path:
        sources[ENRICHMENTS_KEY] = f"enrichment file {enrichments_path}"
    return LoadedConfig(settings=settings, sources=sources, warnings=warnings)


def _set_overrides(
    tree: JsonObject,
    raw_sources: dict[str, str],
    env: Mapping[str, str],
    overrides: Mapping[str, str],
    override_labels: Mapping[str, str],
) -> list[str]:
    """Set the APP_* variables and flags in ``tree``; the problems of unknown flags."""
    index = env_var_index()
    from_env = {
        index[name]: (env[name], f"env {name}")
        for name in sorted(env)
        if name in index and env[name]
    }
    _set_values(tree, from_env, raw_sources)
    labels = {key: override_labels.get(key, f"--set {key}") for key in overrides}
    from_flags = {
        key: (overrides[key], f"flag {labels[key]}") for key in overrides if key in settable_paths()
    }
    _set_values(tree, from_flags, raw_sources)
    return [_unknown_flag_key(key, labels[key]) for key in labels if key not in settable_paths()]


def cached_settings(
    config_path: str | None, overrides: Mapping[str, str], overrides_source: str = "--set"
) -> Settings:
    """The settings of ``config_path`` and ``overrides``, once per their identity.

    Note: an edited file, ``continue --set`` or another APP_* value is loaded afresh, a changed
    Prefect Secret block only in a new process. ``overrides_source`` names the overrides' origin
    in an error (a deployment's parameter).
    """
    # what the settings depend on, secret-free: a digest of the APP_* variables tells that they
    # changed, not what they are
    variables = sorted(
        (name, value) for name, value in os.environ.items() if name.startswith(ENV_PREFIX)
    )
    environment = hashlib.sha256(repr(variables).encode()).hexdigest()[:16]
    return _settings_of_identity(
        config_path,
        file_identity(config_path),
        tuple(sorted(overrides.items())),
        environment,
        overrides_source,
    )


@lru_cache(maxsize=16)
def _settings_of_identity(
    config_path: str | None,
    file: tuple[int, int] | None,
    overrides: tuple[tuple[str, str], ...],
    environment: str,
    overrides_source: str,
) -> Settings:
    labels = {key: f"{overrides_source} {key}" for key, _ in overrides}
    return load_settings(config_path, overrides=dict(overrides), override_labels=labels).settings


HIDDEN = (
    "********"  # a set secret, or a secret parameter's value in a URL, as config check shows it
)


def _display(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, SecretStr):
        return HIDDEN
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"), separators=(",", ":"))
    if isinstance(value, list):
        return f"[{', '.join(_display(item) for item in value)}]"
    return hide_secret_parameters(str(value), HIDDEN)  # a service URL may carry ?access_token=…


def effective_config_rows(loaded: LoadedConfig) -> list[tuple[str, str, str]]:
    """(dotted key, shown value, source) of each leaf key; a set secret shows ********."""
    return [
        (path, _display(value_at(loaded.settings, path)), loaded.sources[path])
        for path in leaf_paths()
    ]


# Keys that name files or directories: relative to the configuration file's directory when
# written there, else to the current directory. A job freezes them as absolute paths when it
# starts, so that ``continue`` from another working directory (or a worker) reads the same files.
PATH_KEYS = (
    "jobs_dir",
    "services.local_import.dir",
    "services.pseudonymizer.anonymization_config",
    "services.crtdl_preprocessing.enrichments_path",
    "services.flattening.lookup_path",
    "tls.ca_cert_path",
)


def resolve_file_paths(tree: JsonObject, config_dir: Path) -> None:
    for key in PATH_KEYS:
        node, leaf = _parent_of(tree, key)
        value = node.get(leaf)
        if isinstance(value, str) and value.strip() and not Path(value).expanduser().is_absolute():
            node[leaf] = str(config_dir / value)


def absolute_path_overrides(settings: Settings) -> dict[str, str]:
    """Every path key that is set, as an absolute path (the file's are so already)."""
    return {
        key: str(Path(str(value)).expanduser().resolve())
        for key in PATH_KEYS
        if (value := value_at(settings, key))
    }


def refuse_secret_overrides(overrides: Mapping[str, str], source: str) -> None:
    """Refuse secret keys, and URLs with a secret in their query, among overrides.

    Why: overrides are stored with the job (job.json, the flow run's parameters). Call it before
    anything else looks at them.
    """
    problems = [
        f"{key} (in {source}): is a secret and cannot be given in {source}, which is stored with "
        f"the job; set it with ${{VAR}} or ${{{SECRET_BLOCK_PREFIX}BLOCK}} in the configuration "
        f"file or the environment variable {env_var_name(key)}"
        for key in sorted(overrides)
        if key in secret_key_paths()
    ]
    for key, value in sorted(overrides.items()):
        text = str(value)
        if has_user_info(text):
            continue  # left to the URL fields' own rule, which names the auth block as the fix
        fix = (
            "give the URL in the configuration file, its token from ${VAR}, or in the environment "
            f"variable {env_var_name(key)}"
        )
        try:
            refuse_credentials_in_url(text, door=f"{key} (in {source})", fix=fix, tokens=True)
        except CredentialsInUrlError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError(problems)


MIN_REDACTABLE_SECRET = 8


def register_secrets(settings: Settings) -> list[str]:
    """Hand every configured secret to the redaction; warn of those too short for it.

    Why: a service that echoes one back in an error never gets it into a message, log or record.
    Note: a secret under ``MIN_REDACTABLE_SECRET`` characters also stands in ordinary text, so the
    redaction either misses it (under 4 characters) or blanks words that merely contain it: its
    warning is logged and returned.
    """
    message = (
        "is shorter than 8 characters, too short to be redacted safely from logs and errors; use "
        "a longer one"
    )
    warnings: list[str] = []
    for path in sorted(secret_key_paths() - set(LEGACY_KEY_PATHS)):  # each by its current path
        if not isinstance(value := value_at(settings, path), SecretStr):
            continue  # not set
        secret = value.get_secret_value()
        register_secret(secret)
        if len(secret) < MIN_REDACTABLE_SECRET:
            logger.warning("%s: %s", path, message)
            warnings.append(f"{path}: {message}")
    for path in leaf_paths():  # a token in a service URL's query (?access_token=…) is one too
        if isinstance(url := value_at(settings, path), str):
            for token in query_tokens(url):
                register_secret(token)
    for auth in (
        settings.services.extractor.auth,
        settings.services.pseudonymizer.auth,
        settings.services.send.auth,
    ):
        # the password is registered above; an echoed header shows the pair's token
        if basic := auth.basic_header_token:
            register_secret(basic)
    return warnings
