"""The workflows on bare runners: every job of gpu-matrix.yml and ci.yml runs from a clean
clone, in fresh containers of a runner image that has python3, git, curl and bash only,
each step of the YAML in order with its env (tests/docker/rehearsal.py emulates the
`uses:` steps). A step that needs something no earlier step installed fails here.

The GPU matrix is rehearsed with one CPU combination (the CPU build of torch from pip's
find-links) and ``--in-place --allow-cpu --quick``: the conformance job installs that lock
and runs the suite's CPU checks. Twice: between the runs a dependency of torch gets a new
release; the second run (a re-run of the first) starts from the published locks, keeps
them because their inputs hold, merges into the lockfile the first run published, and
publishes without colliding.

Then the path a scheduled run takes: the image is built from the lock on the runner, the
suite runs in a container of it (on the CPU: compiled checks and the model group), and the
results are merged into the last published lockfile, which holds another combination's runs
and a retired combination's; the new lockfile keeps both, and is published and attested.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuilder.docker.registry import ImageRecord
from envbuilder.index.pipconfig import pip_config_value
from envbuilder.model import Resolution
from tests.docker.rehearsal import (
    ExpressionError,
    JobResult,
    Rehearsal,
    RunSettings,
    daemon_access,
    evaluate,
    load_workflow,
    parse_output_file,
)
from tests.support.registry import RegistryServer
from tests.support.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
TORCH_VERSION = "2.13.0"
COMBINATION = f"py3.11-cpu-torch{TORCH_VERSION}"
SUITE_ARGS = "--in-place --allow-cpu --quick"
#: jobs left out of the rehearsal, and why
NOT_REHEARSED = {
    "ci.yml": {
        "tests": "runs the README's test command (this suite, this rehearsal included) in a"
        " privileged container with its own Docker daemon; CI runs that very command"
    },
    "gpu-matrix.yml": {},
}
#: pip settings the runners get from this machine, as PIP_* variables (the CA bundle too:
#: this machine's may hold a proxy's CA). Extra local indexes are not passed: their pages
#: link files outside the directory named.
PIP_SETTINGS = ("index-url", "find-links", "cert")


# --- expressions: the evaluator the rehearsal reads `if:`, `env:` and `with:` with ----------

CONTEXTS: dict[str, Any] = {
    "inputs": {"suite-args": "--in-place --quick", "upgrade": False, "publish": True},
    "secrets": {},
    "vars": {"PIP_INDEX_URL": "https://mirror.example/simple"},
    "github": {"event_name": "schedule", "event": {"schedule": "17 3 1 * *"}},
    "needs": {"resolve": {"result": "success", "outputs": {"count": "0", "matrix": '{"a": 1}'}}},
    "matrix": {"id": "py3.11-x", "gpu": None},
}


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("${{ !contains(inputs.suite-args, '--in-place') }}", False),
        ("contains(inputs.suite-args, '--IN-PLACE')", True),
        ("needs.resolve.outputs.count != '0'", False),
        ("inputs.upgrade || github.event.schedule == '17 3 1 * *'", True),
        ("inputs.missing || 'fallback'", "fallback"),
        ("matrix.gpu && format(' on {0}', matrix.gpu) || ''", ""),
        ("format('{0}-{1}', matrix.id, 2)", "py3.11-x-2"),
        ("fromJSON(needs.resolve.outputs.matrix).a", 1),
        ("!cancelled() && needs.resolve.result == 'success'", True),
        ("always()", True),
        ("(inputs.publish && 'yes') || 'no'", "yes"),
        ("needs['resolve'].outputs.count", "0"),
        ("secrets.PIP_INDEX_URL || vars.PIP_INDEX_URL", "https://mirror.example/simple"),
        ("secrets.PYTORCH_INDEX_URL || vars.PYTORCH_INDEX_URL", None),
    ],
)
def test_expressions(expression: str, value: Any) -> None:
    status = {"always": True, "cancelled": False, "success": True, "failure": False}
    assert evaluate(expression, CONTEXTS, status) == value


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("runner.os", "no context 'runner'"),
        ("hashFiles('x')", "no function hashFiles()"),
        ("inputs.a ==", "ends early"),
        ("inputs.a inputs.b", "unexpected"),
    ],
)
def test_expressions_the_rehearsal_cannot_read_are_refused(expression: str, problem: str) -> None:
    with pytest.raises(ExpressionError, match=re.escape(problem)):
        evaluate(expression, CONTEXTS, {})


@pytest.mark.parametrize(
    ("docker_host", "socket", "env"),
    [
        (None, "/var/run/docker.sock", {}),
        ("", "/var/run/docker.sock", {}),
        ("unix:///run/user/1000/docker.sock", "/run/user/1000/docker.sock", {}),
        ("tcp://127.0.0.1:2375", None, {"DOCKER_HOST": "tcp://127.0.0.1:2375"}),
        ("ssh://builder@host", None, {"DOCKER_HOST": "ssh://builder@host"}),
    ],
)
def test_jobs_reach_the_daemon_that_docker_host_names(
    docker_host: str | None, socket: str | None, env: dict[str, str]
) -> None:
    """A rootless or shared daemon is the tests' daemon too: the jobs get that one."""
    assert daemon_access(docker_host) == (socket, env)


def test_output_files_read_lines_and_blocks() -> None:
    text = "count=1\nmatrix<<EOF\n{\n}\nEOF\nempty=\n"
    assert parse_output_file(text) == {"count": "1", "matrix": "{\n}", "empty": ""}


# --- the rehearsal ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def torch_wheels() -> Path:
    """The directory in pip's find-links that holds the CPU torch for cp311."""
    find_links = pip_config_value("find-links") or ""
    for entry in find_links.split():
        directory = Path(urllib.parse.urlparse(entry).path if "://" in entry else entry)
        if list(directory.glob(f"torch-{TORCH_VERSION}+cpu-cp311-*.whl")):
            return directory
    pytest.skip(f"no CPU wheel of torch {TORCH_VERSION} for cp311 in pip's find-links")


#: A combination the rehearsal's index cannot resolve (no such torch in its directory of
#: wheels), and one that is in no matrix any more: the committed results of each, measured
#: on an H200, are the runs of a lockfile published earlier.
OTHER = "py3.12-cu130-torch2.11.0"
RETIRED = "py3.12-cu130-torch2.11.0-xformers0.0.35"
OTHER_ROW = """
[[combinations]]
python = "3.12"
cuda = "cu130"
torch = "2.11.0"
index = "torch-cpu"
"""
#: The scheduled run's suite, cut to fit a CPU: compiled attention (forward and backward)
#: and compiled dropout, which need the image's compiler, and the model group, which needs
#: the image's suite layer (diffusers).
SCHEDULED_CHECKS = (
    "compile.sdpa.causal.dynamic.fullgraph.fp32.*",
    "compile.sdpa.dropout",
    "model.diffusers.qwenimage.sdpa.*",
)
DIFFUSERS = "0.42.1"


def rehearsal_matrix(torch_wheels: Path, *, scheduled: bool = False) -> str:
    # A scheduled run builds images: from the base image made here (nothing can be pulled),
    # with the suite's own dependencies as a layer of their own.
    extra = 'base-image = "envbuilder-test/python:{python}"\n' if scheduled else ""
    suite = f'[suite]\nrequirements = ["diffusers=={DIFFUSERS}"]\n' if scheduled else ""
    other = OTHER_ROW if scheduled else ""
    return f"""\
# The rehearsal's matrix: one CPU combination, its torch from a local directory of wheels.
[defaults]
platform = "manylinux_2_28_x86_64"
{extra}
[indexes.torch-cpu]
url = "{torch_wheels.as_uri()}"
kind = "find-links"
projects = ["torch"]

[axes]
python = ["3.11"]

[runners]
default = ["ubuntu-24.04"]

{suite}
[[combinations]]
python = "3.11"
cuda = "cpu"
torch = "{TORCH_VERSION}"
index = "torch-cpu"
{other}"""


def clean_clone(target: Path, edit: Callable[[Path], None]) -> Path:
    """The working tree's tracked and unignored files, edited, committed in a new repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode()[-300:]}")
    for name in filter(None, listed.stdout.split(b"\0")):
        source = REPO / os.fsdecode(name)
        if source.is_file() and not source.is_symlink():
            destination = target / os.fsdecode(name)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(source.read_bytes())
            destination.chmod(source.stat().st_mode)
    edit(target)
    git = {"GIT_AUTHOR_NAME": "rehearsal", "GIT_AUTHOR_EMAIL": "rehearsal@localhost"}
    env = {**os.environ, **git, "GIT_COMMITTER_NAME": "rehearsal"}
    env["GIT_COMMITTER_EMAIL"] = "rehearsal@localhost"
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *command], cwd=target, env=env, check=True)
    return target


def for_this_machine(torch_wheels: Path, *, scheduled: bool = False) -> Callable[[Path], None]:
    """The rehearsal's own matrix; the committed results (of the real matrix's locks) go."""

    def edit(clone: Path) -> None:
        matrix = rehearsal_matrix(torch_wheels, scheduled=scheduled)
        (clone / "matrix.toml").write_text(matrix, encoding="utf-8")
        for result in (clone / "results").glob("*.json"):
            result.unlink()

    return edit


def cpu_suite_for_the_schedule(torch_wheels: Path) -> Callable[[Path], None]:
    """The scheduled run's matrix, and the suite's arguments a CPU needs in place of the
    schedule's (none: a GPU runner runs the whole suite): ``--allow-cpu`` and a few checks.
    The one edit of the workflow the rehearsal makes; every step runs as written."""

    def edit(clone: Path) -> None:
        for_this_machine(torch_wheels, scheduled=True)(clone)
        path = clone / ".github" / "workflows" / "gpu-matrix.yml"
        text = path.read_text(encoding="utf-8")
        line = "SUITE_ARGS: ${{ inputs.suite-args }}"
        assert text.count(line) == 1, f"gpu-matrix.yml: expected one {line!r}"
        args = " ".join(["--allow-cpu", *(f"--checks {c}" for c in SCHEDULED_CHECKS)])
        path.write_text(text.replace(line, f'SUITE_ARGS: "{args}"'), encoding="utf-8")

    return edit


def repository_variables() -> dict[str, str]:
    """The repository variables the workflow reads: the default index is this machine's
    (a step's ``secrets.X || vars.X`` that comes out empty would hide it)."""
    index_url = pip_config_value("index-url")
    return {"PIP_INDEX_URL": index_url} if index_url else {}


def runner_machine() -> tuple[dict[str, str], list[str]]:
    """pip's settings here as PIP_* variables, and the local paths they name (mounted)."""
    env: dict[str, str] = {}
    mounts: list[str] = []
    for key in PIP_SETTINGS:
        value = pip_config_value(key)
        if not value:
            continue
        env["PIP_" + key.upper().replace("-", "_")] = value
        for entry in value.split():
            path = urllib.parse.urlparse(entry).path if entry.startswith("file:") else entry
            if path.startswith("/") and Path(path).exists() and path not in mounts:
                mounts.append(path)
    return env, mounts


@pytest.fixture(scope="session")
def pip_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip's download cache for every rehearsed job of the session."""
    return tmp_path_factory.mktemp("pip-cache")


def rehearsal(
    docker_client: Any,
    image: str,
    clone: Path,
    workflow: str,
    home: Path,
    *,
    pip_cache: Path,
    extra_mounts: tuple[str, ...] = (),
    **kwargs: Any,
) -> Rehearsal:
    env, mounts = runner_machine()
    only = kwargs.pop("only", None)
    if only is not None and workflow == "gpu-matrix.yml" and "when" not in only:
        only = ["when", *only]  # the schedule's guard, whose output the resolve job reads
    return Rehearsal(
        client=docker_client,
        image=image,
        clone=clone,
        workflow=workflow,
        home=home,
        machine_env=env,
        mounts=[*mounts, *extra_mounts],
        not_rehearsed=NOT_REHEARSED[workflow],
        pip_cache=pip_cache,
        only=only,
        **kwargs,
    )


def results_of(run: dict[str, JobResult]) -> dict[str, str]:
    return {name: job.result for name, job in run.items()}


#: A GPU matrix run of one combination: the schedule's guard runs, one chunk has jobs.
ONE_CHUNK = {
    "when": "success",
    "conformance-2": "skipped",
    "conformance-3": "skipped",
    "conformance-4": "skipped",
    # the build matrix is chunked the same way: one chunk of images at most here
    "build-2": "skipped",
    "build-3": "skipped",
    "build-4": "skipped",
}
#: Without ENVBUILDER_REGISTRY the conformance job builds its own image.
NO_REGISTRY = {"build": "skipped", "images": "skipped"}


def step_log(job: JobResult, name: str) -> str:
    return next(s.log for s in job.steps if s.name == name)


def released_locks(release: Path) -> dict[str, bytes]:
    """The files under locks/ in a release's compat-locks.tar.gz, by name."""
    with tarfile.open(release / "assets" / "compat-locks.tar.gz") as archive:
        return {
            m.name: archive.extractfile(m).read()  # type: ignore[union-attr]
            for m in archive.getmembers()
            if m.isfile() and m.name.startswith("locks/")
        }


def published_lockfile(release: Path) -> dict[str, Any]:
    return dict(json.loads((release / "assets" / "compat.lock.json").read_text()))


def entry_of(lockfile: Mapping[str, Any], combination: str) -> dict[str, Any]:
    return dict(next(e for e in lockfile["combinations"] if e["id"] == combination))


def assert_attested(home: Path, release: Path) -> None:
    """Every asset of the release has an attestation of its very bytes, but the Sigstore
    bundle beside the lockfile, which is that attestation."""
    assets = sorted((release / "assets").iterdir())
    assert "compat.lock.json.sigstore.json" in [a.name for a in assets], release.name
    for asset in assets:
        if asset.name.endswith(".sigstore.json"):
            continue
        digest = hashlib.sha256(asset.read_bytes()).hexdigest()
        record = home / "published" / "attestations" / f"sha256-{digest}.json"
        assert record.is_file(), f"{asset.name} of {release.name} is not attested"
        assert json.loads(record.read_text())["subject"]["name"] == asset.name


def locked_version(pylock: bytes, project: str) -> str:
    packages = tomllib.loads(pylock.decode())["packages"]
    return str(next(p["version"] for p in packages if p["name"] == project))


@pytest.fixture
def images_kept(docker_client: Any) -> Iterator[None]:
    """The daemon's images of the rehearsed combination (other tests build them) survive the
    runners' hygiene step: a second tag keeps each, and its own tag is restored afterwards."""
    kept = [
        (tag, image)
        for image in docker_client.images.list(name=f"envbuilder/{COMBINATION}")
        for tag in image.tags
    ]
    for number, (_, image) in enumerate(kept):
        image.tag("envbuilder-test/kept", str(number))
    yield
    made = {
        tag
        for image in docker_client.images.list(name=f"envbuilder/{COMBINATION}")
        for tag in image.tags
    } - {tag for tag, _ in kept}
    for tag in sorted(made):  # images the rehearsal built
        docker_client.images.remove(tag)
    for number, (tag, image) in enumerate(kept):
        repository, _, name = tag.rpartition(":")
        image.tag(repository, name)
        docker_client.images.remove(f"envbuilder-test/kept:{number}")


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("images_kept")
def test_the_gpu_matrix_runs_on_bare_runners_and_survives_an_upstream_release(
    docker_client: Any,
    runner_image: str,
    torch_wheels: Path,
    tmp_path: Path,
    pip_cache: Path,
) -> None:
    # The combination's own directory of wheels: the CPU torch, and later a new release
    # of one of its dependencies.
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for torch in torch_wheels.glob(f"torch-{TORCH_VERSION}+cpu-cp311-*.whl"):
        try:
            os.link(torch, wheels / torch.name)
        except OSError:
            shutil.copyfile(torch, wheels / torch.name)
    clone = clean_clone(tmp_path / "clone", for_this_machine(wheels))
    home = tmp_path / "home"
    run = rehearsal(
        docker_client,
        runner_image,
        clone,
        "gpu-matrix.yml",
        home,
        pip_cache=pip_cache,
        extra_mounts=(str(wheels),),
    )
    # A runner that already ran an older lock of this combination keeps its image, until
    # the job's hygiene step removes it.
    old_image = f"envbuilder/{COMBINATION}:000000000000"
    docker_client.images.get(runner_image).tag(f"envbuilder/{COMBINATION}", "000000000000")
    inputs = {"suite-args": SUITE_ARGS, "publish": True}
    variables = repository_variables()

    first = run.run(
        RunSettings(
            event_name="workflow_dispatch", inputs=inputs, variables=variables, run_number=7
        )
    )
    expected = {
        **ONE_CHUNK,
        **NO_REGISTRY,
        "resolve": "success",
        "conformance": "success",
        "aggregate": "success",
        "attest": "success",
        "pages": "success",
        "release": "success",
    }
    assert results_of(first) == expected
    start = "Start from the locks of the latest published lockfile"
    previous = "Start from the last published lockfile"
    assert "No published lockfile yet" in step_log(first["resolve"], start)
    assert "No published lockfile yet" in step_log(first["aggregate"], previous)
    assert json.loads(first["resolve"].outputs["chunk-1"])["include"][0]["id"] == COMBINATION
    results = json.loads(
        (home / "run-7" / "artifacts" / f"results-{COMBINATION}" / f"{COMBINATION}.json")
        .read_text()
    )  # fmt: skip
    assert results["combination"] == COMBINATION and results["checks"]
    # hygiene: the older lock's image is gone; the disk use is in the job summary
    assert not docker_client.images.list(name=old_image)
    assert "docker system df" not in first["conformance"].summary  # the output, not the command
    assert "Build Cache" in first["conformance"].summary
    # published: the site, and a release with the lockfile and its locks
    pages = (home / "published" / "pages" / "index.html").read_text(encoding="utf-8")
    assert COMBINATION in pages
    day = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d")
    releases = home / "published" / "releases"
    assert sorted(p.name for p in releases.iterdir()) == [f"compat-{day}-7.1"]
    first_locks = released_locks(releases / f"compat-{day}-7.1")
    assert_attested(home, releases / f"compat-{day}-7.1")
    first_runs = entry_of(published_lockfile(releases / f"compat-{day}-7.1"), COMBINATION)["runs"]
    assert len(first_runs) == 1
    pylock = next(name for name in first_locks if name.endswith(".toml"))
    old_filelock = locked_version(first_locks[pylock], "filelock")

    # Upstream releases a new filelock (torch requires it, unpinned); the resolver sees it.
    build_wheel(wheels, "filelock", "99.0.0")
    upgraded = subprocess.run(
        [sys.executable, "-m", "envbuilder", "resolve", "--upgrade", "--matrix",
         str(clone / "matrix.toml"), "--out", str(tmp_path / "upgraded")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    moved = (tmp_path / "upgraded" / Path(pylock).name).read_bytes()
    assert locked_version(moved, "filelock") == "99.0.0"

    # Re-run all jobs (attempt 2): it starts from the published locks and keeps them (their
    # inputs hold), so the evidence stays bound to the current locks; it merges into the
    # published lockfile, so the first attempt's run is kept beside its own; it publishes
    # beside the first release, and Pages is replaced.
    second = run.run(
        RunSettings(
            event_name="workflow_dispatch",
            inputs=inputs,
            variables=variables,
            run_number=7,
            run_attempt=2,
        )
    )
    assert results_of(second) == expected
    assert f"Starting from the locks of compat-{day}-7.1" in step_log(second["resolve"], start)
    assert f"Merging into the lockfile of compat-{day}-7.1" in step_log(
        second["aggregate"], previous
    )
    merged = step_log(second["aggregate"], "Merge the results into the compatibility lockfile")
    assert "1 run(s) kept from" in merged, merged
    second_lockfile = published_lockfile(releases / f"compat-{day}-7.2")
    second_runs = entry_of(second_lockfile, COMBINATION)["runs"]
    assert len(second_runs) == 2, second_runs

    # the earlier evidence, as it was published; only a source path that no longer leads to
    # its file from the new lockfile says where it was carried from
    def without_source(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k != "source"}

    (kept,) = [r for r in second_runs if without_source(r) == without_source(first_runs[0])]
    assert kept["source"] == first_runs[0]["source"] or kept["source"].startswith(
        "carried from lockfile "
    ), kept["source"]
    assert_attested(home, releases / f"compat-{day}-7.2")
    assert sorted(p.name for p in releases.iterdir()) == [f"compat-{day}-7.1", f"compat-{day}-7.2"]
    second_locks = released_locks(releases / f"compat-{day}-7.2")
    assert second_locks[pylock] == first_locks[pylock]
    assert locked_version(second_locks[pylock], "filelock") == old_filelock
    resolutions = [
        json.loads(locks["locks/resolution.json"])["combinations"]
        for locks in (first_locks, second_locks)
    ]
    assert [c["lock_sha256"] for c in resolutions[1]] == [c["lock_sha256"] for c in resolutions[0]]
    assert COMBINATION in (home / "published" / "pages" / "index.html").read_text()

    # The monthly schedule is an upgrade: its resolve job takes the new release (the rest
    # of a scheduled run is the full suite in containers, not rehearsed here).
    monthly = load_workflow(clone / ".github" / "workflows" / "gpu-matrix.yml")["on"]["schedule"][1]
    resolve_only = rehearsal(
        docker_client,
        runner_image,
        clone,
        "gpu-matrix.yml",
        home,
        pip_cache=pip_cache,
        extra_mounts=(str(wheels),),
        only=["resolve"],
    )
    upgrade = resolve_only.run(
        RunSettings(
            event_name="schedule", schedule=monthly["cron"], variables=variables, run_number=8
        )
    )
    assert upgrade["resolve"].result == "success"
    assert "Upgrade run" in step_log(upgrade["resolve"], start)
    upgraded_lock = (home / "run-8" / "artifacts" / pylock).read_bytes()  # the `locks` artifact
    assert locked_version(upgraded_lock, "filelock") == "99.0.0"
    for number, done in enumerate((first, second), start=1):
        for job in ("conformance", "aggregate"):
            print(f"=== run {number}, {job}: the job summary\n{done[job].summary}")
    for job in ("resolve", "conformance", "aggregate", "pages", "release"):
        print(f"{job}: run 1 {first[job].seconds:.0f} s, run 2 {second[job].seconds:.0f} s")


def earlier_lockfile(tmp_path: Path) -> Path:
    """A lockfile published before this runner's matrix: the committed H200 runs of OTHER and
    RETIRED, merged by `envbuilder lock` (neither is in its resolution: both retired)."""
    out = tmp_path / "earlier"
    (out / "locks").mkdir(parents=True)
    resolution = Resolution(matrix="matrix.toml", matrix_sha256="0" * 64, combinations=())
    (out / "locks" / "resolution.json").write_text(json.dumps(resolution.to_json()))
    files = [
        REPO / "results" / f"{combination}.h200.quick.json" for combination in (OTHER, RETIRED)
    ]
    done = subprocess.run(
        [sys.executable, "-m", "envbuilder", "lock", "--resolution", "locks/resolution.json",
         "--results", *map(str, files), "-o", "compat.lock.json"],
        cwd=out, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "compat.lock.json"


def packed(lockfile: Path) -> Path:
    """compat-locks.tar.gz beside *lockfile*, as the aggregate job packs it."""
    archive = lockfile.parent / "compat-locks.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(lockfile, arcname="compat.lock.json")
        tar.add(lockfile.parent / "locks", arcname="locks")
    return archive


def attest_release(home: Path, release: Path, *, ref: str = "refs/heads/main") -> None:
    """Attestations of *release*'s assets as the workflow's attest job (on *ref*) makes them."""
    store = home / "published" / "attestations"
    store.mkdir(parents=True, exist_ok=True)
    repository = RunSettings(event_name="schedule").repository
    for asset in (release / "assets").iterdir():
        digest = hashlib.sha256(asset.read_bytes()).hexdigest()
        record = {
            "subject": {"name": asset.name, "path": asset.name, "digest": {"sha256": digest}},
            "predicateType": "https://slsa.dev/provenance/v1",
            "repository": repository,
            "workflow_ref": f"{repository}/.github/workflows/gpu-matrix.yml@{ref}",
            "run_id": "1005",
            "run_attempt": "1",
            "sha": "0" * 40,
        }
        (store / f"sha256-{digest}.json").write_text(json.dumps(record, indent=2))


def publish_release(home: Path, tag: str, assets: list[Path]) -> Path:
    """A release as the runners' gh keeps it (made before the run: the newest one)."""
    releases = home / "published" / "releases"
    release = releases / tag
    (release / "assets").mkdir(parents=True)
    for asset in assets:
        shutil.copyfile(asset, release / "assets" / asset.name)
    order = len(list(releases.iterdir()))
    record = {"tag": tag, "target": "0" * 40, "title": tag, "notes": "", "latest": True}
    (release / "release.json").write_text(json.dumps({**record, "order": order}))
    return release


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("images_kept")
def test_a_scheduled_run_builds_the_image_once_pulls_it_by_digest_and_keeps_evidence(
    docker_client: Any,
    runner_image: str,
    base_image: str,
    torch_wheels: Path,
    tmp_path: Path,
    pip_cache: Path,
) -> None:
    with contextlib.ExitStack() as stack:
        scheduled_run(stack, docker_client, runner_image, torch_wheels, tmp_path, pip_cache)


def scheduled_run(
    stack: contextlib.ExitStack[bool | None],
    docker_client: Any,
    runner_image: str,
    torch_wheels: Path,
    tmp_path: Path,
    pip_cache: Path,
) -> None:
    clone = clean_clone(tmp_path / "clone", cpu_suite_for_the_schedule(torch_wheels))
    home = tmp_path / "home"
    earlier = earlier_lockfile(tmp_path)
    earlier_tag = "compat-20261201-5.1"
    attest_release(home, publish_release(home, earlier_tag, [earlier, packed(earlier)]))
    kept_before = {
        e["id"]: e["runs"] for e in json.loads(earlier.read_text())["retired"]
    }  # fmt: skip
    run = rehearsal(docker_client, runner_image, clone, "gpu-matrix.yml", home, pip_cache=pip_cache)
    schedules = load_workflow(clone / ".github" / "workflows" / "gpu-matrix.yml")["on"]["schedule"]
    # the weekly run, except on the 1st: then the monthly one runs and the weekly stands down
    on_the_first = datetime.datetime.now(datetime.UTC).day == 1
    weekly = schedules[1 if on_the_first else 0]
    # The registry the runners share: on loopback (the daemon pushes there over HTTP).
    registry = stack.enter_context(RegistryServer(tmp_path / "registry"))
    variables = {**repository_variables(), "ENVBUILDER_REGISTRY": registry.address}

    done = run.run(
        RunSettings(
            event_name="schedule", schedule=weekly["cron"], variables=variables, run_number=9
        )
    )

    assert results_of(done) == {
        **ONE_CHUNK,
        "resolve": "success",
        "build": "success",
        "images": "success",
        "conformance": "success",
        "aggregate": "success",
        "attest": "success",
        "pages": "success",
        "release": "success",
    }
    # only the resolvable combination gets a job; its image is built once, by the build job,
    # pushed by digest, and its record attested on the (hosted) images job
    assert [e["id"] for e in json.loads(done["resolve"].outputs["chunk-1"])["include"]] == [
        COMBINATION
    ]
    record_file = home / "run-9" / "artifacts" / f"image-{COMBINATION}" / f"{COMBINATION}.json"
    record = ImageRecord.loads(record_file.read_text(encoding="utf-8"))
    digest = record.reference.rpartition("@")[2]
    assert record.reference == f"{registry.address}/envbuilder/{COMBINATION}@{digest}"
    assert registry.tags(f"envbuilder/{COMBINATION}") == [record.lock_sha256[:12]]
    attested = hashlib.sha256(record_file.read_bytes()).hexdigest()
    assert (home / "published" / "attestations" / f"sha256-{attested}.json").is_file()
    # the conformance job verified the record, pulled the image by its digest and checked it
    verify = "Verify that this workflow attested the image record"
    assert "Verification succeeded" in step_log(done["conformance"], verify)
    image_step = "Build the image from the lock and run the conformance suite in it"
    assert [s.outcome for s in done["conformance"].steps if s.name == image_step] == ["success"]
    suite_log = step_log(done["conformance"], image_step)
    assert f"pull {record.reference}" in suite_log
    assert f"is image {record.image_id}" in suite_log
    assert ("GET", f"/v2/envbuilder/{COMBINATION}/manifests/{digest}") in registry.requests
    assert f"::group::build envbuilder/{COMBINATION}:" not in suite_log  # nothing built here
    results = json.loads(
        (home / "run-9" / "artifacts" / f"results-{COMBINATION}" / f"{COMBINATION}.json")
        .read_text()
    )  # fmt: skip
    assert results["runner"]["cc"] == "gcc"  # by name; the image's compiler, not the runner's
    built = docker_client.images.get(f"envbuilder/{COMBINATION}:{results['lock_sha256'][:12]}")
    assert built.labels["io.envbuilder.suite.diffusers"] == DIFFUSERS
    # merged into the last published lockfile
    previous = step_log(done["aggregate"], "Start from the last published lockfile")
    assert f"Merging into the lockfile of {earlier_tag} (attestation verified)" in previous
    assert previous.count("Verification succeeded") == 2  # the lockfile and its archive
    merged = step_log(done["aggregate"], "Merge the results into the compatibility lockfile")
    assert "2 run(s) kept from" in merged, merged
    assert re.search(rf"retired\s+{re.escape(RETIRED)}: last verified", merged), merged
    day = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d")
    releases = home / "published" / "releases"
    assert sorted(p.name for p in releases.iterdir()) == sorted([earlier_tag, f"compat-{day}-9.1"])
    release = releases / f"compat-{day}-9.1"
    lockfile = published_lockfile(release)
    assert_attested(home, release)
    # this run's evidence: compiled checks and the model group, measured in the image
    (measured,) = entry_of(lockfile, COMBINATION)["runs"]
    statuses = {c["name"]: c["status"] for c in measured["checks"]}
    compiled = sorted(n for n in statuses if n.startswith("compile.sdpa."))
    model = sorted(n for n in statuses if n.startswith("model.diffusers."))
    assert len(compiled) == 3 and len(model) == 4, statuses
    assert {statuses[n] for n in compiled} == {"pass"}, statuses
    assert {statuses[n] for n in model} <= {"pass", "fail"}, statuses  # none skipped
    # the other combination's runs are kept (as stale evidence: its lock is not this run's)
    other = entry_of(lockfile, OTHER)
    assert other["status"] == "unsatisfiable" and other["runs"] == []
    assert [r["started"] for r in other["stale_runs"]] == [r["started"] for r in kept_before[OTHER]]
    assert other["last_verified"]["date"] == kept_before[OTHER][0]["date"]
    # the retired combination stays retired, with its runs
    assert [(r["id"], len(r["runs"])) for r in lockfile["retired"]] == [(RETIRED, 1)]
    for entry in lockfile["combinations"]:
        if entry["runs"] or entry["stale_runs"]:
            assert entry["last_verified"]["date"], entry["id"]
    # The next run: the lock did not change, so the attested record is kept and nothing built.
    again = rehearsal(
        docker_client, runner_image, clone, "gpu-matrix.yml", home, pip_cache=pip_cache,
        only=["resolve", "build"],
    ).run(RunSettings(event_name="schedule", schedule=weekly["cron"], variables=variables, run_number=10))  # fmt: skip
    assert again["build"].result == "success"
    kept = step_log(again["build"], "Build the image from the lock and push it, unless an attested record names it")  # fmt: skip
    assert f"its lock did not change; {record.reference} is kept, not built" in kept, kept
    assert (
        ImageRecord.loads(
            (
                home / "run-10" / "artifacts" / f"image-{COMBINATION}" / f"{COMBINATION}.json"
            ).read_text()
        )
        == record
    )
    planted_record(docker_client, runner_image, clone, home, pip_cache, variables, record)
    planted_review_workflow(clone, tmp_path / "planted-workflows")
    print(f"=== the scheduled run's merge\n{merged}")
    for job in ("conformance", "aggregate"):
        print(f"=== the scheduled run, {job}: the job summary\n{done[job].summary}")
    for job in ("resolve", "conformance", "aggregate", "pages", "release"):
        print(f"{job}: {done[job].seconds:.0f} s")


def planted_record(
    docker_client: Any,
    runner_image: str,
    clone: Path,
    home: Path,
    pip_cache: Path,
    variables: Mapping[str, str],
    genuine: ImageRecord,
) -> None:
    """A forged image record where the build job restores earlier runs' records: the same
    lock, another image. No run of this workflow attested it, so it is refused and the
    image is built from the lock; the forged reference is never measured nor kept."""
    forged = ImageRecord(
        combination=genuine.combination,
        lock_sha256=genuine.lock_sha256,
        image_id="sha256:" + "e" * 64,
        reference=genuine.reference.rpartition("@")[0] + "@sha256:" + "d" * 64,
    )
    cache = home / "published" / "actions-cache" / "image-records-9999"  # the newest
    cache.mkdir(parents=True)
    (cache / f"{COMBINATION}.json").write_text(forged.dumps())
    weekly = load_workflow(clone / ".github" / "workflows" / "gpu-matrix.yml")["on"]["schedule"]
    cron = weekly[1 if datetime.datetime.now(datetime.UTC).day == 1 else 0]["cron"]
    third = rehearsal(
        docker_client, runner_image, clone, "gpu-matrix.yml", home, pip_cache=pip_cache,
        only=["resolve", "build"],
    ).run(RunSettings(event_name="schedule", schedule=cron, variables=variables, run_number=11))  # fmt: skip
    log = step_log(third["build"], "Build the image from the lock and push it, unless an attested record names it")  # fmt: skip
    assert third["build"].result == "success", log
    assert "failed to fetch attestations for subject" in log, log
    assert forged.reference not in log.split("failed to fetch attestations")[1], log
    made = ImageRecord.loads(
        (home / "run-11" / "artifacts" / f"image-{COMBINATION}" / f"{COMBINATION}.json").read_text()
    )
    assert made.reference != forged.reference and made.image_id != forged.image_id
    print(f"=== a forged image record, refused\n{log}")


def planted_review_workflow(clone: Path, planted: Path) -> None:
    """A review-triggered workflow beside the GPU matrix that asks for its runners: the
    runner-exposure rule (the lint gate's tests/unit/test_workflow_safety.py) refuses it."""
    from tests.unit.test_workflow_safety import check

    shutil.copytree(clone / ".github" / "workflows", planted)
    assert check(planted) == []
    (planted / "review.yml").write_text(
        "on:\n  pull_request_target:\n    types: [opened, synchronize]\n"
        "permissions:\n  contents: read\n"
        "jobs:\n  measure:\n    runs-on: [self-hosted, linux, x64, gpu]\n"
        "    timeout-minutes: 5\n    steps:\n      - run: echo measured\n"
    )
    refused = check(planted)
    assert refused and all("pull_request_target" in r for r in refused), refused
    print("=== a review-triggered workflow, refused\n" + "\n".join(refused))


@pytest.mark.docker
@pytest.mark.slow
def test_ci_runs_on_bare_runners(
    docker_client: Any,
    runner_image: str,
    torch_wheels: Path,
    tmp_path: Path,
    pip_cache: Path,
) -> None:
    clone = clean_clone(tmp_path / "clone", for_this_machine(torch_wheels))
    run = rehearsal(
        docker_client, runner_image, clone, "ci.yml", tmp_path / "home", pip_cache=pip_cache
    )
    done = run.run(RunSettings(event_name="pull_request"))
    assert results_of(done) == {"lint": "success", "typecheck": "success", "tests": "skipped"}
    assert done["tests"].reason == NOT_REHEARSED["ci.yml"]["tests"]


def without_step(workflow: str, job: str, name: str) -> Callable[[Path], None]:
    def edit(clone: Path) -> None:
        path = clone / ".github" / "workflows" / workflow
        data = load_workflow(path)
        steps = data["jobs"][job]["steps"]
        kept = [s for s in steps if s.get("name") != name]
        assert len(kept) == len(steps) - 1, f"{workflow}: job {job} has no step {name!r}"
        data["jobs"][job]["steps"] = kept
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    return edit


@pytest.mark.docker
@pytest.mark.parametrize(
    ("workflow", "job", "removed", "failing"),
    [
        ("ci.yml", "lint", "Install nox", "Lint"),
        ("ci.yml", "typecheck", "Install nox", "Type check"),
        (
            "gpu-matrix.yml",
            "resolve",
            "Install nox",
            "Resolve the selected combinations into hash-pinned locks",
        ),
    ],
)
def test_a_step_fails_when_the_install_it_needs_is_removed(
    docker_client: Any,
    runner_image: str,
    torch_wheels: Path,
    tmp_path: Path,
    pip_cache: Path,
    workflow: str,
    job: str,
    removed: str,
    failing: str,
) -> None:
    def edit(clone: Path) -> None:
        for_this_machine(torch_wheels)(clone)
        without_step(workflow, job, removed)(clone)

    clone = clean_clone(tmp_path / "clone", edit)
    run = rehearsal(
        docker_client,
        runner_image,
        clone,
        workflow,
        tmp_path / "home",
        pip_cache=pip_cache,
        only=[job],
    )
    done = run.run(RunSettings(event_name="workflow_dispatch"))[job]
    assert done.result == "failure"
    outcomes = [(s.name, s.outcome) for s in done.steps if s.outcome != "skipped"]
    assert outcomes[-1] == (failing, "failure"), outcomes
    assert all(outcome == "success" for _, outcome in outcomes[:-1]), outcomes
    assert "nox: command not found" in step_log(done, failing)


def without_overwrite(workflow: str, job: str, name: str) -> Callable[[Path], None]:
    def edit(clone: Path) -> None:
        path = clone / ".github" / "workflows" / workflow
        data = load_workflow(path)
        step = next(s for s in data["jobs"][job]["steps"] if s.get("name") == name)
        assert step["with"].pop("overwrite") is True
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    return edit


@pytest.mark.docker
@pytest.mark.slow
def test_a_re_run_fails_where_an_upload_does_not_overwrite(
    docker_client: Any,
    runner_image: str,
    torch_wheels: Path,
    tmp_path: Path,
    pip_cache: Path,
) -> None:
    def edit(clone: Path) -> None:
        for_this_machine(torch_wheels)(clone)
        without_overwrite("gpu-matrix.yml", "resolve", "Upload the locks")(clone)

    clone = clean_clone(tmp_path / "clone", edit)
    run = rehearsal(
        docker_client,
        runner_image,
        clone,
        "gpu-matrix.yml",
        tmp_path / "home",
        pip_cache=pip_cache,
        only=["resolve"],
    )
    first = run.run(RunSettings(event_name="workflow_dispatch", run_number=3))["resolve"]
    assert first.result == "success"
    again = run.run(RunSettings(event_name="workflow_dispatch", run_number=3, run_attempt=2))
    outcomes = [(s.name, s.outcome) for s in again["resolve"].steps]
    assert outcomes[-1] == ("Upload the locks", "failure"), outcomes
    assert "artifact with this name already exists" in step_log(
        again["resolve"], "Upload the locks"
    )
