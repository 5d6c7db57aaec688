"""The published page in a real headless Chromium, driven over the DevTools protocol
(``--remote-debugging-pipe``: JSON messages on fds 3/4, no extra library)."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuilder.cli import main

DATA = Path(__file__).parents[1] / "data"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """A minimal Chrome DevTools Protocol client over the browser's pipe."""

    def __init__(self, browser: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self.proc = subprocess.Popen(
            ["bash", "-c", script, browser, *flags],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def send(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_for(self, event: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self._read(deadline))

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(OSError, TimeoutError, EOFError, RuntimeError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


@pytest.fixture
def site_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The site published from the synthetic inputs, served on loopback."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    assert (
        main(["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")])
        == 0
    )
    assert main(["publish", "-o", "site"]) == 0
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site")
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/index.html"
    server.shutdown()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (bash .ci/setup installs it)")
    tools = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        pages = [t for t in tools.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        target = (
            pages[0]["targetId"]
            if pages
            else tools.send("Target.createTarget", url="about:blank")["targetId"]
        )
        tools.session = tools.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        yield tools
    finally:
        tools.close()


VISIBLE = "[...document.querySelectorAll('tr.combo')].filter(r => !r.hidden).map(r => r.dataset.id)"


def choose(browser: DevTools, key: str, value: str) -> list[str]:
    ids: list[str] = browser.evaluate(
        f"(() => {{ const s = document.getElementById('filter-{key}'); s.value = {json.dumps(value)};"
        f" s.dispatchEvent(new Event('change')); return {VISIBLE}; }})()"
    )
    return ids


def test_page_loads_filters_and_screenshots(
    browser: DevTools, site_url: str, tmp_path: Path
) -> None:
    browser.send("Page.enable")
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        width=1400,
        height=1100,
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.send("Page.navigate", url=site_url)
    browser.wait_for("Page.loadEventFired")

    assert browser.evaluate("document.title").startswith("envbuilder compatibility")
    everything = browser.evaluate(VISIBLE)
    assert len(everything) == 9
    assert (
        browser.evaluate("document.getElementById('visible-count').textContent")
        == "9 of 9 combinations shown"
    )
    assert browser.evaluate("document.querySelectorAll('svg.plot').length") >= 2

    assert choose(browser, "python", "3.11") == [
        "py3.11-default-torch2.5.1-xformers0.0.28.post3",
        "py3.11-default-torch2.6.0-xformers0.0.29.post3",
        "py3.11-default-torch2.9.0",
    ]
    assert choose(browser, "gpu", "sm_80") == ["py3.11-default-torch2.5.1-xformers0.0.28.post3"]
    assert (
        browser.evaluate("document.getElementById('visible-count').textContent")
        == "1 of 9 combinations shown"
    )
    choose(browser, "python", "")
    assert choose(browser, "gpu", "sm_90") == [
        "py3.11-default-torch2.5.1-xformers0.0.28.post3",
        "py3.11-default-torch2.6.0-xformers0.0.29.post3",
        "py3.12-default-torch2.10.0-xformers0.0.34",
        "py3.12-default-torch2.11.0-xformers0.0.35",
        "py3.12-default-torch2.7.0-xformers0.0.30-cudart",
        "py3.12-default-torch2.8.0-xformers0.0.32.post2",
        "py3.13-default-torch2.4.1-xformers0.0.28.post1",  # unsatisfiable; its H100 run is evidence
    ]
    assert choose(browser, "gpu", "") == everything
    # verified (with or without a workaround) for one use: broken for compiled training is out
    verified_for_training = [
        "py3.11-default-torch2.5.1-xformers0.0.28.post3",
        "py3.11-default-torch2.6.0-xformers0.0.29.post3",
        "py3.12-default-torch2.10.0-xformers0.0.34",
        "py3.12-default-torch2.11.0-xformers0.0.35",
        "py3.12-default-torch2.7.0-xformers0.0.30-cudart",
    ]
    assert choose(browser, "uses", "training") == verified_for_training
    assert choose(browser, "uses", "training-compiled") == [
        i for i in verified_for_training if i != "py3.12-default-torch2.10.0-xformers0.0.34"
    ]
    assert choose(browser, "uses", "") == everything

    colour = browser.evaluate(
        "getComputedStyle(document.querySelector('tr[data-verdict=broken] td.verdict')).backgroundColor"
    )
    assert colour == "rgb(249, 196, 196)"

    shot = browser.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG")
    path = tmp_path / "site.png"
    path.write_bytes(png)
    print(f"screenshot: {path}")
