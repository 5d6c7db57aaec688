"""When the doctor's GPU checks run again, and what it says when they do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envbuilder.consumer import _checkcache
from envbuilder.consumer.doctor import _probe_findings

KEY = {
    "python": "3.12.3 at /env/bin/python",
    "package:torch": "2.11.0+cu130; RECORD 0123456789abcdef",
    "package:xformers": "0.0.35; RECORD fedcba9876543210",
    "gpu": "NVIDIA H200 (compute capability 9.0)",
    "driver": "580.95.05 (CUDA 13.0)",
    "settings": "",
    "checks": "c0ffee",
}
PASSED = {"status": "pass", "max_abs_error": 0.0005}
RESULTS = {name: PASSED for name in _checkcache.CHECKS}


@pytest.mark.parametrize(
    ("edit", "changed"),
    [
        ({}, []),
        ({"package:torch": "2.11.0+cu130; RECORD 1111111111111111"}, ["torch"]),
        ({"driver": "590.10 (CUDA 13.1)", "gpu": "NVIDIA H100 (compute capability 9.0)"}, ["driver", "gpu"]),
        ({"package:triton": "3.6.0; RECORD 2222222222222222"}, ["triton"]),
        ({"checks": "decaf"}, ["checks"]),
        ({"settings": "TORCHINDUCTOR_MAX_AUTOTUNE=1"}, ["settings"]),
    ],
)  # fmt: skip
def test_a_record_holds_until_what_the_checks_depend_on_changes(
    tmp_path: Path, edit: dict[str, str], changed: list[str]
) -> None:
    assert _checkcache.write_record(tmp_path, KEY, {**RESULTS, "torch": "2.11.0"}) == ""
    record = _checkcache.read_record(tmp_path)
    results, said = _checkcache.reuse(record, {**KEY, **edit}, recheck=False)
    assert said["changed"] == changed
    assert said["reused"] is (not changed)
    assert results == (None if changed else RESULTS)  # only the checks are kept


def test_recheck_and_a_missing_or_foreign_record_run_the_checks(tmp_path: Path) -> None:
    assert _checkcache.reuse(None, KEY, recheck=False) == (
        None,
        {"reused": False, "why": "no earlier result here"},
    )
    _checkcache.write_record(tmp_path, KEY, RESULTS)
    record = _checkcache.read_record(tmp_path)
    assert _checkcache.reuse(record, KEY, recheck=True)[0] is None
    (tmp_path / _checkcache.RECORD_NAME).write_text('{"schema": "other/1"}')
    assert _checkcache.read_record(tmp_path) is None


def test_settings_leave_out_the_caches_the_doctor_sets() -> None:
    environ = {
        "TORCHINDUCTOR_CACHE_DIR": "/a",
        "TRITON_CACHE_DIR": "/b",
        "TORCH_LOGS": "dynamo",
        "CUDA_VISIBLE_DEVICES": "1",
        "HOME": "/root",
    }
    assert _checkcache.settings_part(environ) == "CUDA_VISIBLE_DEVICES=1;TORCH_LOGS=dynamo"


def test_the_cache_falls_back_to_the_users_cache_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "env"
    prefix.mkdir()
    prefix.chmod(0o500)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        found = _checkcache.cache_dir(str(prefix))
    finally:
        prefix.chmod(0o700)
    import os

    if os.geteuid() == 0:  # root writes anywhere: the environment's own directory
        assert found == prefix / ".envbuilder-doctor"
    else:
        assert found is not None and found.parent == tmp_path / "cache" / "envbuilder" / "doctor"


GPU: dict[str, Any] = {
    "torch": "2.11.0+cu130",
    "torch_cuda": "13.0",
    "cuda_available": True,
    "gpu": "NVIDIA H200",
    "compute_capability": "9.0",
    "xformers": {"version": "0.0.35", "extension_loaded": True, "warnings": []},
}


def _said(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f.name, f.status, f.detail) for f in _probe_findings(None, report)]


def test_reused_compile_results_say_when_they_were_measured() -> None:
    report = {
        **GPU,
        "attention_sdpa": PASSED,
        "compile_sdpa": {**PASSED, "from": "2026-12-04T22:00:00Z"},
        "cache": {"reused": True, "at": "2026-12-04T22:00:00Z", "changed": []},
    }
    assert _said(report)[-2:] == [
        ("attention-sdpa", "pass", "on NVIDIA H200 (sm_90): max abs error 0.0005"),
        (
            "compile-sdpa",
            "pass",
            "on NVIDIA H200 (sm_90): max abs error 0.0005 (measured 2026-12-04T22:00:00Z;"
            " torch, xformers, CUDA libraries, GPU, driver, settings and the check unchanged"
            " since)",
        ),
    ]


def test_compile_checks_run_again_say_what_changed() -> None:
    report = {
        **GPU,
        "attention_sdpa": PASSED,
        "compile_sdpa": PASSED,
        "cache": {"reused": False, "changed": ["driver", "torch"], "why": "..."},
    }
    assert _said(report)[-2:] == [
        ("attention-sdpa", "pass", "on NVIDIA H200 (sm_90): max abs error 0.0005"),
        (
            "compile-sdpa",
            "pass",
            "on NVIDIA H200 (sm_90): max abs error 0.0005 (run again: driver, torch changed)",
        ),
    ]


FAST = {**GPU, "light": True, "fast": True, "gpu_present": True, "driver": "580.95.05"}


def test_fast_names_the_gpu_and_warns_where_no_result_holds() -> None:
    report = {
        **FAST,
        "cache": {"reused": False, "changed": ["torch"], "why": "changed since X: torch"},
    }
    assert _said(report) == [
        ("torch", "pass", "torch 2.11.0+cu130 (CUDA 13.0; its libraries load, not imported: --fast)"),
        ("xformers-extension", "pass", "xformers 0.0.35 C++/CUDA extension links against torch's libraries"),
        ("gpu", "pass", "NVIDIA H200 (sm_90), driver 580.95.05, asked of the driver"),
        ("gpu-checks", "warn", "not run (--fast) and no earlier result holds (changed since X: torch):"
         " run envbuilder doctor without --fast once"),
    ]  # fmt: skip


def test_fast_fails_where_the_driver_cannot_answer() -> None:
    report = {**FAST, "cuda_available": False, "gpu_error": "cuInit failed (CUDA driver error 999)"}
    assert _said(report)[-1] == (
        "gpu",
        "fail",
        "the driver: cuInit failed (CUDA driver error 999)",
    )
