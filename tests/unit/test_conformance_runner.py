"""The runner's bookkeeping: what a dead or killed group leaves behind, selection, summary."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from envbuilder.conformance import GROUPS
from envbuilder.conformance._record import (
    CheckResult,
    Status,
    Workaround,
    append_jsonl,
    describe_error,
    matches,
    read_jsonl,
)
from envbuilder.conformance.runner import (
    GroupRun,
    SuiteResults,
    groups_for,
    pattern_problems,
    settle,
    summarize,
    unmatched_patterns,
    write_atomic,
)


def _meta(name: str, gate: bool = True) -> Mapping[str, Any]:
    return {"name": name, "gate": gate, "impl": "sdpa", "workaround": None}


PLAN = (_meta("attention.a"), _meta("attention.b"), _meta("attention.c", gate=False))


@pytest.mark.parametrize(
    ("started", "done", "exit_status", "expected", "restart"),
    [
        # killed at the time limit in b: b timeout, c not started
        (
            ("attention.a", "attention.b"),
            {"attention.a"},
            None,
            {"attention.b": "timeout", "attention.c": "skip"},
            False,
        ),
        # segfault in b: b error, restart for c
        (("attention.a", "attention.b"), {"attention.a"}, -11, {"attention.b": "error"}, True),
        # crash after the last check finished: nothing to record, nothing to rerun
        (
            ("attention.a", "attention.b", "attention.c"),
            {"attention.a", "attention.b", "attention.c"},
            1,
            {},
            False,
        ),
        # worker exited 0 but skipped c: recorded as not run
        (
            ("attention.a", "attention.b"),
            {"attention.a", "attention.b"},
            0,
            {"attention.c": "skip"},
            False,
        ),
    ],
)
def test_settle(
    started: tuple[str, ...],
    done: set[str],
    exit_status: int | None,
    expected: dict[str, str],
    restart: bool,
) -> None:
    run = GroupRun(
        plan=PLAN,
        started=started,
        unplanned={},
        done=frozenset(done),
        exit_status=exit_status,
        log_tail="boom",
    )
    records, again = settle("attention", run, limit_s=60, elapsed_s=10)
    assert {r.name: r.status for r in records} == expected
    assert again is restart
    for record in records:
        assert record.reason
        assert record.gate == (record.name != "attention.c")


def test_settle_names_the_signal() -> None:
    run = GroupRun(
        plan=PLAN,
        started=("attention.a",),
        unplanned={},
        done=frozenset(),
        exit_status=-11,
        log_tail="",
    )
    records, _ = settle("attention", run, limit_s=60, elapsed_s=1)
    assert "SIGSEGV" in records[0].reason


@pytest.mark.parametrize(
    ("check_limit_s", "elapsed_s", "expected", "restart", "words"),
    [
        # killed at its check's own limit: b timeout, the worker restarted for c
        (5.0, 10, {"attention.b": "timeout"}, True, "the check's time limit of 5s"),
        # the same once the group's time is spent: nothing restarted
        (5.0, 61, {"attention.b": "timeout"}, False, "the check's time limit of 5s"),
        # killed at the group's limit: b timeout, c not started
        (None, 61, {"attention.b": "timeout", "attention.c": "skip"}, False, "group's time limit"),
    ],
    ids=["check-limit", "check-limit-group-spent", "group-limit"],
)
def test_settle_a_check_past_its_own_limit(
    check_limit_s: float | None,
    elapsed_s: float,
    expected: dict[str, str],
    restart: bool,
    words: str,
) -> None:
    run = GroupRun(
        plan=PLAN,
        started=("attention.a", "attention.b"),
        unplanned={},
        done=frozenset({"attention.a"}),
        exit_status=None,
        log_tail="",
        check_limit_s=check_limit_s,
    )
    records, again = settle("attention", run, limit_s=60, elapsed_s=elapsed_s)
    assert {r.name: r.status for r in records} == expected
    assert again is restart
    assert words in records[0].reason


def test_settle_without_a_plan_records_the_group() -> None:
    run = GroupRun(
        plan=None,
        started=(),
        unplanned={},
        done=frozenset(),
        exit_status=1,
        log_tail="ImportError: torch",
    )
    records, again = settle("compile", run, limit_s=60, elapsed_s=1)
    assert [(r.name, r.status) for r in records] == [("compile.worker", "error")]
    assert "ImportError: torch" in records[0].reason
    assert again is False


def test_no_restart_once_time_is_up() -> None:
    run = GroupRun(
        plan=PLAN,
        started=("attention.a",),
        unplanned={},
        done=frozenset(),
        exit_status=-6,
        log_tail="",
    )
    _, again = settle("attention", run, limit_s=60, elapsed_s=61)
    assert again is False


@pytest.mark.parametrize(
    ("patterns", "groups"),
    [
        ((), GROUPS),
        (("attention",), ("attention",)),
        (("compile.*.dynamic.*", "environment.versions"), ("environment", "compile")),
        (("*.xformers.*",), GROUPS),
    ],
)
def test_groups_for(patterns: tuple[str, ...], groups: tuple[str, ...]) -> None:
    assert groups_for(patterns) == groups


@pytest.mark.parametrize(
    ("name", "patterns", "selected"),
    [
        ("attention.sdpa.none.bf16", (), True),
        ("attention.sdpa.none.bf16", ("attention",), True),
        ("attention.sdpa.none.bf16", ("attention.sdpa",), True),
        ("attention.sdpa.none.bf16", ("attention.sd",), False),
        ("attention.sdpa.none.bf16", ("*.bf16",), True),
        ("compile.sdpa.block.static.fullgraph", ("attention",), False),
    ],
)
def test_matches(name: str, patterns: tuple[str, ...], selected: bool) -> None:
    assert matches(name, patterns) is selected


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    append_jsonl(path, {"name": "a"})
    with path.open("a", encoding="utf-8") as f:
        f.write('{"name": "b", "sta')
    assert read_jsonl(path) == [{"name": "a"}]


def test_write_atomic_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out" / "results.json"
    write_atomic(target, "{}\n")
    write_atomic(target, '{"x": 1}\n')
    assert json.loads(target.read_text()) == {"x": 1}
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]


def test_write_atomic_gives_the_mode_the_umask_allows(tmp_path: Path) -> None:
    """Results are read by other users (the image's own, CI's): not mkstemp's 0600."""
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "results.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o644


def test_describe_error_keeps_xformers_reasons() -> None:
    message = (
        "No operator found for `memory_efficient_attention_forward` with inputs:\n"
        "     query       : shape=(2, 269, 4, 64) (torch.bfloat16)\n"
        "     attn_bias   : <class 'torch.Tensor'>\n"
        "`cutlassF-pt` is not supported because:\n"
        "    attn_bias.stride(-2) % 8 != 0\n"
    )
    text = describe_error(NotImplementedError(message))
    assert text.startswith("NotImplementedError: No operator found")
    assert "attn_bias.stride(-2) % 8 != 0" in text
    assert "query" not in text


def _result(
    name: str,
    status: Status,
    *,
    gate: bool = True,
    reason: str = "",
    workaround: Workaround | None = None,
    covers: str | None = None,
) -> CheckResult:
    return CheckResult(
        group=name.split(".", 1)[0],
        name=name,
        status=status,
        reason=reason,
        gate=gate,
        impl="sdpa",
        workaround=workaround,
        numbers={},
        duration_s=1.0,
        uses=("training-compiled",) if gate else (),
        covers=covers,
    )


def _results(*checks: CheckResult) -> SuiteResults:
    return SuiteResults(
        suite_version="2.0.0",
        combination="py3.11-cpu-torch2.13.0",
        lock_sha256=None,
        started="2026-12-01T00:00:00Z",
        finished="2026-12-01T00:01:00Z",
        runner={"torch": "2.13.0", "torch_cuda": None, "xformers": None, "gpus": []},
        checks=checks,
    )


def test_summary_lists_failed_direct_gates_with_their_workarounds() -> None:
    results = _results(
        _result("attention.sdpa.none.bf16.forward", "pass"),
        _result("compile.xformers.bias.x", "fail", reason="too far"),
        _result(
            "compile.xformers.bias.x.sdpa_under_compile",
            "pass",
            workaround="sdpa-under-compile",
            covers="compile.xformers.bias.x",
        ),
        _result("compile.xformers.padding.y", "invalid", reason="cannot tell"),
        _result("performance.y", "error", gate=False, reason="oops"),
    )
    text = summarize(results)
    assert "5 checks: 2 pass, 1 fail, 0 skip, 1 error, 0 timeout, 1 invalid" in text
    assert "compile.xformers.bias.x" in text and "too far" in text
    assert "compile.xformers.bias.x.sdpa_under_compile" in text
    assert "cannot tell" in text
    assert "performance.y" not in text
    assert [c.name for c in results.failed_direct_gates] == [
        "compile.xformers.bias.x",
        "compile.xformers.padding.y",
    ]


def test_results_round_trip_through_json_with_uses_and_covers() -> None:
    check = _result(
        "compile.xformers.bias.x.dynamo_disable",
        "invalid",
        reason="r",
        workaround="dynamo-disable",
        covers="compile.xformers.bias.x",
    )
    assert CheckResult.from_json(check.to_json()) == check
    assert check.to_json()["uses"] == ["training-compiled"]
    with pytest.raises(ValueError, match="unknown status 'broken'"):
        CheckResult.from_json({**check.to_json(), "status": "broken"})


def test_a_quick_run_starts_every_group_and_keeps_the_model_training_step() -> None:
    pytest.importorskip("torch")
    from envbuilder.conformance import FULL_ONLY_GROUPS
    from envbuilder.conformance import checks_model as model
    from envbuilder.conformance._context import Context

    assert frozenset() == FULL_ONLY_GROUPS
    specs = model.specs(Context(device="cuda:0", quick=True))
    assert sorted(s.name for s in specs if s.quick) == [
        "model.diffusers.qwenimage.sdpa.training.eager",
        "model.diffusers.qwenimage.xformers.training.eager",
    ]


@pytest.mark.parametrize(
    ("patterns", "problem"),
    [
        (("attention", "compile.xformers.*", "*.sdpa.*", "model.diffusers"), None),
        (("atention.sdpa",), "no check group 'atention' (did you mean 'attention'?)"),
        (("gpu",), "no check group 'gpu'; the groups are environment, attention"),
        (("",), "--checks ''"),
    ],
)
def test_pattern_problems(patterns: tuple[str, ...], problem: str | None) -> None:
    found = pattern_problems(patterns)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0]


def test_unmatched_patterns_names_only_those_that_selected_nothing() -> None:
    results = _results(
        _result("attention.sdpa.none.fp16", "pass"), _result("compile.sdpa.x", "pass")
    )
    assert unmatched_patterns(["attention.sdpa", "attention.sdpz", "*.sdpa.*"], results) == [
        "attention.sdpz"
    ]


def test_a_check_of_the_xformers_implementation_requires_xformers_and_cuda() -> None:
    from envbuilder.conformance._record import CheckSpec, Outcome

    def spec(impl: Any, needs: frozenset[str]) -> CheckSpec:
        return CheckSpec(
            name="g.c", gate=True, uses=("inference",), impl=impl, needs=needs, run=Outcome.passed
        )

    assert spec("xformers", frozenset({"cuda"})).requires == {"cuda", "xformers"}
    # xformers' kernels have no CPU implementation: a CPU run skips, never fails, them
    assert spec("xformers", frozenset()).requires == {"cuda", "xformers"}
    assert spec("sdpa", frozenset({"cuda"})).requires == {"cuda"}
    assert spec(None, frozenset()).requires == frozenset()


def test_results_name_files_relative_to_the_directory_they_were_imported_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from envbuilder.conformance import _record

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr("sys.path", ["", "/", str(site), str(tmp_path / "absent")])
    _record._import_roots.cache_clear()
    monkeypatch.setattr(_record, "_import_roots", _record._import_roots.__wrapped__)
    cause = f"OSError: Could not load this library: {site}/xformers/_C.so <- libcudart.so.12"
    result = _record.CheckResult(
        group="environment",
        name="environment.xformers.extension_loads",
        status="fail",
        reason=f"failed at {site}/xformers/ops/fmha/__init__.py",
        gate=True,
        impl="xformers",
        workaround=None,
        numbers={"cause": cause, "count": 3},
        duration_s=0.1,
    ).to_json()
    assert result["reason"] == "failed at xformers/ops/fmha/__init__.py"
    assert result["numbers"] == {
        "cause": "OSError: Could not load this library: xformers/_C.so <- libcudart.so.12",
        "count": 3,
    }
    assert _record.relative_paths("/usr/bin/python") == "/usr/bin/python"  # "/" is no root
