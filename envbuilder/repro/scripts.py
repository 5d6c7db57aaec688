"""The minimal standalone script of a cause: text out of records, nothing run.

A script imports the standard library and the packages its cause needs (never
envbuilder), prints the versions it runs on (torch, CUDA, xformers, diffusers where
used, Python, GPU, driver), then what it expected and what it got, as two numbers
(a largest error and its bound) or the error, and ends with one line and exit status:

- ``REPRODUCED: …``, 1: it saw the recorded failure;
- ``NOT REPRODUCED: …``, 0: the case ran and did not fail that way;
- ``cannot run this case here: …``, 2: a package is missing, there is no CUDA GPU
  for a case that needs one, or something else stopped the case before it could
  fail or pass (the error is printed): never a reproduction.

The suite's tolerance machinery stays out: the bound is one number far above
low-precision rounding and far below the failure. The shape and dtype are those of
the first of the cause's checks that recorded its case (``case``/``shapes`` in its
numbers), else the suite's own case on a CUDA device, from its torch-free plan
(`envbuilder.conformance.plan`): the masks' case, or the first compiled shape.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from string import Template

from envbuilder.conformance.plan import DTYPE_NAMES, Case, compile_cases, masks_case
from envbuilder.errors import InputError
from envbuilder.repro.causes import KnownCause, listed
from envbuilder.repro.records import Recorded, RunFacts
from envbuilder.textsafe import one_line

__all__ = [
    "ScriptCase",
    "code_lines",
    "default_filename",
    "recorded_versions",
    "render",
    "shape_of",
]

_LABEL = re.compile(r"B(\d+) M(\d+) N(\d+) H(\d+) K(\d+)")
#: the largest size of a recorded case a script takes (the suite's are at most 257)
_LARGEST = 65536
#: a recorded dtype (the suite's name, or torch's) -> torch's name; float32 is no
#: low-precision case a script shows
_DTYPES = {
    **{name: torch for name, torch in DTYPE_NAMES.items() if name != "fp32"},
    **{torch: torch for name, torch in DTYPE_NAMES.items() if name != "fp32"},
}


@dataclass(frozen=True, kw_only=True)
class ScriptCase:
    """The suite's case a script runs, and in which dtype."""

    case: Case
    dtype: str  # a torch dtype's name: float16, bfloat16


def _suite_case(cause: KnownCause) -> ScriptCase:
    """The suite's case of ``cause``'s checks on a CUDA device, in its first dtype."""
    if cause.key == "diffusers-xformers-bool-mask":
        case = masks_case(cuda=True)
    else:
        case = compile_cases(cuda=True)[0]
    return ScriptCase(case=case, dtype=DTYPE_NAMES["fp16"])


def shape_of(cause: KnownCause, checks: Sequence[Recorded]) -> ScriptCase:
    """The first recorded case among ``checks`` (else the suite's default for the cause)."""
    for check in checks:
        found = _LABEL.search(str(check.numbers.get("case") or check.numbers.get("shapes") or ""))
        dtype = _DTYPES.get(str(check.numbers.get("dtype")))
        if found and dtype:
            sizes = found.groups()
            if not all(g.isascii() and len(g) <= 6 and 0 < int(g) <= _LARGEST for g in sizes):
                raise InputError(
                    f"{one_line(check.name)} recorded the case {one_line(found[0])[:80]!r}, whose"
                    f" sizes are not 1 to {_LARGEST}: no case the suite runs; not writing a"
                    " script from it"
                )
            b, m, n, h, k = (int(g) for g in sizes)
            return ScriptCase(case=Case(B=b, M=m, N=n, H=h, K=k), dtype=dtype)
    return _suite_case(cause)


def default_filename(cause: KnownCause) -> str:
    return f"repro_{cause.key.replace('-', '_')}.py"


def code_lines(script: str) -> int:
    """Lines that are neither blank nor only a comment: the measure of a minimal script."""
    return sum(
        1 for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


def recorded_versions(
    facts: RunFacts, checks: Sequence[Recorded], *, diffusers_used: bool = True
) -> list[tuple[str, str]]:
    """(what, version) as the run recorded them: torch (CUDA), xformers, diffusers (where
    used and a check recorded it), Python, GPU, driver."""
    torch = facts.version("torch") or "?"
    if facts.version("torch_cuda"):
        torch += f" (CUDA {facts.version('torch_cuda')})"
    out = [("torch", torch), ("xformers", facts.version("xformers") or "not installed")]
    diffusers = next(
        (str(c.numbers["diffusers"]) for c in checks if c.numbers.get("diffusers")), None
    )
    if diffusers and diffusers_used:
        out.append(("diffusers", diffusers))
    out.append(("Python", facts.version("python") or "?"))
    gpus = facts.runner.get("gpus")
    if facts.gpu and isinstance(gpus, Sequence) and gpus:
        cc = gpus[0].get("compute_capability") if hasattr(gpus[0], "get") else None
        out.append(("GPU", f"{facts.gpu} (compute capability {cc or '?'})"))
        out.append(("driver", facts.version("driver") or "?"))
    else:
        out.append(("GPU", "none (CPU)"))
    return out


def recorded_outcome(check: Recorded, cause: KnownCause | None = None) -> str:
    """The representative check's failure as the suite measured it: two numbers, or the
    error (with the phrase that says ``cause``'s failure, where the first line lacks it)."""
    error, bound = check.number("error"), check.number("bound")
    if error is not None and bound is not None and error > bound:
        worst = f" ({check.numbers['worst']})" if check.numbers.get("worst") else ""
        return f"largest error {error:.3g} against float64, bound {bound:.3g}{worst}"
    text = check.reason.split(" | ")[0].strip()[:300] or check.cause
    if cause is not None and not cause.failure.search(text):
        found = re.search(f"(?:{cause.failure.pattern})[^'|]*", check.reason, cause.failure.flags)
        if found:
            text += f" ({found[0].strip()})"
    return text


_PRELUDE = """\
import pathlib, platform, re, sys


def cannot(why):
    print(f"cannot run this case here: {why}")
    sys.exit(2)


def first(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


nvidia = pathlib.Path("/proc/driver/nvidia/version")  # names the driver's version
driver = (re.findall(r"Kernel Module.*?(\\d+\\.\\d+[.\\d]*)", nvidia.read_text()) or ["?"])[0] if nvidia.exists() else "none"
try:
    import ${imports}
except ImportError as e:
    cannot(f"{e.name} is not installed")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), xformers {xformers.__version__},"${diffusers}
      f" Python {platform.python_version()}, GPU {gpu}, driver {driver}")
"""

_NEEDS_GPU = """\
if gpu == "none":
    cannot("no CUDA GPU visible to torch, and xformers' kernels run on CUDA only")
"""

_BOOL_MASK = """\
B, M, N, H, K, DTYPE = ${B}, ${M}, ${N}, ${H}, ${K}, torch.${dtype}
BOUND = 0.05  # low-precision rounding stays far below it; attending the masked keys, far above
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, n, H, K, generator=g).to("cuda", DTYPE) for n in (M, N, N))
keep = torch.ones(B, N, dtype=torch.bool, device="cuda")  # True: attend to this key
keep[0, N - N // 3 :] = keep[1 % B, N - N // 2 :] = False  # padding at the end of each row
mask = keep[:, None, None, :]  # [B,1,1,N]: the 4-D boolean form
try:
    out = dispatch_attention_fn(q, k, v, attn_mask=mask, backend="xformers")
except Exception as e:
    cannot(f"dispatch_attention_fn(backend='xformers') raised {first(e)}")
qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
scores = (qd @ kd.transpose(-1, -2)) / K**0.5
ref = (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vd).transpose(1, 2)
error = (out.double() - ref).abs().max().item()
print(f"expected: largest |output - float64 reference| <= {BOUND}")
print(f"actual:   {error:.3g}")
if error > BOUND:
    print("REPRODUCED: the xformers backend attends keys a 4-D boolean attn_mask masks out")
    sys.exit(1)
print("NOT REPRODUCED: the xformers backend applies the 4-D boolean attn_mask correctly")
"""

_BIAS_BACKWARD = """\
B, M, N, H, K, DTYPE = ${B}, ${M}, ${N}, ${H}, ${K}, torch.${dtype}
BOUND = 0.05  # largest gradient error relative to the largest float64 gradient
q, k, v = (torch.randn(B, n, H, K, device="cuda", dtype=DTYPE, requires_grad=True) for n in (M, N, N))
# a [B,H,M,N] bias that needs a gradient, its rows 8-aligned in storage as xformers requires
bias = torch.randn(B, H, M, (N + 7) // 8 * 8, device="cuda", dtype=DTYPE)[..., :N].requires_grad_()


@torch.compile(fullgraph=True)
def attention(q, k, v, bias):
    return xformers.ops.memory_efficient_attention(q, k, v, attn_bias=bias)


try:
    attention(q, k, v, bias).float().square().sum().backward()
except Exception as e:
    if not (found := re.search(r"(FakeTensor.?Device|two different devices)[^'\\n]*", str(e), re.I)):
        cannot(f"another error stopped the case first: {first(e)}")
    print("expected: forward and backward compile and run")
    print(f"actual:   {found[0]}")
    print("REPRODUCED: FakeTensor device propagation fails in aten._efficient_attention_backward")
    sys.exit(1)
ref = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
qd, kd, vd = (t.transpose(1, 2) for t in ref[:3])
((((qd @ kd.transpose(-1, -2)) / K**0.5 + ref[3]).softmax(-1) @ vd).square().sum()).backward()
error = max(((t.grad - r.grad).abs().max() / r.grad.abs().max()).item() for t, r in zip((q, k, v, bias), ref))
print(f"expected: largest relative gradient error <= {BOUND}")
print(f"actual:   {error:.3g}")
print("NOT REPRODUCED: the compiled backward runs" + (", but its gradients are off" if error > BOUND else ""))
"""

_CAUSAL = """\
device = "cuda" if gpu != "none" else "cpu"
if device == "cpu":
    print("No CUDA GPU: running on the CPU, where dynamo fails the same way while tracing")
B, M, H, K, DTYPE = ${B}, ${M}, ${H}, ${K}, torch.${dtype}
BOUND = 0.05  # low-precision rounding stays far below it
q, k, v = (torch.randn(B, M, H, K, device=device, dtype=DTYPE) for _ in range(3))


@torch.compile(fullgraph=True)
def attention(q, k, v):
    return xformers.ops.memory_efficient_attention(q, k, v, attn_bias=xformers.ops.LowerTriangularMask())


try:
    out = attention(q, k, v)
except Exception as e:
    if "returned non-Tensor" not in str(e):
        cannot(f"another error stopped the case first ({device}): {first(e)}")
    print("expected: the function compiles as one graph")
    print(f"actual:   {first(e)}")
    print("REPRODUCED: LowerTriangularMask() inside torch.compile(fullgraph=True) does not trace")
    sys.exit(1)
qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
scores = (qd @ kd.transpose(-1, -2)) / K**0.5
causal = torch.ones(M, M, dtype=torch.bool, device=device).tril()
ref = (scores.masked_fill(~causal, float("-inf")).softmax(-1) @ vd).transpose(1, 2)
error = (out.double() - ref).abs().max().item()
print(f"expected: largest |output - float64 reference| <= {BOUND}")
print(f"actual:   {error:.3g}")
print("NOT REPRODUCED: LowerTriangularMask() traces with fullgraph=True" + (", but the output is off" if error > BOUND else ""))
"""

_BODIES = {
    "diffusers-xformers-bool-mask": _BOOL_MASK,
    "xformers-compiled-bias-backward": _BIAS_BACKWARD,
    "xformers-causal-fullgraph": _CAUSAL,
}


def _imports(cause: KnownCause) -> str:
    names = ["torch", "xformers", "xformers.ops"]
    if "diffusers" in cause.needs:
        names.append("diffusers")
        return (
            ", ".join(names)
            + "\n    from diffusers.models.attention_dispatch import dispatch_attention_fn"
        )
    return ", ".join(names)


def _header(cause: KnownCause, checks: Sequence[Recorded], filename: str) -> str:
    first = checks[0]
    facts = first.run
    used = "diffusers" in cause.needs
    versions = ", ".join(
        f"{what} {value}" for what, value in recorded_versions(facts, checks, diffusers_used=used)
    )
    where = (
        "Runs on a CUDA GPU, or on the CPU, where dynamo fails the same way while tracing."
        if cause.runs_on_cpu
        else "Needs a CUDA GPU (xformers' kernels run on CUDA only)."
    )
    fault = first.fault
    if fault == "undecided":
        at_fault = "undecided: no experiment of the suite decided who is at fault"
    else:
        at_fault = f"{fault}, by experiment: {first.fault_evidence}"
    lines = [
        cause.title,
        "",
        f"Recorded on: {versions}",
        f"Run:         {facts.combination or '(no combination)'}, suite"
        f" {facts.suite_version or '?'}, finished {facts.finished or '?'} ({facts.source})",
        f"Failed:      {len(checks)} check(s) with this cause: {listed(checks)}",
        f"Recorded:    {first.name}: {recorded_outcome(first, cause)}",
        f"At fault:    {at_fault}",
        "",
        f"Needs {', '.join(cause.needs)} (nothing from envbuilder). {where}",
        f"Run it: python {filename}",
        "Exit 1 (REPRODUCED) when it sees the recorded failure, 0 (NOT REPRODUCED) when it"
        " does not, 2 ('cannot run this case here: ...') when this environment cannot run it.",
        "Written by `envbuilder repro`.",
    ]
    wrapped: list[str] = []
    for line in map(one_line, lines):  # a recorded NUL, newline or bidi control, escaped
        indent = " " * 13 if re.match(r"[A-Z][a-z ]*: +", line[:13]) else ""
        wrapped += textwrap.wrap(line, 92, subsequent_indent=indent) or [""]
    return "\n".join(f"# {line}".rstrip() for line in wrapped)


def render(cause: KnownCause, checks: Sequence[Recorded], *, filename: str | None = None) -> str:
    """The script of ``cause`` as ``checks`` (its failed checks of one run, the one to
    describe first) recorded it."""
    if not checks:
        raise ValueError(f"no checks recorded for cause {cause.key!r}")
    name = filename or default_filename(cause)
    shape = shape_of(cause, checks)
    values = {
        "imports": _imports(cause),
        "diffusers": (
            '\n      f" diffusers {diffusers.__version__},"' if "diffusers" in cause.needs else ""
        ),
        **{size: str(getattr(shape.case, size)) for size in "BMNHK"},
        "dtype": shape.dtype,
    }
    prelude = Template(_PRELUDE).substitute(values)
    body = ("" if cause.runs_on_cpu else _NEEDS_GPU) + Template(_BODIES[cause.key]).substitute(
        values
    )
    return f"#!/usr/bin/env python3\n{_header(cause, checks, name)}\n{prelude}{body}"
