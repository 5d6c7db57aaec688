"""The user's package index and CA bundle, read the way pip reads them.

envbuilder never names an index host itself: the default index comes from
``PIP_INDEX_URL``, else ``index-url`` in pip's configuration files, else
pip's own built-in default (taken from pip at run time).
"""

from __future__ import annotations

import configparser
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs

from envbuilder.credentials import Credentials, redact_text, split_credentials
from envbuilder.errors import ConfigError, InputError

__all__ = [
    "ca_bundle",
    "default_index_url",
    "extra_index_urls",
    "find_links",
    "index_credentials",
    "pip_config_files",
    "pip_config_value",
]

logger = logging.getLogger(__name__)

#: Sections pip consults for ``pip install``; a later one overrides an earlier one.
_SECTIONS = ("global", "install")
_CONFIG_NAME = "pip.conf" if sys.platform != "win32" else "pip.ini"


def pip_config_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """pip's configuration files in load order; a later file overrides an earlier one.

    Global (site-wide), then user, then the interpreter's own (site), then
    ``PIP_CONFIG_FILE``. As in pip, an existing ``PIP_CONFIG_FILE`` skips the
    user files, and ``PIP_CONFIG_FILE=os.devnull`` reads nothing from it.
    """
    env = os.environ if environ is None else environ
    env_file = env.get("PIP_CONFIG_FILE")
    files: list[Path] = []
    if sys.platform == "win32":
        files.append(Path(platformdirs.site_config_dir("pip", appauthor=False)) / _CONFIG_NAME)
    else:
        xdg_dirs = env.get("XDG_CONFIG_DIRS") or "/etc/xdg"
        files += [Path(d) / "pip" / _CONFIG_NAME for d in xdg_dirs.split(os.pathsep) if d]
        files.append(Path("/etc") / _CONFIG_NAME)
    if not (env_file and Path(env_file).exists()):
        home = Path(env.get("HOME") or Path.home())
        if sys.platform != "win32":
            files.append(home / ".pip" / _CONFIG_NAME)  # pip's legacy user file
            xdg_home = env.get("XDG_CONFIG_HOME") or str(home / ".config")
            files.append(Path(xdg_home) / "pip" / _CONFIG_NAME)
        else:
            user_dir = platformdirs.user_config_dir("pip", appauthor=False, roaming=True)
            files.append(Path(user_dir) / _CONFIG_NAME)
    files.append(Path(sys.prefix) / _CONFIG_NAME)
    if env_file and env_file != os.devnull:
        files.append(Path(env_file))
    return files


def pip_config_value(
    key: str,
    *,
    environ: Mapping[str, str] | None = None,
    config_files: Sequence[Path] | None = None,
) -> str | None:
    """The value pip would use for ``key`` (e.g. ``index-url``): ``PIP_<KEY>`` then the files."""
    env = os.environ if environ is None else environ
    from_env = env.get("PIP_" + key.upper().replace("-", "_"))
    if from_env:
        return from_env
    files = pip_config_files(env) if config_files is None else config_files
    value: str | None = None
    for path in files:
        parser = _read_config(path)
        if parser is None:
            continue
        for section in _SECTIONS:
            if not parser.has_section(section):
                continue
            for name, raw in parser.items(section, raw=True):
                if name.replace("_", "-") == key:
                    value = raw.strip()
                    logger.debug(
                        "pip config %s: %s = %s (section %s)",
                        path,
                        key,
                        redact_text(value),
                        section,
                    )
    return value or None


def _read_config(path: Path) -> configparser.RawConfigParser | None:
    parser = configparser.RawConfigParser()
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:
        raise InputError(f"cannot read pip configuration file {str(path)!r}: {e}") from e
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as e:
        raise ConfigError(str(path), [f"not a valid pip configuration file: {e}"]) from e
    return parser


def _pip_builtin_index() -> str:
    try:
        from pip._internal.models.index import PyPI
    except ImportError as e:  # pragma: no cover - pip is in every environment we run in
        raise InputError(
            "no package index configured and pip is not importable to supply its default; "
            "set PIP_INDEX_URL or index-url in pip.conf"
        ) from e
    url: str = PyPI.simple_url
    return url


def default_index_url(
    environ: Mapping[str, str] | None = None, config_files: Sequence[Path] | None = None
) -> str:
    """The Simple API base pip would install from: env, then pip.conf, then pip's default.

    Without its user name and password: those are `index_credentials`."""
    configured = pip_config_value("index-url", environ=environ, config_files=config_files)
    if configured:
        return _configured_url(configured.strip(), "index-url")[0]
    return _pip_builtin_index()


def extra_index_urls(
    environ: Mapping[str, str] | None = None, config_files: Sequence[Path] | None = None
) -> list[str]:
    """pip's ``extra-index-url`` list (whitespace-separated, as pip splits it), without
    user names and passwords."""
    value = pip_config_value("extra-index-url", environ=environ, config_files=config_files)
    return [_configured_url(url, "extra-index-url")[0] for url in value.split()] if value else []


def find_links(
    environ: Mapping[str, str] | None = None, config_files: Sequence[Path] | None = None
) -> list[str]:
    """pip's ``find-links`` locations: directories, ``file://`` URLs or flat HTML pages."""
    value = pip_config_value("find-links", environ=environ, config_files=config_files)
    return [split_credentials(url)[0] for url in value.split()] if value else []


def index_credentials(
    environ: Mapping[str, str] | None = None, config_files: Sequence[Path] | None = None
) -> Credentials:
    """The user names and passwords in pip's ``index-url``, ``extra-index-url`` and
    ``find-links``, by host; the URLs the other functions return carry none."""
    found = Credentials()
    for key in ("index-url", "extra-index-url", "find-links"):
        value = pip_config_value(key, environ=environ, config_files=config_files)
        # index-url is one URL (pip splits only the list options): "not a url" is refused
        # whole, as `index_url` refuses it
        urls = [value.strip()] if key == "index-url" and value else (value or "").split()
        for url in urls:
            found = found.merged(_configured_url(url, key)[1])
    return found


#: The schemes an index URL can have (``find-links`` also takes a directory's path).
_INDEX_SCHEMES = ("http", "https", "file")


def _configured_url(url: str, key: str) -> tuple[str, Credentials]:
    """`split_credentials` of a URL pip's configuration gives; one that cannot be split
    (``http://[::1/simple``, a port that is no number), or an index URL that is not an
    http(s) URL with a host or a ``file:`` URL (``not a url``, ``htps://…``), is bad input
    naming it and the setting, its password hidden: read as a directory of wheels, it
    would make every combination unsatisfiable."""
    try:
        clean, found = split_credentials(url)
        parts = urlsplit(clean)
        parts.port  # noqa: B018 - parsing the port is what raises for "host:abc"
        scheme = parts.scheme.lower()
        if key != "find-links":
            if scheme not in _INDEX_SCHEMES or any(c.isspace() for c in clean):
                raise ValueError("not an http, https or file URL")
            if scheme != "file" and not parts.hostname:
                raise ValueError("no host")
    except ValueError as e:
        raise InputError(
            f"malformed {key} {redact_text(url)!r} ({e}): correct PIP_{key.upper().replace('-', '_')} "
            f"or {key} in pip.conf"
        ) from e
    return clean, found


def ca_bundle(
    environ: Mapping[str, str] | None = None, config_files: Sequence[Path] | None = None
) -> str | None:
    """The CA bundle to verify TLS with: pip's ``cert``, then requests' and OpenSSL's variables."""
    env = os.environ if environ is None else environ
    cert = pip_config_value("cert", environ=env, config_files=config_files)
    if cert:
        return cert
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if env.get(name):
            return env[name]
    return None
