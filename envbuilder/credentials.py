"""Credentials in index URLs: taken out where a URL enters, never written anywhere.

A URL like ``https://user:token@host/simple`` (from ``PIP_INDEX_URL``, pip's
configuration, a matrix's ``${VAR}``-expanded index) is split where it is
read: the rest of the program sees and stores ``https://host/simple``, and
the user name and password travel beside it in `Credentials`, which the
HTTP client and uv (through a private netrc file) authenticate with.
Messages and logs show a URL as ``user:***@host`` (`redact`, `redact_text`).
Credentials a netrc file or a keyring supply never enter a URL at all.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

__all__ = [
    "Credentials",
    "RedactingFilter",
    "redact",
    "redact_text",
    "split_credentials",
]

#: ``scheme://user[:password]@`` anywhere in a text; the user part is kept, the rest starred.
_USERINFO = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^\s/@:'\"]*)(?P<password>:[^\s/@'\"]*)?@"
)


@dataclass(frozen=True)
class Credentials:
    """User name and password per host (``host`` or ``host:port``); its repr shows no password."""

    by_host: Mapping[str, tuple[str, str]] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"Credentials(hosts={sorted(self.by_host)!r})"

    def __bool__(self) -> bool:
        return bool(self.by_host)

    def __iter__(self) -> Iterator[tuple[str, tuple[str, str]]]:
        return iter(sorted(self.by_host.items()))

    def merged(self, other: Credentials) -> Credentials:
        """Both; ``other`` wins for a host both name."""
        return Credentials({**self.by_host, **other.by_host})

    def for_url(self, url: str) -> tuple[str, str] | None:
        """The (user, password) for ``url``'s host and port, if any."""
        parts = urlsplit(url)
        if parts.hostname is None:
            return None
        return self.by_host.get(_host_key(parts))

    def show(self, url: str) -> str:
        """``url`` as messages and logs show it: ``user:***@`` before a host that has credentials."""
        found = self.for_url(url)
        if found is None or "@" in urlsplit(url).netloc:
            return redact(url)
        parts = urlsplit(url)
        return urlunsplit(parts._replace(netloc=f"{found[0]}:***@{parts.netloc}"))

    def netrc_text(self) -> str:
        """The credentials as a netrc file (for uv, which reads the file ``NETRC`` names)."""
        lines = []
        for key, (user, password) in self:
            host = key.rsplit(":", 1)[0] if key.count(":") == 1 else key
            lines.append(f"machine {host} login {user} password {password}\n")
        return "".join(lines)


def _host_key(parts: SplitResult) -> str:
    host = parts.hostname or ""
    return f"{host}:{parts.port}" if parts.port else host


def split_credentials(url: str) -> tuple[str, Credentials]:
    """``url`` without its user name and password, and those as `Credentials`."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, Credentials()
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urlunsplit(parts._replace(netloc=hostport))
    if not user and not password:
        return clean, Credentials()
    return clean, Credentials({_host_key(parts): (unquote(user), unquote(password))})


def redact(url: str) -> str:
    """``url`` as messages show it: ``scheme://user:***@host/...`` (or unchanged without userinfo)."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL's password in ``text`` replaced by ``***``; the user name is kept only
    beside a password (a user name alone is often a token: ``https://TOKEN@host``)."""

    def starred(m: re.Match[str]) -> str:
        if m.group("password") is None:
            return f"{m.group('head')}***@"
        return f"{m.group('head')}{m.group('user')}:***@"

    return _USERINFO.sub(starred, text)


class RedactingFilter(logging.Filter):
    """A logging filter that formats the record and redacts every URL's password in it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
