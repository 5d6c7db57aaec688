"""``envbuilder resolve`` against a loopback index that misbehaves: it wants a password,
serves pages that are not index pages, breaks bodies off, hangs.

Each test names the promise it keeps: credentials never written, a broken page
an error (never cached, never replacing an earlier answer), body reads retried,
a failed URL remembered for the run, Ctrl-C honoured at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envbuilder.errors import IndexError_
from envbuilder.index.http import HttpClient
from envbuilder.index.simple import fetch_project_page
from tests.integration.conftest import ClientFactory, ServerFactory, WheelFactory
from tests.integration.test_resolver import (  # the resolver's wheels, index layout and runner
    OK,
    PER_CUDA,
    Wheels,
    _default_projects,
    _matrix,
    _server,
    resolve,
    uv,
    wheels,
)
from tests.support.index_server import IndexServer, PageFault
from tests.support.signals import sigint_at_default

__all__ = ["resolve", "uv", "wheels"]  # fixtures, used by name

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55"
ROWS = """
[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.28.post1"

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.5.1"
torch-index = "pytorch"
"""


def _envbuilder(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def _every_file(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("password_ok", [True, False], ids=["right-password", "wrong-password"])
def test_credentials_authenticate_but_are_never_written_or_shown(
    wheels: Wheels, tmp_path: Path, uv: str, password_ok: bool
) -> None:
    """The default index from PIP_INDEX_URL and a matrix index through ${VAR}, both with
    user:password: every output (locks, requirements, resolution.json, --json, --debug
    logs, messages) is searched for the password."""
    given = SECRET if password_ok else SECRET + "-wrong"
    with _server(wheels, basic_auth=("user", SECRET)) as server:
        authed = server.url.replace("http://", f"http://user:{given}@")
        matrix = tmp_path / "matrix.toml"
        matrix.write_text(
            "[indexes.pytorch]\n"
            'url = "'
            + server.url.replace("http://", "http://user:${INDEX_TOKEN}@")
            + '/whl/{cuda}"\n'
            'projects = ["torch"]\n' + ROWS,
            encoding="utf-8",
        )
        env = {
            "PIP_INDEX_URL": authed + "/simple",
            "PIP_CONFIG_FILE": os.devnull,
            "INDEX_TOKEN": given,
        }
        out = tmp_path / "locks"
        argv = ["--debug", "resolve", "--matrix", str(matrix), "--out", str(out), "-vv"]
        proc = _envbuilder(
            *argv, "--cache-dir", str(tmp_path / "cache"), "--json", env=env, cwd=tmp_path
        )
    doc = json.loads(proc.stdout)
    statuses = {c["combination"]["id"]: c["status"] for c in doc["combinations"]}
    if password_ok:
        assert proc.returncode == 0, proc.stderr
        assert statuses == {OK: "resolved", PER_CUDA: "resolved"}
        assert "user:***@127.0.0.1" in proc.stderr  # the debug logs name the index, starred
    else:
        assert proc.returncode == 1
        assert set(statuses.values()) == {"error"}
        reasons = " ".join(c["reason"] for c in doc["combinations"])
        assert "HTTP 401" in reasons and "user:***@127.0.0.1" in reasons
    written = _every_file(out)
    assert written, "resolve wrote nothing"
    for path, data in written.items():
        assert given.encode() not in data, f"{path} carries the password"
        # messages kept in a file (a reason) may name the user, never the password
        assert not re.search(rb"user:(?!\*\*\*@)", data), f"{path} carries userinfo"
    assert given not in proc.stdout
    assert given not in proc.stderr


# -- a page that is not an index page ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "fmt", "problem"),
    [
        ("portal", "auto", "not an index page: none of its 2 link(s) is a distribution file"),
        ("blank", "auto", "not an index page: no links"),
        ("short-length", "html", "the page ends before </html>"),
        ("short-length", "json", "not a valid PEP 691 JSON page"),
    ],
)
def test_a_page_that_is_not_an_index_page_is_an_error_never_cached(
    wheel_factory: WheelFactory,
    index_server: ServerFactory,
    http_client: ClientFactory,
    fault: PageFault,
    fmt: str,
    problem: str,
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]}, format=fmt, cache_control="max-age=600", etag=False)
    url = server.index_url("simple")
    server.break_next(1, fault)
    with pytest.raises(IndexError_, match=re.escape(problem)) as raised:
        fetch_project_page(http_client(), url, "six")
    assert f"{url}/six/" in str(raised.value)
    # the next run asks again (nothing cached) and reads the recovered index
    page = fetch_project_page(http_client(), url, "six")
    assert [f.filename for f in page.files] == [six.filename]
    assert server.stats.paths().count("/simple/six/") == 2


def test_a_broken_page_is_an_error_that_keeps_the_earlier_answer(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    with _server(wheels) as server:
        matrix = _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")
        first = resolve(matrix, OK)
        assert first.by_id()[OK]["status"] == "resolved"
        server.break_next(1, "portal")
        broken = resolve(matrix, OK)
        assert broken.rc == 1
        answer = broken.by_id()[OK]
        assert answer["status"] == "error"
        assert "not an index page" in answer["reason"]
        assert server.index_url("simple") + "/torch/" in answer["reason"]
        assert broken.written()[OK] == first.written()[OK]  # the earlier answer stands
        assert "kept the earlier resolved answer" in broken.stderr + broken.doc.get("note", "")
        recovered = resolve(matrix, OK)
        assert (recovered.rc, recovered.by_id()[OK]["status"]) == (0, "resolved")


def test_an_index_page_listing_no_files_is_a_note(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    server = IndexServer()
    projects = _default_projects(wheels)
    projects["torch"] = []
    server.add_index("simple", projects)
    with server:
        matrix = _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")
        run = resolve(matrix, OK)
    answer = run.by_id()[OK]
    assert (run.rc, answer["status"]) == (0, "unsatisfiable")
    assert "index 'default' lists no files for torch" in answer["notes"]


# -- body reads are retried -------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["cut", "reset"])
@pytest.mark.parametrize("fmt", ["json", "html"])
def test_a_body_broken_off_mid_stream_is_retried(
    wheel_factory: WheelFactory,
    index_server: ServerFactory,
    http_client: ClientFactory,
    fault: PageFault,
    fmt: str,
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]}, format=fmt)
    server.break_next(2, fault)
    page = fetch_project_page(http_client(retries=3), server.index_url("simple"), "six")
    assert [f.filename for f in page.files] == [six.filename]
    assert server.stats.paths().count("/simple/six/") == 3


def test_a_body_that_always_breaks_off_is_an_error_after_the_retries(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]})
    server.break_next(10, "cut")
    with pytest.raises(IndexError_, match=r"reading the body failed.*after retries: 3 attempt"):
        fetch_project_page(http_client(retries=2), server.index_url("simple"), "six")
    assert server.stats.paths().count("/simple/six/") == 3


# -- a hung index -----------------------------------------------------------------------------


def test_a_hung_url_costs_its_time_budget_once_per_run(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]})
    server.delay_next(100, 5.0)
    client = http_client(retries=4, timeout=0.3, url_budget=1.0)
    started = time.monotonic()
    with pytest.raises(IndexError_, match=r"after retries"):
        fetch_project_page(client, server.index_url("simple"), "six")
    first = time.monotonic() - started
    assert first < 2.0  # bounded by the budget, not 5 attempts x timeout + backoff
    asked = server.stats.arrivals
    started = time.monotonic()
    with pytest.raises(IndexError_, match=r"failed earlier in this run; not asked again"):
        fetch_project_page(client, server.index_url("simple"), "six")
    assert time.monotonic() - started < 0.1
    assert server.stats.arrivals == asked


def test_a_hung_index_fails_each_combination_that_needs_it_once(
    wheels: Wheels, tmp_path: Path, resolve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = HttpClient.__init__.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "timeout", 0.3)
    monkeypatch.setitem(defaults, "url_budget", 1.0)
    with _server(wheels) as server:
        server.delay_next(1000, 5.0)
        matrix = _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")
        started = time.monotonic()
        run = resolve(matrix, OK, "py3.11-cu121-torch2.4.1-xformers0.0.26.post1")
        took = time.monotonic() - started
        torch_page_asks = server.stats.arrivals
    assert run.rc == 1
    reasons = [c["reason"] for c in run.doc["combinations"]]
    assert len(reasons) == 2
    for reason in reasons:
        assert server.index_url("simple") + "/" in reason
    assert took < 5.0  # one budget for the shared page, not one per combination
    assert torch_page_asks <= 5


def test_ctrl_c_stops_a_run_on_a_hung_index_at_once_writing_nothing(
    wheels: Wheels, tmp_path: Path, uv: str
) -> None:
    with _server(wheels) as server:
        server.delay_next(1000, 60.0)
        matrix = _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")
        out = tmp_path / "locks"
        argv = ["resolve", "--matrix", str(matrix), "--out", str(out), "--json"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "envbuilder", *argv, "--cache-dir", str(tmp_path / "c")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PIP_CONFIG_FILE": os.devnull},
            cwd=tmp_path,
            preexec_fn=sigint_at_default,
        )
        deadline = time.monotonic() + 60
        while server.stats.arrivals < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.stats.arrivals >= 2, "resolve never reached the index"
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        took = time.monotonic() - sent
    assert took < 2.0, f"took {took:.1f} s to stop"
    assert proc.returncode == 130
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert stdout == ""
    assert not out.exists() or not any(out.iterdir())
