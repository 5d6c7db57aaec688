"""The settings of one run, read once from the environment by `cli.main`.

Every ``ENVBUILDER_*`` variable is read here and nowhere else; commands get
the frozen `Settings` as ``args.settings`` and pass what they need down as
arguments. Command-line options win over these (``--cache-dir`` over
``ENVBUILDER_CACHE_DIR``, ``--lock`` over ``ENVBUILDER_LOCK``).

| variable                      | setting           | default                         |
|-------------------------------|-------------------|---------------------------------|
| ``ENVBUILDER_DEBUG``          | ``debug``         | off (``--debug`` turns it on)   |
| ``ENVBUILDER_CACHE_DIR``      | ``cache_dir``     | the user cache directory        |
| ``ENVBUILDER_WHEEL_CACHE``    | ``wheel_cache``   | ``wheels`` in ``cache_dir``     |
| ``ENVBUILDER_LOCK``           | ``lockfile``      | ``./compat.lock.json`` (lockfile/) |
| ``ENVBUILDER_LOCK_URL``       | ``lock_url``      | none: the wheel's snapshot      |
| ``ENVBUILDER_SOURCE_REVISION``| ``revision``      | ``GITHUB_SHA``, else git asks   |
| ``ENVBUILDER_VERIFY``         | ``verify``        | none: ``install`` verifies only with ``--verify`` |

The package index and the CA bundle come from pip's configuration
(``envbuilder.index.pipconfig``), read on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envbuilder.credentials import Credentials
    from envbuilder.index.http import HttpClient

__all__ = ["Settings"]


def _user_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("envbuilder", appauthor=False))


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the environment configures for a run."""

    debug: bool = False
    cache_dir: Path = field(default_factory=_user_cache)
    wheel_cache: Path = field(default_factory=lambda: _user_cache() / "wheels")
    lockfile: Path | None = None
    lock_url: str | None = None  # a published lockfile, downloaded at most once a day
    revision: str | None = None
    verify: str | None = None  # OWNER/NAME whose workflow must have attested the lockfile
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], *, debug: bool = False) -> Settings:
        cache = environ.get("ENVBUILDER_CACHE_DIR")
        wheels = environ.get("ENVBUILDER_WHEEL_CACHE")
        cache_dir = Path(cache) if cache else _user_cache()
        return cls(
            debug=debug or environ.get("ENVBUILDER_DEBUG", "") not in ("", "0"),
            cache_dir=cache_dir,
            wheel_cache=Path(wheels) if wheels else cache_dir / "wheels",
            lockfile=Path(environ["ENVBUILDER_LOCK"]) if environ.get("ENVBUILDER_LOCK") else None,
            lock_url=environ.get("ENVBUILDER_LOCK_URL") or None,
            revision=environ.get("ENVBUILDER_SOURCE_REVISION") or environ.get("GITHUB_SHA") or None,
            verify=environ.get("ENVBUILDER_VERIFY") or None,
            environ=dict(environ),
        )

    @cached_property
    def index_url(self) -> str:
        """The default package index: pip's ``index-url`` setting, else pip's own default."""
        from envbuilder.index.pipconfig import default_index_url

        return default_index_url(self.environ)

    @cached_property
    def credentials(self) -> Credentials:
        """User names and passwords from pip's index URLs, which `index_url` carries none of."""
        from envbuilder.index.pipconfig import index_credentials

        return index_credentials(self.environ)

    @cached_property
    def ca_bundle(self) -> str | None:
        """The CA bundle to verify TLS with, as pip would find it."""
        from envbuilder.index.pipconfig import ca_bundle

        return ca_bundle(self.environ)

    def http_client(self, **options: Any) -> HttpClient:
        """An HTTP client that verifies TLS with `ca_bundle` and authenticates with
        `credentials` (plus any given); other ``options`` go to `HttpClient`."""
        from envbuilder.index.http import HttpClient

        return HttpClient(**self.http_client_options(**options))

    def http_client_options(self, **options: Any) -> dict[str, Any]:
        """`http_client`'s arguments to `HttpClient`, for a client made in another process."""
        extra = options.pop("credentials", None)
        credentials = self.credentials.merged(extra) if extra else self.credentials
        return {"ca_bundle": self.ca_bundle, "credentials": credentials, **options}
