"""``envbuilder lock`` keeps evidence across runs: retired combinations, ``--previous``, dates.

A run that covers part of the matrix adds to the last published lockfile; nothing is lost
between runs, nothing is counted twice, and every verdict made of runs says when it was
measured. Built from the synthetic inputs in tests/data (make_synthetic.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from envbuilder.aggregate.results import run_identity
from envbuilder.cli import main
from envbuilder.lockfile.canonical import seal
from envbuilder.lockfile.model import Run
from envbuilder.lockfile.read import load_lockfile
from envbuilder.lockfile.verdicts import overall, run_use_verdicts

DATA = Path(__file__).parents[1] / "data"
RETIRED = "py3.9-cu999-torch0.1"  # in retired_results/, not in the resolution
TWO_GPUS = "py3.11-default-torch2.5.1-xformers0.0.28.post3"
PER_USE = "py3.12-default-torch2.10.0-xformers0.0.34"
UNSATISFIABLE = "py3.13-default-torch2.4.1-xformers0.0.28.post1"
EVERYTHING = ("results", "stale_results", "retired_results")


def sha(text: str) -> str:
    """The synthetic locks' hashes that no pylock has (tests/data/make_synthetic.py)."""
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("locks", *EVERYTHING):
        shutil.copytree(DATA / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lock(*extra: str) -> int:
    return main(["lock", "--resolution", "locks/resolution.json", *extra])


def summary(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.splitlines()[-1]


def test_a_result_for_a_combination_no_longer_resolved_is_retired_not_rejected(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock("--results", "results", "retired_results") == 0
    err = capsys.readouterr().err
    assert "✕ rejected" not in err
    assert err.splitlines()[-1].endswith(
        "10 runs from 11 results file(s), 0 rejected; "
        "1 retired combination(s) (not in the resolution) kept with 1 run(s)"
    )
    last_lock = sha("the last lock of torch 0.1")
    assert f"retired{' ' * 19}{RETIRED}: last verified 2026-11-18 on lock {last_lock[:12]}" in err
    compat = load_lockfile(workdir / "compat.lock.json")
    assert RETIRED not in compat.by_id()  # never offered
    (retired,) = compat.retired
    assert retired.id == RETIRED
    assert [r.source for r in retired.runs] == [f"retired_results/{RETIRED}.h100.json"]
    assert (retired.python, retired.torch) == (None, None)  # only a results file named it
    last = retired.last_verified
    assert (last.lock_sha256, last.date, last.verdict.verdict) == (
        last_lock,
        "2026-11-18",
        "verified",
    )
    assert last.runs == (f"retired_results/{RETIRED}.h100.json",)


@pytest.mark.parametrize(
    ("lock_sha256", "message"),
    [("C" * 64, "is not a sha256 hex digest"), (12, "fails the results schema at lock_sha256")],
)
def test_a_retired_combination_s_run_must_still_name_a_lock(
    workdir: Path, capsys: pytest.CaptureFixture[str], lock_sha256: object, message: str
) -> None:
    path = workdir / "retired_results" / f"{RETIRED}.h100.json"
    data = json.loads(path.read_text())
    data["lock_sha256"] = lock_sha256
    path.write_text(json.dumps(data))
    assert lock("--results", "results", "retired_results") == 2
    err = capsys.readouterr().err
    assert f"✕ rejected retired_results/{RETIRED}.h100.json: " in err and message in err
    assert not (workdir / "compat.lock.json").exists()


def test_results_is_repeatable_and_every_one_is_read(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock("--results", "results", "--results", "stale_results", "-o", "repeated.json") == 0
    assert "10 runs and 3 stale (on an older lock) from 13 results file(s), 0 rejected" in summary(
        capsys
    )
    assert lock("--results", "results", "stale_results", "-o", "once.json") == 0
    assert (workdir / "repeated.json").read_bytes() == (workdir / "once.json").read_bytes()


def test_every_run_has_a_date_and_every_entry_with_runs_has_last_verified(workdir: Path) -> None:
    assert lock("--results", *EVERYTHING) == 0
    raw = json.loads((workdir / "compat.lock.json").read_text())
    for record in raw["combinations"] + raw["retired"]:
        for run in record["runs"] + record.get("stale_runs", []):
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", run["date"]), run["source"]
        if record["runs"]:
            assert record["last_verified"] is not None, record["id"]
    compat = load_lockfile(workdir / "compat.lock.json")
    for entry in compat.combinations:
        if not entry.runs:
            continue
        last = entry.last_verified
        assert last is not None
        # the runs the verdict is made of: their lock, the newest one's date, that verdict
        assert last.lock_sha256 == (entry.lock.sha256 if entry.lock else None)
        assert last.date == max(r.date for r in entry.runs)
        assert (last.verdict, last.uses) == (entry.verdict, entry.uses)
        assert sorted(last.runs) == sorted(r.source for r in entry.runs)
    by_id = compat.by_id()
    two_gpus = by_id[TWO_GPUS].last_verified
    assert two_gpus is not None and two_gpus.date == "2026-11-21"  # the A100 run, the newer
    assert two_gpus.describe().startswith("last verified 2026-11-21 on lock ")
    unsatisfiable = by_id[UNSATISFIABLE].last_verified
    assert unsatisfiable is not None and unsatisfiable.lock_sha256 is None
    assert unsatisfiable.describe() == "last verified 2026-11-25: unsatisfiable"


def test_a_partial_run_keeps_the_previous_lockfile_s_runs(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two merges (everything but one combination, then that one on top) give the lockfile
    one merge of everything gives, byte for byte."""
    assert lock("--results", *EVERYTHING, "-o", "at-once.json") == 0
    others = [str(p) for p in sorted((workdir / "results").glob("*.json")) if PER_USE not in p.name]
    assert (
        lock("--results", *others, "stale_results", "retired_results", "-o", "previous.json") == 0
    )
    assert lock("--results", f"results/{PER_USE}.h100.json", "--previous", "previous.json") == 0
    assert summary(capsys).endswith(
        "from 1 results file(s) and 13 run(s) kept from previous.json, 0 rejected; "
        "1 retired combination(s) (not in the resolution) kept with 1 run(s)"
    )
    assert (workdir / "compat.lock.json").read_bytes() == (workdir / "at-once.json").read_bytes()
    # without --previous the same partial run would have lost every other verdict
    assert lock("--results", f"results/{PER_USE}.h100.json", "-o", "alone.json") == 0
    alone = load_lockfile(workdir / "alone.json")
    assert [e.id for e in alone.combinations if e.runs] == [PER_USE]


def test_a_run_already_in_the_previous_lockfile_is_kept_once(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock("--results", *EVERYTHING, "-o", "previous.json") == 0
    assert lock("--results", *EVERYTHING, "--previous", "previous.json") == 0
    assert (
        "and 0 run(s) kept from previous.json (14 of its runs given again), 0 rejected"
        in summary(capsys)
    )
    assert (workdir / "compat.lock.json").read_bytes() == (workdir / "previous.json").read_bytes()
    # nothing new: the previous lockfile alone gives itself again
    assert lock("--results", "--previous", "previous.json", "-o", "same.json") == 0
    assert (workdir / "same.json").read_bytes() == (workdir / "previous.json").read_bytes()


def test_the_same_run_written_out_again_replaces_its_earlier_record(workdir: Path) -> None:
    """Other bytes, same run (combination, lock, runner, GPU, start): one run, the new file's."""
    assert lock("--results", *EVERYTHING, "-o", "previous.json") == 0
    path = workdir / "results" / f"{TWO_GPUS}.h100.json"
    path.write_text(json.dumps(json.loads(path.read_text())))  # re-serialised
    assert lock("--results", str(path), "--previous", "previous.json") == 0
    entry = load_lockfile(workdir / "compat.lock.json").by_id()[TWO_GPUS]
    assert len(entry.runs) == 2
    new = hashlib.sha256(path.read_bytes()).hexdigest()
    assert new in {r.source_sha256 for r in entry.runs}


def test_two_files_claiming_one_run_with_other_content_are_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = workdir / "results" / f"{TWO_GPUS}.h100.json"
    data = json.loads(original.read_text())
    data["checks"] = data["checks"][:1]
    (workdir / "copy").mkdir()
    (workdir / "copy" / original.name).write_text(json.dumps(data))
    assert lock("--results", "results", "copy") == 2
    err = capsys.readouterr().err
    assert f"results/{original.name}: the same run as copy/{original.name}" in err
    assert not (workdir / "compat.lock.json").exists()


def move_lock(workdir: Path, combination: str) -> None:
    """An upstream release moved *combination*'s lock: a new pylock, a new hash."""
    pylock = workdir / "locks" / f"pylock.{combination}.toml"
    pylock.write_text(pylock.read_text() + "# re-resolved\n")
    resolution = workdir / "locks" / "resolution.json"
    data = json.loads(resolution.read_text())
    for combo in data["combinations"]:
        if combo["id"] == combination:
            combo["lock_sha256"] = hashlib.sha256(pylock.read_bytes()).hexdigest()
    resolution.write_text(json.dumps(data))


def test_runs_kept_from_the_previous_lockfile_on_a_lock_that_moved_become_stale(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock("--results", "results", "-o", "previous.json") == 0
    previous = load_lockfile(workdir / "previous.json")
    old = previous.by_id()[TWO_GPUS]
    assert old.lock is not None
    move_lock(workdir, TWO_GPUS)
    assert lock("--results", "--previous", "previous.json") == 0
    text = f"last verified 2026-11-21 on lock {old.lock.sha256[:12]}: verified"
    assert f"stale evidence: {text}" in capsys.readouterr().err
    compat = load_lockfile(workdir / "compat.lock.json")
    entry = compat.by_id()[TWO_GPUS]
    assert entry.runs == () and entry.verdict.verdict == "unverified"
    assert [r.source_sha256 for r in entry.stale_runs] == [r.source_sha256 for r in old.runs]
    assert entry.last_verified is not None and entry.last_verified.lock_sha256 == old.lock.sha256
    assert text in entry.verdict.reason
    # the combinations whose lock did not move keep their runs as current
    for before in previous.combinations:
        if before.id != TWO_GPUS:
            after = compat.by_id()[before.id]
            assert (after.runs, after.verdict) == (before.runs, before.verdict)


def drop(workdir: Path, combination: str) -> bytes:
    """Take *combination* out of the resolution (a selector run, a matrix.toml change);
    returns the resolution as it was."""
    resolution = workdir / "locks" / "resolution.json"
    before = resolution.read_bytes()
    data = json.loads(before)
    data["combinations"] = [c for c in data["combinations"] if c["id"] != combination]
    resolution.write_text(json.dumps(data))
    return before


_ID = re.compile(r"py(\d+\.\d+)-default-torch([^-]+)(?:-xformers([^-]+))?(-cudart)?")


def write_matrix(workdir: Path, *, without: tuple[str, ...] = ()) -> Path:
    """The matrix the synthetic resolution names (tests/data/matrix.toml, from the working
    directory), one explicit row per combination it resolves but *without*."""
    resolution = json.loads((DATA / "locks" / "resolution.json").read_bytes())
    rows = []
    for combo in resolution["combinations"]:
        if combo["id"] in without:
            continue
        found = _ID.fullmatch(combo["id"])
        assert found is not None, combo["id"]
        python, torch, xformers, cudart = found.groups()
        row = f'[[combinations]]\npython = "{python}"\ntorch = "{torch}"\n'
        row += f'xformers = "{xformers}"\n' if xformers else ""
        row += "add-cuda-runtime = true\n" if cudart else ""
        rows.append(row)
    path: Path = workdir / str(resolution["matrix"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows))
    return path


def test_a_row_not_selected_keeps_its_runs_as_they_were(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A selector run resolves part of the matrix: the rows it left out are not retired."""
    write_matrix(workdir)
    assert lock("--results", *EVERYTHING, "-o", "full.json") == 0
    full = load_lockfile(workdir / "full.json")
    drop(workdir, TWO_GPUS)  # resolved without it: it is still in the matrix
    assert lock("--results", "--previous", "full.json", "-o", "selected.json") == 0
    assert "1 combination(s) not in this resolution but in the matrix kept as they were" in (
        summary(capsys)
    )
    selected = load_lockfile(workdir / "selected.json")
    assert [r.id for r in selected.retired] == [RETIRED]
    assert selected.by_id()[TWO_GPUS] == full.by_id()[TWO_GPUS]
    assert [e.id for e in selected.combinations] == [e.id for e in full.combinations]
    assert (workdir / "selected.json").read_bytes() == (workdir / "full.json").read_bytes()


def test_a_previous_row_the_resolution_leaves_out_needs_the_matrix(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock("--results", *EVERYTHING, "-o", "full.json") == 0
    drop(workdir, TWO_GPUS)
    assert lock("--results", "--previous", "full.json", "-o", "selected.json") == 2
    err = capsys.readouterr().err
    assert f"this resolution does not name ({TWO_GPUS})" in err and "--matrix" in err
    assert not (workdir / "selected.json").exists()


def test_a_row_removed_from_the_matrix_is_retired_and_comes_back(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_matrix(workdir)
    assert lock("--results", *EVERYTHING, "-o", "full.json") == 0
    full = load_lockfile(workdir / "full.json").by_id()[TWO_GPUS]
    before = drop(workdir, TWO_GPUS)
    write_matrix(workdir, without=(TWO_GPUS,))
    assert lock("--results", "--previous", "full.json", "-o", "dropped.json") == 0
    assert "; 2 retired combination(s) (not in the resolution) kept with 4 run(s)" in summary(
        capsys
    )
    dropped = load_lockfile(workdir / "dropped.json")
    assert TWO_GPUS not in dropped.by_id()
    retired = {r.id: r for r in dropped.retired}
    assert list(retired) == [TWO_GPUS, RETIRED]  # by id
    record = retired[TWO_GPUS]
    # its axes, and every run: those on its last lock and the stale one
    assert (record.python, record.cuda, record.torch, record.xformers) == (
        "3.11",
        "default",
        "2.5.1",
        "0.0.28.post3",
    )
    assert {r.source_sha256 for r in record.runs} == {
        r.source_sha256 for r in full.runs + full.stale_runs
    }
    assert full.lock is not None
    assert (record.last_verified.lock_sha256, record.last_verified.date) == (
        full.lock.sha256,
        "2026-11-21",
    )
    assert record.last_verified.verdict.verdict == "verified"
    # a further run keeps it retired
    assert lock("--results", "--previous", "dropped.json", "-o", "still.json") == 0
    assert (workdir / "still.json").read_bytes() == (workdir / "dropped.json").read_bytes()
    # resolved again, it takes its runs back: the lockfile is the one before it was dropped
    (workdir / "locks" / "resolution.json").write_bytes(before)
    write_matrix(workdir)
    assert lock("--results", "--previous", "still.json", "-o", "back.json") == 0
    assert (workdir / "back.json").read_bytes() == (workdir / "full.json").read_bytes()


def as_compat_2(data: dict[str, Any]) -> dict[str, Any]:
    """The lockfile as envbuilder.compat/2 wrote it: no retired section, no run dates,
    ``last_verified`` only for stale evidence."""
    old = {k: v for k, v in data.items() if k not in ("retired", "content_sha256")}
    old["schema"] = "envbuilder.compat/2"
    for entry in old["combinations"]:
        for run in entry["runs"] + entry["stale_runs"]:
            del run["date"]
        if entry["runs"]:
            entry["last_verified"] = None
    return old


def test_a_compat_2_lockfile_is_read_and_can_be_the_previous_one(workdir: Path) -> None:
    assert lock("--results", "results", "stale_results", "-o", "new.json") == 0
    (workdir / "old.json").write_bytes(
        seal(as_compat_2(json.loads((workdir / "new.json").read_text())))
    )
    old = load_lockfile(workdir / "old.json")
    assert old.schema == "envbuilder.compat/2" and old.retired == ()
    assert {r.date for e in old.combinations for r in e.runs} >= {"2026-11-20", "2026-11-21"}
    assert lock("--results", "--previous", "old.json", "-o", "again.json") == 0
    assert (workdir / "again.json").read_bytes() == (workdir / "new.json").read_bytes()


def test_a_carried_run_is_judged_anew_from_its_checks(workdir: Path) -> None:
    """A previous lockfile's verdicts are not trusted: a run's verdict comes from its checks."""
    assert lock("--results", "results", "-o", "previous.json") == 0
    data = json.loads((workdir / "previous.json").read_text())
    (entry,) = [e for e in data["combinations"] if e["id"] == PER_USE]
    for use in entry["runs"][0]["uses"]:
        use["verdict"]["verdict"] = "verified"
    entry["runs"][0]["verdict"]["verdict"] = "verified"
    (workdir / "previous.json").write_bytes(seal(data))
    assert lock("--results", "--previous", "previous.json") == 0
    judged = load_lockfile(workdir / "compat.lock.json").by_id()[PER_USE]
    assert judged.verdict.verdict == "broken"
    assert judged.runs[0].verdict.verdict == "broken"


@pytest.mark.parametrize(
    ("previous", "message"),
    [
        ("absent.json", "--previous absent.json: no such file"),
        ("tampered.json", "--previous: tampered.json: content_sha256 mismatch"),
        (
            "http://example.invalid/compat.lock.json",
            "--previous 'http://example.invalid/compat.lock.json': a published lockfile is "
            "read over https only",
        ),
    ],
)
def test_a_previous_lockfile_that_cannot_be_trusted_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str], previous: str, message: str
) -> None:
    assert lock("--results", "results", "-o", "tampered.json") == 0
    path = workdir / "tampered.json"
    path.write_text(path.read_text().replace('"verdict": "broken"', '"verdict": "verified"', 1))
    capsys.readouterr()
    assert lock("--results", "results", "--previous", previous) == 2
    assert message in capsys.readouterr().err
    assert not (workdir / "compat.lock.json").exists()


BASE = {
    "source": "results/a.json",
    "source_sha256": "0" * 64,
    "lock_sha256": "1" * 64,
    "suite_version": "2.0.0",
    "started": "2026-11-20T10:00:00Z",
    "finished": "2026-11-20T10:04:00Z",
    "gpu": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0",
    "runner": {"hostname": "gpu-runner-1"},
}


def run_record(**changes: Any) -> Run:
    uses = run_use_verdicts(())
    return Run(**{**BASE, **changes}, checks=(), uses=uses, verdict=overall(uses))


@pytest.mark.parametrize(
    ("other", "same"),
    [
        ({}, True),
        ({"source": "elsewhere/b.json", "source_sha256": "f" * 64}, True),  # another copy
        ({"started": "2026-11-20T10:00:00+00:00"}, True),  # the same moment
        ({"started": "2026-11-20T05:00:00-05:00"}, True),
        ({"finished": "2026-11-20T10:09:00Z", "suite_version": "2.0.1"}, True),
        ({"started": "2026-11-20T12:00:00Z"}, False),  # the same runner again that day
        ({"runner": {"hostname": "gpu-runner-2"}}, False),
        ({"gpu": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}, False),
        ({"lock_sha256": "2" * 64}, False),
    ],
)
def test_run_identity(other: dict[str, Any], same: bool) -> None:
    a, b = run_record(), run_record(**other)
    assert (run_identity("c", a) == run_identity("c", b)) is same
    assert run_identity("c", a) != run_identity("d", a)  # another combination's run


def test_a_run_s_date_is_its_finish_in_utc_whatever_the_file_says(workdir: Path) -> None:
    assert lock("--results", "results") == 0
    path = workdir / "compat.lock.json"
    data = json.loads(path.read_text())
    run = data["combinations"][0]["runs"][0]
    run["date"] = "1999-01-01"
    path.write_bytes(seal(data))
    read = load_lockfile(path).combinations[0].runs[0]
    assert read.date == read.finished[:10] != "1999-01-01"
    late = run_record(finished="2026-11-20T23:30:00-05:00")
    assert late.date == "2026-11-21"


TORCH_ONLY = "py3.11-default-torch2.9.0"
#: a run on a Mac of another stack (py3.12, torch 2.5.1 without CUDA, xformers), no GPU
ON_A_MAC: dict[str, Any] = {
    "platform": "macOS-14.5-arm64-arm-64bit",
    "python": "3.12.4",
    "torch": "2.5.1",
    "torch_cuda": None,
    "driver": None,
    "xformers": "0.0.28.post3",
    "gpus": [],
}


def test_a_run_of_another_stack_carried_into_a_row_is_dropped_with_its_reason(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run the previous lockfile files under a combination is checked as a results file
    naming that combination would be: a Mac run of another stack never makes a row."""
    assert lock("--results", "results", "-o", "previous.json") == 0
    data = json.loads((workdir / "previous.json").read_text())
    by_id = {e["id"]: e for e in data["combinations"]}
    forged = json.loads(json.dumps(by_id[TWO_GPUS]["runs"][0]))
    forged.update(
        lock_sha256=by_id[TORCH_ONLY]["lock"]["sha256"],
        gpu="cpu",
        compute_capability=None,
        runner={**forged["runner"], **ON_A_MAC},
    )
    by_id[TORCH_ONLY]["runs"].append(forged)
    (workdir / "previous.json").write_bytes(seal(data))
    capsys.readouterr()
    assert lock("--results", "--previous", "previous.json") == 0
    err = capsys.readouterr().err
    entry = load_lockfile(workdir / "compat.lock.json").by_id()[TORCH_ONLY]
    assert entry.runs == () and entry.verdict.verdict == "unverified"
    (line,) = [x for x in err.splitlines() if x.startswith("✕ dropped")]
    assert f"(a run of {TORCH_ONLY!r} in the previous lockfile)" in line
    for reason in ("Python 3.12.4, not 3.11", "torch 2.5.1, not 2.9.0", "not a x86_64 machine"):
        assert reason in line
    assert err.splitlines()[-1].endswith(
        "kept from previous.json, 1 dropped (listed above), 0 rejected"
    )


@pytest.mark.parametrize(
    ("relabel", "reason"),
    [
        (  # the name everywhere, the A100's compute capability left
            {"gpu": "NVIDIA H200", "runner_name": "NVIDIA H200"},
            "GPU 'NVIDIA H200' with compute capability '8.0'; a H200 is 9.0",
        ),
        (  # the GPU it is filed under only
            {"gpu": "NVIDIA H200", "compute_capability": "9.0"},
            "filed under GPU 'NVIDIA H200' with compute capability '9.0', but its runner's "
            "first GPU is 'NVIDIA A100-SXM4-80GB' with '8.0'",
        ),
    ],
)
def test_an_a100_run_relabelled_as_an_h200_is_dropped(
    workdir: Path, capsys: pytest.CaptureFixture[str], relabel: dict[str, str], reason: str
) -> None:
    assert lock("--results", "results", "-o", "previous.json") == 0
    data = json.loads((workdir / "previous.json").read_text())
    (entry,) = [e for e in data["combinations"] if e["id"] == TWO_GPUS]
    (a100,) = [r for r in entry["runs"] if r["compute_capability"] == "8.0"]
    name = relabel.pop("runner_name", None)
    if name is not None:
        a100["runner"]["gpus"][0]["name"] = name
    a100.update(relabel)
    (workdir / "previous.json").write_bytes(seal(data))
    capsys.readouterr()
    assert lock("--results", "--previous", "previous.json") == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("✕ dropped")]
    assert reason in line
    judged = load_lockfile(workdir / "compat.lock.json").by_id()[TWO_GPUS]
    assert [g.compute_capability for g in judged.gpus] == ["9.0"]  # the H100 alone
    assert all("H200" not in r.gpu for r in judged.runs + judged.stale_runs)


def test_a_row_not_selected_drops_a_relabelled_run_it_carries(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row this merge leaves out keeps its runs only through the same claim checks."""
    write_matrix(workdir)
    assert lock("--results", "results", "-o", "previous.json") == 0
    data = json.loads((workdir / "previous.json").read_text())
    (entry,) = [e for e in data["combinations"] if e["id"] == TWO_GPUS]
    (a100,) = [r for r in entry["runs"] if r["compute_capability"] == "8.0"]
    a100.update(gpu="NVIDIA H200", compute_capability="9.0")
    (workdir / "previous.json").write_bytes(seal(data))
    drop(workdir, TWO_GPUS)  # resolved without it: it is still in the matrix
    capsys.readouterr()
    assert lock("--results", "--previous", "previous.json") == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("✕ dropped")]
    assert "filed under GPU 'NVIDIA H200'" in line
    kept = load_lockfile(workdir / "compat.lock.json").by_id()[TWO_GPUS]
    assert all("H200" not in r.gpu for r in kept.runs + kept.stale_runs)


@pytest.mark.parametrize("change", ["edited", "missing"])
def test_a_lock_changed_after_resolving_stops_lock(
    workdir: Path, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    resolution = json.loads((workdir / "locks" / "resolution.json").read_text())
    # the resolution names its locks from the directory it was written beside
    resolved = next(c["lock"] for c in resolution["combinations"] if c["status"] == "resolved")
    pylock = workdir / resolved
    if change == "edited":
        pylock.write_bytes(pylock.read_bytes() + b"\n")
    else:
        pylock.unlink()
    assert lock("--results", "results") == 2
    err = capsys.readouterr().err
    assert str(pylock.name) in err and "run `nox -s resolve`" in err
    assert not (workdir / "compat.lock.json").exists()  # nothing written
