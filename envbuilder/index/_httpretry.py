"""When a failed request to an index is asked again, and how long it may take.

A status in `RETRY_STATUSES` is asked again after the server's ``Retry-After``
(`retry_after`) or else an exponential backoff (`backoff`); one read waits at
most `DEFAULT_TIMEOUT` seconds and one URL takes at most `DEFAULT_URL_BUDGET`
seconds in all, retries included. Which exceptions may pass on retry is
`envbuilder.index._httpfailures`'s to say.
"""

from __future__ import annotations

import email.utils
import time

import requests

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_URL_BUDGET", "RETRY_STATUSES", "backoff", "retry_after"]

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Seconds one read may wait, and one URL may take in all, retries included.
DEFAULT_TIMEOUT = 30.0
DEFAULT_URL_BUDGET = 90.0


def backoff(factor: float, attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt, when the server does not say."""
    return factor * 2.0 ** (attempts - 1)


def retry_after(resp: requests.Response) -> float | None:
    """Seconds the server asks to wait (Retry-After: seconds or an HTTP date), if it asks."""
    value = resp.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
