"""The configuration file: read in bounds, parsed once, its ``${...}`` expanded.

``${VAR}`` from the environment; for a secret key ``${prefect-secret:NAME}`` from the Prefect
Secret block NAME when the file is loaded, never a parameter; ``$${X}`` stays ``${X}``
(docs/development.md, Configuration).
"""

import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from config.errors import ConfigError
from config.fields import Problem, join_key_path
from config.keys import secret_key_paths
from config.yaml_bounds import YamlLoader, yaml_shape_problem
from tasks.core.json_shapes import JsonObject
from tasks.core.jsonfile import read_at_most
from tasks.core.redaction import register_secret
from tasks.core.url_credentials import shown_url

MAX_CONFIG_BYTES = 1_000_000


class _DuplicateKeyError(yaml.MarkedYAMLError):  # type: ignore[misc]  # yaml has no types
    """Two entries of one mapping with the same key (PyYAML would keep the last)."""


# misc, valid-type: YamlLoader is a variable; unused-ignore: under --strict yaml's Any hides that
class _StrictLoader(YamlLoader):  # type: ignore[misc, valid-type, unused-ignore]
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _DuplicateKeyError(
                        problem=f"key {key!r} appears twice", problem_mark=key_node.start_mark
                    )
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _file_problem(config_path: Path, text: str, where: yaml.Mark | None = None) -> ConfigError:
    return ConfigError([f"{config_path}: {f'line {where.line + 1}: ' if where else ''}{text}"])


def _read_text(config_path: Path) -> str:
    try:
        data = read_at_most(config_path, MAX_CONFIG_BYTES)
    except OSError as error:
        raise _file_problem(
            config_path, f"cannot read the file ({error.strerror}); check the path"
        ) from error
    if len(data) > MAX_CONFIG_BYTES:
        raise _file_problem(
            config_path,
            f"larger than {MAX_CONFIG_BYTES // 1_000_000} MB, more than any configuration needs",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        text = f"not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); save it as UTF-8"
        raise _file_problem(config_path, text) from None


def read_yaml(config_path: Path) -> JsonObject:
    """The file's YAML tree, ``${VAR}`` not yet expanded: parsed once per file version.

    Why: the command, the job's preparation and its steps share one read (per path,
    modification time and size, in this process).
    Note: shared, so read only: ``substitute_variables`` makes the tree that is changed.
    """
    return _parsed_yaml(config_path, file_identity(str(config_path)))


@lru_cache(maxsize=8)
def _parsed_yaml(config_path: Path, identity: tuple[int, int] | None) -> JsonObject:
    if (data := parse_yaml_file(config_path)) is None:
        return {}
    if not isinstance(data, dict):
        raise _file_problem(
            config_path, "the top level must be a mapping of keys (services, pipeline, ...)"
        )
    return data


def parse_yaml_file(config_path: Path) -> Any:
    """The YAML document of a file within this module's bounds.

    Note: of the configuration and every other YAML file dupflow reads (the automation file).
    """
    text = _read_text(config_path)
    try:
        if found := yaml_shape_problem(text):  # before anything is built
            raise _file_problem(config_path, *found)
        # a safe loader that also refuses duplicate keys
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506
    except _DuplicateKeyError as error:
        raise _file_problem(
            config_path,
            f"{error.problem} in the same block; keep only one of them",
            error.problem_mark,
        ) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise _file_problem(
            config_path, f"invalid YAML at {where} ({error.problem}); fix the syntax"
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as error:
        raise _file_problem(
            config_path, f"invalid YAML ({type(error).__name__}); fix the syntax"
        ) from None
    return data


def file_identity(path: str | None) -> tuple[int, int] | None:
    """The file's modification time (ns) and size; None for none (the loader says so)."""
    try:
        status = Path(path).stat() if path else None
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size) if status else None


_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ${prefect-secret:NAME}: the text of the Secret block NAME ("-" and ":" are in no variable name)
SECRET_BLOCK_PREFIX = "prefect-secret:"
_BLOCK_NAME = re.compile(r"[a-z0-9-]+")  # Prefect's rule for block names


class _UnusableBlock(Exception):
    """The Secret block cannot give a value; the message says why and what to do."""


def _substitute_text(text: str, path: str, env: Mapping[str, str], problems: list[Problem]) -> str:
    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if name.startswith(SECRET_BLOCK_PREFIX):
            value = _secret_block_value(name.removeprefix(SECRET_BLOCK_PREFIX), path, problems)
            return match.group(0) if value is None else value
        if not _VARIABLE_NAME.fullmatch(name):
            problem = (
                f"'${{{name}}}' is not a valid variable reference; write ${{NAME}} (letters, "
                "digits, _) or $${...} for a literal ${...}"
            )
        elif name not in env:
            problem = (
                f"environment variable {name} (referenced as ${{{name}}}) is not set; set {name} "
                "or change the value"
            )
        else:
            return env[name]
        problems.append((path, problem))
        return match.group(0)

    return _REFERENCE.sub(expand, text)


def _secret_block_value(block: str, path: str, problems: list[Problem]) -> str | None:
    """The text of the Prefect Secret block ``block`` for the secret key ``path``.

    Note: registered for redaction; None (and a problem) when it cannot be used.
    """
    reference = f"${{{SECRET_BLOCK_PREFIX}{block}}}"
    if path not in secret_key_paths():
        problem = (
            f"is not a secret key, so it cannot name a Prefect Secret block ({reference}); only "
            "passwords, client secrets, API keys and S3 keys can: write the value itself or use "
            "${VAR}"
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
    import httpx
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:  # Prefect would start a temporary server of its own: slow, and not the jobs' server
        raise _UnusableBlock(
            "PREFECT_API_URL is not set, so no Prefect server is known to read the Secret block "
            f"{block} from; set it to the API address of the server holding the block (uv run "
            "python -m flows.run server start prints the local server's)"
        )
    try:
        # Prefect's async_dispatch wrapper takes _sync (and then gives the block, never a
        # coroutine), but its typed signature is the sync function's, without _sync, returning
        # "block or coroutine".
        value = Secret.load(block, _sync=True).get()  # type: ignore[call-arg, union-attr]
    except ValueError:
        raise _UnusableBlock(
            f"the Prefect API {shown_url(api)} has no Secret block named {block}; create it (the "
            "UI's Blocks page, or Secret(value=...).save(name) in Python) or correct the name"
        ) from None
    except httpx.HTTPError as error:
        raise _UnusableBlock(
            f"the Prefect API {shown_url(api)} did not answer the request for the Secret block "
            f"{block} ({type(error).__name__}); start that server or set PREFECT_API_URL to the "
            "one holding the block"
        ) from None
    if not isinstance(value, str):
        raise _UnusableBlock(
            f"the Secret block {block} holds a {type(value).__name__}, not a text; store the "
            "secret as a single value"
        )
    return value


def substitute_variables(
    node: Any, env: Mapping[str, str], problems: list[Problem], path: str = ""
) -> Any:
    """``node`` with ``${...}`` expanded, without its keys written with no value.

    Note: ``auth:`` with every line commented out is the same as the key absent.
    """
    if isinstance(node, dict):
        return {
            key: substitute_variables(value, env, problems, join_key_path(path, str(key)))
            for key, value in node.items()
            if value is not None
        }
    if isinstance(node, list):
        return [
            substitute_variables(item, env, problems, f"{path}[{index}]")
            for index, item in enumerate(node)
        ]
    if isinstance(node, str):
        return _substitute_text(node, path, env, problems)
    return node


def names_secret_blocks(config_path: str | None) -> bool:
    """Whether the file takes a value from a Prefect Secret block.

    Why: the command must then know the jobs' Prefect server before it loads the settings.
    """
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
