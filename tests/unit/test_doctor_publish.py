"""doctor's findings for a given environment and probe report; the site's content."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from envbuilder.consumer.doctor import (
    Finding,
    Installed,
    check_environment,
    installed_from_report,
    summary,
)
from envbuilder.lockfile.model import USES, CompatLock, RejectedResults
from envbuilder.publish.site import html_page, markdown_table

DATA = Path(__file__).parents[1] / "data"


GOOD = {"torch": "2.5.1", "xformers": "0.0.28.post3", "filelock": "3.16.1"}
GPU_OK: dict[str, Any] = {
    "torch": "2.5.1",
    "torch_cuda": "12.4",
    "cuda_available": True,
    "gpu": "NVIDIA H200",
    "compute_capability": "9.0",
    "xformers": {"version": "0.0.28.post3", "extension_loaded": True, "warnings": []},
    "attention_sdpa": {"status": "pass", "max_abs_error": 0.0004},
    "attention_xformers": {"status": "pass", "max_abs_error": 0.0005},
    "compile_sdpa": {"status": "pass", "max_abs_error": 0.0004},
    "compile_xformers": {"status": "pass", "max_abs_error": 0.0005},
}


def statuses(
    compat: CompatLock, python: str, versions: Mapping[str, str], probe: Mapping[str, Any] | None
) -> tuple[str | None, dict[str, str]]:
    entry, findings = check_environment(
        compat, env=Installed(python=python, versions=versions), probe=probe, hashes=False
    )
    return (entry.id if entry else None), {f.name: f.status for f in findings}


@pytest.mark.parametrize(
    ("python", "versions", "probe", "combination", "expected"),
    [
        (
            "3.11",
            GOOD,
            GPU_OK,
            "py3.11-default-torch2.5.1-xformers0.0.28.post3",
            {
                "combination": "pass",
                "verdict": "pass",
                "versions": "pass",
                "installed-files": "skip",
                "torch": "pass",
                "xformers-extension": "pass",
                "attention-sdpa": "pass",
                "attention-xformers": "pass",
                "compile-sdpa": "pass",
                "compile-xformers": "pass",
            },
        ),
        (  # a local version label still matches; a wrong dependency version fails
            "3.11",
            {**GOOD, "torch": "2.5.1+cu124", "filelock": "3.0"},
            None,
            "py3.11-default-torch2.5.1-xformers0.0.28.post3",
            {
                "combination": "pass",
                "verdict": "pass",
                "versions": "fail",
                "installed-files": "skip",
                "probe": "skip",
            },
        ),
        (  # no such combination
            "3.12",
            GOOD,
            None,
            None,
            {
                "combination": "fail",
                "versions": "skip",
                "installed-files": "skip",
                "probe": "skip",
            },
        ),
        (  # the extension did not load; no GPU here
            "3.11",
            GOOD,
            {
                **GPU_OK,
                "cuda_available": False,
                "xformers": {
                    "version": "0.0.28.post3",
                    "extension_loaded": False,
                    "warnings": ["xFormers can't load C++/CUDA extensions"],
                },
            },
            "py3.11-default-torch2.5.1-xformers0.0.28.post3",
            {
                "combination": "pass",
                "verdict": "pass",
                "versions": "pass",
                "installed-files": "skip",
                "torch": "pass",
                "xformers-extension": "fail",
                "gpu-smoke": "skip",
            },
        ),
        (  # xformers under compile fails where the lockfile verified a workaround for it
            "3.11",
            {**GOOD, "torch": "2.6.0", "xformers": "0.0.29.post3"},
            {**GPU_OK, "compile_xformers": {"status": "fail", "error": "graph break"}},
            "py3.11-default-torch2.6.0-xformers0.0.29.post3",
            {
                "combination": "pass",
                "verdict": "warn",
                "versions": "pass",
                "installed-files": "skip",
                "torch": "pass",
                "xformers-extension": "pass",
                "attention-sdpa": "pass",
                "attention-xformers": "pass",
                "compile-sdpa": "pass",
                "compile-xformers": "warn",
            },
        ),
        (  # a combination the lockfile calls broken fails the doctor
            "3.10",
            {"torch": "2.4.1", "xformers": "0.0.28.post1", "filelock": "3.16.1"},
            {"torch": None},
            "py3.10-default-torch2.4.1-xformers0.0.28.post1",
            {
                "combination": "pass",
                "verdict": "fail",
                "versions": "pass",
                "installed-files": "skip",
                "torch": "fail",
            },
        ),
        (  # the probe crashed
            "3.11",
            GOOD,
            {"probe_error": "the probe exited with status -11"},
            "py3.11-default-torch2.5.1-xformers0.0.28.post3",
            {
                "combination": "pass",
                "verdict": "pass",
                "versions": "pass",
                "installed-files": "skip",
                "probe": "fail",
            },
        ),
    ],
)
def test_doctor_findings(
    compat: CompatLock,
    python: str,
    versions: Mapping[str, str],
    probe: Mapping[str, Any] | None,
    combination: str | None,
    expected: dict[str, str],
) -> None:
    assert statuses(compat, python, versions, probe) == (combination, expected)


@pytest.mark.parametrize(
    ("versions", "status", "says"),
    [
        # the lockfile verified the xformers call under torch.compiler.disable: expected
        (
            {**GOOD, "torch": "2.6.0", "xformers": "0.0.29.post3"},
            "warn",
            "graph break (expected: the lockfile verifies the xformers call under "
            "torch.compiler.disable)",
        ),
        # verified without any workaround: a failure here is news
        (GOOD, "fail", "graph break"),
    ],
)
def test_a_compile_failure_is_expected_only_where_a_workaround_is_verified(
    compat: CompatLock, versions: Mapping[str, str], status: str, says: str
) -> None:
    probe = {**GPU_OK, "compile_xformers": {"status": "fail", "error": "graph break"}}
    _, findings = check_environment(
        compat,
        env=Installed(python="3.11", versions=versions),
        probe=probe,
        hashes=False,
    )
    (finding,) = [f for f in findings if f.name == "compile-xformers"]
    assert (finding.status, finding.detail) == (status, f"on NVIDIA H200 (sm_90): {says}")


def test_markdown_table_lists_every_combination_and_verdict(compat: CompatLock) -> None:
    table = markdown_table(compat, "ab" * 32)
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(compat.combinations)
    for entry, row in zip(compat.combinations, rows, strict=True):
        assert f"`{entry.id}`" in row and entry.verdict.verdict in row
        assert all(u in row for u in USES)
    assert "conflicting results" in table
    (row,) = [r for r in rows if "torch2.10.0" in r]
    assert "inference ✅ inference-compiled 🟡 training ✅ training-compiled ❌" in row


def test_html_page_is_self_contained_with_rows_filters_and_plots(compat: CompatLock) -> None:
    page = html_page(compat, "ab" * 32)
    assert page.count('<tr class="combo"') == len(compat.combinations)
    for key in ("python", "cuda", "gpu", "uses"):
        assert f'id="filter-{key}"' in page
    # every row has a cell per use, coloured by that use's verdict
    assert page.count('<td class="use v-') == len(USES) * len(compat.combinations)
    assert 'data-uses="inference inference-compiled training"' in page
    assert "<svg" in page and "xformers 1" in page  # the H100 speed bar of the verified one
    assert "envbuilder install py3.11-default-torch2.5.1-xformers0.0.28.post3" in page
    assert "envbuilder install py3.10-default" not in page  # broken ones get no install command
    # nothing is fetched from elsewhere: the only URL is the SVG namespace
    offline = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http://" not in offline and "https://" not in offline


HOSTILE = [
    # (text from a results file or the resolver, how compat.md must write it)
    ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
    ('<img src=x onerror="alert(1)">', '&lt;img src=x onerror="alert(1)"&gt;'),
    ("&lt;b&gt; stays text", "&amp;lt;b&amp;gt; stays text"),
    ("a | b", "a \\| b"),
    ("**bold** and _it_ and ~~gone~~", "\\*\\*bold\\*\\* and \\_it\\_ and \\~\\~gone\\~\\~"),
    ("[click](javascript:alert(1))", "\\[click\\](javascript:alert(1))"),
    ("![x](http://tracker.invalid/p.png)", "!\\[x\\](http://tracker.invalid/p.png)"),
    ("`code` and \\escape", "\\`code\\` and \\\\escape"),
    ("two\nlines\r\n| --- |", "two lines \\| --- \\|"),
]


@pytest.mark.parametrize(("text", "written"), HOSTILE)
def test_markdown_table_writes_text_from_results_literally(
    compat: CompatLock, text: str, written: str
) -> None:
    """A check's reason, a GPU's name, a resolver's reason or a rejected file's name never
    becomes HTML, a link or table structure in compat.md."""
    entry = compat.combinations[0]
    gpu = replace(entry.gpus[0], gpu=text)
    run = entry.runs[0]
    failing = set(entry.verdict.failing_checks)
    checks = tuple(
        replace(c, reason=text, numbers={**c.numbers, "cause": text}) if c.name in failing else c
        for c in run.checks
    )
    torch = entry.resolved.torch
    assert torch is not None
    hostile = replace(
        entry,
        # the resolver's reason is the action of an unsatisfiable combination
        verdict=replace(entry.verdict, verdict="unsatisfiable", reason=text),
        gpus=(gpu,),
        resolved=replace(entry.resolved, torch=replace(torch, version=text)),
        runs=(replace(run, checks=checks), *entry.runs[1:]),
    )
    lock = replace(
        compat,
        combinations=(hostile,),
        rejected_results=(RejectedResults(file=f"results/{text}.json", reason=text),),
    )
    table = markdown_table(lock, "ab" * 32, now=datetime(2026, 12, 2, tzinfo=UTC))
    (row,) = [line for line in table.splitlines() if line.startswith(f"| `{entry.id}`")]
    # what to do, the last cell
    assert row.endswith(f"| {written} (measured 2026-11-19, 13 days ago) |")
    # the failing checks' cause, under the table
    assert f"- 2 checks: {written} \\[undecided\\] repro: envbuilder repro " in table
    assert f"| {written} |" in row  # torch
    assert f"{written}: broken" in row  # the GPU
    cells = re.split(r"(?<!\\)\|", row)[1:-1]
    assert len(cells) == 9  # nothing in the text opened or closed a cell
    (rejected,) = [ln for ln in table.splitlines() if ln.startswith("- ") and "results/" in ln]
    assert rejected.endswith(f": {written}")
    # outside code spans (where everything is literal) no raw HTML and no link opens
    prose = re.sub(r"`[^`]*`", "", table)
    assert "<" not in prose and not re.search(r"(?<!\\)\[", prose)


def test_doctor_names_the_verdict_of_every_use(compat: CompatLock) -> None:
    """Broken for compiled training only: the finding fails and says which use is broken."""
    versions = {"torch": "2.10.0", "xformers": "0.0.34", "filelock": "3.16.1"}
    entry, findings = check_environment(
        compat, env=Installed(python="3.12", versions=versions), probe=None, hashes=False
    )
    assert entry is not None and entry.id == "py3.12-default-torch2.10.0-xformers0.0.34"
    (verdict,) = [f for f in findings if f.name == "verdict"]
    assert verdict.status == "fail"
    assert verdict.detail.startswith("broken: ")
    assert verdict.detail.endswith(
        "; per use: inference verified, inference-compiled verified-with-workaround, "
        "training verified, training-compiled broken"
    )


@pytest.mark.parametrize(
    ("findings", "lines"),
    [
        (
            [
                Finding(name="combination", status="pass", detail="x"),
                Finding(name="verdict", status="warn", detail="x"),
                Finding(name="installed-files", status="pass", detail="x"),
                Finding(name="xformers-extension", status="pass", detail="x"),
                Finding(name="gpu-smoke", status="skip", detail="not run (no GPU)"),
            ],
            [
                "passed: combination, file hashes, xformers extension",
                "warnings: verdict",
                "not checked: GPU smoke: not run (no GPU)",
            ],
        ),
        (
            [
                Finding(name="combination", status="fail", detail="x"),
                Finding(name="probe", status="skip", detail="not run (--no-probe)"),
            ],
            ["failed: combination", "not checked: probe: not run (--no-probe)"],
        ),
        ([], []),
    ],
)
def test_the_summary_says_what_passed_and_what_was_not_checked(
    findings: list[Finding], lines: list[str]
) -> None:
    assert summary(findings) == lines


def test_an_environment_is_read_from_its_probe_report(tmp_path: Path) -> None:
    report = {
        "schema": "envbuilder.env-probe/1",
        "python": "3.12",
        "executable": "/envs/a/bin/python",
        "prefix": "/envs/a",
        "markers": {"sys_platform": "linux", "python_version": "3.12"},
        "distributions": [
            {"name": "Torch", "version": "2.11.0", "record": "/envs/a/torch.dist-info/RECORD"},
            {"name": "torch", "version": "2.0.0", "record": "/elsewhere/RECORD"},  # shadowed
            {"name": "zope.interface", "version": "7", "record": None},
        ],
    }
    env = installed_from_report(report)
    assert env.versions == {"torch": "2.11.0", "zope-interface": "7"}
    assert env.records == {"torch": Path("/envs/a/torch.dist-info/RECORD")}
    assert (env.python, env.prefix, env.executable) == ("3.12", "/envs/a", "/envs/a/bin/python")
    assert env.markers == {"sys_platform": "linux", "python_version": "3.12"}


@pytest.mark.parametrize(
    ("markers", "versions", "expected"),
    [
        # the locked package applies only on Windows: another environment's markers decide
        ({"sys_platform": "linux"}, {"torch": "2.5.1"}, "pass"),
        ({"sys_platform": "win32"}, {"torch": "2.5.1"}, "fail"),
    ],
)
def test_markers_are_the_checked_environments(
    compat: CompatLock, markers: dict[str, str], versions: dict[str, str], expected: str
) -> None:
    entry = compat.by_id()["py3.11-default-torch2.9.0"]
    windows_only = replace(entry.packages[0], marker="sys_platform == 'win32'")
    pinned = replace(entry, packages=(windows_only, *entry.packages[1:]))
    lock = replace(compat, combinations=(pinned,))
    env = Installed(python="3.11", versions={**versions, "torch": "2.9.0"}, markers=markers)
    _, findings = check_environment(lock, env=env, probe=None, hashes=False)
    assert {f.name: f.status for f in findings}["versions"] == expected
