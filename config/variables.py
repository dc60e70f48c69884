"""``${VAR}`` in the values of the configuration file: the text of an environment variable, or, for a secret key,
``${prefect-secret:NAME}``: the text of the Prefect Secret block NAME, read from the Prefect API when the file is
loaded (inside the run, for a run's steps), never a parameter. ``$${X}`` stays the literal ``${X}``."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from config.fields import Problem, join_key_path
from config.keys import secret_key_paths
from config.yaml_file import read_yaml
from tasks.core.redaction import register_secret

_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ${prefect-secret:NAME}: the text of the Prefect Secret block NAME. "-" and ":" never occur in a variable name.
SECRET_BLOCK_PREFIX = "prefect-secret:"
_BLOCK_NAME = re.compile(r"[a-z0-9-]+")  # Prefect's rule for block names


class _UnusableBlock(Exception):
    """The Secret block cannot give a value; the message says why and what to do (never the value)."""


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
            problem = (
                f"'${{{name}}}' is not a valid variable reference; write ${{NAME}} (letters, digits, _) or $${{...}} "
                "for a literal ${...}"
            )
        elif name not in env:
            problem = (
                f"environment variable {name} (referenced as ${{{name}}}) is not set; set {name} or change the value"
            )
        else:
            return env[name]
        problems.append((path, problem))
        return match.group(0)

    return _REFERENCE.sub(expand, text)


def _secret_block_value(block: str, path: str, problems: list[Problem]) -> str | None:
    """The text held by the Prefect Secret block ``block`` for the secret key ``path``, registered for redaction;
    None (and a problem naming the key, the block and the fix) when it cannot be used."""
    reference = f"${{{SECRET_BLOCK_PREFIX}{block}}}"
    if path not in secret_key_paths():
        problem = (
            f"is not a secret key, so it cannot name a Prefect Secret block ({reference}); only passwords, "
            "client secrets, API keys and S3 keys can: write the value itself or use ${VAR}"
        )
    elif not _BLOCK_NAME.fullmatch(block):
        problem = (
            f"'{reference}' does not name a Prefect block (lowercase letters, digits and -); "
            f"write ${{{SECRET_BLOCK_PREFIX}my-block-name}}"
        )
    else:
        try:
            value = _load_secret_block(block)
        except _UnusableBlock as error:
            problem = f"{reference}: {error}"
        else:
            register_secret(value)
            return value
    problems.append((path, problem))
    return None


def _load_secret_block(block: str) -> str:
    """The text of the Prefect Secret block ``block``, read from the Prefect API this process uses; _UnusableBlock
    when the block is missing, the API does not answer or the block holds no text."""
    import httpx
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:  # Prefect would start a temporary server of its own: slow, and not the jobs' server
        raise _UnusableBlock(
            f"PREFECT_API_URL is not set, so no Prefect server is known to read the Secret block {block} from; "
            "set it to the API address of the server holding the block (uv run python -m flows.run server start "
            "prints the local server's)"
        )
    try:
        value = Secret.load(block, _sync=True).get()
    except ValueError:
        raise _UnusableBlock(
            f"the Prefect API {api} has no Secret block named {block}; create it (the UI's Blocks page, "
            "or Secret(value=...).save(name) in Python) or correct the name"
        ) from None
    except httpx.HTTPError as error:
        raise _UnusableBlock(
            f"the Prefect API {api} did not answer the request for the Secret block {block} "
            f"({type(error).__name__}); start that server or set PREFECT_API_URL to the one holding the block"
        ) from None
    if not isinstance(value, str):
        raise _UnusableBlock(
            f"the Secret block {block} holds a {type(value).__name__}, not a text; store the secret as a single value"
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
    return any(reference.search(text) for text in _strings_of(read_yaml(Path(config_path))))


def _strings_of(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, (dict, list)):
        for value in node.values() if isinstance(node, dict) else node:
            yield from _strings_of(value)
