"""Checking an environment against the lockfile (``envbuilder doctor``).

Findings are ``pass``, ``warn``, ``skip`` or ``fail``; the doctor passes when
nothing failed, and `summary` says what passed and what was not checked. Needs
only the standard library and packaging; torch is never imported here.

The environment may be another one (``--python PATH``): nothing of envbuilder is
installed there. Standard-library files run in its interpreter, by path:
`_envprobe` reports its Python, marker values and distributions with their
``RECORD`` locations (read back here as `metadata.PathDistribution`);
`_extload` proves that torch's libraries and xformers' extension link, without
importing torch (about 1 s against tens of seconds for a cold import of torch
and xformers); `_smoke` imports torch and xformers and runs the GPU smoke test.
`start_probe` runs the light one first and the full one only where a GPU device
is present, where the light one finds something not loading (an import decides a
failure), or when asked, beside the file hashing rather than after it.

The GPU's compile checks cost more than importing torch: `_smoke` runs them only
when something they depend on changed since their last run (`_checkcache` names
each part: torch, xformers, triton and CUDA libraries, GPU, driver, settings, the
checks' code), else reports their recorded results with their date; torch's
compile caches live in the doctor's directory beside that record. ``fast`` (a
start-up check within the import's own time) imports nothing: the light probe
asks the driver for the GPU and reports the checks' last results where they hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from envbuilder.consumer import _envprobe, _extload, _smoke
from envbuilder.consumer._extload import gpu_present
from envbuilder.consumer.record_check import check_files, expected_files, stamp_path
from envbuilder.errors import InputError
from envbuilder.lockfile.model import CompatLock, Entry

__all__ = [
    "Finding",
    "Installed",
    "ProbeRun",
    "check_environment",
    "inspect_environment",
    "installed",
    "installed_from_report",
    "match_entry",
    "run_probe",
    "start_probe",
    "summary",
]

Status = Literal["pass", "warn", "skip", "fail"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    name: str
    status: Status
    detail: str


@dataclass(frozen=True, kw_only=True)
class Installed:
    """What the environment has: Python ``major.minor`` and distributions by normalised name."""

    python: str
    versions: Mapping[str, str]
    records: Mapping[str, Path] = field(default_factory=dict)  # name -> its RECORD file
    markers: Mapping[str, str] | None = None  # PEP 508 values; None: this interpreter's
    prefix: str = sys.prefix  # where its doctor stamp lives
    executable: str = sys.executable


def _norm(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def installed_from_report(report: Mapping[str, Any]) -> Installed:
    """`Installed` from an `_envprobe` report; the first of a name on sys.path wins, as
    for imports."""
    versions: dict[str, str] = {}
    records: dict[str, Path] = {}
    for dist in report["distributions"]:
        key = _norm(dist["name"])
        if key in versions:
            continue
        versions[key] = dist["version"]
        if dist.get("record"):
            records[key] = Path(dist["record"])
    return Installed(
        python=report["python"],
        versions=versions,
        records=records,
        markers=dict(report["markers"]),
        prefix=report["prefix"],
        executable=report["executable"],
    )


def installed() -> Installed:
    """The running environment."""
    return installed_from_report(_envprobe.report())


def _run_file(
    python: str, script: Path, timeout: float, args: Sequence[str] = ()
) -> subprocess.CompletedProcess[str] | str:
    """Run *script* by path in *python*, with neither the script's directory nor the working
    directory on ``sys.path`` (no ``-P`` before 3.11): a file there cannot shadow a module."""
    boot = (
        "import runpy, sys; del sys.path[0]; script = sys.argv.pop(1); "
        "runpy.run_path(script, run_name='__main__')"
    )
    try:
        return subprocess.run(
            [python, "-c", boot, str(script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"it did not finish in {timeout:.0f}s"
    except OSError as e:
        return f"it did not start ({e.strerror or e})"


def inspect_environment(python: str, timeout: float = 120) -> Installed:
    """The environment of the interpreter *python*, by running `_envprobe` in it."""
    proc = _run_file(python, Path(_envprobe.__file__), timeout)
    if isinstance(proc, str):
        raise InputError(f"{python}: cannot inspect the environment: {proc}")
    lines = proc.stdout.strip().splitlines()
    try:
        if proc.returncode != 0 or not lines:
            raise ValueError(f"exited with status {proc.returncode}")
        report = json.loads(lines[-1])
        if report.get("schema") != _envprobe.SCHEMA:
            raise ValueError(f"printed no {_envprobe.SCHEMA} report")
        return installed_from_report(report)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise InputError(
            f"{python}: cannot inspect the environment: the interpreter {e}"
            + (f" ({' / '.join(tail)})" if tail else "")
            + "; give a Python 3.10 or newer of the environment to check, e.g. .venv/bin/python"
        ) from e


def _same_version(installed_version: str | None, locked: str | None) -> bool:
    from packaging.version import InvalidVersion, Version

    if installed_version is None or locked is None:
        return installed_version == locked
    try:
        return Version(installed_version) == Version(locked)
    except InvalidVersion:
        return installed_version == locked


def _applies(marker: str | None, env: Installed) -> bool:
    if not marker:
        return True
    from packaging.markers import Marker

    return Marker(marker).evaluate(None if env.markers is None else dict(env.markers))


def _score(entry: Entry, env: Installed) -> int:
    return sum(
        _same_version(env.versions.get(_norm(p.name)), p.version)
        for p in entry.packages
        if _applies(p.marker, env)
    )


def match_entry(lock: CompatLock, env: Installed) -> Entry | None:
    """The entry for this environment: same Python, torch and xformers; ties go to the one
    whose locked packages match the most installed versions."""
    torch = env.versions.get("torch")
    xformers = env.versions.get("xformers")
    candidates = [
        e
        for e in lock.combinations
        if e.python == env.python
        and e.torch is not None
        and torch is not None
        and (_same_version(torch, e.torch) or torch.split("+")[0] == e.torch)
        and (e.xformers is None) == (xformers is None)
        and (e.xformers is None or _same_version(xformers, e.xformers))
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda e: (_score(e, env), e.id))


def _verdict_finding(entry: Entry) -> Finding:
    v = entry.verdict
    status: Status = {
        "verified": "pass",
        "verified-with-workaround": "warn",
        "xformers-unusable": "warn",
        "unverified": "warn",
    }.get(v.verdict, "fail")  # type: ignore[assignment]
    extra = f" (workarounds: {', '.join(v.workarounds)})" if v.workarounds else ""
    per_use = ", ".join(f"{u.use} {u.verdict.verdict}" for u in entry.uses)
    return Finding(
        name="verdict", status=status, detail=f"{v.verdict}: {v.reason}{extra}; per use: {per_use}"
    )


def _advisory_findings(entry: Entry, env: Installed) -> list[Finding]:
    """Per library the row does not pin but whose own verdict is short of verified: a warning
    where this environment has it (naming a version other than the one measured), a pass
    where it does not; never a failure (the row's verdict is made without it)."""
    from envbuilder.consumer.advice import advisories, advisory_line

    found = []
    for item in advisories(entry.verdict):
        here = env.versions.get(_norm(item.library))
        line = advisory_line(entry, item, width=400)
        if here is None:
            status: Status = "pass"
            detail = f"{item.library} is not installed here, so this does not apply: {line}"
        else:
            status = "warn"
            other = (
                f" (measured on {item.version})"
                if item.version is not None and here != item.version
                else ""
            )
            detail = f"{item.library} {here} is installed here{other}: {line}"
        found.append(Finding(name=f"advisory:{item.library}", status=status, detail=detail))
    return found


def _versions(entry: Entry, env: Installed) -> Finding:
    problems = []
    pins = [p for p in entry.packages if _applies(p.marker, env)]
    for pin in pins:
        have = env.versions.get(_norm(pin.name))
        if have is None:
            problems.append(f"{pin.name} missing (locked {pin.version})")
        elif not _same_version(have, pin.version):
            problems.append(f"{pin.name} {have} (locked {pin.version})")
    if problems:
        return Finding(name="versions", status="fail", detail="; ".join(problems))
    return Finding(name="versions", status="pass", detail=f"all {len(pins)} locked packages match")


def _hashes(entry: Entry, env: Installed, *, stamp: Path | None, rehash: bool) -> Iterable[Finding]:
    """Installed files against each distribution's RECORD (`record_check`: parallel, and
    remembered in *stamp*), and the wheel's own sha256 against the lock where the installer
    kept it (``direct_url.json``). The distributions are *env*'s, found by their RECORD."""
    dists: list[metadata.Distribution] = []
    wheel_ok, wheel_bad = 0, []
    for pin in entry.packages:
        record = env.records.get(_norm(pin.name))
        if record is None:
            continue
        dist = metadata.PathDistribution(record.parent)
        dists.append(dist)
        direct = dist.read_text("direct_url.json")
        if direct:
            try:
                hashes = json.loads(direct).get("archive_info", {}).get("hashes", {})
            except json.JSONDecodeError:
                hashes = {}
            sha = hashes.get("sha256")
            if sha:
                if sha in {h for _, h in pin.wheels}:
                    wheel_ok += 1
                else:
                    wheel_bad.append(f"{pin.name} was installed from a wheel with sha256 {sha}")
    result = check_files(expected_files(dists), stamp=stamp, rehash=rehash)
    cost = (
        f"{result.hashed} hashed, {result.reused} unchanged since the last check,"
        f" {result.seconds:.1f} s"
    )
    if rehash:
        cost += "; --rehash: nothing taken from the stamp"
    if result.note:
        cost += f"; {result.note}"
    if result.problems:
        bad = result.problems
        shown = "; ".join(bad[:5]) + (f"; … {len(bad) - 5} more" if len(bad) > 5 else "")
        yield Finding(name="installed-files", status="fail", detail=f"{shown} ({cost})")
    else:
        yield Finding(
            name="installed-files",
            status="pass",
            detail=f"{result.checked} files match their RECORD ({cost})",
        )
    if wheel_bad:
        yield Finding(name="wheel-hashes", status="fail", detail="; ".join(wheel_bad))
    elif wheel_ok:
        yield Finding(
            name="wheel-hashes", status="pass", detail=f"{wheel_ok} wheels match the lock's sha256"
        )


def run_probe(
    python: str = sys.executable, timeout: float = 300, args: Sequence[str] = ()
) -> dict[str, Any]:
    """Run `_smoke`, by path, in the interpreter *python* and return its report."""
    return _report_of(_smoke, python, timeout, args)


def _report_of(
    script: Any, python: str, timeout: float, args: Sequence[str] = ()
) -> dict[str, Any]:
    proc = _run_file(python, Path(script.__file__), timeout, args)
    if isinstance(proc, str):
        return {"probe_error": f"the probe: {proc}"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {
            "probe_error": f"the probe exited with status {proc.returncode}: "
            + proc.stderr.strip()[-1500:]
        }
    report: dict[str, Any] = json.loads(lines[-1])
    return report


class ProbeRun:
    """The probe of *python*, running in the background (`start_probe`); `report` waits."""

    def __init__(
        self,
        python: str,
        *,
        full: bool,
        fast: bool = False,
        cache: Path | None = None,
        recheck: bool = False,
        timeout: float,
    ) -> None:
        self._report: dict[str, Any] = {}
        where = ["--cache", str(cache)] if cache is not None else []
        self._light_args = [*(["--fast"] if fast else []), *where]
        self._full_args = [*(["--recheck"] if recheck else []), *where]
        self._thread = threading.Thread(
            target=self._run, args=(python, full, fast, timeout), name="doctor-probe", daemon=True
        )
        self._thread.start()

    def _run(self, python: str, full: bool, fast: bool, timeout: float) -> None:
        seconds: dict[str, float] = {}
        # with a GPU device (and not --fast) the smoke test runs whatever the light probe
        # would find: it starts at once
        if not full and (fast or not gpu_present()):
            start = time.perf_counter()
            light = _report_of(_extload, python, timeout, self._light_args)
            seconds["light probe"] = round(time.perf_counter() - start, 3)
            if "probe_error" in light or not light_failed(light):
                self._report = {**light, "probe_seconds": seconds}
                return
        start = time.perf_counter()
        self._report = run_probe(python, timeout, self._full_args)
        seconds["full probe"] = round(time.perf_counter() - start, 3)
        self._report["probe_seconds"] = seconds

    def report(self) -> dict[str, Any]:
        self._thread.join()
        return self._report


def light_failed(report: Mapping[str, Any]) -> bool:
    """Whether the light probe found torch's or xformers' libraries not loading: only an
    import decides that, since ``import torch`` loads the CUDA runtimes of the ``nvidia-*``
    wheels beside it first (measured on an H200: xformers 0.0.35's extension needs
    ``libcudart.so.12``, which only ``nvidia-cuda-runtime-cu12`` brings; the light probe
    could not load it, ``import xformers.ops`` then did)."""
    xformers = report.get("xformers")
    return report.get("torch") is None or (
        isinstance(xformers, Mapping) and xformers.get("extension_loaded") is False
    )


def start_probe(
    python: str = sys.executable,
    *,
    full: bool = False,
    fast: bool = False,
    cache: Path | None = None,
    recheck: bool = False,
    timeout: float = 300,
) -> ProbeRun:
    """Start probing *python*: the light probe (`_extload`: torch's libraries and xformers'
    extension link, nothing imported), then the full one (`_smoke`: import and GPU smoke
    test) where it finds a GPU device (unless *fast*) or a library that does not load
    (`light_failed`), or at once when *full*. *cache* is the doctor's directory for the
    checks' record and torch's compile caches (default: beside the environment);
    *recheck* runs the compile checks even where their record holds."""
    return ProbeRun(python, full=full, fast=fast, cache=cache, recheck=recheck, timeout=timeout)


def _probe_findings(entry: Entry | None, report: Mapping[str, Any]) -> Iterable[Finding]:
    if "probe_error" in report:
        yield Finding(name="probe", status="fail", detail=report["probe_error"])
        return
    if report.get("torch") is None:
        why = report.get("torch_error") if report.get("light") else None
        yield Finding(name="torch", status="fail", detail=why or "torch is not importable here")
        return
    light = bool(report.get("light"))
    fast = bool(report.get("fast"))
    how = ""
    if light:
        how = "; its libraries load, not imported: " + ("--fast" if fast else "no GPU here")
    yield Finding(
        name="torch",
        status="pass",
        detail=f"torch {report['torch']} (CUDA {report.get('torch_cuda') or 'none'}{how})",
    )
    xf = report.get("xformers")
    if isinstance(xf, Mapping):
        if xf.get("error"):
            yield Finding(name="xformers-extension", status="fail", detail=xf["error"])
        elif xf.get("extension_loaded") is False:
            why = " ".join(xf.get("warnings") or []) or "xformers._has_cpp_library is False"
            yield Finding(name="xformers-extension", status="fail", detail=why)
        else:
            loaded = "links against torch's libraries" if light else "loaded"
            yield Finding(
                name="xformers-extension",
                status="pass",
                detail=f"xformers {xf.get('version')} C++/CUDA extension {loaded}",
            )
    if fast and report.get("gpu_error"):
        yield Finding(name="gpu", status="fail", detail=f"the driver: {report['gpu_error']}")
        return
    if not report.get("cuda_available"):
        seen = "no NVIDIA GPU device here" if light else "torch sees no CUDA GPU here"
        yield Finding(name="gpu-smoke", status="skip", detail=f"not run ({seen})")
        return
    where = f"{report.get('gpu')} (sm_{str(report.get('compute_capability', '')).replace('.', '')})"
    if light:
        driver = f", driver {report['driver']}" if report.get("driver") else ""
        yield Finding(name="gpu", status="pass", detail=f"{where}{driver}, asked of the driver")
    cache: Mapping[str, Any] = report.get("cache") or {}
    if light and not cache.get("reused"):
        yield Finding(
            name="gpu-checks",
            status="warn",
            detail=f"not run (--fast) and no earlier result holds ({cache.get('why')}):"
            " run envbuilder doctor without --fast once",
        )
    sdpa_compiles = report.get("compile_sdpa", {}).get("status") == "pass"
    # the lockfile already says compiling xformers directly fails here when it verified a
    # workaround for it: the disabled call keeps xformers, SDPA under compile replaces it
    verified = set(entry.verdict.workarounds) if entry is not None else set()
    verified |= {o.workaround for o in entry.verdict.options} if entry is not None else set()
    expected = (
        "the lockfile verifies the xformers call under torch.compiler.disable"
        if "dynamo-disable" in verified
        else "the lockfile verifies SDPA under compile"
        if "sdpa-under-compile" in verified and sdpa_compiles
        else None
    )
    for key in ("attention_sdpa", "attention_xformers", "compile_sdpa", "compile_xformers"):
        if key not in report:
            continue
        outcome = report[key]
        since = _since(outcome, cache, compiled=key.startswith("compile"))
        if outcome["status"] == "pass":
            detail = f"on {where}: max abs error {outcome['max_abs_error']:.2g}{since}"
            yield Finding(name=key.replace("_", "-"), status="pass", detail=detail)
            continue
        status: Status = "fail"
        detail = f"on {where}: {outcome['error']}{since}"
        if key == "compile_xformers" and expected is not None:
            status, detail = "warn", f"{detail} (expected: {expected})"
        yield Finding(name=key.replace("_", "-"), status=status, detail=detail)


def _since(outcome: Mapping[str, Any], cache: Mapping[str, Any], *, compiled: bool) -> str:
    """How a GPU check's result was come by: reused from its record, or run because what
    it depends on changed."""
    if outcome.get("from"):
        return (
            f" (measured {outcome['from']}; torch, xformers, CUDA libraries, GPU, driver,"
            " settings and the check unchanged since)"
        )
    if compiled and cache.get("changed"):
        return f" (run again: {', '.join(cache['changed'])} changed)"
    return ""


def _runtime_hint(
    entry: Entry | None, env: Installed, findings: Iterable[Finding]
) -> Iterable[Finding]:
    """A ``-cudart`` combination whose extension did not load: say the ``LD_LIBRARY_PATH``
    (prepended) that lets it find the runtime the lock adds; where that directory is not
    there, that the runtime is not installed and how to install it."""
    from dataclasses import replace

    from envbuilder.consumer.install import on_windows, runtime_line
    from envbuilder.target import library_path

    for f in findings:
        if entry is None or f.name != "xformers-extension" or f.status != "fail":
            yield f
            continue
        line = runtime_line(entry, env.prefix)
        windows = on_windows(entry)
        dirs = library_path(
            entry.extra_runtime, python=entry.python, venv=env.prefix, windows=windows
        ).split(";" if windows else ":")
        absent = [d for d in dirs if d and not Path(d).is_dir()]
        if line and absent:
            runtimes = ", ".join(entry.extra_runtime)
            line = (
                f"the CUDA runtime {entry.id} adds ({runtimes}) is not installed here "
                f"(no {absent[0]}): `envbuilder install {entry.id}` installs it"
            )
        if line:
            f = replace(f, detail=f"{f.detail}; {line.removeprefix('! ')}")
        yield f


def check_environment(
    lock: CompatLock,
    *,
    env: Installed | None = None,
    probe: Mapping[str, Any] | ProbeRun | None = None,
    hashes: bool = True,
    rehash: bool = False,
    stamp: Path | None = None,
) -> tuple[Entry | None, list[Finding]]:
    """Every finding for *env* (default: the running environment). *probe* is `run_probe`'s
    report, or a `start_probe` still running, waited for after the hashing (None: not run). File hashes are remembered in *stamp* (default: in *env*, see
    `record_check`); *rehash* ignores what it remembers."""
    env = env if env is not None else installed()
    findings: list[Finding] = []
    torch = env.versions.get("torch")
    entry = match_entry(lock, env)
    described = (
        f"Python {env.python}, torch {torch or 'not installed'}, "
        f"xformers {env.versions.get('xformers') or 'not installed'}"
    )
    if entry is None:
        findings.append(
            Finding(
                name="combination",
                status="fail",
                detail=f"no combination in the lockfile matches this environment ({described})",
            )
        )
        nothing = "not run (no combination to compare with)"
        findings.append(Finding(name="versions", status="skip", detail=nothing))
        findings.append(Finding(name="installed-files", status="skip", detail=nothing))
    else:
        findings.append(
            Finding(name="combination", status="pass", detail=f"{entry.id} ({described})")
        )
        findings.append(_verdict_finding(entry))
        findings += _advisory_findings(entry, env)
        findings.append(_versions(entry, env))
        if hashes:
            where = stamp if stamp is not None else stamp_path(env.prefix)
            findings += _hashes(entry, env, stamp=where, rehash=rehash)
        else:
            findings.append(Finding(name="installed-files", status="skip", detail=NOT_HASHED))
    if probe is not None:
        report = probe.report() if isinstance(probe, ProbeRun) else probe
        findings += _runtime_hint(entry, env, _probe_findings(entry, report))
    else:
        findings.append(Finding(name="probe", status="skip", detail=NOT_PROBED))
    return entry, findings


NOT_HASHED = "not run (--no-hashes)"
NOT_PROBED = "not run (--no-probe): torch, xformers' extension and the GPU smoke test"

#: How the summary names a finding.
LABELS = {
    "gpu": "GPU",
    "gpu-checks": "GPU checks",
    "gpu-smoke": "GPU smoke",
    "installed-files": "file hashes",
    "versions": "versions",
    "wheel-hashes": "wheel hashes",
    "xformers-extension": "xformers extension",
    "probe": "probe",
}


def summary(findings: Sequence[Finding]) -> list[str]:
    """What passed, what only warned, what failed and what was not checked, one line each
    (lines with nothing to list are left out)."""
    lines = []
    for status, title in (
        ("pass", "passed"),
        ("warn", "warnings"),
        ("fail", "failed"),
    ):
        names = [LABELS.get(f.name, f.name) for f in findings if f.status == status]
        if names:
            lines.append(f"{title}: {', '.join(names)}")
    skipped = [f"{LABELS.get(f.name, f.name)}: {f.detail}" for f in findings if f.status == "skip"]
    if skipped:
        lines.append(f"not checked: {'; '.join(skipped)}")
    return lines
