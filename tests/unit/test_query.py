"""Choosing combinations: GPU names, CUDA spellings, order, and the arch-list prediction."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from envbuilder.aggregate.results import accept, find_results
from envbuilder.consumer.advice import (
    LINE_WIDTH,
    action,
    age,
    cause_line,
    causes,
    column_widths,
    dated,
    one_line,
)
from envbuilder.consumer.query import Query, answer, asked_cuda, select
from envbuilder.consumer.query_text import render
from envbuilder.errors import InputError
from envbuilder.gpus import arch_covering, arch_covers, compute_capability
from envbuilder.lockfile.model import (
    USES,
    CompatLock,
    DriverTable,
    Entry,
    LockPointer,
    Run,
    Use,
    UseVerdict,
    Verdict,
    VerdictName,
    use_verdict,
)
from envbuilder.lockfile.verdicts import combination_use_verdicts, gpu_verdicts, overall
from envbuilder.model import ResolvedCombination
from tests.support.cells import cell

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize(
    ("gpu", "cc"),
    [
        ("sm90", "9.0"),
        ("sm_90", "9.0"),
        ("SM86", "8.6"),
        ("sm100", "10.0"),
        ("9.0", "9.0"),
        ("H100", "9.0"),
        ("h200", "9.0"),
        ("A100", "8.0"),
        ("L40S", "8.9"),
        ("RTX 4090", "8.9"),
        ("Quadro X9", "7.7"),  # not in the table: taken from what a runner recorded
    ],
)
def test_gpu_names(gpu: str, cc: str) -> None:
    assert compute_capability(gpu, [("NVIDIA Quadro X9", "7.7")]) == cc


def test_unknown_gpu_is_bad_input() -> None:
    with pytest.raises(InputError, match="unknown GPU 'Z9'"):
        compute_capability("Z9")


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("8.0 9.0", "9.0", True),
        ("8.0;9.0", "8.6", True),  # sm_80 machine code runs on later minors of its major
        ("8.6", "8.0", False),
        ("8.0 8.6+PTX", "9.0", True),
        ("9.0+PTX", "8.0", False),
        ("7.5 8.0", "10.0", False),
        ("9.0a", "9.0", True),  # arch-specific code, on its own capability
        ("9.0a", "10.0", False),
    ],
)
def test_arch_list_coverage(arch: str, cc: str, runs: bool) -> None:
    assert arch_covers(arch, cc) is runs


@pytest.mark.parametrize(
    ("arch", "cc", "by"),
    [
        ("7.5 8.0+PTX 8.0 9.0a", "9.0", "9.0a"),  # xformers 0.0.35's list on an H100
        ("7.5 8.0+PTX 8.0 9.0a", "8.9", "8.0"),  # machine code, no JIT on an L4
        ("7.5 8.0+PTX 8.0 9.0a", "10.0", "8.0+PTX"),  # a B200 runs it only by PTX JIT
    ],
)
def test_the_query_and_the_suite_read_coverage_alike(arch: str, cc: str, by: str) -> None:
    from envbuilder.conformance._archs import covering, parse_arch_list

    major, minor = (int(part) for part in cc.split("."))
    assert arch_covering(arch, cc) == covering(parse_arch_list(arch), (major, minor)) == by


@pytest.mark.parametrize(
    ("given", "normal"),
    [("12.1", "cu121"), ("cu124", "cu124"), ("CPU", "cpu"), ("13.0", "cu130"), (" CU121", "cu121")],
)
def test_cuda_spellings(given: str, normal: str) -> None:
    assert asked_cuda(given) == normal


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            Query(python="3.11"),
            [
                ("py3.11-default-torch2.5.1-xformers0.0.28.post3", "verified"),
                ("py3.11-default-torch2.6.0-xformers0.0.29.post3", "verified-with-workaround"),
                ("py3.11-default-torch2.9.0", "unverified"),
            ],
        ),
        (
            Query(torch="2.4"),
            [
                ("py3.10-default-torch2.4.1-xformers0.0.28.post1", "broken"),
                ("py3.13-default-torch2.4.1-xformers0.0.28.post1", "unsatisfiable"),
            ],
        ),
        (
            Query(cuda="12.4", xformers="0.0.30"),
            [
                ("py3.12-default-torch2.7.0-xformers0.0.30-cudart", "verified-with-workaround"),
            ],
        ),
        # on an H200 (sm_90): H100 runs count, A100-only results do not
        (
            Query(python="3.10", gpu="H200"),
            [
                (
                    "py3.10-default-torch2.4.1-xformers0.0.28.post1",
                    "broken",  # predicted: xformers built for 8.0 only
                ),
            ],
        ),
        (
            Query(python="3.11", gpu="sm80", torch="2.6"),
            [
                ("py3.11-default-torch2.6.0-xformers0.0.29.post3", "unverified"),
            ],
        ),
        (Query(python="3.9"), []),
    ],
)
def test_select(compat: CompatLock, query: Query, expected: list[tuple[str, str]]) -> None:
    assert [(m.entry.id, m.verdict.verdict) for m in select(compat, query)] == expected


PER_USE = "py3.12-default-torch2.10.0-xformers0.0.34"
CHEAPEST = "py3.12-default-torch2.11.0-xformers0.0.35"
CUDART = "py3.12-default-torch2.7.0-xformers0.0.30-cudart"
CONFLICT = "py3.12-default-torch2.8.0-xformers0.0.32.post2"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # overall: the worst use decides
        (
            Query(python="3.12"),
            [
                (CHEAPEST, "verified-with-workaround"),
                (CUDART, "verified-with-workaround"),
                (PER_USE, "broken"),
                (CONFLICT, "broken"),
            ],
        ),
        # by one use: that use's verdict decides the order and is the one shown
        (
            Query(python="3.12", use="training"),
            [
                (CHEAPEST, "verified"),
                (PER_USE, "verified"),
                (CUDART, "verified-with-workaround"),
                (CONFLICT, "broken"),
            ],
        ),
        (
            Query(python="3.12", use="training-compiled"),
            [
                (CHEAPEST, "verified-with-workaround"),
                (CUDART, "verified-with-workaround"),
                (PER_USE, "broken"),
                (CONFLICT, "broken"),
            ],
        ),
        (
            Query(python="3.12", torch="2.10", use="inference-compiled"),
            [(PER_USE, "verified-with-workaround")],
        ),
        # results/1 evidence speaks for every use
        (
            Query(python="3.11", torch="2.6", use="training-compiled"),
            [("py3.11-default-torch2.6.0-xformers0.0.29.post3", "verified-with-workaround")],
        ),
        # per use on a GPU: H100 runs count for an H200; none on an A100
        (
            Query(python="3.12", torch="2.10", gpu="H200", use="training-compiled"),
            [(PER_USE, "broken")],
        ),
        (
            Query(python="3.12", torch="2.10", gpu="A100", use="training"),
            [(PER_USE, "unverified")],
        ),
    ],
)
def test_select_by_use(compat: CompatLock, query: Query, expected: list[tuple[str, str]]) -> None:
    matches = select(compat, query)
    assert [(m.entry.id, m.verdict.verdict) for m in matches] == expected
    for m in matches:
        assert m.use == query.use
        assert [u.use for u in m.uses] == list(USES)
        if query.use is not None:
            assert use_verdict(m.uses, query.use) == m.verdict


def test_the_workaround_named_for_a_use_is_the_one_measured_for_it(compat: CompatLock) -> None:
    (match,) = select(compat, Query(torch="2.11", use="inference-compiled"))
    (choice,) = match.verdict.choices
    assert (choice.workaround, choice.graph_breaks, choice.step_ms) == ("dynamo-disable", 0, 1.2)
    (match,) = select(compat, Query(torch="2.11", use="training-compiled"))
    # the one that keeps xformers, though the replacement has fewer graph breaks: it is
    # the cheaper tier, so it is listed first too
    assert match.verdict.workarounds == ("dynamo-disable",)
    assert [o.workaround for o in match.verdict.options] == ["dynamo-disable", "sdpa-under-compile"]


# ---- one screen per answer, on the committed H200 results ------------------------------------

ROOT = Path(__file__).parents[2]
NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
#: a day after the committed H200 runs (2026-12-04): what their dates are read against
AFTER_RUNS = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
CUDART_H200 = "py3.12-cu130-torch2.11.0-xformers0.0.35-cudart"
ALONE_H200 = "py3.12-cu130-torch2.11.0"


def _entry(combo: ResolvedCombination, runs: tuple[Run, ...]) -> Entry:
    """What `lock` makes of a combination, without its pylock (not in the repository)."""
    gpus = gpu_verdicts(runs)
    uses = combination_use_verdicts(status=combo.status, resolver_reason=combo.reason, gpus=gpus)
    resolved = combo.status == "resolved"
    return Entry(
        resolved=combo,
        arch="x86_64",
        cuda_release="13.0",
        minimum_driver="580.65.06",
        lock=LockPointer(path=f"locks/{combo.id}.toml", sha256=combo.lock_sha256 or "")
        if resolved
        else None,
        packages=(),
        runs=runs,
        gpus=gpus,
        uses=uses,
        verdict=overall(uses) if gpus else uses[0].verdict,
    )


@pytest.fixture(scope="module")
def committed() -> CompatLock:
    """The lockfile of the repository's results/ (the H200 runs of the torch 2.11.0 rows)."""
    files = find_results([ROOT / "results"])
    shas = {}
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        shas[data["combination"]] = data["lock_sha256"]
    combos = {
        cid: ResolvedCombination(
            combination=cell(cid, python="3.12", cuda="cu130", torch="2.11.0"),
            status="resolved" if sha else "unsatisfiable",
            reason="" if sha else "xformers 0.0.35 is built for CUDA 12.8",
            lock_sha256=sha,
            extra_runtime=("nvidia-cuda-runtime-cu12==12.8.90",) if cid.endswith("cudart") else (),
        )
        for cid, sha in shas.items()
    }
    accepted = accept(files, combos, base=ROOT)
    assert not accepted.rejected
    entries = tuple(_entry(c, tuple(accepted.current.get(c.id, ()))) for c in combos.values())
    return CompatLock(
        generated_by="test",
        resolution={},
        combinations=tuple(sorted(entries, key=lambda e: e.id)),
        drivers=DriverTable(source="test", minimum={}),
    )


def _fits_one_screen(lines: list[str]) -> None:
    assert len(lines) <= 40
    assert max(len(line) for line in lines) <= 200


@pytest.mark.parametrize("use", [None, *USES])
def test_every_answer_fits_one_screen_on_the_committed_results(
    committed: CompatLock, use: Use | None
) -> None:
    # on a terminal LINE_WIDTH columns wide (a pipe gets up to 200)
    lines = render(answer(committed, Query(use=use)), use=use, now=AFTER_RUNS, width=LINE_WIDTH)
    _fits_one_screen(lines)
    assert all(len(line) <= LINE_WIDTH for line in lines[1:])
    rows = [line for line in lines[1:] if not line.startswith("! ")]
    assert len(rows) == len(committed.combinations)  # one line per combination
    # and each advisory of a library the rows do not pin once, below them
    advisories = lines[1 + len(rows) :]
    assert advisories == sorted(set(advisories), key=advisories.index)
    assert all(line.startswith("! ") for line in advisories)
    long = render(answer(committed, Query(use=use)), use=use, now=AFTER_RUNS, long=True)
    _fits_one_screen(long)


def test_compiled_training_says_xformers_is_unusable_and_names_the_torch_alone_row(
    committed: CompatLock,
) -> None:
    lines = render(
        answer(committed, Query(use="training-compiled")), use="training-compiled", now=AFTER_RUNS
    )
    (line,) = [ln for ln in lines if ln.split()[1] == CUDART_H200]
    assert line.startswith("xformers-unusable ")
    assert line.endswith(f"use {ALONE_H200} (verified)")
    assert re.search(r" \d+ \dd ago ", line)
    (alone,) = [ln for ln in lines if ln.split()[1] == ALONE_H200]
    assert alone.startswith("verified ") and alone.endswith("nothing to change")


def test_without_a_verified_torch_alone_row_the_action_is_the_cheapest_replacement(
    committed: CompatLock,
) -> None:
    unverified = tuple(
        UseVerdict(use=u, verdict=Verdict(verdict="unverified", reason="no results")) for u in USES
    )
    entries = tuple(
        replace(e, uses=unverified, verdict=unverified[0].verdict, runs=(), gpus=())
        if e.id == ALONE_H200
        else e
        for e in committed.combinations
    )
    (match,) = select(
        replace(committed, combinations=entries),
        Query(torch="2.11", xformers="0.0.35", use="training-compiled", cuda="cu130"),
    )[:1]
    assert match.verdict.verdict == "xformers-unusable"
    assert match.replacement is None
    assert action(match.verdict).startswith(
        "use SDPA in xformers' place under torch.compile (0 graph breaks"
    )


def test_failing_checks_are_grouped_by_cause(committed: CompatLock) -> None:
    entry = committed.by_id()[CUDART_H200]
    verdict = use_verdict(entry.uses, "training-compiled")
    found = causes(entry, verdict)
    # one line per cause, not per check; every failing check in exactly one
    assert sum(len(c.checks) for c in found) == len(verdict.failing_checks)
    assert len(found) < len(verdict.failing_checks) / 4
    biggest = found[0]
    # tensor bias and padding mask, compiled with backward: the fake-tensor device error in
    # torch's backward op; the model's compiled step went through diffusers, not in here
    assert len(biggest.checks) == 24
    assert all(n.startswith("compile.") and n.endswith(".backward") for n in biggest.checks)
    assert {n.split(".")[2] for n in biggest.checks} == {"bias", "bias_expanded", "padding"}
    assert biggest.text == "FakeTensor device propagation in aten._efficient_attention_backward"
    assert biggest.workarounds == ("sdpa-under-compile",)  # the only one on all 24
    # the disabled call passes the 12 fullgraph ones; on the 12 nobreaks ones it leaves the
    # very graph break they failed for, so it is no fix there (counted within this cause)
    assert biggest.partial == (("dynamo-disable", 12),)
    assert biggest.repro == f"envbuilder repro {biggest.checks[0]}"
    # the causal fullgraph ones also pass with the disabled call: it keeps xformers
    causal = [c for c in found if all(".causal." in n and ".fullgraph." in n for n in c.checks)]
    assert causal and all("dynamo-disable" in c.workarounds for c in causal)
    line = cause_line(biggest)
    assert len(line) <= 200 and line.endswith(biggest.repro)
    assert "(ok with sdpa-under-compile; dynamo-disable on 12 of 24)" in line
    # the model's step is diffusers' advisory's cause, with its own fix
    (advisory,) = verdict.advisories
    (model,) = causes(entry, advisory.verdict)
    assert model.checks == ("model.diffusers.qwenimage.xformers.training.compiled",)
    assert model.workarounds == ("sdpa-under-compile",)


def test_a_cause_is_grouped_with_who_an_experiment_found_at_fault(
    committed: CompatLock,
) -> None:
    entry = committed.by_id()[CUDART_H200]
    verdict = use_verdict(entry.uses, "training-compiled")
    # suite 3.0.0 decided every direct cause by experiment: xformers' glue, each of them
    assert {c.component for c in causes(entry, verdict)} == {"xformers"}
    (fake,) = [c for c in causes(entry, verdict) if c.text.startswith("FakeTensor")]
    assert fake.op == "aten._efficient_attention_backward" and fake.evidence
    # 200 columns: the text is cut at a word and the op, which has no room, is left to --json
    line = cause_line(fake)
    assert len(line) <= 200 and line.startswith("24 checks: FakeTensor device propagation in… ")
    # dynamo-disable fixes the fullgraph checks (dropping fullgraph), not the nobreaks ones
    assert " [xformers] (ok with sdpa-under-compile; dynamo-disable on 12 of 24) repro: " in line
    # who is at fault is part of the group: without its experiment a check is undecided
    run = max(entry.runs, key=lambda r: len(r.checks))
    untold = {"fault_component": "undecided", "fault_evidence": None}
    checks = tuple(
        replace(c, numbers={**c.numbers, **untold}) if ".static.fullgraph." in c.name else c
        for c in run.checks
    )
    moved = causes(replace(entry, runs=(replace(run, checks=checks),)), verdict)
    (undecided,) = [c for c in moved if c.text == fake.text and c.component == "undecided"]
    (rest,) = [c for c in moved if c.text == fake.text and c.component == "xformers"]
    assert len(undecided.checks) == 6 and len(rest.checks) == 18
    assert undecided.evidence is None and rest.evidence == fake.evidence
    # what works on part of a group is counted within it
    assert undecided.workarounds == ("dynamo-disable", "sdpa-under-compile")
    assert rest.partial == (("dynamo-disable", 6),)
    assert " [undecided] (ok with dynamo-disable, sdpa-under-compile) repro: " in cause_line(
        undecided
    )


@pytest.mark.parametrize(
    ("day", "words", "short"),
    [
        ("2026-12-02", "today", "today"),
        ("2026-12-01", "1 day ago", "1d ago"),
        ("2026-11-20", "12 days ago", "12d ago"),
        ("2026-06-01", "184 days ago", "6mo ago"),
        ("2026-12-09", "in the future", "future"),
    ],
)
def test_age(day: str, words: str, short: str) -> None:
    assert age(day, NOW) == words
    assert age(day, NOW, short=True) == short


def test_every_verdict_shows_its_date(committed: CompatLock) -> None:
    for m in answer(committed, Query()).matches:
        text = dated(m.entry, m.verdict, AFTER_RUNS)
        if m.entry.runs:
            assert re.fullmatch(r"measured 2026-1[12]-\d\d, \d+ days? ago", text)
        else:
            assert text in ("never run", "not resolvable")


@pytest.mark.parametrize(
    ("verdict", "reason", "todo"),
    [
        ("verified", "all 12 gate checks passed", "nothing to change"),
        (
            "unverified",
            "resolved; no conformance results yet",
            "not measured yet: choose a verified row",
        ),
        (
            "unverified",
            "on NVIDIA H100: resolved; no conformance results yet",
            "not measured yet: choose a verified row",
        ),
        # the stale evidence is the date's, not the action's
        (
            "unverified",
            "the lock changed since its last results; last verified 2026-11-12 on lock "
            "aaaaaaaaaaaa: verified (re-run the suite on the current lock)",
            "the lock changed since its last results",
        ),
        # the resolver's reason is the action, whole
        (
            "unsatisfiable",
            "no torch wheel for cp313; newest Python it supports is 3.12",
            "no torch wheel for cp313; newest Python it supports is 3.12",
        ),
        (
            "broken",
            "2 failing gate checks with no working workaround: …",
            "no workaround works (see the causes)",
        ),
    ],
)
def test_the_action_of_a_verdict_without_workarounds(
    verdict: VerdictName, reason: str, todo: str
) -> None:
    assert action(Verdict(verdict=verdict, reason=reason)) == todo


def test_the_one_line_stays_within_120_characters(compat: CompatLock) -> None:
    matches = answer(compat, Query()).matches
    lines = [one_line(m, NOW, **column_widths(matches, NOW)) for m in matches]
    assert all(len(line) <= LINE_WIDTH for line in lines)
    (cheap,) = [ln for ln in lines if f" {CHEAPEST} " in ln]
    # the overall verdict of a row kept with a disabled attention call: that is the action
    assert cheap.endswith(" wrap attn in torch.compiler.disable")


def test_a_compat_2_lockfile_is_still_read(compat: CompatLock, tmp_path: Path) -> None:
    """A /2 file (no ``options``, no ``xformers-unusable``) loads; its verdicts are made again
    from its runs by this envbuilder's rules, options included."""
    from envbuilder.lockfile.canonical import HASH_KEY, content_sha256
    from envbuilder.lockfile.read import load_lockfile

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "options"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    data = strip(compat.to_json())
    assert isinstance(data, dict)
    data["schema"] = "envbuilder.compat/2"
    data[HASH_KEY] = content_sha256(data)
    path = tmp_path / "compat.lock.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    old = load_lockfile(path)
    assert old.schema == "envbuilder.compat/2"
    assert [e.verdict.verdict for e in old.combinations] == [
        e.verdict.verdict for e in compat.combinations
    ]
    assert [e.verdict.options for e in old.combinations] == [
        e.verdict.options for e in compat.combinations
    ]


def test_install_refuses_an_xformers_unusable_row_naming_the_torch_alone_row(
    committed: CompatLock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from envbuilder.cli import main
    from envbuilder.lockfile.canonical import seal

    path = tmp_path / "compat.lock.json"
    path.write_bytes(seal(committed.to_json()))
    args = ["install", CUDART_H200, "--use", "training-compiled", "--dry-run", "--lock", str(path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        f"refusing to install {CUDART_H200!r}: it is xformers-unusable for training-compiled"
    ) in err
    assert (
        f"without xformers {ALONE_H200!r} is verified for training-compiled: "
        f"`envbuilder install {ALONE_H200}`; pass --allow-unverified"
    ) in err
