"""No job of a workflow that pull requests trigger can reach a self-hosted runner.

A pull request's workflow files come from its branch (a fork's too, for `pull_request`), and
`pull_request_target` runs with the base repository's rights: a job of such a workflow that
can land on a persistent self-hosted runner (whose user controls Docker) runs a stranger's
code there. The rule checked here, for every workflow with either trigger, and for the
reusable workflows its jobs call: each job's ``runs-on`` can only ever be one GitHub-hosted
label. Literal labels, lists, ``group:``/``labels:`` mappings and ``${{ }}`` expressions are
all read; an expression passes only when every value it can produce is a hosted label (its
string literals, and the values of a literal ``strategy.matrix``), so anything taken from
inputs, variables, job outputs or functions fails.

This guards the repository's own files; the runner group (README, runner safety) is what
keeps a fork's edited copy away from the GPU runners.
"""

from __future__ import annotations

import itertools
import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_DIR = REPO / ".github" / "workflows"
PR_EVENTS = frozenset({"pull_request", "pull_request_target"})
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


def triggers(workflow: Mapping[str, Any]) -> set[str]:
    on = workflow.get("on")
    if isinstance(on, str):
        return {on}
    if isinstance(on, list):
        return {str(event) for event in on}
    if isinstance(on, dict):
        return {str(event) for event in on}
    return set()


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


def findings(path: Path, *, called: bool = False) -> Iterator[Finding]:
    """Every job of a workflow pull requests trigger (or of one such a workflow calls) that
    can select a self-hosted runner."""
    root = path.parents[2] if path.parent.parts[-2:] == (".github", "workflows") else REPO
    workflow = load(path.read_text(encoding="utf-8"), str(path))
    if not called and not triggers(workflow) & PR_EVENTS:
        return
    for name, job in (workflow.get("jobs") or {}).items():
        if "uses" in job:  # a reusable workflow runs its jobs under the caller's trigger
            target = str(job["uses"])
            if not target.startswith("./"):
                yield Finding(
                    path.name, name, f"calls {target}, whose runners this repository cannot check"
                )
                continue
            local = root / target.split("@", 1)[0]
            if not local.is_file():
                yield Finding(path.name, name, f"calls {target}, which does not exist")
                continue
            yield from findings(local, called=True)
            continue
        if "runs-on" not in job:
            yield Finding(path.name, name, "has no runs-on")
            continue
        matrix = (job.get("strategy") or {}).get("matrix")
        try:
            problem = runs_on_problem(job["runs-on"], matrix)
        except ValueError as e:
            problem = str(e)
        if problem:
            yield Finding(path.name, name, problem)


def check(path: Path) -> list[str]:
    return [str(f) for f in findings(path)]


# --- the repository's workflows pass -------------------------------------------------------------


@pytest.mark.parametrize("workflow", sorted(WORKFLOW_DIR.glob("*.yml")), ids=lambda p: p.name)
def test_the_repositorys_workflows_keep_pull_requests_off_self_hosted_runners(
    workflow: Path,
) -> None:
    assert check(workflow) == []


def test_ci_is_pull_request_triggered_and_the_gpu_matrix_is_not() -> None:
    """So the rule above does check ci.yml, and the GPU matrix's runners stay out of reach."""
    ci = load((WORKFLOW_DIR / "ci.yml").read_text(encoding="utf-8"), "ci.yml")
    gpu = load((WORKFLOW_DIR / "gpu-matrix.yml").read_text(encoding="utf-8"), "gpu-matrix.yml")
    assert "pull_request" in triggers(ci)
    assert not triggers(gpu) & PR_EVENTS


def test_the_gpu_matrix_would_fail_the_rule_if_pull_requests_triggered_it(tmp_path: Path) -> None:
    text = (WORKFLOW_DIR / "gpu-matrix.yml").read_text(encoding="utf-8")
    planted = text.replace("\non:\n", "\non:\n  pull_request:\n", 1)
    assert planted != text
    path = tmp_path / "gpu-matrix.yml"
    path.write_text(planted, encoding="utf-8")
    assert check(path) == [
        "gpu-matrix.yml: job 'conformance': can run on matrix.runs-on, which is not a"
        " GitHub-hosted label"
    ]


# --- planted workflows ---------------------------------------------------------------------------


def job(runs_on: str, *, on: str = "pull_request", strategy: str = "") -> str:
    return (
        f"on: {on}\njobs:\n  planted:\n{textwrap.indent(strategy, '    ')}"
        f"    runs-on: {runs_on}\n    steps:\n      - run: echo hi\n"
    )


UNSAFE = [
    ("self-hosted", job("self-hosted"), "'self-hosted'"),
    ("gpu label", job("gpu"), "'gpu'"),
    ("label list", job("[self-hosted, gpu]"), "asks for several labels"),
    ("hosted name plus gpu", job("[ubuntu-24.04, gpu]"), "asks for several labels"),
    ("group mapping", job("{group: gpu-runners}"), "names a runner group"),
    ("labels mapping", job("{labels: [gpu]}"), "'gpu'"),
    ("pull_request_target", job("[self-hosted]", on="pull_request_target"), "'self-hosted'"),
    ("trigger list", job("self-hosted", on="[push, pull_request]"), "'self-hosted'"),
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
]


@pytest.mark.parametrize(
    ("workflow", "problem"), [(w, p) for _, w, p in UNSAFE], ids=[i for i, _, _ in UNSAFE]
)
def test_a_planted_job_that_can_reach_a_self_hosted_runner_is_rejected(
    tmp_path: Path, workflow: str, problem: str
) -> None:
    path = tmp_path / "planted.yml"
    path.write_text(workflow, encoding="utf-8")
    (found,) = check(path)
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
        "self-hosted, but no pull request trigger",
        job("[self-hosted, gpu]", on="[push, workflow_dispatch]"),
    ),
]


@pytest.mark.parametrize("workflow", [w for _, w in SAFE], ids=[i for i, _ in SAFE])
def test_jobs_that_can_only_run_on_hosted_runners_pass(tmp_path: Path, workflow: str) -> None:
    path = tmp_path / "planted.yml"
    path.write_text(workflow, encoding="utf-8")
    assert check(path) == []


def test_a_local_reusable_workflow_is_checked_under_the_callers_trigger(tmp_path: Path) -> None:
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "gpu.yml").write_text(
        "on: workflow_call\njobs:\n  measure:\n    runs-on: [self-hosted, gpu]\n"
        "    steps:\n      - run: nvidia-smi\n",
        encoding="utf-8",
    )
    caller = workflows / "pr.yml"
    caller.write_text(
        "on: pull_request\njobs:\n  planted:\n    uses: ./.github/workflows/gpu.yml\n",
        encoding="utf-8",
    )
    assert check(caller) == [
        "gpu.yml: job 'measure': runs-on ['self-hosted', 'gpu'] asks for several labels:"
        " only a self-hosted runner has them"
    ]
    # the called workflow alone is not pull-request triggered
    assert check(workflows / "gpu.yml") == []
