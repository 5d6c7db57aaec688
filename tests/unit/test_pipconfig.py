"""Which index and CA bundle envbuilder uses, decided the way pip decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.errors import ConfigError
from envbuilder.index.pipconfig import (
    ca_bundle,
    default_index_url,
    extra_index_urls,
    find_links,
    pip_config_files,
)

MIRROR = "https://mirror.example/simple"
OTHER = "https://other.example/simple"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("environ", "files", "expected"),
    [
        ({"PIP_INDEX_URL": MIRROR}, {"a.conf": f"[global]\nindex-url = {OTHER}\n"}, MIRROR),
        ({}, {"a.conf": f"[global]\nindex-url = {MIRROR}\n"}, MIRROR),
        ({}, {"a.conf": f"[global]\nindex_url = {MIRROR}\n"}, MIRROR),
        ({}, {"a.conf": f"[install]\nindex-url = {MIRROR}\n"}, MIRROR),
        # [install] overrides [global] within a file
        (
            {},
            {"a.conf": f"[install]\nindex-url = {MIRROR}\n[global]\nindex-url = {OTHER}\n"},
            MIRROR,
        ),
        # a later file overrides an earlier one
        (
            {},
            {
                "a.conf": f"[global]\nindex-url = {OTHER}\n",
                "b.conf": f"[global]\nindex-url = {MIRROR}\n",
            },
            MIRROR,
        ),
        # other sections and keys are not the index
        (
            {},
            {"a.conf": f"[download]\nindex-url = {OTHER}\n[global]\nextra-index-url = {OTHER}\n"},
            None,
        ),
        ({}, {}, None),
    ],
)
def test_default_index_url(
    tmp_path: Path, environ: dict[str, str], files: dict[str, str], expected: str | None
) -> None:
    paths = [_write(tmp_path, name, text) for name, text in files.items()]
    paths.append(tmp_path / "missing.conf")  # absent files are skipped
    url = default_index_url(environ, paths)
    if expected is not None:
        assert url == expected
    else:
        # pip's built-in default, taken from pip itself at run time
        from pip._internal.models.index import PyPI

        assert url == PyPI.simple_url


def test_pip_config_file_variable_is_read_last(tmp_path: Path) -> None:
    home = tmp_path / "home"
    user = _write(tmp_path, "user.conf", f"[global]\nindex-url = {OTHER}\n")
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(user.read_text())
    env_file = _write(tmp_path, "env.conf", f"[global]\nindex-url = {MIRROR}\n")
    environ = {
        "HOME": str(home),
        "PIP_CONFIG_FILE": str(env_file),
        "XDG_CONFIG_DIRS": str(tmp_path / "xdg"),
    }
    files = pip_config_files(environ)
    assert files[-1] == env_file
    # as in pip, an existing PIP_CONFIG_FILE replaces the user's files
    assert home / ".config" / "pip" / "pip.conf" not in files
    assert default_index_url(environ) == MIRROR


def test_user_file_found_without_pip_config_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nindex-url = {MIRROR}\n")
    environ = {"HOME": str(home), "XDG_CONFIG_DIRS": str(tmp_path / "xdg")}
    assert home / ".config" / "pip" / "pip.conf" in pip_config_files(environ)
    assert default_index_url(environ) == MIRROR


def test_broken_config_file_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.conf", "index-url = no section header\n")
    with pytest.raises(ConfigError, match=r"bad\.conf") as info:
        default_index_url({}, [path])
    assert info.value.return_code == 2


@pytest.mark.parametrize(
    ("environ", "config", "expected"),
    [
        (
            {"PIP_CERT": "/a.pem", "REQUESTS_CA_BUNDLE": "/b.pem"},
            "[global]\ncert = /c.pem\n",
            "/a.pem",
        ),
        ({"REQUESTS_CA_BUNDLE": "/b.pem"}, "[global]\ncert = /c.pem\n", "/c.pem"),
        ({"REQUESTS_CA_BUNDLE": "/b.pem", "SSL_CERT_FILE": "/d.pem"}, "", "/b.pem"),
        ({"SSL_CERT_FILE": "/d.pem"}, "", "/d.pem"),
        ({}, "", None),
    ],
)
def test_ca_bundle(
    tmp_path: Path, environ: dict[str, str], config: str, expected: str | None
) -> None:
    path = _write(tmp_path, "pip.conf", config)
    assert ca_bundle(environ, [path]) == expected


@pytest.mark.parametrize(
    ("environ", "config", "extra", "links"),
    [
        (
            {},
            f"[global]\nextra-index-url = {MIRROR}\n    {OTHER}\nfind-links = /srv/wheels\n",
            [MIRROR, OTHER],
            ["/srv/wheels"],
        ),
        (
            {"PIP_FIND_LINKS": "/a /b", "PIP_EXTRA_INDEX_URL": OTHER},
            "[global]\nfind-links = /c\n",
            [OTHER],
            ["/a", "/b"],
        ),
        ({}, "", [], []),
    ],
)
def test_extra_indexes_and_find_links(
    tmp_path: Path, environ: dict[str, str], config: str, extra: list[str], links: list[str]
) -> None:
    path = _write(tmp_path, "pip.conf", config)
    assert extra_index_urls(environ, [path]) == extra
    assert find_links(environ, [path]) == links
