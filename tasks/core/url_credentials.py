"""The one rule for every URL that enters dupflow: no user name or password in it.

Nor, in a URL the job keeps whole (its input, a status URL), a secret parameter (``?token=…``).
Why: such URLs are stored with the job and shown in logs, and httpx sends a followed URL's
user info to its host as Basic auth. Standard library only (docs/development.md, Secrets).
"""

import re
from urllib.parse import SplitResult, parse_qsl, quote, unquote_plus, urlsplit

from tasks.core.errors import DupflowError
from tasks.core.names import show_text
from tasks.core.redaction import URL_PARAMETER, is_secret_query_name

SERVER_URL_FIX = (
    "the server sent it; fix the server's configuration (its public base URL) so that its URLs "
    "carry no credentials, and put the credentials in services.extractor.auth"
)


class CredentialsInUrlError(DupflowError):
    """A URL with a user name or password; the message never contains them."""


# a scheme and its slashes, however many were typed
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)(:/*)")

# Kept as they are in a path: escapes stay escaped, so a decoded %0A never breaks a line.
_PATH_SAFE = "/%:@!$&'()*+,=-._~"


def shown_url(url: str) -> str:
    """The one way a URL is shown: scheme://host[:port]/path, the path encoded as sent.

    Why: its user info, path parameters (``;jsessionid=…``), query or fragment may carry secrets.
    """
    parts = split_url(url)
    host = parts.netloc.rpartition("@")[2]
    path = quote(parts.path.split(";", 1)[0], safe=_PATH_SAFE)
    return f"{parts.scheme}://{host}{path}" if parts.scheme else f"{host}{path}"


def has_user_info(url: str) -> bool:
    """Whether ``url`` may carry a user name or password (see ``_without_user_info``)."""
    return _without_user_info(url.strip()) != url.strip()


def _without_user_info(text: str) -> str:
    """``text`` without what may be user info: up to the network location's last ``@``.

    Note:
    - The location ends at the first ``/``, ``?`` or ``#``, as in ``urlsplit``; it starts after
      ``//`` with or without a scheme, and after any number of slashes (``http:/u:p@host``).
    - A password with one of those three in it ends the location early (``http://u:a/b@h``),
      so a later ``@`` counts too when ``?`` or ``#`` follows the location or its port is no
      number; an ``@`` in a path after a host (``https://h/exports/@latest/``) does not.
    """
    if typed := _SCHEME.match(text):
        scheme, separator, rest = typed[1], typed[2], text[typed.end() :]
    else:
        scheme, separator, rest = ("", "//", text[2:]) if text.startswith("//") else ("", "", text)
    end = _location_end(rest)
    at = rest.rfind("@", 0, end)
    if (
        at < 0
        and "@" in rest[end:]
        and (rest[end : end + 1] in ("?", "#") or not _port_is_a_number(rest[:end]))
    ):
        at = rest.rfind("@")
    return text if at < 0 else f"{scheme}{separator}{rest[at + 1 :]}"


def _location_end(rest: str) -> int:
    """Where the network location at the start of ``rest`` ends, as in ``urlsplit``."""
    return min((at for at in map(rest.find, "/?#") if at >= 0), default=len(rest))


def _port_is_a_number(location: str) -> bool:
    """Whether a network location (``host[:port]``) has no port or a numeric one."""
    port = (
        location.rpartition("]")[2].partition(":")[2]
        if location.startswith("[")
        else location.partition(":")[2]
    )
    return port == "" or port.isascii() and port.isdigit()


def split_url(url: str) -> SplitResult:
    """``urlsplit``, which never raises: a location it cannot read is split by hand.

    Why: a ``[`` in a password gave an error quoting the secret.
    """
    text = _without_user_info(url.strip())
    try:
        return urlsplit(text)
    except ValueError:
        scheme, separator, rest = text.partition("://")
        if not separator:
            scheme, rest = "", text.removeprefix("//")
        end = _location_end(rest)
        netloc, rest = rest[:end], rest[end:]
        rest, _, fragment = rest.partition("#")
        path, _, query = rest.partition("?")
        return SplitResult(scheme, netloc, path, query, fragment)


def query_tokens(url: str) -> list[str]:
    """The values of the secret parameters in ``url``'s query, as written and decoded.

    Note: secrets to redact (a service URL may carry ``?access_token=${TOKEN}``).
    """
    query = split_url(url).query
    written_and_decoded = URL_PARAMETER.findall("?" + query) + parse_qsl(query)
    return [value for name, value in written_and_decoded if value and is_secret_query_name(name)]


def refuse_credentials_in_url(
    url: str | None, *, door: str, fix: str = SERVER_URL_FIX, tokens: bool = False
) -> None:
    """Raise ``CredentialsInUrlError`` when ``url`` carries user info.

    Note: with ``tokens`` (a URL the job stores), a secret in its query (or path) too. ``door``
    names where the URL came from (empty where the message names the key already), ``fix`` what to
    do (by default, of a URL the server sent).
    """
    if url is None:
        return
    parts = split_url(url)
    if has_user_info(url):
        carried = "a user name or password (user:password@host; write a literal @ as %40)"
    elif tokens and (found := _secret_names(f"{parts.path}?{parts.query}#{parts.fragment}")):
        carried = f"a secret in its query ({', '.join(show_text(name) for name in found)})"
    else:
        return
    raise CredentialsInUrlError(
        f"{door}{': ' if door else ''}the URL {shown_url(url)} carries {carried}, which would be "
        f"stored with the job, shown in logs and sent to that host; {fix}"
    )


def _secret_names(text: str) -> list[str]:
    """The decoded names of ``text``'s URL parameters that have a value and say secret."""
    found = URL_PARAMETER.findall(text)
    return sorted({unquote_plus(k) for k, value in found if value and is_secret_query_name(k)})
