"""What the configuration's blocks share: model, field types, problems, warnings.

The field types coerce text (environment, flags, ``${VAR}``); a block reports its problems at
their key paths and its warnings through the validation context (docs/development.md,
Configuration).
"""

import logging
import unicodedata
from datetime import timedelta
from typing import Annotated

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    SecretStr,
    ValidationError,
    ValidationInfo,
)

from config.yaml_bounds import yaml_shape_problem
from tasks.core.names import CONTROL, invisible_character
from tasks.core.url_credentials import (
    CredentialsInUrlError,
    refuse_credentials_in_url,
    shown_url,
    split_url,
)

CONFIG_LOGGER = "dupflow.config"  # the configuration's warnings
logger = logging.getLogger(CONFIG_LOGGER)

ENV_PREFIX = "APP_"

# (key path relative to the model being validated, what is wrong and how to fix it)
Problem = tuple[str, str]
Loc = tuple[int | str, ...]  # a pydantic error's location


def env_var_name(key_path: str) -> str:
    """The APP_* environment variable that overrides a dotted key path."""
    return ENV_PREFIX + key_path.upper().replace(".", "_")


def join_key_path(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def loc_path(loc: Loc) -> str:
    """A pydantic error's location as a key path: ``a.b[0].c``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def raise_problems(problems: list[Problem]) -> None:
    """Every problem of one model as a pydantic error at its key path."""
    if problems:
        raise ValidationError.from_exception_data(
            "config",
            [
                {
                    "type": "value_error",
                    "loc": tuple(path.split(".")) if path else (),
                    "input": None,
                    "ctx": {"error": message},
                }
                for path, message in problems
            ],
        )


def emit_warning(info: ValidationInfo, message: str) -> None:
    """Log a configuration warning and hand it to the loader by the validation context."""
    logger.warning(message)
    if isinstance(info.context, dict):  # only the loader's: {"warnings": the list it returns}
        info.context["warnings"].append(message)


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _blank_to_none(value: object) -> object:
    """An empty or blank string means "not set" (APP_X=, or ${VAR} of an empty VAR)."""
    return None if isinstance(value, str) and not value.strip() else value


def list_from_text(value: object) -> object:
    """Accept lists written as text: ``a,b`` or a JSON/YAML flow list ``[a, b]``."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:  # in the configuration file's bounds: the text may come from a deployment's form
            if found := yaml_shape_problem(text):
                raise ValueError(found[0])
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise ValueError("is not a valid flow list; write a,b or [a, b]") from None
    return [item.strip() for item in text.split(",") if item.strip()]


def _control_code(text: str) -> str | None:
    """The code (``000A``) of the first control character in ``text``, or None."""
    return next((f"{ord(char):04X}" for char in text if unicodedata.category(char) == "Cc"), None)


def refuse_control_characters(path: str | None) -> str | None:
    """A path with a control character (NUL, newline), refused naming its key.

    Why: it would fail only the step that opens it.
    """
    if code := _control_code(path or ""):
        raise ValueError(
            f"contains the control character U+{code}, which no path should have; remove it from "
            "the path"
        )
    return path


def refuse_userinfo(url: str | None) -> str | None:
    """A URL must not carry a user name or password (``tasks.core.url_credentials``)."""
    try:
        refuse_credentials_in_url(
            url,
            door="",
            fix="remove them from the URL and put the credentials in the service's auth block "
            "(username, password, set with ${VAR} or an APP_* variable)",
        )
    except CredentialsInUrlError as exc:
        raise ValueError(str(exc)) from None
    return url


def refuse_invisible_url_characters(url: str | None) -> str | None:
    """A URL with a character not shown as itself (Unicode Cc, Cf, Zl, Zp), refused.

    Why: the URL checks read URLs as browsers do, skipping tabs and line ends (a CR from an env
    file), which httpx then refused naming no key; a bidi override or line separator passed them
    all and ``config check`` printed another address or a forged line.

    Note: named by its code, never showing the URL (it may hold a token).
    """
    if not (found := invisible_character(url or "")):
        return url
    kind, code = found
    hint = (
        " (a line end or tab, e.g. from an env file with Windows line ends)"
        if kind == CONTROL
        else ""
    )
    raise ValueError(
        f"contains the {kind} {code}{hint}, which no URL may have: it would not show as what it "
        "is; remove it where the value is set"
    )


def refuse_non_http_url(url: str | None) -> str | None:
    """``http(s)://host[:port][/path]``, or refused.

    Why: a scheme left out (``localhost:8080``) or another one would fail only the step that
    first calls the service, naming no key.
    """
    if url is None:
        return None
    parts = split_url(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or not port_ok:
        shown = shown_url(url) if "://" in url else repr(url.split("?")[0].split("#")[0])
        raise ValueError(
            f"{shown} is not an http(s) URL with a host; write it as https://host[:port][/path]"
        )
    return url


def positive(note: str) -> AfterValidator:
    """A duration longer than zero; ``note`` ends the message (e.g. "default PT30S")."""

    def check(value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"must be longer than zero; set e.g. PT30S or 30s ({note})")
        return value

    return AfterValidator(check)


def zero_means(default: int | timedelta) -> AfterValidator:
    return AfterValidator(lambda value: value if value > type(default)() else default)


OptionalStr = Annotated[str | None, BeforeValidator(_blank_to_none)]
OptionalPath = Annotated[OptionalStr, AfterValidator(refuse_control_characters)]
MAX_SECRET_BYTES = 64 * 1024


def refuse_unsendable_secret(secret: SecretStr | None) -> SecretStr | None:
    """A secret that can travel in an HTTP header and into the redaction's registry.

    Why: httpx quotes a header value with a control character (a pasted line break) in its
    error, and a secret of megabytes makes every redaction crawl.
    """
    text = secret.get_secret_value() if secret is not None else ""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SECRET_BYTES:
        raise ValueError(
            "is longer than 64 KB, more than any password, key or token; check what sets it",
        )
    if code := _control_code(text):
        raise ValueError(
            f"contains the control character U+{code} (a pasted line break?), which no HTTP "
            "header may carry; remove it where the value is set"
        )
    return secret


OptionalSecret = Annotated[
    SecretStr | None, BeforeValidator(_blank_to_none), AfterValidator(refuse_unsendable_secret)
]


def refuse_non_ascii_header_secret(secret: SecretStr | None) -> SecretStr | None:
    """A secret sent as it is in a header (an API key, an S3 access key id): ASCII.

    Why: httpx sends it as UTF-8, servers read ASCII or Latin-1, so it would not match. A Basic
    password may be non-ASCII: its header carries Base64.
    """
    if secret is not None and not secret.get_secret_value().isascii():
        raise ValueError(
            "is not ASCII, and it is sent as an HTTP header value, which servers read as ASCII or "
            "Latin-1, so it would not match the key the service issued; give the key exactly as "
            "issued (ASCII) and check the encoding of what sets it (the file, variable or Secret "
            "block)",
        )
    return secret


HeaderSecret = Annotated[OptionalSecret, AfterValidator(refuse_non_ascii_header_secret)]
OptionalUrl = Annotated[
    OptionalStr,
    AfterValidator(refuse_invisible_url_characters),
    AfterValidator(refuse_userinfo),
    AfterValidator(refuse_non_http_url),
]
StrList = Annotated[list[str], BeforeValidator(list_from_text)]
