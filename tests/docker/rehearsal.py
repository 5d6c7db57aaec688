"""Runs a GitHub Actions workflow from its YAML the way a hosted runner would, in containers.

Each job (each matrix entry of it) gets a fresh container made from a bare runner image
(python3, git, curl, bash: what a hosted runner has before any step). Every ``run:`` step
runs in order, with ``bash --noprofile --norc -eo pipefail`` and its ``env:``, in the job's
workspace; ``$GITHUB_OUTPUT``, ``$GITHUB_ENV``, ``$GITHUB_PATH`` and
``$GITHUB_STEP_SUMMARY`` work as on a runner. ``uses:`` steps are emulated by
:data:`ACTIONS`, a small table of shell scripts that also run inside the container:

- ``actions/checkout``: a copy of the clean clone (mounted read-only at ``/clone``);
- ``actions/setup-python``: the image's own interpreter (a venv with pip) put on PATH;
- ``actions/upload-artifact`` / ``download-artifact``: a directory shared by the run's jobs
  and kept across its attempts (as for a re-run of failed jobs; stricter than a re-run of
  all jobs, which starts afresh): a second upload under one name fails unless it overwrites;
- ``actions/upload-pages-artifact`` / ``deploy-pages``: the site goes to ``published/pages``;
- ``actions/cache/restore`` and ``actions/cache/save``: a directory per key under
  ``published/actions-cache``, the newest match of a restore-key when the key has none.
- ``actions/attest-build-provenance``: the sha256 of every file its ``subject-path`` globs
  match is recorded under ``published/attestations``, and its ``bundle-path`` is a file
  listing those subjects (what ``gh attestation verify`` would
  find); no match fails, as does a job without ``id-token: write`` (GitHub gives such a job
  no OIDC token to sign with).

Tools a hosted runner has preinstalled are given the same way: ``gh`` is
``runner_tools/gh`` (releases are written under ``published/releases``) and ``docker``
is the host's client and daemon. Nothing else is installed: a step that needs
something no earlier step installed fails, as it would on the real runner.

The job's workspace, ``RUNNER_TEMP``, ``HOME`` and ``TMPDIR`` lie in a fresh host directory
mounted at its own path, as on a runner whose Docker daemon is local: a path the job hands
the daemon (a bind mount of the suite, of a build's wheels, of a scratch directory for
results) names the same files there.

``${{ }}`` expressions are evaluated by :func:`evaluate` (the operators and functions
the workflows use); jobs run in the order of ``needs:``, with ``if:`` honoured.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "ACTIONS",
    "ExpressionError",
    "JobResult",
    "Rehearsal",
    "RunSettings",
    "StepResult",
    "evaluate",
    "interpolate",
    "load_workflow",
]

RUNNER_TOOLS = Path(__file__).resolve().parent / "runner_tools"
TOOLCACHE = "/opt/hostedtoolcache"
MACHINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


#: Where a job finds the daemon's socket (Docker's default, which its clients try first).
_JOB_SOCKET = "/var/run/docker.sock"


def daemon_access(docker_host: str | None) -> tuple[str | None, dict[str, str]]:
    """How a job reaches the daemon the tests use: the host's socket to mount at
    ``_JOB_SOCKET`` (``DOCKER_HOST``'s ``unix://`` path, else the default socket) and the
    environment to give the job (``DOCKER_HOST`` itself for a ``tcp://`` or ``ssh://`` one,
    which the job's host network reaches as the host does)."""
    if not docker_host:
        return _JOB_SOCKET, {}
    if docker_host.startswith("unix://"):
        return docker_host.removeprefix("unix://"), {}
    return None, {"DOCKER_HOST": docker_host}


class ExpressionError(ValueError):
    """An expression the evaluator cannot read, or one naming a context it was not given."""


# --- expressions ---------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[!()\[\],.<>*])|(?P<name>[A-Za-z_][\w-]*))"
)
_EMBEDDED = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, float) and value != value)


def to_text(value: Any) -> str:
    """A value as GitHub writes it into a string."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _loose_equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    return bool(a == b)


def _contains(search: Any, item: Any) -> bool:
    if isinstance(search, list):
        return any(_loose_equal(x, item) for x in search)
    return to_text(item).casefold() in to_text(search).casefold()


def _format(template: str, *args: Any) -> str:
    return re.sub(r"\{(\d+)\}", lambda m: to_text(args[int(m[1])]), template)


class _Parser:
    def __init__(self, text: str, contexts: Mapping[str, Any], status: Mapping[str, bool]) -> None:
        self.text = text
        self.contexts = contexts
        self.status = status
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise ExpressionError(f"cannot read {text!r} at {text[pos:]!r}")
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m[kind]))
            pos = m.end()
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise ExpressionError(f"{self.text!r} ends early")
        token = self.tokens[self.at]
        if expected is not None and token[1] != expected:
            raise ExpressionError(f"{self.text!r}: expected {expected!r}, found {token[1]!r}")
        self.at += 1
        return token

    def parse(self) -> Any:
        value = self.or_()
        if self.at != len(self.tokens):
            raise ExpressionError(f"{self.text!r}: unexpected {self.tokens[self.at][1]!r}")
        return value

    def or_(self) -> Any:
        left = self.and_()
        while self.peek() == "||":
            self.take()
            right = self.and_()
            left = left if truthy(left) else right
        return left

    def and_(self) -> Any:
        left = self.equality()
        while self.peek() == "&&":
            self.take()
            right = self.equality()
            left = right if truthy(left) else left
        return left

    def equality(self) -> Any:
        left = self.unary()
        while self.peek() in ("==", "!="):
            op = self.take()[1]
            right = self.unary()
            left = _loose_equal(left, right) == (op == "==")
        return left

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.or_()
            self.take(")")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind != "name":
            raise ExpressionError(f"{self.text!r}: unexpected {text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self.peek() == "(":
            return self.properties(self.call(text))
        if text not in self.contexts:
            raise ExpressionError(f"{self.text!r}: the rehearsal has no context {text!r}")
        return self.properties(self.contexts[text])

    def properties(self, value: Any) -> Any:
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                key = self.take()[1]
            else:
                key = to_text(self.or_())
                self.take("]")
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def call(self, name: str) -> Any:
        self.take("(")
        args: list[Any] = []
        while self.peek() != ")":
            args.append(self.or_())
            if self.peek() == ",":
                self.take()
        self.take(")")
        lowered = name.lower()
        if lowered in self.status:
            return self.status[lowered]
        functions: dict[str, Callable[..., Any]] = {
            "contains": _contains,
            "startswith": lambda a, b: to_text(a).casefold().startswith(to_text(b).casefold()),
            "endswith": lambda a, b: to_text(a).casefold().endswith(to_text(b).casefold()),
            "format": _format,
            "fromjson": json.loads,
            "tojson": json.dumps,
            "join": lambda a, sep=",": to_text(sep).join(map(to_text, a)),
        }
        if lowered not in functions:
            raise ExpressionError(f"{self.text!r}: the rehearsal has no function {name}()")
        return functions[lowered](*args)


def evaluate(
    expression: str, contexts: Mapping[str, Any], status: Mapping[str, bool] | None = None
) -> Any:
    """The value of one expression (with or without its ``${{ }}``)."""
    text = expression.strip()
    m = _EMBEDDED.fullmatch(text)
    if m:
        text = m[1]
    return _Parser(text, contexts, status or {}).parse()


def interpolate(text: str, contexts: Mapping[str, Any]) -> str:
    """A string with every ``${{ }}`` replaced by its value."""
    return _EMBEDDED.sub(lambda m: to_text(evaluate(m[1], contexts)), text)


def _value(raw: Any, contexts: Mapping[str, Any]) -> Any:
    """A ``with:``/``env:``/``strategy`` value: a lone expression keeps its type."""
    if not isinstance(raw, str):
        return raw
    m = _EMBEDDED.fullmatch(raw.strip())
    if m:
        return evaluate(m[1], contexts)
    return interpolate(raw, contexts)


# --- the workflow ---------------------------------------------------------------------------


def load_workflow(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping")
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def _needs(job: Mapping[str, Any]) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def job_order(workflow: Mapping[str, Any]) -> list[str]:
    """Job names so that every job comes after those it needs (declaration order otherwise)."""
    jobs: dict[str, Any] = workflow["jobs"]
    done: list[str] = []
    while len(done) < len(jobs):
        ready = [n for n, j in jobs.items() if n not in done and set(_needs(j)) <= set(done)]
        if not ready:
            raise ValueError(f"jobs {sorted(set(jobs) - set(done))} need each other")
        done.append(ready[0])
    return done


def parse_output_file(text: str) -> dict[str, str]:
    """``name=value`` lines and ``name<<DELIMITER`` blocks, as runners read them."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            block: list[str] = []
            for text_line in lines:
                if text_line == delimiter:
                    break
                block.append(text_line)
            values[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
    return values


# --- the actions a workflow uses ------------------------------------------------------------

#: action (owner/name) -> (the `with:` keys it takes, with their defaults; the script that
#: emulates it). Inputs reach the script as INPUT_<NAME> (upper case, `-` as `_`), as they
#: reach a real action; the script runs in the job's workspace like a `run:` step.
ACTIONS: dict[str, tuple[dict[str, str], str]] = {
    "actions/checkout": (
        {"persist-credentials": "true"},
        'cp -a /clone/. "$GITHUB_WORKSPACE"/\n',
    ),
    "actions/setup-python": (
        {"python-version": ""},
        """\
have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "$INPUT_PYTHON_VERSION" ]; then
  echo "setup-python: the runner image has Python $have, the step asks for $INPUT_PYTHON_VERSION" >&2
  exit 1
fi
prefix=$TOOLCACHE/Python/$have/x64
[ -x "$prefix/bin/python" ] || python3 -m venv "$prefix"
echo "$prefix/bin" >> "$GITHUB_PATH"
echo "pythonLocation=$prefix" >> "$GITHUB_ENV"
echo "python-version=$have" >> "$GITHUB_OUTPUT"
""",
    ),
    "actions/upload-artifact": (
        {"name": "artifact", "path": "", "if-no-files-found": "warn", "overwrite": "false"},
        """\
dest=/artifacts/$INPUT_NAME
if [ -e "$dest" ]; then
  if [ "$INPUT_OVERWRITE" != true ]; then
    echo "upload-artifact: (409) Conflict: an artifact with this name already exists on the workflow run" >&2
    exit 1
  fi
  rm -rf "$dest"
fi
mapfile -t paths < <(printf '%s\\n' "$INPUT_PATH" | sed -e 's/^[[:space:]]*//' -e '/^$/d')
found=()
shopt -s nullglob
for pattern in "${paths[@]}"; do
  for p in $pattern; do  # unquoted: a glob, as upload-artifact's path takes one
    if [ -e "$p" ] && [ -n "$(find "$p" -type f -print -quit)" ]; then found+=("${p%/}"); fi
  done
done
if [ ${#found[@]} -eq 0 ]; then
  case $INPUT_IF_NO_FILES_FOUND in
    error) echo "upload-artifact: no files were found with the provided path: $INPUT_PATH" >&2; exit 1 ;;
    ignore) exit 0 ;;
    *) echo "::warning::No files were found with the provided path: $INPUT_PATH. No artifacts will be uploaded."; exit 0 ;;
  esac
fi
mkdir -p "$dest"
if [ ${#paths[@]} -eq 1 ] && [ -d "${found[0]}" ]; then
  cp -a "${found[0]}/." "$dest/"
else
  cp -a --parents "${found[@]}" "$dest/"
fi
echo "upload-artifact: $INPUT_NAME: $(find "$dest" -type f | wc -l) file(s)"
""",
    ),
    "actions/download-artifact": (
        {"name": "", "pattern": "", "path": ".", "merge-multiple": "false"},
        """\
mkdir -p "$INPUT_PATH"
if [ -n "$INPUT_NAME" ]; then
  if [ ! -d "/artifacts/$INPUT_NAME" ]; then
    echo "download-artifact: Artifact not found: $INPUT_NAME" >&2
    exit 1
  fi
  cp -a "/artifacts/$INPUT_NAME/." "$INPUT_PATH/"
else
  shopt -s nullglob
  for artifact in /artifacts/${INPUT_PATTERN:-*}; do
    if [ "$INPUT_MERGE_MULTIPLE" = true ]; then
      cp -a "$artifact/." "$INPUT_PATH/"
    else
      cp -a "$artifact" "$INPUT_PATH/$(basename "$artifact")"
    fi
  done
fi
""",
    ),
    "actions/upload-pages-artifact": (
        {"path": "_site/", "name": "github-pages"},
        """\
if [ ! -d "$INPUT_PATH" ]; then
  echo "upload-pages-artifact: $INPUT_PATH is not a directory" >&2
  exit 1
fi
if ! mkdir "/artifacts/$INPUT_NAME"; then
  echo "upload-pages-artifact: (409) Conflict: an artifact with this name already exists on the workflow run" >&2
  exit 1
fi
tar -C "$INPUT_PATH" -cf "/artifacts/$INPUT_NAME/artifact.tar" .
""",
    ),
    "actions/deploy-pages": (
        {"artifact_name": "github-pages"},
        """\
archive=/artifacts/$INPUT_ARTIFACT_NAME/artifact.tar
if [ ! -f "$archive" ]; then
  echo "deploy-pages: no artifact named $INPUT_ARTIFACT_NAME in this run" >&2
  exit 1
fi
rm -rf /published/pages.new && mkdir -p /published/pages.new
tar -C /published/pages.new -xf "$archive"
rm -rf /published/pages && mv /published/pages.new /published/pages
echo "page_url=file:///published/pages/" >> "$GITHUB_OUTPUT"
""",
    ),
    # The Actions cache: one directory per key under /published/actions-cache (it outlives
    # runs, as GitHub's does); a restore takes the exact key, else the newest entry whose key
    # starts with a restore-key; a save under a key that exists is skipped with a warning.
    "actions/cache/restore": (
        {"path": "", "key": "", "restore-keys": ""},
        """\
store=/published/actions-cache
found=""
if [ -d "$store/$INPUT_KEY" ]; then
  found="$store/$INPUT_KEY"
else
  while IFS= read -r prefix; do
    [ -n "$prefix" ] || continue
    found=$(ls -1dt "$store/$prefix"* 2>/dev/null | head -n 1 || true)
    [ -z "$found" ] || break
  done <<< "$INPUT_RESTORE_KEYS"
fi
if [ -z "$found" ]; then
  echo "Cache not found for input keys: $INPUT_KEY"
  echo "cache-hit=false" >> "$GITHUB_OUTPUT"
  exit 0
fi
mkdir -p "$INPUT_PATH"
cp -a "$found/." "$INPUT_PATH/"
echo "Cache restored from key: $(basename "$found")"
echo "cache-hit=$([ "$found" = "$store/$INPUT_KEY" ] && echo true || echo false)" >> "$GITHUB_OUTPUT"
""",
    ),
    "actions/cache/save": (
        {"path": "", "key": ""},
        """\
store=/published/actions-cache
if [ -e "$store/$INPUT_KEY" ]; then
  echo "::warning::Failed to save: Unable to reserve cache with key $INPUT_KEY"
  exit 0
fi
if [ ! -d "$INPUT_PATH" ]; then
  echo "::warning::Path Validation Error: $INPUT_PATH does not exist"
  exit 0
fi
mkdir -p "$store"
cp -a "$INPUT_PATH" "$store/$INPUT_KEY"
echo "Cache saved with key: $INPUT_KEY"
""",
    ),
    "actions/attest-build-provenance": (
        {"subject-path": "", "show-summary": "true"},
        """\
if [ -z "${ACTIONS_ID_TOKEN_REQUEST_URL:-}" ]; then
  echo "attest-build-provenance: Error: Unable to get ACTIONS_ID_TOKEN_REQUEST_URL env variable" \\
    "(the job needs permissions: id-token: write)" >&2
  exit 1
fi
python3 - <<'EOF'
import glob, hashlib, json, os, pathlib, sys
patterns = [p.strip() for line in os.environ["INPUT_SUBJECT_PATH"].splitlines()
            for p in line.split(",") if p.strip()]
subjects = sorted({f for p in patterns for f in glob.glob(p, recursive=True) if os.path.isfile(f)})
if not subjects:
    sys.exit(f"attest-build-provenance: Error: could not find subject at path(s) {patterns}")
store = pathlib.Path("/published/attestations")
store.mkdir(parents=True, exist_ok=True)
for name in subjects:
    digest = hashlib.sha256(pathlib.Path(name).read_bytes()).hexdigest()
    record = {
        "subject": {"name": os.path.basename(name), "path": name, "digest": {"sha256": digest}},
        "predicateType": "https://slsa.dev/provenance/v1",
        "repository": os.environ["GITHUB_REPOSITORY"],
        "workflow_ref": os.environ["GITHUB_WORKFLOW_REF"],
        "run_id": os.environ["GITHUB_RUN_ID"],
        "run_attempt": os.environ["GITHUB_RUN_ATTEMPT"],
        "sha": os.environ["GITHUB_SHA"],
    }
    (store / f"sha256-{digest}.json").write_text(json.dumps(record, indent=2))
    print(f"attested {name} sha256:{digest}")
bundle = pathlib.Path(os.environ["RUNNER_TEMP"]) / "attestation.bundle.json"
bundle.write_text(json.dumps({"subjects": subjects}, indent=2))
with open(os.environ["GITHUB_OUTPUT"], "a") as out:
    out.write(f"bundle-path={bundle}\\n")
if os.environ.get("INPUT_SHOW_SUMMARY") == "true":
    with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as summary:
        summary.write(f"Attested {len(subjects)} subject(s)\\n")
EOF
""",
    ),
}


# --- running ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepResult:
    job: str
    name: str
    outcome: str  # success | failure | skipped
    seconds: float
    log: str


@dataclass(kw_only=True)
class JobResult:
    name: str
    result: str  # success | failure | skipped
    outputs: dict[str, str] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)
    summary: str = ""
    seconds: float = 0.0
    reason: str = ""  # why a job was not run


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What a run gets from GitHub: the event and its inputs, variables, run numbers."""

    event_name: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    variables: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    run_number: int = 1
    run_attempt: int = 1
    repository: str = "rehearsal/envbuilder"
    schedule: str = ""  # the cron line, for a scheduled run


class Rehearsal:
    """One workflow run: its jobs in order, each in fresh containers of ``image``.

    ``home`` is a host directory: ``home/published`` outlives runs (what Pages and the
    releases would hold); ``home/run-<n>`` holds one run's artifacts (across its attempts)
    and, under ``attempt-<a>``, each job's step scripts, output files and summary.
    ``machine_env`` and ``mounts`` are the runner machine's own environment and
    read-only host paths (pip's configuration, local wheel directories).
    ``not_rehearsed`` names jobs left out, with the reason; ``pip_cache`` is pip's download
    cache, shared by the jobs (it saves downloads, not installs).
    """

    def __init__(
        self,
        *,
        client: Any,
        image: str,
        clone: Path,
        workflow: str,
        home: Path,
        machine_env: Mapping[str, str],
        mounts: Sequence[str] = (),
        not_rehearsed: Mapping[str, str] | None = None,
        only: Sequence[str] | None = None,
        pip_cache: Path | None = None,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.client = client
        self.image = image
        self.clone = clone
        self.workflow_path = clone / ".github" / "workflows" / workflow
        self.workflow = load_workflow(self.workflow_path)
        self.home = home
        self.machine_env = dict(machine_env)
        self.mounts = list(mounts)
        self.not_rehearsed = dict(not_rehearsed or {})
        self.only = list(only) if only is not None else None
        self.pip_cache = pip_cache or home / "pip-cache"
        self.echo = echo
        unknown = set(self.not_rehearsed) - set(self.workflow["jobs"])
        if unknown:
            raise ValueError(f"{workflow} has no job(s) {sorted(unknown)} to leave out")

    def run(self, settings: RunSettings) -> dict[str, JobResult]:
        run_dir = self.home / f"run-{settings.run_number}"
        (run_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        (self.home / "published").mkdir(exist_ok=True)
        inputs = self._inputs(settings)
        sha = self._head()
        github = {
            "event_name": settings.event_name,
            "event": {"inputs": inputs, "schedule": settings.schedule},
            "run_number": str(settings.run_number),
            "run_attempt": str(settings.run_attempt),
            "run_id": str(1000 + settings.run_number),
            "repository": settings.repository,
            "sha": sha,
            "ref": "refs/heads/main",
            "token": "rehearsal-token",
            "workflow_ref": f"{settings.repository}/.github/workflows/"
            f"{self.workflow_path.name}@refs/heads/main",
        }
        results: dict[str, JobResult] = {}
        for name in job_order(self.workflow):
            job = self.workflow["jobs"][name]
            if name in self.not_rehearsed or (self.only is not None and name not in self.only):
                reason = self.not_rehearsed.get(name, "not selected")
                results[name] = JobResult(name=name, result="skipped", reason=reason)
                self.echo(f"=== {name}: not rehearsed ({reason})")
                continue
            needs = {
                n: {"result": results[n].result, "outputs": results[n].outputs} for n in _needs(job)
            }
            contexts = {
                "github": github,
                "inputs": inputs,
                "vars": dict(settings.variables),
                "secrets": dict(settings.secrets),
                "needs": needs,
                "env": {},
            }
            status = {
                "always": True,
                "cancelled": False,
                "success": all(n["result"] == "success" for n in needs.values()),
                "failure": any(n["result"] == "failure" for n in needs.values()),
            }
            condition = job.get("if", "success()")
            if not truthy(evaluate(str(condition), contexts, status)):
                results[name] = JobResult(name=name, result="skipped", reason=f"if: {condition}")
                self.echo(f"=== {name}: skipped (if: {condition})")
                continue
            results[name] = self._run_job(
                name, job, contexts, run_dir, f"attempt-{settings.run_attempt}"
            )
        return results

    # -- one job ----------------------------------------------------------------------------

    def _inputs(self, settings: RunSettings) -> dict[str, Any]:
        if settings.event_name != "workflow_dispatch":
            return {}
        declared = (self.workflow["on"].get("workflow_dispatch") or {}).get("inputs") or {}
        unknown = set(settings.inputs) - set(declared)
        if unknown:
            raise ValueError(f"the workflow has no input(s) {sorted(unknown)}")
        return {k: settings.inputs.get(k, v.get("default")) for k, v in declared.items()}

    def _head(self) -> str:
        head = (self.clone / ".git" / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            return (self.clone / ".git" / head[5:]).read_text().strip()
        return head

    def _run_job(
        self,
        name: str,
        job: Mapping[str, Any],
        contexts: dict[str, Any],
        run_dir: Path,
        attempt: str,
    ) -> JobResult:
        if "container" in job or "services" in job:
            raise ValueError(f"job {name} runs in a container of its own: leave it out, with why")
        matrix = (job.get("strategy") or {}).get("matrix")
        entries: list[dict[str, Any]] = [{}]
        if matrix is not None:
            value = _value(matrix, contexts)
            if set(value) != {"include"}:
                raise ValueError(f"job {name}: the rehearsal takes only `include` matrices")
            entries = list(value["include"])
        result = JobResult(name=name, result="success")
        for index, entry in enumerate(entries):
            label = name if matrix is None else f"{name} ({index + 1}/{len(entries)})"
            one = self._run_instance(
                label,
                job,
                {**contexts, "matrix": entry},
                run_dir / attempt / f"job-{name}-{index}",
            )
            result.steps += one.steps
            result.outputs.update(one.outputs)
            result.summary += one.summary
            result.seconds += one.seconds
            if one.result == "failure":
                result.result = "failure"
        return result

    def _run_instance(
        self, label: str, job: Mapping[str, Any], contexts: dict[str, Any], runner_dir: Path
    ) -> JobResult:
        started = time.monotonic()
        runner_dir.mkdir(parents=True)
        (runner_dir / "summary.md").touch()
        # the job's own files, at the same path for the job and for the Docker daemon
        machine = runner_dir.resolve() / "machine"
        for directory in ("work/repo", "temp", "home", "tmp"):
            (machine / directory).mkdir(parents=True)
        (machine / "tmp").chmod(0o1777)
        volumes = {
            str(self.clone): {"bind": "/clone", "mode": "ro"},
            str(runner_dir.parent.parent / "artifacts"): {"bind": "/artifacts", "mode": "rw"},
            str(self.home / "published"): {"bind": "/published", "mode": "rw"},
            str(runner_dir): {"bind": "/runner", "mode": "rw"},
            str(RUNNER_TOOLS / "gh"): {"bind": "/usr/local/bin/gh", "mode": "ro"},
            # pip's download cache, shared by the run's jobs: it saves downloads, not installs
            str(self.pip_cache): {"bind": "/cache/pip", "mode": "rw"},
            str(machine): {"bind": str(machine), "mode": "rw"},
        }
        docker_cli = shutil.which("docker")
        daemon_env: dict[str, str] = {}
        if docker_cli is not None:
            volumes[docker_cli] = {"bind": "/usr/local/bin/docker", "mode": "ro"}
            socket, daemon_env = daemon_access(os.environ.get("DOCKER_HOST"))
            if socket is not None:
                volumes[socket] = {"bind": _JOB_SOCKET, "mode": "rw"}
        for path in self.mounts:
            volumes[path] = {"bind": path, "mode": "ro"}
        container = self.client.containers.run(
            self.image,
            ["sleep", "infinity"],
            detach=True,
            network_mode="host",
            volumes=volumes,
            environment={
                "PATH": MACHINE_PATH,
                "HOME": str(machine / "home"),
                "TMPDIR": str(machine / "tmp"),
                "PIP_CACHE_DIR": "/cache/pip",
                **daemon_env,
                **self.machine_env,
            },
        )
        result = JobResult(name=label, result="success")
        try:
            timeout = 60 * int(job.get("timeout-minutes", 360))
            result = self._run_steps(container, label, job, contexts, runner_dir, machine, timeout)
        finally:
            container.remove(force=True)
        result.seconds = time.monotonic() - started
        self.echo(f"=== {label}: {result.result} in {result.seconds:.0f} s")
        return result

    def _run_steps(
        self,
        container: Any,
        label: str,
        job: Mapping[str, Any],
        contexts: dict[str, Any],
        runner_dir: Path,
        machine: Path,
        timeout: int,
    ) -> JobResult:
        result = JobResult(name=label, result="success")
        workspace = str(machine / "work" / "repo")
        shell = ((self.workflow.get("defaults") or {}).get("run") or {}).get("shell", "bash")
        if shell != "bash":
            raise ValueError(f"the rehearsal runs bash steps only, not {shell!r}")
        steps: dict[str, Any] = {}
        added_env: dict[str, str] = {}
        added_path: list[str] = []
        contexts = {**contexts, "steps": steps}
        contexts["github"] = {**contexts["github"], "workspace": workspace}
        base_env = {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": workspace,
            "GITHUB_EVENT_NAME": contexts["github"]["event_name"],
            "GITHUB_RUN_NUMBER": contexts["github"]["run_number"],
            "GITHUB_RUN_ATTEMPT": contexts["github"]["run_attempt"],
            "GITHUB_REPOSITORY": contexts["github"]["repository"],
            "GITHUB_SHA": contexts["github"]["sha"],
            "GITHUB_REF": contexts["github"]["ref"],
            "GITHUB_WORKFLOW_REF": contexts["github"]["workflow_ref"],
            "GITHUB_RUN_ID": contexts["github"]["run_id"],
            "GITHUB_STEP_SUMMARY": "/runner/summary.md",
            "RUNNER_OS": "Linux",
            "RUNNER_TEMP": str(machine / "temp"),
            "TOOLCACHE": TOOLCACHE,
            **self._oidc(job),
        }
        failed = False
        for number, step in enumerate(job.get("steps", []), start=1):
            name = str(
                step.get("name")
                or str(step.get("uses", "")).split("@")[0]
                or step["run"].splitlines()[0]
            )
            status = {"always": True, "cancelled": False, "success": not failed, "failure": failed}
            env_context = {
                **self._env(self.workflow, contexts),
                **self._env(job, contexts),
                **added_env,
            }
            step_contexts = {**contexts, "env": env_context}
            condition = step.get("if", "success()")
            if not truthy(evaluate(str(condition), step_contexts, status)):
                result.steps.append(
                    StepResult(job=label, name=name, outcome="skipped", seconds=0, log="")
                )
                self.echo(f"--- {label} / {name}: skipped (if: {condition})")
                if "id" in step:
                    steps[step["id"]] = {
                        "outputs": {},
                        "outcome": "skipped",
                        "conclusion": "skipped",
                    }
                continue
            env = {**env_context, **self._env(step, step_contexts)}
            if "uses" in step:
                script, inputs = self._action(step, step_contexts)
                env.update(inputs)
            else:
                script = step["run"]
            files = {
                k: f"/runner/{k.lower()}-{number}"
                for k in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH")
            }
            for path in files.values():
                (runner_dir / Path(path).name).touch()
            (runner_dir / f"step-{number}.sh").write_text(script, encoding="utf-8")
            path = os.pathsep.join([*reversed(added_path), MACHINE_PATH])
            full_env = {**self.machine_env, **base_env, **env, **files, "PATH": path}
            started = time.monotonic()
            exit_code, output = container.exec_run(
                ["timeout", "--signal=KILL", str(timeout), "bash", "--noprofile", "--norc",
                 "-eo", "pipefail", f"/runner/step-{number}.sh"],
                environment=full_env,
                workdir=workspace,
            )  # fmt: skip
            seconds = time.monotonic() - started
            log = output.decode("utf-8", "replace")
            outcome = "success" if exit_code == 0 else "failure"
            result.steps.append(
                StepResult(job=label, name=name, outcome=outcome, seconds=seconds, log=log)
            )
            self.echo(
                f"--- {label} / {name}: {outcome} (exit {exit_code}, {seconds:.1f} s)\n{log.rstrip()}"
            )
            outputs = parse_output_file((runner_dir / f"github_output-{number}").read_text())
            added_env.update(parse_output_file((runner_dir / f"github_env-{number}").read_text()))
            added_path += [
                p for p in (runner_dir / f"github_path-{number}").read_text().splitlines() if p
            ]
            if "id" in step:
                steps[step["id"]] = {"outputs": outputs, "outcome": outcome, "conclusion": outcome}
            if outcome == "failure":
                failed = True
        result.result = "failure" if failed else "success"
        result.summary = (runner_dir / "summary.md").read_text(encoding="utf-8")
        final = {**contexts, "env": {}}
        for key, raw in (job.get("outputs") or {}).items():
            result.outputs[key] = to_text(_value(raw, final))
        return result

    def _oidc(self, job: Mapping[str, Any]) -> dict[str, str]:
        """What GitHub gives a job that may ask for an OIDC token (``id-token: write``)."""
        permissions = job.get("permissions", self.workflow.get("permissions"))
        granted = permissions == "write-all" or (
            isinstance(permissions, Mapping) and permissions.get("id-token") == "write"
        )
        if not granted:
            return {}
        return {
            "ACTIONS_ID_TOKEN_REQUEST_URL": "http://localhost/rehearsal/oidc",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "rehearsal-oidc",
        }

    @staticmethod
    def _env(scope: Mapping[str, Any], contexts: Mapping[str, Any]) -> dict[str, str]:
        return {k: to_text(_value(v, contexts)) for k, v in (scope.get("env") or {}).items()}

    @staticmethod
    def _action(step: Mapping[str, Any], contexts: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        action = str(step["uses"]).split("@", 1)[0]
        if action not in ACTIONS:
            raise ValueError(f"the rehearsal has no emulation of {action}: add one to ACTIONS")
        defaults, script = ACTIONS[action]
        given = {k: to_text(_value(v, contexts)) for k, v in (step.get("with") or {}).items()}
        unknown = set(given) - set(defaults)
        if unknown:
            raise ValueError(f"{action}: the emulation does not take with: {sorted(unknown)}")
        inputs = {**defaults, **given}
        return script, {"INPUT_" + k.upper().replace("-", "_"): v for k, v in inputs.items()}
