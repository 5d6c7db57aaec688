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


V = {
    "2.5.1": "py3.11-default-torch2.5.1-xformers0.0.28.post3",  # verified
    "2.11.0": "py3.12-default-torch2.11.0-xformers0.0.35",  # verified-with-workaround
    "2.7.0": "py3.12-default-torch2.7.0-xformers0.0.30-cudart",  # verified-with-workaround
    "2.6.0": "py3.11-default-torch2.6.0-xformers0.0.29.post3",  # verified-with-workaround
    "2.9.0": "py3.11-default-torch2.9.0",  # unverified
    "2.10.0": "py3.12-default-torch2.10.0-xformers0.0.34",  # broken (compiled training)
    "2.8.0": "py3.12-default-torch2.8.0-xformers0.0.32.post2",  # broken (conflict)
    "2.4.1": "py3.10-default-torch2.4.1-xformers0.0.28.post1",  # broken
    "2.4.1-py3.13": "py3.13-default-torch2.4.1-xformers0.0.28.post1",  # unsatisfiable
}
#: verified first, then by verdict, newest versions first (query's order)
ORDER = list(V.values())


def load(browser: DevTools, url: str, width: int, height: int, *, mobile: bool) -> None:
    browser.send("Page.enable")
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=height,
        deviceScaleFactor=1,
        mobile=mobile,
    )
    browser.send("Page.navigate", url=url)
    browser.wait_for("Page.loadEventFired")


def screenshot(browser: DevTools, tmp_path: Path, name: str) -> Path:
    """The first screen as a user sees it (no capture beyond the viewport)."""
    shot = browser.send("Page.captureScreenshot", format="png")
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG")
    folder = Path(os.environ.get("ENVBUILDER_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    path.write_bytes(png)
    print(f"screenshot: {path}")
    return path


def rect(browser: DevTools, selector: str) -> dict[str, float]:
    box: dict[str, float] = browser.evaluate(
        f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
        ".getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left, "
        "right: r.right, width: r.width, height: r.height}; })()"
    )
    return box


def pick(browser: DevTools, **choices: str) -> dict[str, str]:
    """Set the picker's controls (python, cuda, driver, gpu, use) and read its answer."""
    script = "".join(
        f"(() => {{ const el = document.getElementById('pick-{key}'); "
        f"el.value = {json.dumps(value)}; "
        f"el.dispatchEvent(new Event(el.tagName === 'INPUT' ? 'input' : 'change')); }})();"
        for key, value in choices.items()
    )
    answer: dict[str, str] = browser.evaluate(
        script + "({verdict: document.getElementById('answer-verdict').textContent, "
        "id: document.getElementById('answer-id').textContent, "
        "cmd: (document.getElementById('answer-cmd') || {}).textContent || '', "
        "more: document.getElementById('answer-more').textContent})"
    )
    return answer


def pick_gpu(browser: DevTools, name: str) -> dict[str, str]:
    """Choose a GPU by its name (several share a compute capability, the option's value)."""
    browser.evaluate(
        "(() => { const s = document.getElementById('pick-gpu'); "
        f"s.selectedIndex = [...s.options].findIndex(o => o.text.startsWith({json.dumps(name)} + ' ')); "
        "s.dispatchEvent(new Event('change')); })()"
    )
    return pick(browser)


def test_page_loads_filters_and_orders_verified_first(browser: DevTools, site_url: str) -> None:
    load(browser, site_url, 1400, 1100, mobile=False)
    assert browser.evaluate("document.title").startswith("envbuilder compatibility")
    everything = browser.evaluate(VISIBLE)
    assert everything == ORDER
    assert (
        browser.evaluate("document.getElementById('visible-count').textContent")
        == "9 of 9 combinations shown"
    )
    assert browser.evaluate("document.querySelectorAll('svg.plot').length") >= 2

    assert choose(browser, "python", "3.11") == [V["2.5.1"], V["2.6.0"], V["2.9.0"]]
    assert choose(browser, "gpu", "sm_80") == [V["2.5.1"]]
    assert (
        browser.evaluate("document.getElementById('visible-count').textContent")
        == "1 of 9 combinations shown"
    )
    choose(browser, "python", "")
    # runs on sm_90: not the A100-only one nor the one without runs; the unsatisfiable
    # one's H100 run is evidence too
    assert choose(browser, "gpu", "sm_90") == [
        i for i in ORDER if i not in (V["2.4.1"], V["2.9.0"])
    ]
    assert choose(browser, "gpu", "") == everything
    # verified (with or without a workaround) for one use: broken for compiled training is out
    training = [V["2.5.1"], V["2.11.0"], V["2.7.0"], V["2.6.0"], V["2.10.0"]]
    assert choose(browser, "uses", "training") == training
    assert choose(browser, "uses", "training-compiled") == [i for i in training if i != V["2.10.0"]]
    assert choose(browser, "uses", "") == everything

    colour = browser.evaluate(
        "getComputedStyle(document.querySelector('tr[data-verdict=broken] td.verdict')).backgroundColor"
    )
    assert colour == "rgb(249, 196, 196)"
    words = browser.evaluate("document.getElementById('plots').textContent")
    assert "slower than SDPA" in words or "faster than SDPA" in words


def test_the_picker_answers_on_the_first_screen(
    browser: DevTools, site_url: str, tmp_path: Path
) -> None:
    load(browser, site_url, 1280, 900, mobile=False)
    answer = pick(browser)
    assert answer == {
        "verdict": "verified",
        "id": V["2.5.1"],
        "cmd": f"envbuilder install {V['2.5.1']}",
        "more": "7 more fit, 1 without a lock",
    }
    for selector in ("#pick", "#answer-verdict", "#answer-id", "#answer-cmd"):
        box = rect(browser, selector)
        assert box["height"] > 0 and box["top"] >= 0 and box["bottom"] <= 900, selector
        assert box["right"] <= 1280, selector
    screenshot(browser, tmp_path, "site-1280x900")

    # Python 3.12 for compiled training: the workaround one, and the use in the command
    assert pick(browser, python="3.12", use="training-compiled") == {
        "verdict": "verified-with-workaround",
        "id": V["2.11.0"],
        "cmd": f"envbuilder install {V['2.11.0']} --use training-compiled",
        "more": "3 more fit, 5 ruled out by your choices",  # 3.12 has no lockless one
    }
    # on an A100 only the A100-run combination is verified; a 3.12 stack is not, so no command
    assert pick(browser, python="3.11", use="", gpu="8.0") == {
        "verdict": "verified",
        "id": V["2.5.1"],
        "cmd": f"envbuilder install {V['2.5.1']}",
        "more": "2 more fit, 6 ruled out by your choices",  # nor 3.11
    }
    unverified = pick(browser, python="3.12", gpu="8.0")
    assert (unverified["verdict"], unverified["cmd"]) == ("unverified", "")
    # a driver older than CUDA 12.4 needs leaves nothing; a GH200 is an ARM host
    assert pick(browser, python="", gpu="", driver="545.23")["verdict"] == "nothing fits"
    assert browser.evaluate("document.getElementById('answer-why').textContent") == (
        "No installable combination in this lockfile fits these choices "
        "(8 ruled out, 1 without a lock): needs driver ≥ 550.54.14 (8)."
    )
    assert pick(browser, driver="550.54.14")["id"] == V["2.5.1"]
    pick(browser, driver="")
    assert pick_gpu(browser, "H100")["id"] == V["2.5.1"]
    assert pick_gpu(browser, "GH200")["verdict"] == "nothing fits"
    assert browser.evaluate("document.getElementById('answer-why').textContent") == (
        "No installable combination in this lockfile fits these choices "
        "(9 ruled out): built for x86_64 (9)."
    )


def test_the_phone_layout_keeps_the_verdict(
    browser: DevTools, site_url: str, tmp_path: Path
) -> None:
    load(browser, site_url, 390, 844, mobile=True)
    assert browser.evaluate("document.documentElement.scrollWidth") <= 390
    for selector in ("#answer-verdict", "#answer-id", "#answer-cmd"):
        box = rect(browser, selector)
        assert box["height"] > 0 and box["bottom"] <= 844 and box["right"] <= 390, selector
    # the grid keeps the combination and its verdict; the detail columns give way
    verdict = rect(browser, "tr.combo td.verdict")
    assert verdict["width"] > 0 and verdict["left"] >= 0 and verdict["right"] <= 390
    hidden = browser.evaluate(
        "['td.python', 'td.torch', 'td.use', 'td.install'].map("
        "s => getComputedStyle(document.querySelector('tr.combo ' + s)).display)"
    )
    assert hidden == ["none"] * 4
    screenshot(browser, tmp_path, "site-390x844")


#: The lockfile the wheel carries (``nox -s snapshot``, from results/ and the default matrix's
#: locks): its H200 rows, the ``-cudart`` one with the longest reasons, are the real worst case.
COMMITTED = Path(__file__).parents[2] / "envbuilder" / "data" / "compat.lock.json"


def _serve(root: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/index.html"
    server.shutdown()


@pytest.fixture(params=["synthetic", "committed"])
def any_site_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The page of the synthetic lockfile (tests/data) and of the committed one (results/)."""
    from envbuilder.lockfile.read import load_lockfile
    from envbuilder.publish.site import html_page

    if request.param == "synthetic":
        shutil.copytree(DATA / "locks", tmp_path / "locks")
        lockfile = tmp_path / "compat.lock.json"
        argv = ["lock", "--resolution", str(tmp_path / "locks" / "resolution.json")]
        assert main([*argv, "--results", str(DATA / "results"), "-o", str(lockfile)]) == 0
    else:
        lockfile = COMMITTED
    sha = json.loads(lockfile.read_bytes())["content_sha256"]
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text(html_page(load_lockfile(lockfile), sha))
    yield from _serve(tmp_path / "site")


ROW_HEIGHT = 200  # px: a row of the grid, however long its reasons
CHART_PHONE = 360  # px: a chart on a phone

SIZES = """(() => {
  const grid = document.getElementById('grid');
  const box = grid.parentElement.getBoundingClientRect();
  const rows = [...document.querySelectorAll('tr.combo')].filter(r => !r.hidden)
    .map(r => [r.dataset.id, Math.round(r.getBoundingClientRect().height)]);
  const charts = [...document.querySelectorAll('svg.plot')].map(s => {
    const r = s.getBoundingClientRect(), f = s.closest('figure').parentElement.getBoundingClientRect();
    return [Math.round(r.width), Math.round(f.width), Math.round(r.right), Math.round(f.right)];
  });
  return {rows: rows, table: Math.round(grid.getBoundingClientRect().width),
          box: Math.round(box.width), page: document.documentElement.scrollWidth,
          charts: charts};
})()"""


@pytest.mark.parametrize(("width", "mobile"), [(390, True), (1280, False)], ids=["390", "1280"])
def test_every_row_is_at_most_200_px_tall(
    browser: DevTools, any_site_url: str, width: int, mobile: bool
) -> None:
    load(browser, any_site_url, width, 900, mobile=mobile)
    sizes = browser.evaluate(SIZES)
    assert sizes["rows"]
    tall = [(cid, h) for cid, h in sizes["rows"] if h > ROW_HEIGHT]
    assert tall == [], f"rows taller than {ROW_HEIGHT} px at {width} px"


@pytest.mark.parametrize(("width", "mobile"), [(390, True), (1280, False)], ids=["390", "1280"])
def test_the_table_fits_its_box_and_the_page_does_not_scroll_sideways(
    browser: DevTools, any_site_url: str, width: int, mobile: bool
) -> None:
    load(browser, any_site_url, width, 900, mobile=mobile)
    sizes = browser.evaluate(SIZES)
    assert (sizes["table"], sizes["page"]) <= (sizes["box"], width), sizes
    assert sizes["table"] <= sizes["box"], f"table {sizes['table']} px in a {sizes['box']} px box"
    assert sizes["page"] <= width, f"page {sizes['page']} px wide at {width} px"


@pytest.mark.parametrize(("width", "mobile"), [(390, True), (1280, False)], ids=["390", "1280"])
def test_every_chart_fits_its_box(
    browser: DevTools, any_site_url: str, width: int, mobile: bool
) -> None:
    load(browser, any_site_url, width, 900, mobile=mobile)
    charts = browser.evaluate(SIZES)["charts"]
    assert charts, "no chart on the page"
    for chart_width, box_width, right, box_right in charts:
        assert chart_width <= box_width and right <= box_right, (chart_width, box_width)
        if width == 390:
            assert chart_width <= CHART_PHONE, f"a {chart_width} px chart on a 390 px phone"


def test_the_grid_follows_the_pickers_choices(browser: DevTools, site_url: str) -> None:
    load(browser, site_url, 1280, 900, mobile=False)
    assert pick(browser, python="3.11")["id"] == V["2.5.1"]
    assert browser.evaluate(VISIBLE) == [V["2.5.1"], V["2.6.0"], V["2.9.0"]]
    figures = browser.evaluate(
        "[...document.querySelectorAll('figure')].filter(f => !f.hidden).map(f => f.dataset.python)"
    )
    assert set(figures) <= {"3.11"}
    pick(browser, python="")
    assert browser.evaluate(VISIBLE) == ORDER


def test_the_answer_for_each_use_comes_first(browser: DevTools, site_url: str) -> None:
    load(browser, site_url, 1280, 900, mobile=False)
    uses = browser.evaluate(
        "[...document.querySelectorAll('#answer-uses [data-use]')]"
        ".map(li => [li.dataset.use, li.querySelector('.uid').textContent])"
    )
    assert [u for u, _ in uses] == [
        "inference",
        "inference-compiled",
        "training",
        "training-compiled",
    ]
    assert dict(uses)["training"] == V["2.11.0"]  # verified for training, newest first
    assert dict(uses)["inference"] == V["2.11.0"]
    picker, grid = rect(browser, "#picker"), rect(browser, "#grid")
    assert picker["bottom"] <= grid["top"]


def test_the_install_box_says_how_to_get_the_cli(browser: DevTools, site_url: str) -> None:
    load(browser, site_url, 1280, 900, mobile=False)
    steps = browser.evaluate("document.getElementById('answer-steps').textContent")
    assert "pip install gpu-envbuilder" in steps
    assert "uv tool install gpu-envbuilder" in steps
    assert f"envbuilder install {V['2.5.1']}" in steps
    assert "envbuilder doctor" in steps
