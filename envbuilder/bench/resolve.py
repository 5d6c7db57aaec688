"""Benchmark: resolving a matrix with envbuilder against ``uv pip compile`` run once per combination.

Anchors measured in the same run, with empty caches ("cold") and again with
the caches those runs left ("warm"):

- envbuilder: ``envbuilder resolve`` over the selected combinations;
- serial uv: ``uv pip compile --generate-hashes`` once per combination, for
  the same target (``--python-version``, ``--python-platform``) and the same
  pins (``torch==``, ``xformers==`` and any added CUDA runtime), with
  ``UV_PYTHON_DOWNLOADS=never``.

Every process runs behind a loopback proxy that counts the bytes received,
so downloads are measured the same way for both. Targets (issue 2): cold
envbuilder ≤ 1/3 of cold serial uv; a warm re-run with nothing changed
≤ 1 s; bytes downloaded < 1 % of the size of the wheels resolved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuilder.bench._proxy import CountingProxy
from envbuilder.pylock import packages, read_lock

__all__ = ["main"]


@dataclass(frozen=True, kw_only=True)
class Measurement:
    name: str
    seconds: float
    bytes_down: int
    runs: int
    failures: int = 0


def _env(proxy: CountingProxy, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        env.pop(key, None)
    env.update({"HTTPS_PROXY": proxy.url, "https_proxy": proxy.url, "UV_PYTHON_DOWNLOADS": "never"})
    env.update(extra)
    return env


def _envbuilder(
    proxy: CountingProxy, name: str, argv: Sequence[str], env: Mapping[str, str]
) -> Measurement:
    before = proxy.snapshot()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "envbuilder", "resolve", *argv],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode not in (0,):
        sys.stderr.write(proc.stderr[-4000:])
    return Measurement(
        name=name,
        seconds=seconds,
        bytes_down=proxy.snapshot() - before,
        runs=1,
        failures=0 if proc.returncode == 0 else 1,
    )


def _uv_serial(
    proxy: CountingProxy,
    name: str,
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
        name=name,
        seconds=time.perf_counter() - start,
        bytes_down=proxy.snapshot() - before,
        runs=len(jobs),
        failures=failures,
    )


def _jobs(resolution: Mapping[str, object]) -> list[dict[str, object]]:
    """The same pins for uv as envbuilder's combinations (unsatisfiable ones included)."""
    jobs: list[dict[str, object]] = []
    for combo in resolution["combinations"]:  # type: ignore[attr-defined]
        torch = combo.get("torch") or {}
        xformers = combo.get("xformers") or {}
        if not torch:
            continue
        requirements = [f"torch=={torch['version']}"]
        if xformers:
            requirements.append(f"xformers=={xformers['version']}")
        requirements += list(combo.get("extra_runtime", []))
        jobs.append(
            {"python": combo["python"], "platform": combo["platform"], "requirements": requirements}
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


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nox -s bench -- resolve", description=__doc__)
    parser.add_argument("selectors", nargs="*", help="combinations to resolve (default: all)")
    parser.add_argument("--matrix", default="matrix.toml")
    args = parser.parse_args(argv)

    from envbuilder.resolve.closure import find_uv
    from envbuilder.settings import Settings

    index_url = Settings.from_environment(os.environ).index_url
    uv = find_uv()
    with tempfile.TemporaryDirectory(prefix="bench-resolve-") as tmp, CountingProxy() as proxy:
        root = Path(tmp)
        out, cache = root / "locks", root / "cache"
        env = _env(proxy, ENVBUILDER_CACHE_DIR=str(cache))
        argv_eb = [
            *args.selectors,
            "--matrix",
            args.matrix,
            "--out",
            str(out),
            "--cache-dir",
            str(cache),
        ]
        print(f"+ envbuilder resolve {' '.join(argv_eb)}  (cold, then warm)", flush=True)
        cold = _envbuilder(proxy, "envbuilder cold", argv_eb, env)
        warm = _envbuilder(proxy, "envbuilder warm (nothing changed)", argv_eb, env)
        resolution = json.loads((out / "resolution.json").read_text(encoding="utf-8"))
        jobs = _jobs(resolution)
        combos = len(resolution["combinations"])
        resolved = sum(1 for c in resolution["combinations"] if c["status"] == "resolved")
        print(f"+ uv pip compile x {len(jobs)}, serially  (cold, then warm)", flush=True)
        uv_cold = _uv_serial(proxy, "serial uv cold", jobs, root / "uv-cache", index_url, uv)
        uv_warm = _uv_serial(proxy, "serial uv warm", jobs, root / "uv-cache", index_url, uv)
        total_wheels = _wheel_bytes(out)

    rows = [cold, warm, uv_cold, uv_warm]
    print()
    print(f"combinations: {combos} ({resolved} resolved); wheels resolved: {_mb(total_wheels)}")
    print(
        f"{'run':<36}{'time':>9}{'vs uv cold':>12}{'downloaded':>14}{'of wheels':>11}{'failed':>8}"
    )
    for m in rows:
        ratio = m.seconds / uv_cold.seconds if uv_cold.seconds else float("nan")
        share = m.bytes_down / total_wheels if total_wheels else float("nan")
        print(
            f"{m.name:<36}{m.seconds:>8.2f}s{ratio:>12.3f}{_mb(m.bytes_down):>14}"
            f"{share:>10.3%}{m.failures:>5}/{m.runs}"
        )
    cold_ratio = cold.seconds / uv_cold.seconds
    share = cold.bytes_down / total_wheels if total_wheels else float("nan")
    checks = [
        (f"cold envbuilder / cold serial uv = {cold_ratio:.3f}", "<= 0.333", cold_ratio <= 1 / 3),
        (f"warm re-run = {warm.seconds:.2f} s", "<= 1 s", warm.seconds <= 1.0),
        (f"bytes downloaded (cold) = {share:.3%} of wheels", "< 1%", share < 0.01),
    ]
    print()
    for text, target, ok in checks:
        print(f"{'✓' if ok else '✕'} {text}  (target {target})")
    return 0 if cold.failures == 0 else 1
