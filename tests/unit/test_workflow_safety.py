"""Only triggers that never run pull-request code reach a self-hosted runner.

A pull request's workflow files come from its branch (a fork's too), review and comment
events check out its merge ref, ``pull_request_target`` runs with the base repository's
rights one checkout away from the pull request's code, and a ``workflow_run`` or a called
workflow runs under whatever started its caller. A job that can land on a persistent
self-hosted runner (whose user controls Docker) would run a stranger's code there.

The rule, for every workflow file together: a job that can select a self-hosted runner
may be started only by the allow-list (`schedule`, `workflow_dispatch`, `push` to a
protected branch, `release`); a ``workflow_call`` counts as what starts each of its callers
in this repository (none: refused), a ``workflow_run`` as what starts each workflow it
follows (one not here: refused). Everything else is refused with the reason.

A job can select a self-hosted runner unless its ``runs-on`` can only ever be one
GitHub-hosted label. Literal labels, lists, ``group:``/``labels:`` mappings and ``${{ }}``
expressions are all read; an expression passes only when every value it can produce is a
hosted label (its string literals, and the values of a literal ``strategy.matrix``), so
anything taken from inputs, variables, job outputs or functions counts as self-hosted.

This guards the repository's own files; the runner group (README, runner safety) is what
keeps a fork's edited copy away from the GPU runners.
"""

from __future__ import annotations

import itertools
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_DIR = REPO / ".github" / "workflows"
#: Triggers that never run pull-request code, whatever their filters.
ALLOWED_EVENTS = frozenset({"schedule", "workflow_dispatch", "release"})
#: Branches only maintainers can push to (branch protection): `push` to these is allowed.
PROTECTED_BRANCHES = frozenset({"main"})
ALLOW_LIST = "schedule, workflow_dispatch, push to a protected branch, release"
#: Why the events that carry pull-request code are refused (the rest: not on the allow-list).
PULL_REQUEST_CODE = {
    "pull_request": "runs the pull request's branch, a fork's too",
    "pull_request_target": (
        "runs for forks' pull requests with the base repository's rights, one checkout away"
        " from their code"
    ),
    "pull_request_review": "a review event checks out the pull request's merge ref",
    "pull_request_review_comment": (
        "a review comment event checks out the pull request's merge ref"
    ),
    "issue_comment": (
        "anyone can comment, and a comment on a pull request is one checkout away from its code"
    ),
    "merge_group": "runs the merge queue's branch: pull-request code before it lands",
}
#: GitHub-hosted runner labels: ubuntu-24.04, ubuntu-24.04-arm, windows-2025, macos-15-xlarge...
HOSTED = re.compile(r"(ubuntu|windows|macos)-(latest|\d+(\.\d+)?)(-(arm|intel|large|xlarge))?")


class _NotALabel:
    """A value that selects no runner at all (a boolean, an empty string): the job fails."""

    def __repr__(self) -> str:
        return "<not a label>"


class _Unknown:
    """A value the workflow file does not fix (an input, a variable, a job output, ...)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __repr__(self) -> str:
        return self.source


NOT_A_LABEL = _NotALabel()
Value = str | _NotALabel | _Unknown

# --- the workflow files ------------------------------------------------------------------------


def load(text: str, where: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{where}: not a mapping"
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def triggers(workflow: Mapping[str, Any]) -> dict[str, Any]:
    """Each event of `on:` with its filters (None where it has none)."""
    on = workflow.get("on")
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {str(event): None for event in on}
    if isinstance(on, dict):
        return {str(event): spec for event, spec in on.items()}
    return {}


# --- expressions: what values can `runs-on` take? ----------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[!()\[\],.<>*])|(?P<name>[A-Za-z_][\w-]*))"
)
_EMBEDDED = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


class _Values:
    """The values an expression can produce (GitHub's `&&`/`||` return one of their operands)."""

    def __init__(self, text: str, matrix: Any) -> None:
        self.text = text
        self.matrix = matrix
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text) and text[pos:].strip():
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"cannot read the expression {text!r}")
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m[kind]))
            pos = m.end()
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise ValueError(f"the expression {self.text!r} ends early")
        self.at += 1
        return self.tokens[self.at - 1]

    def all(self) -> set[Value]:
        values = self.or_()
        if self.at != len(self.tokens):
            raise ValueError(f"{self.text!r}: unexpected {self.tokens[self.at][1]!r}")
        return values

    def or_(self) -> set[Value]:
        values = self.and_()
        while self.peek() == "||":  # any operand can be the result
            self.take()
            values |= self.and_()
        return values

    def and_(self) -> set[Value]:
        values = self.comparison()
        while self.peek() == "&&":  # the last operand, or a falsy earlier one
            self.take()
            values = self.comparison() | {NOT_A_LABEL}
        return values

    def comparison(self) -> set[Value]:
        values = self.unary()
        while self.peek() in ("==", "!=", "<", ">", "<=", ">="):
            self.take()
            self.unary()
            values = {NOT_A_LABEL}  # a boolean
        return values

    def unary(self) -> set[Value]:
        if self.peek() == "!":
            self.take()
            self.unary()
            return {NOT_A_LABEL}
        return self.primary()

    def primary(self) -> set[Value]:
        kind, text = self.take()
        if text == "(":
            values = self.or_()
            self.take()
            return values
        if kind == "str":
            return {text[1:-1].replace("''", "'")}
        if kind == "num":
            return {text}
        if kind != "name":
            raise ValueError(f"{self.text!r}: unexpected {text!r}")
        if text in ("true", "false", "null"):
            return {NOT_A_LABEL}
        name, path = text, [text]
        if self.peek() == "(":  # a function: its result is not read here
            self.take()
            self.skip_to(")")
            name, path = f"{text}()", []
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                key = self.take()[1]
                name, path = f"{name}.{key}", [*path, key]
            else:
                self.skip_to("]")
                name, path = f"{name}[...]", []
        # `matrix.KEY` of a literal matrix has the values written there; all else is unknown.
        if len(path) == 2 and path[0] == "matrix" and isinstance(self.matrix, dict):
            return matrix_values(self.matrix, path[1]) or {_Unknown(name)}
        return {_Unknown(name)}

    def skip_to(self, closing: str) -> None:
        opening = {")": "(", "]": "["}[closing]
        depth = 1
        while depth:
            token = self.take()[1]
            depth += (token == opening) - (token == closing)


def matrix_values(matrix: Mapping[str, Any], key: str) -> set[Value]:
    values: set[Value] = set()
    axis = matrix.get(key)
    if axis is not None:
        entries = axis if isinstance(axis, list) else [axis]
        values |= {scalar(v, f"matrix.{key}") for v in entries}
    for entry in matrix.get("include") or []:
        if isinstance(entry, dict) and key in entry:
            values.add(scalar(entry[key], f"matrix.{key}"))
    return values


def scalar(value: Any, source: str) -> Value:
    if isinstance(value, str) and "${{" not in value:
        return value
    return _Unknown(f"{source} = {value!r}")


def string_values(raw: str, matrix: Any) -> set[Value]:
    """The values of a `runs-on` string: literal, one expression, or text around expressions."""
    whole = _EMBEDDED.fullmatch(raw.strip())
    if whole:
        return _Values(whole[1], matrix).all()
    parts = _EMBEDDED.split(raw)
    if len(parts) == 1:
        return {raw}
    choices: list[list[str]] = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            choices.append([part])
            continue
        values = _Values(part, matrix).all()
        if not all(isinstance(v, str) for v in values):
            return {_Unknown(f"{raw!r}")}
        choices.append([v for v in values if isinstance(v, str)])
    return {"".join(combination) for combination in itertools.product(*choices)}


# --- the rule ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    workflow: str
    job: str
    problem: str

    def __str__(self) -> str:
        return f"{self.workflow}: job {self.job!r}: {self.problem}"


def label_problem(values: set[Value]) -> str | None:
    unsafe = sorted((repr(v) for v in values if v is not NOT_A_LABEL and not _hosted(v)), key=str)
    if unsafe:
        return f"can run on {', '.join(unsafe)}, which is not a GitHub-hosted label"
    return None


def _hosted(value: Value) -> bool:
    return isinstance(value, str) and HOSTED.fullmatch(value) is not None


def runs_on_problem(runs_on: Any, matrix: Any) -> str | None:
    """Why `runs-on` can select a self-hosted runner, or None when it can only be hosted."""
    if isinstance(runs_on, dict):
        if "group" in runs_on:
            return f"runs-on names a runner group ({runs_on['group']!r}): groups hold self-hosted runners"
        if "labels" not in runs_on:
            return f"runs-on {runs_on!r} has no labels"
        runs_on = runs_on["labels"]
    if isinstance(runs_on, str):
        return label_problem(string_values(runs_on, matrix))
    if isinstance(runs_on, list):
        if len(runs_on) != 1:
            # A runner must carry every label: no hosted runner has two, self-hosted ones do.
            return (
                f"runs-on {runs_on!r} asks for several labels: only a self-hosted runner has them"
            )
        return runs_on_problem(runs_on[0], matrix)
    return f"runs-on {runs_on!r} is not a label, a list or a mapping"


Workflows = Mapping[str, Mapping[str, Any]]


def load_workflows(directory: Path) -> dict[str, dict[str, Any]]:
    """Every workflow file of ``directory`` by file name."""
    return {
        path.name: load(path.read_text(encoding="utf-8"), str(path))
        for path in sorted([*directory.glob("*.yml"), *directory.glob("*.yaml")])
    }


def _local_call(uses: str) -> str | None:
    """The file name a job's ``uses:`` calls in this repository, None for another repository's."""
    if not uses.startswith("./.github/workflows/"):
        return None
    return uses.split("@", 1)[0].removeprefix("./.github/workflows/")


def reach(name: str, job: Mapping[str, Any], workflows: Workflows) -> str | None:
    """How the job can land on a self-hosted runner, None when it only runs on hosted ones
    (a call of a workflow here: its own jobs answer for themselves, under the caller's triggers)."""
    if "uses" in job:
        target = str(job["uses"])
        local = _local_call(target)
        if local is None:
            return f"calls {target}, whose runners this repository cannot check"
        if local not in workflows:
            return f"calls {target}, which does not exist"
        return None
    if "runs-on" not in job:
        return "has no runs-on"
    matrix = (job.get("strategy") or {}).get("matrix")
    try:
        return runs_on_problem(job["runs-on"], matrix)
    except ValueError as e:
        return str(e)


def push_problem(spec: Any) -> str | None:
    """Why a ``push`` trigger can run code no maintainer merged, None when it cannot."""
    if not isinstance(spec, dict) or "branches" not in spec:
        return "push of any branch runs whatever was pushed (no `branches:` filter)"
    for key in ("branches-ignore", "tags", "tags-ignore"):
        if key in spec:
            return f"push with `{key}:` runs refs that are not protected branches"
    branches = spec["branches"]
    if not isinstance(branches, list) or not branches:
        return f"push `branches: {branches!r}` is not a list of branch names"
    other = sorted(str(b) for b in branches if b not in PROTECTED_BRANCHES)
    if other:
        return (
            f"push to {', '.join(other)}: not a protected branch"
            f" ({', '.join(sorted(PROTECTED_BRANCHES))})"
        )
    return None


def trigger_problems(
    name: str, workflows: Workflows, seen: frozenset[str] = frozenset()
) -> list[str]:
    """Why the workflow ``name`` can be started with pull-request code: one line per trigger
    off the allow-list, a called or following workflow by what starts its callers."""
    on = triggers(workflows[name])
    if not on:
        return ["has no `on:` that this check can read"]
    seen = seen | {name}
    problems: list[str] = []
    for event, spec in on.items():
        if event in ALLOWED_EVENTS:
            continue
        if event == "push":
            problem = push_problem(spec)
            problems += [f"push: {problem}"] if problem else []
        elif event == "workflow_call":
            problems += _caller_problems(name, workflows, seen)
        elif event == "workflow_run":
            problems += _run_problems(spec, workflows, seen)
        else:
            why = PULL_REQUEST_CODE.get(event, f"not on the allow-list ({ALLOW_LIST})")
            problems.append(f"{event}: {why}")
    return problems


def _caller_problems(name: str, workflows: Workflows, seen: frozenset[str]) -> list[str]:
    callers = [
        (caller, job_name)
        for caller, workflow in workflows.items()
        for job_name, job in (workflow.get("jobs") or {}).items()
        if isinstance(job, dict) and _local_call(str(job.get("uses", ""))) == name
    ]
    if not callers:
        return ["workflow_call: no workflow here calls it, so what starts it cannot be checked"]
    return [
        f"workflow_call from {caller} (job {job_name!r}) <- {problem}"
        for caller, job_name in callers
        if caller not in seen
        for problem in trigger_problems(caller, workflows, seen)
    ]


def workflow_name(file: str, workflow: Mapping[str, Any]) -> str:
    """The name ``workflow_run`` knows a workflow by: its ``name:``, else its path."""
    return str(workflow.get("name") or f".github/workflows/{file}")


def _run_problems(spec: Any, workflows: Workflows, seen: frozenset[str]) -> list[str]:
    followed = spec.get("workflows") if isinstance(spec, dict) else None
    if not isinstance(followed, list) or not followed:
        return ["workflow_run: names no `workflows:` it follows"]
    problems: list[str] = []
    for wanted in followed:
        files = [f for f, w in workflows.items() if workflow_name(f, w) == wanted]
        if not files:
            problems.append(f"workflow_run after {wanted!r}: no workflow here has that name")
        problems += [
            f"workflow_run after {file} <- {problem}"
            for file in files
            if file not in seen
            for problem in trigger_problems(file, workflows, seen)
        ]
    return problems


def findings(directory: Path) -> list[Finding]:
    """Every job, in every workflow of ``directory``, that can select a self-hosted runner
    and be started by a trigger off the allow-list: one finding per such trigger."""
    workflows = load_workflows(directory)
    found: list[Finding] = []
    for file, workflow in workflows.items():
        jobs = workflow.get("jobs") or {}
        exposed = {n: why for n, job in jobs.items() if (why := reach(n, job, workflows))}
        if not exposed:
            continue
        for problem in trigger_problems(file, workflows):
            found += [Finding(file, n, f"{why}, and {problem}") for n, why in exposed.items()]
    return found


def check(directory: Path) -> list[str]:
    return [str(f) for f in findings(directory)]


# --- the repository's workflows pass -------------------------------------------------------------


def test_the_repositorys_self_hosted_jobs_start_only_from_the_allow_list() -> None:
    assert check(WORKFLOW_DIR) == []


def test_the_gpu_matrix_reaches_self_hosted_runners_and_ci_does_not() -> None:
    """So the rule above does judge the GPU matrix's triggers, and ci.yml's pull_request
    trigger is allowed only because none of its jobs can leave GitHub's hosted runners."""
    workflows = load_workflows(WORKFLOW_DIR)
    gpu, ci = workflows["gpu-matrix.yml"], workflows["ci.yml"]
    assert reach("conformance", gpu["jobs"]["conformance"], workflows) is not None
    assert [n for n, job in ci["jobs"].items() if reach(n, job, workflows)] == []
    assert "pull_request" in triggers(ci)
    assert trigger_problems("gpu-matrix.yml", workflows) == []


def workflow_dir(tmp_path: Path, files: Mapping[str, str]) -> Path:
    directory = tmp_path / ".github" / "workflows"
    directory.mkdir(parents=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


#: Every event GitHub starts workflows on, once each, starting a job on a self-hosted runner:
#: None where that is allowed, else a part of the reason it is refused. A `workflow_call`
#: has no caller here; a `workflow_run` follows CI, which pull requests start.
EVERY_TRIGGER: list[tuple[str, str | None]] = [
    ("branch_protection_rule", "branch_protection_rule: not on the allow-list"),
    ("check_run", "check_run: not on the allow-list"),
    ("check_suite", "check_suite: not on the allow-list"),
    ("create", "create: not on the allow-list"),
    ("delete", "delete: not on the allow-list"),
    ("deployment", "deployment: not on the allow-list"),
    ("deployment_status", "deployment_status: not on the allow-list"),
    ("discussion", "discussion: not on the allow-list"),
    ("discussion_comment", "discussion_comment: not on the allow-list"),
    ("fork", "fork: not on the allow-list"),
    ("gollum", "gollum: not on the allow-list"),
    ("issue_comment", "issue_comment: anyone can comment"),
    ("issues", "issues: not on the allow-list"),
    ("label", "label: not on the allow-list"),
    ("merge_group", "merge_group: runs the merge queue's branch"),
    ("milestone", "milestone: not on the allow-list"),
    ("page_build", "page_build: not on the allow-list"),
    ("public", "public: not on the allow-list"),
    ("pull_request", "pull_request: runs the pull request's branch"),
    (
        "{pull_request_review: {types: [submitted]}}",
        "pull_request_review: a review event checks out",
    ),
    ("pull_request_review_comment", "pull_request_review_comment: a review comment event"),
    ("pull_request_target", "pull_request_target: runs for forks' pull requests"),
    ("push", "push: push of any branch"),
    ("{push: {branches: [main]}}", None),
    ("registry_package", "registry_package: not on the allow-list"),
    ("{release: {types: [published]}}", None),
    ("repository_dispatch", "repository_dispatch: not on the allow-list"),
    ("{schedule: [{cron: '0 0 * * 0'}]}", None),
    ("status", "status: not on the allow-list"),
    ("watch", "watch: not on the allow-list"),
    ("workflow_call", "workflow_call: no workflow here calls it"),
    ("workflow_dispatch", None),
    ("{workflow_run: {workflows: [CI]}}", "workflow_run after ci.yml <- pull_request: runs"),
]


@pytest.mark.parametrize(
    ("on", "problem"),
    EVERY_TRIGGER,
    ids=[on.strip("{").split(":", 1)[0] for on, _ in EVERY_TRIGGER],
)
def test_every_trigger_planted_once(tmp_path: Path, on: str, problem: str | None) -> None:
    ci = (WORKFLOW_DIR / "ci.yml").read_text(encoding="utf-8")
    directory = workflow_dir(tmp_path, {"planted.yml": job("gpu", on=on), "ci.yml": ci})
    found = check(directory)
    if problem is None:
        assert found == []
        return
    (one,) = found
    assert one.startswith(
        "planted.yml: job 'planted': can run on 'gpu', which is not a GitHub-hosted label, and "
    )
    assert problem in one


def test_a_review_trigger_planted_into_the_gpu_matrix_is_refused(tmp_path: Path) -> None:
    """The edit actionlint and every other workflow test let through."""
    text = (WORKFLOW_DIR / "gpu-matrix.yml").read_text(encoding="utf-8")
    planted = text.replace("\non:\n", "\non:\n  pull_request_review:\n    types: [submitted]\n", 1)
    assert planted != text
    directory = workflow_dir(tmp_path, {"gpu-matrix.yml": planted})
    assert check(directory) == [
        f"gpu-matrix.yml: job {name!r}: can run on matrix.runs-on, which is not a"
        " GitHub-hosted label, and pull_request_review: a review event checks out the pull"
        " request's merge ref"
        for name in (
            "build",
            "build-2",
            "build-3",
            "build-4",
            "conformance",
            "conformance-2",
            "conformance-3",
            "conformance-4",
        )
    ]


def job(runs_on: str, *, on: str = "pull_request", strategy: str = "") -> str:
    return (
        f"on: {on}\njobs:\n  planted:\n{textwrap.indent(strategy, '    ')}"
        f"    runs-on: {runs_on}\n    steps:\n      - run: echo hi\n"
    )


#: A workflow of its own: the job that can reach a self-hosted runner, and why.
UNSAFE = [
    ("self-hosted", job("self-hosted"), "'self-hosted'"),
    ("gpu label", job("gpu"), "'gpu'"),
    ("label list", job("[self-hosted, gpu]"), "asks for several labels"),
    ("hosted name plus gpu", job("[ubuntu-24.04, gpu]"), "asks for several labels"),
    ("group mapping", job("{group: gpu-runners}"), "names a runner group"),
    ("labels mapping", job("{labels: [gpu]}"), "'gpu'"),
    ("pull_request_target", job("[self-hosted]", on="pull_request_target"), "'self-hosted'"),
    ("trigger list", job("self-hosted", on="[schedule, pull_request]"), "'self-hosted'"),
    ("trigger mapping", job("gpu", on="{pull_request: {branches: [main]}}"), "'gpu'"),
    (
        "matrix with a self-hosted entry",
        job(
            "${{ matrix.os }}",
            strategy="strategy:\n  matrix:\n    os: [ubuntu-24.04, self-hosted]\n",
        ),
        "'self-hosted'",
    ),
    (
        "matrix include with a gpu entry",
        job(
            "${{ matrix.runner }}",
            strategy="strategy:\n  matrix:\n    include:\n      - runner: ubuntu-24.04\n"
            "      - runner: gpu\n",
        ),
        "'gpu'",
    ),
    (
        "matrix from a job's output",
        job(
            "${{ matrix.runs-on }}",
            strategy="strategy:\n  matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}\n",
        ),
        "matrix.runs-on",
    ),
    ("a job's output", job("${{ fromJSON(needs.plan.outputs.runner) }}"), "fromJSON()"),
    ("a job's output, indexed", job("${{ needs.plan.outputs['runner'] }}"), "outputs[...]"),
    (
        "an input with a hosted fallback",
        job("${{ inputs.runner || 'ubuntu-24.04' }}"),
        "inputs.runner",
    ),
    ("a repository variable", job("${{ vars.RUNNER }}"), "vars.RUNNER"),
    (
        "a literal choice including a self-hosted label",
        job("${{ github.event_name == 'push' && 'ubuntu-24.04' || 'gpu' }}"),
        "'gpu'",
    ),
    (
        "text around a matrix value",
        job(
            "linux-${{ matrix.size }}",
            strategy="strategy:\n  matrix:\n    size: [small, gpu]\n",
        ),
        "'linux-gpu'",
    ),
    (
        "a remote reusable workflow",
        "on: pull_request\njobs:\n  planted:\n    uses: someone/else/.github/workflows/x.yml@0123456789abcdef0123456789abcdef01234567\n",
        "cannot check",
    ),
    ("review", job("gpu", on="{pull_request_review: {types: [submitted]}}"), "merge ref"),
    ("review comment", job("gpu", on="pull_request_review_comment"), "merge ref"),
    ("comment", job("gpu", on="issue_comment"), "anyone can comment"),
    ("merge queue", job("gpu", on="merge_group"), "merge queue"),
    ("push of any branch", job("gpu", on="push"), "no `branches:` filter"),
    ("push of another branch", job("gpu", on="{push: {branches: [main, dev]}}"), "push to dev"),
    ("push of a branch glob", job("gpu", on="{push: {branches: ['main*']}}"), "push to main*"),
    ("push of tags", job("gpu", on="{push: {branches: [main], tags: ['v*']}}"), "`tags:`"),
    ("push, ignoring", job("gpu", on="{push: {branches-ignore: [dev]}}"), "no `branches:`"),
    ("an uncalled reusable workflow", job("gpu", on="workflow_call"), "no workflow here calls it"),
    (
        "after a workflow that is not here",
        job("gpu", on="{workflow_run: {workflows: [Elsewhere]}}"),
        "no workflow here has that name",
    ),
]


@pytest.mark.parametrize(
    ("workflow", "problem"), [(w, p) for _, w, p in UNSAFE], ids=[i for i, _, _ in UNSAFE]
)
def test_a_planted_job_that_can_reach_a_self_hosted_runner_is_rejected(
    tmp_path: Path, workflow: str, problem: str
) -> None:
    (found,) = check(workflow_dir(tmp_path, {"planted.yml": workflow}))
    assert found.startswith("planted.yml: job 'planted': ")
    assert problem in found


SAFE = [
    ("hosted label", job("ubuntu-24.04")),
    ("hosted list of one", job("[windows-2025]")),
    ("hosted labels mapping", job("{labels: [ubuntu-24.04-arm]}")),
    (
        "matrix of hosted labels",
        job(
            "${{ matrix.os }}",
            strategy="strategy:\n  matrix:\n    os: [ubuntu-24.04, windows-2022, macos-15]\n"
            "    include:\n      - os: ubuntu-22.04\n",
        ),
    ),
    (
        "a literal choice of hosted labels",
        job("${{ github.event_name == 'push' && 'ubuntu-24.04' || 'ubuntu-22.04' }}"),
    ),
    (
        "text around hosted matrix values",
        job("ubuntu-${{ matrix.v }}", strategy="strategy:\n  matrix:\n    v: ['24.04', '22.04']\n"),
    ),
    (
        "self-hosted, started only from the allow-list",
        job(
            "[self-hosted, gpu]",
            on="{push: {branches: [main], paths: [matrix.toml]}, workflow_dispatch: null,"
            " schedule: [{cron: '0 0 * * 0'}], release: {types: [published]}}",
        ),
    ),
]


@pytest.mark.parametrize("workflow", [w for _, w in SAFE], ids=[i for i, _ in SAFE])
def test_jobs_that_can_only_run_on_hosted_runners_pass(tmp_path: Path, workflow: str) -> None:
    assert check(workflow_dir(tmp_path, {"planted.yml": workflow})) == []


GPU_CALLED = (
    "on: workflow_call\njobs:\n  measure:\n    runs-on: [self-hosted, gpu]\n"
    "    steps:\n      - run: nvidia-smi\n"
)


def caller(on: str) -> str:
    return f"on: {on}\njobs:\n  planted:\n    uses: ./.github/workflows/gpu.yml\n"


def test_a_reusable_workflow_is_judged_by_what_starts_its_callers(tmp_path: Path) -> None:
    directory = workflow_dir(
        tmp_path,
        {
            "gpu.yml": GPU_CALLED,
            "nightly.yml": caller("schedule"),
            "pr.yml": caller("pull_request"),
        },
    )
    assert check(directory) == [
        "gpu.yml: job 'measure': runs-on ['self-hosted', 'gpu'] asks for several labels: only a"
        " self-hosted runner has them, and workflow_call from pr.yml (job 'planted') <-"
        " pull_request: runs the pull request's branch, a fork's too"
    ]
    (directory / "pr.yml").unlink()  # called by the schedule alone: allowed
    assert check(directory) == []


def follower(after: str) -> str:
    return (
        f"name: Follower\non:\n  workflow_run:\n    workflows: [{after}]\n    types: [completed]\n"
        "jobs:\n  measure:\n    runs-on: gpu\n    steps:\n      - run: nvidia-smi\n"
    )


def test_a_workflow_run_chain_is_judged_by_what_starts_its_first_workflow(tmp_path: Path) -> None:
    hosted = "jobs:\n  build:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: make\n"
    directory = workflow_dir(
        tmp_path,
        {
            "first.yml": f"name: First\non: [pull_request, schedule]\n{hosted}",
            "middle.yml": f"name: Middle\non:\n  workflow_run:\n    workflows: [First]\n{hosted}",
            "follower.yml": follower("Middle"),
        },
    )
    assert check(directory) == [
        "follower.yml: job 'measure': can run on 'gpu', which is not a GitHub-hosted label, and"
        " workflow_run after middle.yml <- workflow_run after first.yml <- pull_request: runs"
        " the pull request's branch, a fork's too"
    ]
    (directory / "first.yml").write_text(f"name: First\non: schedule\n{hosted}", encoding="utf-8")
    assert check(directory) == []


def test_a_cycle_of_workflows_ends(tmp_path: Path) -> None:
    directory = workflow_dir(tmp_path, {"loop.yml": follower("Follower")})
    assert check(directory) == []  # it follows itself: nothing else starts it
