"""envbuilder lock and every reader of compat.lock.json, from the synthetic inputs in tests/data."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from envbuilder.aggregate.merge import build_lockfile
from envbuilder.aggregate.results import bind, documented_shape
from envbuilder.cli import main
from envbuilder.conformance._record import legacy_via
from envbuilder.errors import InputError
from envbuilder.lockfile.canonical import seal
from envbuilder.lockfile.model import (
    COMPAT_SCHEMA,
    USES,
    VERDICTS,
    CompatLock,
    Entry,
    RetiredEntry,
    use_verdict,
)
from envbuilder.lockfile.read import load_lockfile
from envbuilder.model import ResolvedCombination, Status, load_resolution
from tests.support.cells import cell

DATA = Path(__file__).parents[1] / "data"
SCHEMA = Path(__file__).parents[2] / "envbuilder" / "schemas" / "compat.schema.json"

EXPECTED = {
    "py3.10-default-torch2.4.1-xformers0.0.28.post1": "broken",
    "py3.11-default-torch2.5.1-xformers0.0.28.post3": "verified",
    "py3.11-default-torch2.6.0-xformers0.0.29.post3": "verified-with-workaround",
    "py3.11-default-torch2.9.0": "unverified",
    "py3.12-default-torch2.10.0-xformers0.0.34": "broken",
    "py3.12-default-torch2.11.0-xformers0.0.35": "verified-with-workaround",
    "py3.12-default-torch2.7.0-xformers0.0.30-cudart": "verified-with-workaround",
    "py3.12-default-torch2.8.0-xformers0.0.32.post2": "broken",
    "py3.13-default-torch2.4.1-xformers0.0.28.post1": "unsatisfiable",
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    shutil.copytree(DATA / "bad_results", tmp_path / "bad_results")
    shutil.copytree(DATA / "stale_results", tmp_path / "stale_results")
    shutil.copytree(DATA / "retired_results", tmp_path / "retired_results")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def user_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An active Python 3.12 venv with pip, as its files show it (``pyvenv.cfg``, pip in its
    site-packages): what `install` reads of it without running it."""
    venv = tmp_path / "user-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\nversion = 3.12.4\n")
    pip = venv / "lib" / "python3.12" / "site-packages" / "pip"
    pip.mkdir(parents=True)
    (pip / "__init__.py").touch()
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    return venv


def lock(*extra: str) -> int:
    return main(["lock", "--resolution", "locks/resolution.json", *extra])


def test_every_verdict_from_the_synthetic_results(workdir: Path) -> None:
    assert lock("--results", "results") == 0
    compat = load_lockfile(workdir / "compat.lock.json")
    assert {e.id: e.verdict.verdict for e in compat.combinations} == EXPECTED
    by_id = compat.by_id()
    ww = by_id["py3.11-default-torch2.6.0-xformers0.0.29.post3"].verdict
    # SDPA under compile (0 graph breaks) is cheaper, but the disabled call keeps xformers
    assert ww.workarounds == ("dynamo-disable",)
    assert [(o.workaround, o.keeps_xformers) for o in ww.options] == [
        ("dynamo-disable", True),
        ("sdpa-under-compile", False),
    ]
    cudart = by_id["py3.12-default-torch2.7.0-xformers0.0.30-cudart"].verdict
    assert cudart.workarounds == ("cuda-runtime:nvidia-cuda-runtime-cu12==12.8.90",)
    conflicted = by_id["py3.12-default-torch2.8.0-xformers0.0.32.post2"]
    assert [g.conflict for g in conflicted.gpus] == [True]
    assert len(conflicted.runs) == 2
    two_gpus = by_id["py3.11-default-torch2.5.1-xformers0.0.28.post3"]
    assert sorted(g.compute_capability or "" for g in two_gpus.gpus) == ["8.0", "9.0"]
    assert two_gpus.lock is not None and two_gpus.lock.path.startswith("locks/pylock.")
    assert {p.name for p in two_gpus.packages} == {"filelock", "torch", "xformers"}


PER_USE: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    # broken only for compiled training: one failing case has a workaround measured on it,
    # the other has none, and one case could not see its padding mask (invalid)
    "py3.12-default-torch2.10.0-xformers0.0.34": {
        "inference": ("verified", ()),
        "inference-compiled": ("verified-with-workaround", ("dynamo-disable",)),
        "training": ("verified", ()),
        "training-compiled": ("broken", ()),
    },
    # every failing compiled case has two working workarounds: the one that keeps xformers
    # is named even where replacing xformers is cheaper (2 graph breaks against 0)
    "py3.12-default-torch2.11.0-xformers0.0.35": {
        "inference": ("verified", ()),
        "inference-compiled": ("verified-with-workaround", ("dynamo-disable",)),
        "training": ("verified", ()),
        "training-compiled": ("verified-with-workaround", ("dynamo-disable",)),
    },
    # results/1: every gate check speaks for every use
    "py3.11-default-torch2.6.0-xformers0.0.29.post3": {
        use: ("verified-with-workaround", ("dynamo-disable",))
        for use in ("inference", "inference-compiled", "training", "training-compiled")
    },
}


@pytest.mark.parametrize("combination", sorted(PER_USE))
def test_per_use_verdicts(workdir: Path, combination: str) -> None:
    assert lock("--results", "results") == 0
    entry = load_lockfile(workdir / "compat.lock.json").by_id()[combination]
    got = {u.use: (u.verdict.verdict, u.verdict.workarounds) for u in entry.uses}
    assert got == PER_USE[combination]
    # the workaround named keeps xformers; every verified one is listed, cheapest first
    for u in entry.uses:
        listed: dict[str, bool] = {o.workaround: o.keeps_xformers for o in u.verdict.options}
        assert all(listed[w] for w in u.verdict.workarounds)
    assert [u.use for u in entry.gpus[0].uses] == list(PER_USE[combination])
    # the overall verdict is the worst use's
    worst = max(VERDICTS.index(v) for v, _ in PER_USE[combination].values())
    assert entry.verdict.verdict == VERDICTS[worst]


def test_a_broken_use_names_only_the_checks_nobody_worked_around(workdir: Path) -> None:
    assert lock("--results", "results") == 0
    entry = load_lockfile(workdir / "compat.lock.json").by_id()[
        "py3.12-default-torch2.10.0-xformers0.0.34"
    ]
    verdict = use_verdict(entry.uses, "training-compiled")
    assert verdict.failing_checks == (
        "compile.sdpa.fp16.padding.fwd_bwd.static",
        "compile.xformers.bf16.padding.fwd_bwd.dynamic",
    )
    assert "static invalid (sensitivity 1.5× its bound)" in verdict.reason
    assert "training-compiled" in entry.verdict.reason


def test_a_run_for_an_unsatisfiable_combination_is_kept_as_evidence(workdir: Path) -> None:
    assert lock("--results", "results") == 0
    compat = load_lockfile(workdir / "compat.lock.json")
    (entry,) = [e for e in compat.combinations if e.status == "unsatisfiable"]
    assert entry.verdict.verdict == "unsatisfiable"
    assert [r.gpu for r in entry.runs] and entry.lock is None
    # the versions it asked for come from the resolution's record, not from parsing its id
    assert (entry.torch, entry.xformers) == ("2.4.1", "0.0.28.post1")


def test_output_is_deterministic_and_matches_its_schema(workdir: Path) -> None:
    assert lock("--results", "results", "stale_results", "retired_results", "-o", "a.json") == 0
    # the same inputs named in another order give the same bytes
    files = sorted([*workdir.glob("results/*.json"), *workdir.glob("*_results/*")], reverse=True)
    files = [f for f in files if f.parent.name != "bad_results"]
    assert lock("--results", *map(str, files), "-o", "b.json") == 0
    a, b = (workdir / "a.json").read_bytes(), (workdir / "b.json").read_bytes()
    assert a == b and a.endswith(b"}\n")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(a))
    assert any(c["last_verified"] for c in json.loads(a)["combinations"])  # the schema saw one
    assert json.loads(a)["retired"]  # and a retired combination
    args = ("--results", "results", "stale_results", "retired_results", "-o", "a.json")
    assert lock(*args, "--check") == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("newer-suite.json", "newer conformance suite"),
        ("newer-schema.json", "'envbuilder.results/4'"),
        ("invalid-in-results1.json", "fails the results schema at checks/0/status"),
        ("results2-without-uses.json", "fails the results schema at checks/0: 'uses'"),
        (
            "covers-unknown-check.json",
            "covers 'compile.x', which is not a direct gate check of this file",
        ),
        ("workaround-without-covers.json", "fails the results schema at checks/1/covers"),
        ("null-lock.json", "lock_sha256 is null: this run is not tied to the lock"),
        (
            "undated.json",
            "finished 'last Tuesday' is not an ISO 8601 time with a zone (such as "
            "2026-11-20T10:04:00Z): a run without a date",
        ),
        ("unsatisfiable-with-lock.json", "is unsatisfiable and has no lock"),
        ("bad-status.json", "fails the results schema at checks/0/status"),
        ("truncated.json", "not valid JSON"),
        ("deeply-nested.json", "JSON nested deeper than 64 levels"),
    ],
)
def test_rejected_results_abort_with_nothing_written(
    workdir: Path, capsys: pytest.CaptureFixture[str], bad: str, message: str
) -> None:
    assert lock("--results", "results", f"bad_results/{bad}") == 2
    err = capsys.readouterr().err
    assert f"bad_results/{bad}" in err and message in err
    assert not (workdir / "compat.lock.json").exists()
    assert not list(workdir.glob(".compat.lock.json.*"))


def sha(text: str) -> str:
    """The synthetic older locks' hashes (tests/data/make_synthetic.py)."""
    return hashlib.sha256(text.encode()).hexdigest()


NO_XFORMERS = "py3.11-default-torch2.9.0"
TWO_GPUS = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


CURRENT = "c" * 64


def resolved(status: Status, lock_sha256: str | None = CURRENT) -> ResolvedCombination:
    return ResolvedCombination(
        combination=cell("py3.12-cu124-torch2.5.1"),
        status=status,
        reason="",
        lock="locks/pylock.x.toml" if status == "resolved" else None,
        lock_sha256=lock_sha256 if status == "resolved" else None,
    )


@pytest.mark.parametrize(
    ("status", "run_lock", "expected"),
    [
        ("resolved", CURRENT, "current"),
        ("resolved", "0" * 64, "stale"),  # an older lock of the combination
        ("resolved", None, "lock_sha256 is null: this run is not tied to the lock"),
        ("resolved", "C" * 64, "is not a sha256 hex digest"),
        ("resolved", "c" * 63, "is not a sha256 hex digest"),
        ("resolved", 12, "is not a sha256 hex digest"),
        ("unsatisfiable", None, "current"),  # evidence for the resolver's reason
        ("unsatisfiable", "0" * 64, "is unsatisfiable and has no lock"),
        ("error", CURRENT, "is error, not resolved"),
    ],
)
def test_a_run_binds_to_the_current_lock_an_older_one_or_is_rejected(
    status: Status, run_lock: object, expected: str
) -> None:
    combo = resolved(status)
    if expected in ("current", "stale"):
        assert bind(run_lock, combo) == expected
    else:
        with pytest.raises(ValueError, match=re.escape(expected)):
            bind(run_lock, combo)


def test_results_on_an_older_lock_no_longer_abort_lock(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock moved (an upstream release) while the committed results name the old one:
    they are stale evidence, merged without --skip-rejected, and nothing is rejected."""
    assert lock("--results", "results", "stale_results") == 0
    err = capsys.readouterr().err
    assert "✕ rejected" not in err
    assert "10 runs and 3 stale (on an older lock) from 13 results file(s), 0 rejected" in err
    assert "stale evidence: last verified 2026-11-12 on lock" in err
    compat = load_lockfile(workdir / "compat.lock.json")
    assert compat.rejected_results == ()
    # stale evidence never changes a verdict
    assert {e.id: e.verdict.verdict for e in compat.combinations} == EXPECTED


def test_stale_evidence_is_kept_with_its_lock_suite_and_date(workdir: Path) -> None:
    assert lock("--results", "results", "stale_results") == 0
    by_id = load_lockfile(workdir / "compat.lock.json").by_id()
    entry = by_id[NO_XFORMERS]
    assert entry.runs == () and entry.gpus == ()
    assert sorted((r.lock_sha256, r.suite_version, r.finished) for r in entry.stale_runs) == sorted(
        [
            (sha("an older lock of torch 2.9.0"), "1.0.0", "2026-11-12T10:04:00Z"),
            (sha("the oldest lock of torch 2.9.0"), "1.0.0", "2026-11-05T10:04:00Z"),
        ]
    )
    last = entry.last_verified
    assert last is not None
    # the newer of the two older locks; its run passed every gate
    assert (last.lock_sha256, last.date, last.suite_version) == (
        sha("an older lock of torch 2.9.0"),
        "2026-11-12",
        "1.0.0",
    )
    assert last.verdict.verdict == "verified"
    assert last.runs == ("stale_results/py3.11-default-torch2.9.0.h100.older-lock.json",)
    text = f"last verified 2026-11-12 on lock {sha('an older lock of torch 2.9.0')[:12]}: verified"
    assert [u.verdict.verdict for u in entry.uses] == ["unverified"] * 4
    assert all(text in u.verdict.reason for u in entry.uses)
    assert entry.verdict.verdict == "unverified" and text in entry.verdict.reason
    # a combination with runs on its current lock keeps its verdict, and the stale run
    two_gpus = by_id[TWO_GPUS]
    assert two_gpus.verdict.verdict == "verified" and "last verified" not in two_gpus.verdict.reason
    assert [r.lock_sha256 for r in two_gpus.stale_runs] == [sha("an older lock")]
    assert {r.lock_sha256 for r in two_gpus.runs} == {two_gpus.lock.sha256 if two_gpus.lock else ""}


def test_query_shows_when_a_combination_was_last_verified(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock("--results", "results", "stale_results") == 0
    text = f"last verified 2026-11-12 on lock {sha('an older lock of torch 2.9.0')[:12]}: verified"
    capsys.readouterr()
    # one line: its age in the age column (the stale run finished 2026-11-12), the lock moved
    assert main(["query", "--torch", "2.9"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.startswith("verdicts (the worst of the four uses):")
    age = (datetime.now(UTC).date() - date(2026, 11, 12)).days
    assert line.startswith("unverified") and NO_XFORMERS in line
    assert f" {age}d ago " in line and "the lock changed since its last results" in line
    # --long and the combination's own answer say what was verified then, on which lock
    assert main(["query", "--torch", "2.9", "--long"]) == 0
    assert f"    {text}, {age} days ago" in capsys.readouterr().out.splitlines()
    assert main(["query", NO_XFORMERS, "--gpu", "H100", "--use", "training"]) == 0
    assert f"    {text}, {age} days ago" in capsys.readouterr().out.splitlines()
    assert main(["query", "--torch", "2.9", "--use", "training", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["matches"]
    assert row["verdict"] == "unverified" and text in row["reason"]
    assert row["last_verified"] == {
        "date": "2026-11-12",
        "lock_sha256": sha("an older lock of torch 2.9.0"),
        "suite_version": "1.0.0",
        "verdict": "verified",
        "uses": dict.fromkeys(USES, "verified"),
        "text": text,
    }
    # a verdict made of runs on the current lock is dated by them
    assert main(["query", "--torch", "2.5.1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["matches"]
    compat = load_lockfile(workdir / "compat.lock.json")
    current = compat.by_id()[TWO_GPUS].lock
    assert current is not None
    assert row["last_verified"]["date"] == "2026-11-21"
    assert row["last_verified"]["lock_sha256"] == current.sha256
    assert row["last_verified"]["text"] == (
        f"last verified 2026-11-21 on lock {current.sha256[:12]}: verified"
    )


def test_the_site_and_compat_md_show_when_a_combination_was_last_verified(workdir: Path) -> None:
    assert lock("--results", "results", "stale_results") == 0
    assert main(["publish", "--lock", "compat.lock.json", "-o", "site"]) == 0
    text = f"last verified 2026-11-12 on lock {sha('an older lock of torch 2.9.0')[:12]}: verified"
    (row,) = [
        line
        for line in (workdir / "site" / "compat.md").read_text().splitlines()
        if NO_XFORMERS in line
    ]
    assert "⬜ unverified" in row and text in row
    page = (workdir / "site" / "index.html").read_text()
    assert '<span class="last-verified"' in page and f">{text}</span>" in page
    assert page.count('class="last-verified"') == 1  # not for combinations run on their lock


def test_skip_rejected_records_them_in_the_lockfile(workdir: Path) -> None:
    assert lock("--results", "results", "bad_results", "--skip-rejected") == 0
    compat = load_lockfile(workdir / "compat.lock.json")
    assert sorted(r.file for r in compat.rejected_results) == sorted(
        f"bad_results/{p.name}" for p in (workdir / "bad_results").iterdir()
    )
    assert {e.id: e.verdict.verdict for e in compat.combinations} == EXPECTED


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, "JSON nested deeper than 64 levels"),
        ('{"schema": ' + "[" * 200 + "]" * 200 + "}", "JSON nested deeper than 64 levels"),
        ("[]", "not a resolution file"),
        ("{", "not valid JSON"),
    ],
)
def test_a_resolution_that_cannot_be_read_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    (workdir / "locks" / "resolution.json").write_text(text)
    assert lock("--results", "results") == 2
    err = capsys.readouterr().err
    assert "locks/resolution.json" in err and message in err
    assert "Traceback" not in err
    assert not (workdir / "compat.lock.json").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = " + "[" * 100_000, "not a TOML file (nested too deeply)"),
        ("a = " + "[" * 500 + "]" * 500, "not a TOML file (nested too deeply)"),
        ("\udcff", "not a TOML file"),
    ],
)
def test_a_pylock_that_cannot_be_read_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    """The resolution names the damaged pylock with its hash, so only its content is wrong."""
    pylock = workdir / "locks" / "pylock.py3.11-default-torch2.9.0.toml"
    pylock.write_bytes(text.encode("utf-8", "surrogateescape"))
    resolution = workdir / "locks" / "resolution.json"
    data = json.loads(resolution.read_text())
    for combo in data["combinations"]:
        if combo["id"] == "py3.11-default-torch2.9.0":
            combo["lock_sha256"] = hashlib.sha256(pylock.read_bytes()).hexdigest()
    resolution.write_text(json.dumps(data))
    assert lock("--results", "results") == 2
    err = capsys.readouterr().err
    assert f"{pylock.relative_to(workdir)}: {message}" in err
    assert not (workdir / "compat.lock.json").exists()


def test_a_lock_that_disagrees_with_the_resolution_is_refused(workdir: Path) -> None:
    pylock = workdir / "locks" / "pylock.py3.11-default-torch2.9.0.toml"
    pylock.write_text(pylock.read_text() + "\n")
    assert lock("--results", "results") == 2
    assert not (workdir / "compat.lock.json").exists()


def edit_value(text: str) -> str:
    return text.replace('"verdict": "unverified"', '"verdict": "verified"', 1)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: t[: len(t) // 2], "truncated or damaged"),
        (edit_value, "content_sha256 mismatch"),
        (lambda t: t.replace("envbuilder.compat/4", "envbuilder.compat/5"), "upgrade envbuilder"),
        (lambda t: t.replace("envbuilder.compat/4", "envbuilder.compat/1"), "older envbuilder"),
        (lambda t: t.replace("envbuilder.compat/4", "something/4"), "not an envbuilder"),
        (lambda t: "[]", "not a compatibility lockfile"),
        (lambda t: "[" * 100_000, "JSON nested deeper than 128 levels"),
        (lambda t: "[" * 500 + "]" * 500, "JSON nested deeper than 128 levels"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["query"],
        ["export", "py3.11-default-torch2.9.0"],
        ["doctor", "--no-probe"],
        ["install", "py3.11-default-torch2.9.0", "--dry-run"],
        ["publish", "-o", "site"],
    ],
)
def test_every_reader_refuses_a_damaged_lockfile(
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    damage: object,
    message: str,
    command: list[str],
) -> None:
    assert lock("--results", "results") == 0
    path = workdir / "compat.lock.json"
    assert callable(damage)
    path.write_text(damage(path.read_text()))
    assert main([*command, "--lock", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err
    assert not (workdir / "site").exists()


def _set(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        *parents, last = path
        target: Any = data
        for key in parents:
            target = target[key]
        target[last] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set(("combinations", 0, "verdict", "verdict"), "<b>fine</b>"), "verdict '<b>fine</b>'"),
        (_set(("combinations", 0, "uses", 0, "use"), "flying"), "use 'flying' is not one of"),
        (_set(("combinations", 0, "uses"), []), "per-use verdicts list []"),
        (_set(("combinations", 0, "runs", 0, "checks", 0, "status"), "ok"), "check status 'ok'"),
        (_set(("combinations", 0, "runs"), 5), "malformed lockfile"),
        (_set(("combinations", 6, "id"), []), "a combination's id is [], not a string"),
        (_set(("combinations", 0, "cuda"), "cu9x"), "cuda 'cu9x' is not a CUDA"),
        # the entry's torch is its resolved torch's: a file that says otherwise is not one `lock` wrote
        (_set(("combinations", 0, "torch"), "9.9.9"), "torch '9.9.9' is not the version of its"),
        # values of the wrong type, each once a traceback in the re-judging or in export
        (
            _set(("combinations", 0, "runs", 0, "gpu"), {"name": "H100"}),
            "combinations[0].runs[0].gpu is {'name': 'H100'}, not a string",
        ),
        (
            _set(("combinations", 0, "runs", 0, "compute_capability"), 9.0),
            "combinations[0].runs[0].compute_capability is 9.0, not a string or null",
        ),
        (_set(("combinations", 0, "lock", "path"), 7), "combinations[0].lock.path is 7, not a"),
        (_set(("combinations", 0, "python"), None), ".python is None, not a string"),
        (_set(("combinations", 0, "gpus", 0, "gpu"), 5), "combinations[0].gpus[0].gpu is 5, not"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["query", "--use", "inference"],
        ["doctor", "--no-probe"],
        ["publish", "-o", "site"],
        ["export", "-o", "pylock.toml", "py3.10-default-torch2.4.1-xformers0.0.28.post1"],
    ],
)
def test_a_sealed_lockfile_with_values_no_reader_knows_is_refused(
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any]], None],
    message: str,
    command: list[str],
) -> None:
    """Hash intact, content not: a clear error (exit 2), never a KeyError or raw HTML."""
    assert lock("--results", "results") == 0
    path = workdir / "compat.lock.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_bytes(seal(data))
    capsys.readouterr()
    assert main([*command, "--lock", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: malformed lockfile" in err and message in err
    assert not (workdir / "site").exists()


def test_an_entry_nests_the_resolvers_record_and_is_written_flat(workdir: Path) -> None:
    """`lock` nests each combination's `ResolvedCombination` in its entry (nothing copied);
    the file keeps compat/3's flat keys, and an entry read back writes the same JSON."""
    resolution = load_resolution(workdir / "locks" / "resolution.json")
    compat, _ = build_lockfile(
        resolution,
        resolution_path=workdir / "locks" / "resolution.json",
        results=[workdir / "results"],
        out=workdir / "compat.lock.json",
    )
    answers = resolution.by_id()
    for entry in compat.combinations:
        answer = answers[entry.id]
        assert entry.resolved is answer
        assert (entry.python, entry.cuda, entry.platform, entry.status, entry.resolver_reason) == (
            answer.python,
            answer.cuda,
            answer.platform,
            answer.status,
            answer.reason,
        )
        assert entry.torch == (answer.torch.version if answer.torch else answer.combination.torch)
        data = entry.to_json()
        assert "resolved" not in data and "combination" not in data
        read = Entry.from_json(json.loads(json.dumps(data)))
        assert read.to_json() == data
        assert (read.id, read.status, read.extra_runtime) == (
            entry.id,
            entry.status,
            entry.extra_runtime,
        )
        # what a lockfile does not record reads as absent: URLs live in the entry's pylock
        if read.resolved.torch is not None:
            assert read.resolved.torch.url == ""
            assert read.torch_build == entry.torch_build
        assert read.resolved.rejected == ()


def test_the_embedded_snapshot_reads_back_to_its_own_bytes() -> None:
    """Published files (the snapshot in the wheel) read into nested entries and write the
    very bytes they were read from; one of an older schema (compat/3, whose checks record no
    ``via``) does so once it is written in this one's, its checks' call paths taken from
    their names."""
    path = Path(__file__).parents[2] / "envbuilder" / "data" / "compat.lock.json"
    raw = path.read_bytes()
    snapshot = CompatLock.from_json(json.loads(raw))
    assert snapshot.combinations and all(e.resolved.id == e.id for e in snapshot.combinations)
    written = seal(snapshot.to_json())
    if snapshot.schema == COMPAT_SCHEMA:
        assert written == raw
    assert seal(CompatLock.from_json(json.loads(written)).to_json()) == written
    checks = [c for e in snapshot.combinations for r in e.runs for c in r.checks]
    assert checks and all(c.via == legacy_via(c.name) for c in checks)


def test_a_lockfile_without_its_hash_is_refused(workdir: Path) -> None:
    assert lock("--results", "results") == 0
    path = workdir / "compat.lock.json"
    data = json.loads(path.read_text())
    del data["content_sha256"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="no content_sha256"):
        load_lockfile(path)


def test_reformatting_keeps_the_hash_valid(workdir: Path) -> None:
    """The hash covers the content, not the layout: a re-indented file still reads."""
    assert lock("--results", "results") == 0
    path = workdir / "compat.lock.json"
    original = path.read_bytes()
    data = json.loads(original)
    path.write_text(json.dumps(data, indent=None))
    assert load_lockfile(path).by_id().keys() == EXPECTED.keys()
    assert seal(data) == original  # and sealing again restores the canonical bytes


@pytest.mark.parametrize(
    ("args", "rc", "expected"),
    [
        # the workaround printed is the one verified for that use, on its case
        (
            ["py3.12-default-torch2.11.0-xformers0.0.35", "--use", "inference-compiled"],
            0,
            [
                "for inference-compiled: verified-with-workaround",
                "compile.xformers.fp16.block_diagonal.fwd.dynamic is verified for "
                "inference-compiled only with the workaround 'dynamo-disable'",
            ],
        ),
        (
            ["py3.12-default-torch2.11.0-xformers0.0.35", "--use", "training-compiled"],
            0,
            [
                "for training-compiled: verified-with-workaround",
                "1 failing gate check passes with dynamo-disable (2 graph breaks",
                "only with the workaround 'dynamo-disable'",
            ],
        ),
        # fine for eager training, refused for compiled training
        (
            ["py3.12-default-torch2.10.0-xformers0.0.34", "--use", "training"],
            0,
            ["for training: verified"],
        ),
        (
            ["py3.12-default-torch2.10.0-xformers0.0.34", "--use", "training-compiled"],
            2,
            ["refusing to install", "broken for training-compiled", "--allow-unverified"],
        ),
        (
            [
                "py3.12-default-torch2.10.0-xformers0.0.34",
                "--use",
                "training-compiled",
                "--allow-unverified",
            ],
            0,
            ["for training-compiled: broken"],
        ),
        # without --use the worst use decides
        (["py3.12-default-torch2.10.0-xformers0.0.34"], 2, ["it is broken, not verified"]),
    ],
)
def test_install_judges_by_the_use(
    workdir: Path,
    user_venv: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    rc: int,
    expected: list[str],
) -> None:
    assert lock("--results", "results") == 0
    capsys.readouterr()
    assert main(["install", *args, "--dry-run", "--lock", "compat.lock.json"]) == rc
    out = capsys.readouterr()
    for text in expected:
        assert text in out.out + out.err


def test_export_requirements_header_names_the_verdict_of_every_use(workdir: Path) -> None:
    assert lock("--results", "results") == 0
    combination = "py3.12-default-torch2.10.0-xformers0.0.34"
    args = ["export", combination, "--format", "requirements", "-o", "req.txt"]
    assert main([*args, "--lock", "compat.lock.json"]) == 0
    header = (workdir / "req.txt").read_text().splitlines()[1]
    assert header == (
        "# target: Python 3.12, manylinux_2_28_x86_64; verdict: broken (per use: inference "
        "verified, inference-compiled verified-with-workaround, training verified, "
        "training-compiled broken)"
    )


def test_query_by_use_shows_that_use(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lock("--results", "results") == 0
    capsys.readouterr()
    assert main(["query", "--torch", "2.10", "--use", "training", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["matches"]
    assert (row["use"], row["verdict"]) == ("training", "verified")
    assert row["uses"]["training-compiled"] == "broken"
    assert main(["query", "--python", "3.12", "--use", "training-compiled"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("verdicts for training-compiled: ")
    (line,) = [ln for ln in lines if "py3.12-default-torch2.10.0" in ln]
    assert line.startswith("broken") and line.endswith("no workaround works (see the causes)")


RESULTS_2 = sorted(
    p.name
    for p in (DATA / "results").glob("*.json")
    if json.loads(p.read_text())["schema"] == "envbuilder.results/2"
)
PACKAGED_RESULTS = json.loads((SCHEMA.parent / "results.schema.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", RESULTS_2)
def test_results_2_fixtures_keep_the_documented_shape(name: str) -> None:
    data = json.loads((DATA / "results" / name).read_text())
    jsonschema.Draft202012Validator(documented_shape("envbuilder.results/2")).validate(data)


@pytest.mark.skipif(
    "envbuilder.results/2" not in PACKAGED_RESULTS["properties"]["schema"]["enum"],
    reason="the packaged results schema does not take envbuilder.results/2 files",
)
@pytest.mark.parametrize("name", RESULTS_2)
def test_results_2_fixtures_pass_the_packaged_results_schema(name: str) -> None:
    data = json.loads((DATA / "results" / name).read_text())
    jsonschema.Draft202012Validator(PACKAGED_RESULTS).validate(data)


@pytest.mark.parametrize(
    ("installer", "flags"),
    [("uv", ["--no-build"]), ("pip", ["--only-binary", ":all:", "--require-hashes", "--no-deps"])],
)
def test_install_never_builds_a_source_distribution(
    workdir: Path,
    user_venv: Path,
    capsys: pytest.CaptureFixture[str],
    installer: str,
    flags: list[str],
) -> None:
    assert lock("--results", "results") == 0
    capsys.readouterr()
    combination = "py3.12-default-torch2.10.0-xformers0.0.34"
    args = [combination, "--allow-unverified", "--installer", installer, "--dry-run"]
    assert main(["install", *args, "--lock", "compat.lock.json"]) == 0
    out = capsys.readouterr()
    commands = [line for line in (out.out + out.err).splitlines() if " install " in line]
    assert len(commands) == 1, commands
    words = commands[0].split()
    for flag in flags:
        assert flag in words


@pytest.mark.parametrize(
    ("cuda", "ok"),
    [
        ("cu121", True),
        ("cpu", True),
        ("default", True),
        (None, True),
        ("12.1", False),
        ("cu9x", False),
        (121, False),
    ],
)
def test_a_retired_combinations_cuda_is_read_as_ids_spell_it(cuda: object, ok: bool) -> None:
    """A retired record keeps its CUDA as its id spells it; anything else is malformed."""
    snapshot = json.loads(
        (Path(__file__).parents[2] / "envbuilder/data/compat.lock.json").read_text()
    )
    verified = next(e["last_verified"] for e in snapshot["combinations"] if e.get("last_verified"))
    data = {"id": "py3.11-cu121-torch2.4.1", "cuda": cuda, "last_verified": verified}
    if ok:
        assert RetiredEntry.from_json(data).cuda == cuda
    else:
        with pytest.raises(ValueError, match="is not a CUDA value"):
            RetiredEntry.from_json(data)
