"""Benchmark: ``envbuilder resolve`` against one ``uv lock`` over the same pairings.

The anchor a user would time us against is one ``uv lock`` of a project with
one extra per torch/xformers pairing of the matrix (its resolved ones), all
extras declared conflicting (``[tool.uv] conflicts``), ``environments`` =
Linux x86_64 and ``requires-python`` spanning the matrix's Pythons: it
resolves every pairing for every Python, with hashes. Measured in one run:

- *cold*: envbuilder and ``uv lock`` interleaved, ``--rounds`` each, every run
  with empty caches and a fresh output, so that load hits both alike;
- *re-run*: envbuilder again into the same ``--out`` with its cache;
- *CI-warm*: envbuilder into a fresh ``--out`` with a warm cache (a CI job on
  a fresh checkout with its cache restored);
- ``uv lock`` re-run, and ``uv export`` of one pylock per extra;
- second anchor: ``uv pip compile --generate-hashes`` once per combination,
  serially, cold (the same pins and targets as envbuilder's combinations).

Every process runs behind a loopback proxy that counts the bytes received.
Each run notes the load average it ended at; the summary says when the load
exceeded the CPU count (envbuilder's side is CPU-bound, the anchor mostly waits
on the network, so a loaded machine moves the ratio against envbuilder).
Targets: cold envbuilder / cold ``uv lock`` ≤ 0.5 (medians; issue 27); re-run ≤ 1 s;
CI-warm ≤ 2 s; bytes downloaded cold < 1 % of the wheels resolved; every
CI-warm lock byte-identical to the cold run's. Exit 1 when one is missed
or a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuilder.bench._proxy import CountingProxy
from envbuilder.pylock import packages, read_lock

__all__ = ["anchor_project", "main"]

COLD_RATIO_TARGET = 0.5
RERUN_TARGET_S = 1.0
CI_WARM_TARGET_S = 2.0
BYTES_SHARE_TARGET = 0.01


@dataclass(frozen=True, kw_only=True)
class Measurement:
    name: str
    seconds: float
    bytes_down: int
    runs: int = 1
    failures: int = 0
    load: float = 0.0
    """The 1-minute load average when the run ended: a loaded machine slows the CPU-bound
    side (envbuilder's Python and its uv processes) more than the anchor."""


def _env(proxy: CountingProxy, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        env.pop(key, None)
    env.update({"HTTPS_PROXY": proxy.url, "https_proxy": proxy.url, "UV_PYTHON_DOWNLOADS": "never"})
    env.update(extra)
    return env


def _timed(
    proxy: CountingProxy, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None
) -> Measurement:
    before = proxy.snapshot()
    start = time.perf_counter()
    proc = subprocess.run(
        list(argv), env=dict(env), cwd=cwd, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}\n")
    return Measurement(
        name=name,
        seconds=seconds,
        bytes_down=proxy.snapshot() - before,
        failures=0 if proc.returncode == 0 else 1,
        load=os.getloadavg()[0],
    )


def _envbuilder(
    proxy: CountingProxy, name: str, selectors: Sequence[str], matrix: str, out: Path, cache: Path
) -> Measurement:
    argv = [sys.executable, "-m", "envbuilder", "resolve", *selectors, "--matrix", matrix]
    argv += ["--out", str(out), "--cache-dir", str(cache)]
    return _timed(proxy, name, argv, _env(proxy, ENVBUILDER_CACHE_DIR=str(cache)), None)


def _pairings(resolution: Mapping[str, object]) -> dict[str, list[str]]:
    """One requirement list per resolved torch/xformers pairing (with any added runtime)."""
    pairings: dict[str, list[str]] = {}
    for combo in resolution["combinations"]:  # type: ignore[attr-defined]
        if combo["status"] != "resolved":
            continue
        requirements = [f"torch=={combo['torch']['version']}"]
        if combo.get("xformers"):
            requirements.append(f"xformers=={combo['xformers']['version']}")
        requirements += list(combo.get("extra_runtime", []))
        name = re.sub(r"[^a-z0-9]+", "-", "-".join(requirements).lower()).strip("-")
        pairings[name] = requirements
    return dict(sorted(pairings.items()))


def anchor_project(
    pairings: Mapping[str, Sequence[str]], *, pythons: Sequence[str], index_url: str
) -> str:
    """``pyproject.toml`` of the anchor: one extra per pairing, all declared conflicting."""

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    low, high = min(pythons, key=key), max(pythons, key=key)
    major, minor = key(high)[:2]
    extras = "".join(
        f"{name} = [{', '.join(json.dumps(r) for r in reqs)}]\n" for name, reqs in pairings.items()
    )
    conflicts = ", ".join(f'{{ extra = "{name}" }}' for name in pairings)
    declared = f"conflicts = [[{conflicts}]]\n" if len(pairings) > 1 else ""  # uv wants two
    return (
        '[project]\nname = "bench-pairings"\nversion = "0"\n'
        f'requires-python = ">={low},<{major}.{minor + 1}"\ndependencies = []\n\n'
        f"[project.optional-dependencies]\n{extras}\n"
        "[tool.uv]\n"
        "environments = [\"sys_platform == 'linux' and platform_machine == 'x86_64'\"]\n"
        f"{declared}\n"
        f"[[tool.uv.index]]\nurl = {json.dumps(index_url)}\ndefault = true\n"
    )


def _uv_lock(proxy: CountingProxy, name: str, project: Path, cache: Path, uv: str) -> Measurement:
    env = _env(proxy, UV_CACHE_DIR=str(cache), UV_NO_CONFIG="1")
    return _timed(proxy, name, [uv, "lock", "--quiet"], env, project)


def _uv_export(
    proxy: CountingProxy, project: Path, extras: Sequence[str], cache: Path, uv: str
) -> Measurement:
    env = _env(proxy, UV_CACHE_DIR=str(cache), UV_NO_CONFIG="1")
    before, start, failures = proxy.snapshot(), time.perf_counter(), 0
    for extra in extras:
        argv = [uv, "export", "--quiet", "--frozen", "--format", "pylock.toml", "--extra", extra]
        argv += ["-o", f"pylock.{extra.replace('-', '_')}.toml"]
        proc = subprocess.run(argv, env=env, cwd=project, capture_output=True, check=False)
        failures += proc.returncode != 0
    return Measurement(
        name=f"uv export x {len(extras)} (one per extra)",
        seconds=time.perf_counter() - start,
        bytes_down=proxy.snapshot() - before,
        runs=len(extras),
        failures=failures,
        load=os.getloadavg()[0],
    )


def _uv_serial(
    proxy: CountingProxy,
    jobs: Sequence[Mapping[str, object]],
    cache: Path,
    index_url: str,
    uv: str,
) -> Measurement:
    from envbuilder.target import Target

    env = _env(proxy, UV_CACHE_DIR=str(cache), UV_NO_CONFIG="1")
    before = proxy.snapshot()
    failures = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-uv-") as tmp:
        for i, job in enumerate(jobs):
            req = Path(tmp) / f"{i}.in"
            req.write_text("\n".join(job["requirements"]) + "\n", encoding="utf-8")  # type: ignore[arg-type]
            target = Target(python=str(job["python"]), platform=str(job["platform"]))
            argv = [
                uv, "pip", "compile", str(req), "--quiet", "--generate-hashes",
                "--python-version", target.python, "--python-platform", target.uv_platform,
                "--default-index", index_url, "-o", str(Path(tmp) / f"{i}.txt"),
            ]  # fmt: skip
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            failures += proc.returncode != 0
    return Measurement(
        name=f"serial uv pip compile x {len(jobs)} cold",
        seconds=time.perf_counter() - start,
        bytes_down=proxy.snapshot() - before,
        runs=len(jobs),
        failures=failures,
        load=os.getloadavg()[0],
    )


def _jobs(resolution: Mapping[str, object]) -> list[dict[str, object]]:
    """The same pins for uv as envbuilder's resolved combinations."""
    jobs: list[dict[str, object]] = []
    for combo in resolution["combinations"]:  # type: ignore[attr-defined]
        if combo["status"] != "resolved":
            continue
        requirements = [f"torch=={combo['torch']['version']}"]
        if combo.get("xformers"):
            requirements.append(f"xformers=={combo['xformers']['version']}")
        requirements += list(combo.get("extra_runtime", []))
        jobs.append(
            {
                "python": combo["combination"]["python"],
                "platform": combo["combination"]["platform"],
                "requirements": requirements,
            }
        )
    return jobs


def _wheel_bytes(out: Path) -> int:
    """Total size of the distinct files the locks resolved."""
    sizes: dict[str, int] = {}
    for lock in sorted(out.glob("pylock.*.toml")):
        for package in packages(read_lock(lock.read_bytes(), source=lock)):
            for wheel in package.wheels:
                if wheel.sha256 and wheel.size:
                    sizes[wheel.sha256] = wheel.size
    return sum(sizes.values())


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _spread(name: str, runs: Sequence[Measurement]) -> str:
    s = [m.seconds for m in runs]
    fails = sum(m.failures for m in runs)
    down = statistics.median(m.bytes_down for m in runs)
    loads = [m.load for m in runs]
    return (
        f"{name:<34} median {statistics.median(s):6.2f} s  (min {min(s):.2f}, max {max(s):.2f}, "
        f"n={len(s)})  {_mb(down):>10} down  {fails} failed  load {min(loads):.1f}-{max(loads):.1f}"
    )


@dataclass(frozen=True, kw_only=True)
class Check:
    text: str
    target: str
    ok: bool


def exit_status(checks: Sequence[Check], failures: int) -> int:
    """0 only when every target is met and no run failed."""
    return 0 if failures == 0 and all(c.ok for c in checks) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)

    from envbuilder.resolve.closure import find_uv
    from envbuilder.settings import Settings

    index_url = Settings.from_environment(os.environ).index_url
    uv = find_uv()
    load = os.getloadavg()
    print(
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)",
        flush=True,
    )
    runs = _measure(args, index_url=index_url, uv=uv)
    _print_runs(runs)
    checks = _checks(runs)
    print()
    for c in checks:
        print(f"{'✓' if c.ok else '✕'} {c.text}  (target {c.target})")
    if runs.failures:
        print(f"✕ {runs.failures} run(s) failed")
    rc = exit_status(checks, runs.failures)
    print(f"bench resolve: {'targets met' if rc == 0 else 'a target was missed'} (exit {rc})")
    return rc


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nox -s bench -- resolve", description=__doc__)
    parser.add_argument("selectors", nargs="*", help="combinations to resolve (default: all)")
    parser.add_argument("--matrix", default="matrix.toml")
    parser.add_argument("--rounds", type=int, default=3, help="cold runs of each (default: 3)")
    parser.add_argument(
        "--no-serial", action="store_true", help="skip the serial uv pip compile anchor"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


@dataclass(frozen=True, kw_only=True)
class _Runs:
    """Every run of one benchmark, with what the first cold run resolved."""

    eb_cold: list[Measurement]
    uv_cold: list[Measurement]
    reruns: list[Measurement]
    ci_warm: list[Measurement]
    identical: bool
    """Whether every CI-warm run wrote the first cold run's files, byte for byte."""
    uv_rerun: Measurement
    uv_export: Measurement
    serial: Measurement | None
    extras: list[str]
    resolution: Mapping[str, Any]
    total_wheels: int

    @property
    def failures(self) -> int:
        """Failed cold runs of both sides and envbuilder's warm runs (the ``uv lock`` re-run,
        the exports and the serial anchor are reported, not counted)."""
        return sum(m.failures for m in [*self.eb_cold, *self.uv_cold, *self.reruns, *self.ci_warm])


def _measure(args: argparse.Namespace, *, index_url: str, uv: str) -> _Runs:
    """Every run, behind one counting proxy, in a temporary directory removed after them."""
    with tempfile.TemporaryDirectory(prefix="bench-resolve-") as tmp, CountingProxy() as proxy:
        root = Path(tmp)
        project = root / "anchor"
        project.mkdir()
        eb_cold, uv_cold, extras = _cold_rounds(
            proxy, args, root, project, index_url=index_url, uv=uv
        )
        first_out, first_cache = root / "cold-1" / "locks", root / "cold-1" / "cache"
        print("+ envbuilder re-runs (same --out) and CI-warm runs (fresh --out)", flush=True)
        reruns, ci_warm, identical = _warm_rounds(proxy, args, root, first_out, first_cache)
        print("+ uv lock re-run, uv export per extra", flush=True)
        last_uv_cache = root / f"uv-cache-{args.rounds}"
        uv_rerun = _uv_lock(proxy, "uv lock re-run", project, last_uv_cache, uv)
        uv_export = _uv_export(proxy, project, extras, last_uv_cache, uv)
        serial: Measurement | None = None
        resolution = json.loads((first_out / "resolution.json").read_text(encoding="utf-8"))
        if not args.no_serial:
            jobs = _jobs(resolution)
            print(f"+ uv pip compile x {len(jobs)}, serially (cold)", flush=True)
            serial = _uv_serial(proxy, jobs, root / "uv-serial-cache", index_url, uv)
        total_wheels = _wheel_bytes(first_out)
    return _Runs(
        eb_cold=eb_cold, uv_cold=uv_cold, reruns=reruns, ci_warm=ci_warm, identical=identical,
        uv_rerun=uv_rerun, uv_export=uv_export, serial=serial, extras=extras,
        resolution=resolution, total_wheels=total_wheels,
    )  # fmt: skip


def _cold_rounds(
    proxy: CountingProxy,
    args: argparse.Namespace,
    root: Path,
    project: Path,
    *,
    index_url: str,
    uv: str,
) -> tuple[list[Measurement], list[Measurement], list[str]]:
    """Cold envbuilder and cold ``uv lock`` runs, interleaved; the anchor project is written
    from the first envbuilder run's resolution. Returns both sides' runs and the extras."""
    eb_cold: list[Measurement] = []
    uv_cold: list[Measurement] = []
    extras: list[str] = []
    for i in range(1, args.rounds + 1):
        out, cache = root / f"cold-{i}" / "locks", root / f"cold-{i}" / "cache"
        print(f"+ round {i}: envbuilder resolve (cold)", flush=True)
        eb_cold.append(
            _envbuilder(proxy, "envbuilder cold", args.selectors, args.matrix, out, cache)
        )
        if i == 1:
            extras = _write_anchor(project, out / "resolution.json", index_url=index_url)
        print(f"+ round {i}: uv lock over {len(extras)} conflicting extras (cold)", flush=True)
        (project / "uv.lock").unlink(missing_ok=True)
        uv_cache = root / f"uv-cache-{i}"
        uv_cold.append(_uv_lock(proxy, "uv lock cold", project, uv_cache, uv))
        if i < args.rounds:
            shutil.rmtree(uv_cache, ignore_errors=True)
    return eb_cold, uv_cold, extras


def _write_anchor(project: Path, resolution_json: Path, *, index_url: str) -> list[str]:
    """Writes the anchor's ``pyproject.toml`` for the pairings ``resolution_json`` resolved;
    returns its extras."""
    resolution = json.loads(resolution_json.read_text(encoding="utf-8"))
    pairings = _pairings(resolution)
    pythons = sorted({c["combination"]["python"] for c in resolution["combinations"]})
    (project / "pyproject.toml").write_text(
        anchor_project(pairings, pythons=pythons, index_url=index_url),
        encoding="utf-8",
    )
    return list(pairings)


def _warm_rounds(
    proxy: CountingProxy, args: argparse.Namespace, root: Path, first_out: Path, first_cache: Path
) -> tuple[list[Measurement], list[Measurement], bool]:
    """Re-runs into the first cold run's ``--out`` and CI-warm runs into fresh ones, both with
    its cache; returns them and whether every CI-warm run wrote the same files."""
    reruns: list[Measurement] = []
    ci_warm: list[Measurement] = []
    identical = True
    for i in range(1, args.rounds + 1):
        reruns.append(
            _envbuilder(proxy, "re-run", args.selectors, args.matrix, first_out, first_cache)
        )
        ci_out = root / f"ci-{i}" / "locks"
        ci_warm.append(
            _envbuilder(proxy, "CI-warm", args.selectors, args.matrix, ci_out, first_cache)
        )
        identical = identical and _tree(ci_out) == _tree(first_out)
    return reruns, ci_warm, identical


def _median_s(runs: Sequence[Measurement]) -> float:
    return statistics.median(m.seconds for m in runs)


def _print_runs(runs: _Runs) -> None:
    """The load, what was resolved, each kind of run's spread and the cold ratios."""
    combos = runs.resolution["combinations"]
    resolved = sum(1 for c in combos if c["status"] == "resolved")
    load = os.getloadavg()
    print()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if max(m.load for m in [*runs.eb_cold, *runs.uv_cold]) > (os.cpu_count() or 1):
        print("note: the load exceeded the CPU count during the cold runs; not a quiet machine")
    print(
        f"combinations: {len(combos)} ({resolved} resolved) in {len(runs.extras)} pairings; "
        f"wheels resolved: {_mb(runs.total_wheels)}"
    )
    print(_spread("envbuilder cold", runs.eb_cold))
    print(_spread(f"uv lock cold ({len(runs.extras)} extras)", runs.uv_cold))
    print(_spread("envbuilder re-run (same --out)", runs.reruns))
    print(_spread("envbuilder CI-warm (fresh --out)", runs.ci_warm))
    print(_spread("uv lock re-run", [runs.uv_rerun]))
    print(_spread(runs.uv_export.name, [runs.uv_export]))
    if runs.serial is not None:
        print(_spread(runs.serial.name, [runs.serial]))

    eb_med = _median_s(runs.eb_cold)
    ratio = eb_med / _median_s(runs.uv_cold)
    per_round = [e.seconds / u.seconds for e, u in zip(runs.eb_cold, runs.uv_cold, strict=True)]
    print(
        f"cold ratio envbuilder / uv lock: median {ratio:.2f} "
        f"(per round {', '.join(f'{r:.2f}' for r in per_round)})"
    )
    if runs.serial is not None:
        print(f"cold ratio envbuilder / serial uv pip compile: {eb_med / runs.serial.seconds:.2f}")


def _checks(runs: _Runs) -> list[Check]:
    """Each target against the runs."""
    ratio = _median_s(runs.eb_cold) / _median_s(runs.uv_cold)
    eb_down = statistics.median(m.bytes_down for m in runs.eb_cold)
    share = eb_down / runs.total_wheels if runs.total_wheels else 1.0
    rerun_med = _median_s(runs.reruns)
    ci_med = _median_s(runs.ci_warm)
    return [
        Check(
            text=f"cold envbuilder / cold uv lock = {ratio:.2f} (medians)",
            target=f"<= {COLD_RATIO_TARGET}",
            ok=ratio <= COLD_RATIO_TARGET,
        ),
        Check(
            text=f"re-run = {rerun_med:.2f} s",
            target=f"<= {RERUN_TARGET_S:g} s",
            ok=rerun_med <= RERUN_TARGET_S,
        ),
        Check(
            text=f"CI-warm = {ci_med:.2f} s",
            target=f"<= {CI_WARM_TARGET_S:g} s",
            ok=ci_med <= CI_WARM_TARGET_S,
        ),
        Check(
            text=f"CI-warm locks byte-identical to the cold run's: {runs.identical}",
            target="identical",
            ok=runs.identical,
        ),
        Check(
            text=f"bytes downloaded (cold) = {share:.3%} of wheels",
            target=f"< {BYTES_SHARE_TARGET:.0%}",
            ok=share < BYTES_SHARE_TARGET,
        ),
    ]
