"""Credentials in index URLs: taken out where a URL enters, shown starred, written nowhere."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from envbuilder.credentials import RedactingFilter, redact_text, split_credentials
from envbuilder.index.pipconfig import default_index_url, extra_index_urls, index_credentials
from envbuilder.resolve.matrix import load_matrix


@pytest.mark.parametrize(
    ("url", "clean", "by_host"),
    [
        ("https://u:p@h/simple", "https://h/simple", {"h": ("u", "p")}),
        ("http://u:p%40q@127.0.0.1:8080/s", "http://127.0.0.1:8080/s", {"127.0.0.1:8080": ("u", "p@q")}),
        ("https://TOKEN@h/s", "https://h/s", {"h": ("TOKEN", "")}),
        ("https://h/simple", "https://h/simple", {}),
        ("file:///wheels", "file:///wheels", {}),
    ],
)  # fmt: skip
def test_a_url_splits_into_the_url_without_userinfo_and_its_credentials(
    url: str, clean: str, by_host: dict[str, tuple[str, str]]
) -> None:
    got, credentials = split_credentials(url)
    assert (got, dict(credentials.by_host)) == (clean, by_host)
    assert "p" not in repr(credentials).replace("hosts", "")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("GET 'https://u:secret@h/x': 401", "GET 'https://u:***@h/x': 401"),
        ("see https://TOKEN@h/x and http://h/y", "see https://***@h/x and http://h/y"),
        ("no url here", "no url here"),
    ],
)
def test_messages_show_a_password_as_stars(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_a_url_of_a_host_with_credentials_is_shown_with_the_user_and_stars() -> None:
    credentials = split_credentials("https://u:secret@h:8443/simple")[1]
    assert credentials.show("https://h:8443/simple/torch/") == "https://u:***@h:8443/simple/torch/"
    assert credentials.show("https://other/simple/") == "https://other/simple/"
    assert credentials.for_url("https://h:8443/files/x.whl") == ("u", "secret")
    assert credentials.netrc_text() == "machine h login u password secret\n"


def test_log_records_are_redacted() -> None:
    record = logging.LogRecord("t", logging.DEBUG, __file__, 1, "GET %s", ("http://u:pw@h/",), None)
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "GET http://u:***@h/"


def test_pip_s_index_urls_come_without_credentials(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = https://a:pa@main/simple\n"
        "extra-index-url = https://b:pb@extra/simple https://plain/simple\n",
        encoding="utf-8",
    )
    env = {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path)}
    files = [conf]
    assert default_index_url(env, files) == "https://main/simple"
    assert extra_index_urls(env, files) == ["https://extra/simple", "https://plain/simple"]
    assert dict(index_credentials(env, files).by_host) == {
        "main": ("a", "pa"),
        "extra": ("b", "pb"),
    }
    env = {"PIP_INDEX_URL": "https://c:pc@env/simple", "PIP_CONFIG_FILE": os.devnull}
    assert default_index_url(env, []) == "https://env/simple"
    assert dict(index_credentials(env, []).by_host) == {"env": ("c", "pc")}


def test_a_matrix_index_url_expanded_from_a_variable_keeps_no_token(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(
        '[indexes.private]\nurl = "https://__token__:${TOKEN}@priv/{cuda}"\nprojects = ["torch"]\n'
        '[[combinations]]\npython = "3.11"\ncuda = "cu121"\ntorch = "2.4.1"\n'
        'torch-index = "private"\n',
        encoding="utf-8",
    )
    matrix = load_matrix(path, environ={"TOKEN": "tok-123"})
    assert matrix.indexes["private"].url == "https://priv/{cuda}"
    assert dict(matrix.credentials.by_host) == {"priv": ("__token__", "tok-123")}
    assert "tok-123" not in repr(matrix)
