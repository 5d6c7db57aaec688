"""What went wrong with a request to an index: whether it may pass, and its cause in words.

A connection that fails or times out before a response may pass
(`TRANSIENT_ERRORS`), as may a TLS handshake cut short (`tls_may_pass`); a TLS
version or certificate error never does. A body that breaks off mid-stream (a
reset, fewer bytes than its Content-Length) is `Transient`. The causes are
worded without the exception tuples requests and urllib3 wrap them in.
"""

from __future__ import annotations

import requests
import urllib3

__all__ = [
    "TRANSIENT_ERRORS",
    "Transient",
    "body_cause",
    "cause",
    "status_message",
    "tls_may_pass",
]


class Transient(Exception):
    """A body that broke off mid-stream (reset, shorter than its Content-Length): retried."""


#: failures before a response that may pass: retried
TRANSIENT_ERRORS = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)

#: TLS failures that asking again cannot change: the server speaks no TLS or another
#: version of it, or its certificate does not verify
_TLS_FINAL = (
    "WRONG_VERSION_NUMBER",
    "UNSUPPORTED_PROTOCOL",
    "PROTOCOL_VERSION",
    "VERSION_TOO_LOW",
    "NO_PROTOCOLS_AVAILABLE",
    "CERTIFICATE_VERIFY_FAILED",
    "HOSTNAME MISMATCH",
    "DOESN'T MATCH",
)


def tls_may_pass(error: requests.exceptions.SSLError) -> bool:
    """Whether a TLS failure may pass on retry (a handshake cut short may; a version or
    certificate error never does)."""
    text = str(error).upper()
    return not any(marker in text for marker in _TLS_FINAL)


def cause(e: BaseException) -> str:
    """The innermost reason of a requests or urllib3 error, as text."""
    while isinstance(e.__context__, BaseException) and not str(e):
        e = e.__context__
    reason = getattr(e, "reason", None) or (e.args[0] if e.args else None)
    inner = getattr(reason, "reason", None)
    return str(inner or reason or e)


def body_cause(e: BaseException) -> str:
    """Why a body broke off, without the exception tuples urllib3 wraps it in."""
    inner = e.args[0] if e.args and isinstance(e.args[0], BaseException) else e
    if isinstance(inner, urllib3.exceptions.ProtocolError) and inner.args:
        return str(inner.args[0])
    return cause(e)


def status_message(shown: str, resp: requests.Response) -> str:
    """``GET <url>: HTTP <status> <reason>``, for ``shown`` (the URL without its password)."""
    return f"GET {shown!r}: HTTP {resp.status_code} {resp.reason or ''}".rstrip()
