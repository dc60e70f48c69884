"""The secret registry and ``redact``; imports nothing of dupflow's.

Every text that leaves dupflow (error, log line, job file, artifact) passes ``redact``, as a
service may quote the request back: registered secrets in each form they may come back in,
``Authorization`` values, ``Basic``/``Bearer`` tokens, URLs' user info and secret parameters.
"""

import contextlib
import json
import logging
import re
import threading
from base64 import b64encode, urlsafe_b64encode
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

REDACTED = "***"
MIN_SECRET_CHARS = 4
"""Shorter values are not registered: replacing every "ab" would garble text, hiding nothing."""

_AUTHORIZATION_VALUE = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)[^\"'\r\n,;}]+"
)
_SCHEME_TOKEN = re.compile(r"(?i)\b(basic|bearer)(\s+)([A-Za-z0-9._~+/-]{8,}=*)")
_URL_USERINFO = re.compile(r"(://)[^/?#@\s:]*(?::[^/@\s]*)?@")  # user:password@, or user@
_LOWER_ESCAPES = re.compile(r"%[0-9A-F]{2}")

_secrets: set[str] = set()
_secrets_pattern: re.Pattern[str] | None = None
_secrets_lock = threading.Lock()


def register_secret(value: str) -> None:
    """Redact ``value`` from each text ``redact`` sees, in all its ``secret_forms``."""
    global _secrets_pattern
    if len(value) < MIN_SECRET_CHARS:
        return
    forms = secret_forms(value)
    with _secrets_lock:
        if forms <= _secrets:
            return
        _secrets.update(forms)
        # longest first: a secret inside a longer one must not split it
        ordered = sorted(_secrets, key=len, reverse=True)
        _secrets_pattern = re.compile("|".join(re.escape(secret) for secret in ordered))


def secret_forms(value: str) -> set[str]:
    """Every form in which a service may quote ``value`` back.

    Note: as it is, or its UTF-8 read as Latin-1 or Windows-1252 (``Ã¤`` for ``ä``), each
    URL-encoded (either escape case) and JSON-escaped; and its Base64 (standard and URL-safe,
    unpadded: it matches with or without padding).
    """
    data = value.encode()
    texts = {value, data.decode("latin-1")}
    with contextlib.suppress(UnicodeDecodeError):  # a byte that Windows-1252 leaves undefined
        texts.add(data.decode("cp1252"))
    forms = {b64encode(data).decode().rstrip("="), urlsafe_b64encode(data).decode().rstrip("=")}
    for text in texts:
        encoded = quote(text, safe="")
        forms |= {
            text,
            quote_plus(text),
            encoded,
            _LOWER_ESCAPES.sub(lambda m: m[0].lower(), encoded),
        }
        forms |= {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}
    return forms


# The words of a parameter name that say secret (``is_secret_query_name``): alone, and as the
# start or end of words run together (``accesstoken``, ``sessionid``; ``key`` only after a word
# that makes it a credential, as in ``privatekey``: ``monkey`` and ``sortkey`` are none).
_SECRET_WORDS = frozenset(
    {"token", "key", "secret", "password", "passwd", "passwort", "kennwort", "pwd", "pass"}
    | {"bearer", "passphrase", "passcode", "signature", "sig", "session", "sessid", "cred"}
    | {"credential", "auth", "authorization", "apikey", "jwt", "otp"}
)
_SECRET_WORD_STARTS = ("token", "secret", "passw", "bearer", "signature", "credential", "session")
_KEY_KINDS = ("access", "api", "auth", "client", "private", "secret", "session", "shared")
_SECRET_WORD_ENDS = (
    *("token", "secret", "passwd", "password", "passwort", "pwd", "bearer", "signature"),
    *("credential", "sessionid", "sessid", "signingkey", "subscriptionkey"),
    *(kind + "key" for kind in _KEY_KINDS),
)
_SIGNED_URL_PREFIXES = ("x-amz-", "x-goog-")
_PAGE_CURSOR = re.compile(r"(?i)page[\W_]*tokens?$")
_NAME_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def is_secret_query_name(name: str) -> bool:
    """Whether a URL parameter of this name (as written or encoded) carries a secret.

    Note:
    - The one rule of the refusal of such a URL (``url_credentials``) and of the redaction.
    - The name is cut into words at every other character and at camelCase
      (``X-Amz-Signature``, ``clientSecret``, ``APIKey``, ``api_key``), lower-cased, a plural
      ``s`` dropped. It says secret when a word is one of ``_SECRET_WORDS`` (token, key, secret,
      password, bearer, signature, sig, session, credential, auth, …), starts or ends with one
      (``accesstoken``, ``PHPSESSID``, ``privatekey``), or the name is a signed URL's
      (``X-Amz-…``, ``X-Goog-…``).
    - Harmless: FHIR's search parameters (``code``, ``_sort``, ``_count``, ``_lastUpdated``),
      words that only hold one (``keyword``, ``author``, ``monkey``), and a page cursor
      (``page_token``, ``pageToken``; Google's FHIR API): it names a page and opens nothing.
    """
    decoded = _PAGE_CURSOR.sub("", unquote_plus(name).strip())
    if decoded.lower().startswith(_SIGNED_URL_PREFIXES):
        return True
    return any(_is_secret_word(word.lower()) for word in _NAME_WORD.findall(decoded))


def _is_secret_word(word: str) -> bool:
    singular = word[:-1] if word.endswith("s") and len(word) > 3 else word
    ends = singular.endswith(_SECRET_WORD_ENDS)
    return singular in _SECRET_WORDS or ends or word.startswith(_SECRET_WORD_STARTS)


URL_PARAMETER = re.compile(r"(?<=[?&;#])([^=&;#?\s\"'<>][^=&;#?\"'<>\r\n]*)=([^&;#\s\"'<>]*)")
"""A parameter of a URL's query, fragment (``#access_token=``) or path (``;jsessionid=``): its
name and value, which ends where a URL quoted in a text ends (a space or a quote)."""


def hide_secret_parameters(text: str, mark: str = REDACTED) -> str:
    """``text`` with ``mark`` for the value of each URL parameter whose name says so."""

    def hidden(found: re.Match[str]) -> str:
        name, value = found.groups()
        return f"{name}={mark}" if value and is_secret_query_name(name) else found[0]

    return URL_PARAMETER.sub(hidden, text)


def basic_token(login: str) -> str:
    """``user:password`` in Base64 of its UTF-8, as httpx sends Basic auth."""
    return b64encode(login.encode()).decode()


def _looks_like_token(word: str) -> bool:
    """A credential rather than prose ("Basic Auth"): digits, symbols or mixed case."""
    return any(c.isdigit() or c in "+/=._~-" for c in word) or (any(c.isupper() for c in word[1:]))


def redact(text: str) -> str:
    """``text`` without any secret this module knows of.

    Note: a registered secret, an Authorization value, a Basic/Bearer token, a URL's user info,
    the value of a URL parameter whose name says secret.
    """
    if not text:
        return text
    if pattern := _secrets_pattern:
        text = pattern.sub(REDACTED, text)
    text = _AUTHORIZATION_VALUE.sub(rf"\g<1>{REDACTED}", text)
    text = _SCHEME_TOKEN.sub(
        lambda m: m[1] + m[2] + (REDACTED if _looks_like_token(m[3]) else m[3]),
        text,
    )
    return hide_secret_parameters(_URL_USERINFO.sub(rf"\g<1>{REDACTED}@", text))


def redact_strings(value: Any) -> Any:  # JSON; Any: its callers index the answer freely
    """A parsed JSON document with ``redact`` applied to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_strings(item) for item in value]
    return value


def redact_record(record: logging.LogRecord) -> bool:
    """Pass a record through ``redact``, its traceback too: a logging filter.

    Note: the formatted traceback is kept on the record, where each handler's formatter takes it.
    """
    message = record.getMessage()
    if (redacted := redact(message)) != message:
        record.msg, record.args = redacted, None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return True


PREFECT_API_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect.extra", "prefect.workers")
"""The loggers whose handlers (Prefect's ``api``, ``worker_api``) send records to its API."""


def redact_records_sent_to_prefect() -> None:
    """Redact the records this process sends to Prefect's API, Prefect's own too.

    Note:
    - Idempotent.
    - For every process that runs a flow or task: a failed task's traceback has chained causes
      that no handler rewrites.
    - Here, as ``flows.run_logging`` must not import Prefect before the command line has
      configured it.
    """
    for handler in (h for name in PREFECT_API_LOGGERS for h in logging.getLogger(name).handlers):
        handler.addFilter(redact_record)


for _logger_name in ("dupflow.clients", "httpx"):
    logging.getLogger(_logger_name).addFilter(redact_record)
