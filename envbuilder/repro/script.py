"""The standalone script that rebuilds one check's case: text out of records, nothing run.

The script imports torch and, as the case needs, xformers and diffusers; never
envbuilder, so that it can be sent upstream as it is. It prints what it measures,
then one verdict line, ``REPRODUCED: …`` (exit status 1) or ``NOT REPRODUCED: …``
(exit status 0), after a line saying how the recorded failure compares.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envbuilder.conformance._record import Status
from envbuilder.repro import _snippets
from envbuilder.repro.cases import (
    DROPOUT_P,
    DROPOUT_STD_DEVIATIONS,
    MASKS_PATTERN_KEEP,
    MODEL_ATTENTION_GAIN,
    MODEL_IMAGE_SIDE,
    MODEL_LEARNING_RATE,
    AttentionCase,
    CompileCase,
    DropoutCase,
    MaskFormCase,
    ModelCase,
    ReproCase,
    Seeded,
)

__all__ = ["Origin", "default_filename", "render"]

#: checks_compile._COMPILE_LIMITS
COMPILE_LIMITS: dict[str, int] = {
    "cache_size_limit": 4096,
    "recompile_limit": 4096,
    "accumulated_cache_size_limit": 65536,
    "accumulated_recompile_limit": 65536,
}

_MASK_WORDS = {
    "none": "no mask",
    "causal": "causal mask",
    "blockdiag": "block-diagonal mask of packed sequences",
    "bias": "dense [B,H,M,N] tensor bias",
    "padding": "key-padding mask as an additive bias",
    "bias_b1mn": "[B,1,M,N] tensor bias as it is",
    "bias_expanded": "[B,1,M,N] tensor bias expanded to [B,H,M,N]",
}
_FORM_WORDS = {
    "bool2d": "[B,N] boolean key mask",
    "bool4d_b11n": "[B,1,1,N] boolean key mask",
    "bool4d_b1mn": "[B,1,M,N] boolean mask differing per query row",
    "additive": "additive float [B,1,M,N] mask (random where attended, lowest where masked)",
}
#: checks_model._TRANSFORMER_MODULE: whose dispatch_attention_fn the workaround disables
TRANSFORMER_MODULE = "diffusers.models.transformers.transformer_qwenimage"
_DISABLED_WORDS = (
    " Workaround dynamo-disable: the attention call behind torch.compiler.disable inside the"
    " compiled code (a graph break there by design); invalid unless dynamo broke the graph"
    " and the kernel ran outside the compiled graph."
)


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Where the failure was recorded: the check, its outcome and the run's facts."""

    check: str
    status: Status | None  # None: a status the suite does not make
    reason: str
    results_path: str
    combination: str | None
    lock_sha256: str | None
    suite_version: str | None
    finished: str | None
    runner: Mapping[str, object]
    numbers: Mapping[str, object]
    fault_component: str | None = None
    fault_op: str | None = None
    cause: str | None = None


def default_filename(check: str) -> str:
    """``repro_<check>.py`` with every character outside [A-Za-z0-9_] made ``_``."""
    safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in check)
    return f"repro_{safe}.py"


def first_clause(reason: str, limit: int = 400) -> str:
    """A recorded reason's first ``|``-separated clause (the error's first line)."""
    return reason.split(" | ")[0].strip()[:limit]


def _failed_on(origin: Origin) -> str:
    r = origin.runner
    parts = [f"torch {r.get('torch', '?')}"]
    if r.get("torch_cuda"):
        parts[0] += f" (CUDA {r['torch_cuda']})"
    parts.append(f"xformers {r.get('xformers') or 'not installed'}")
    diffusers = origin.numbers.get("diffusers")
    if diffusers:
        parts.append(f"diffusers {diffusers}")
    parts.append(f"Python {r.get('python', '?')}")
    gpus = r.get("gpus")
    if isinstance(gpus, Sequence) and gpus and isinstance(gpus[0], Mapping):
        gpu = gpus[0]
        parts.append(
            f"{gpu.get('name', 'GPU')} (compute capability {gpu.get('compute_capability', '?')})"
        )
        if r.get("driver"):
            parts.append(f"driver {r['driver']}")
    else:
        parts.append("CPU")
    return ", ".join(parts)


def _needs(case: ReproCase) -> str:
    needs = ["torch"]
    uses_xformers = (
        case.backend == "xformers" if isinstance(case, MaskFormCase) else case.impl == "xformers"
    )
    if uses_xformers:
        needs.append("xformers")
    if isinstance(case, ModelCase | MaskFormCase):
        needs.append("diffusers")
    return ", ".join(needs)


def _describe(case: ReproCase) -> str:
    text = _describe_case(case)
    if getattr(case, "workaround", None) == "dynamo-disable":
        text += _DISABLED_WORDS
    return text


def _describe_case(case: ReproCase) -> str:
    if isinstance(case, AttentionCase):
        mode = "forward + backward" if case.backward else "forward under torch.no_grad"
        return (
            f"eager {case.impl} attention, {_MASK_WORDS[case.mask]}, {case.dtype}, {mode};"
            f" shapes (BMHK) {_shapes(case.cases)}"
        )
    if isinstance(case, CompileCase):
        mode = "forward + backward" if case.backward else "forward under torch.no_grad"
        what = f"{case.impl} attention"
        if case.workaround == "dynamo-disable":
            what = f"an attention layer (projections around a disabled {case.impl} call)"
        return (
            f"torch.compile(dynamic={case.dynamic}, fullgraph={case.fullgraph}) of {what}"
            f" with a {_MASK_WORDS[case.mask]} built inside, {case.dtype}, {mode};"
            f" shapes (BMHK) {_shapes(case.cases)}, each run twice"
        )
    if isinstance(case, DropoutCase):
        how = "torch.compile(dynamic=False)" if case.compiled else "eager"
        return (
            f"{case.impl} attention with dropout p={DROPOUT_P} in training mode, {how},"
            f" {case.dtype}, {case.shape.label}, seeds 31/32, torch.manual_seed(1234) x 3"
        )
    if isinstance(case, ModelCase):
        backend = "xformers" if case.impl == "xformers" else "native (SDPA)"
        return (
            f"diffusers QwenImageTransformer2DModel (random weights, {dict(case.config)}),"
            f" attention backend {backend}, {'one training step' if case.training else 'inference'},"
            f" {'torch.compile' if case.compiled else 'eager'}, {case.dtype},"
            f" {MODEL_IMAGE_SIDE * MODEL_IMAGE_SIDE} image + {case.text} text tokens with a"
            " text padding mask"
        )
    source = "as recorded" if case.shape_recorded else "the suite's; the results named none"
    return (
        f"diffusers dispatch_attention_fn, backend {case.backend}, {_FORM_WORDS[case.form]},"
        f" {case.dtype}, forward + backward, case {case.shape.label} ({source}), seeds"
        f" {case.seed}/{case.mask_seed}; output and q/k/v gradients against float64 attention"
        " under the same mask"
    )


def _shapes(cases: Sequence[Seeded]) -> str:
    return "; ".join(f"{c.shape.label} (seed {c.seed}/{c.grad_seed})" for c in cases)


def _header(case: ReproCase, origin: Origin, filename: str) -> str:
    numbers = origin.numbers
    recorded = (
        f"{origin.status or 'no status'}: {first_clause(origin.reason) or '(no reason recorded)'}"
    )
    if isinstance(numbers.get("error"), int | float) and isinstance(
        numbers.get("bound"), int | float
    ):
        recorded += f" [worst error {numbers['error']:.3g}, bound {numbers['bound']:.3g}]"
    fault = origin.fault_component or "not named by the results"
    if origin.fault_op:
        fault += f" ({origin.fault_op})"
    if origin.cause:
        fault += f"; cause: {origin.cause}"
    run = f"combination {origin.combination or '(not named)'}"
    if origin.lock_sha256:
        run += f", lock sha256 {origin.lock_sha256[:12]}"
    lines = [
        "Reproducer of an envbuilder conformance check",
        "",
        f"Check:     {origin.check}",
        f"Case:      {_describe(case)}",
        f"Failed on: {_failed_on(origin)}",
        f"Run:       {run}, suite {origin.suite_version or '?'}, finished {origin.finished or '?'}",
        f"Results:   {origin.results_path}",
        f"Recorded:  {recorded}",
        f"At fault:  {fault}",
        "",
        f"Needs:     {_needs(case)} (nothing from envbuilder)",
        f"Run it:    python {filename}",
        "Exit 1 and 'REPRODUCED: ...' when the case fails here as the check did; exit 0 and",
        "'NOT REPRODUCED: ...' when it passes. Written by `envbuilder repro` from the suite's",
        "definitions (the same inputs, seeds, tolerance rule and float64 reference).",
    ]
    wrapped: list[str] = []
    for line in lines:
        wrapped += textwrap.wrap(line, 92, subsequent_indent=" " * 11) or [""]
    return "\n".join(f"# {line}".rstrip() for line in wrapped)


def _constants(case: ReproCase, origin: Origin) -> list[tuple[str, object]]:
    device = "cuda" if origin.runner.get("gpus") else "cpu"
    common: list[tuple[str, object]] = [
        ("CHECK", origin.check),
        ("RECORDED_STATUS", origin.status or ""),
        ("RECORDED_REASON", first_clause(origin.reason)),
        ("FAILED_ON", _failed_on(origin)),
        ("DEVICE", device),
        ("DTYPE_NAME", case.dtype),
    ]
    if isinstance(case, AttentionCase | CompileCase):
        specific: list[tuple[str, object]] = [
            ("IMPL", case.impl),
            ("KERNEL", case.impl),
            ("MASK", case.mask),
            ("BACKWARD", case.backward),
            ("CASES", [_case_dict(c) for c in case.cases]),
        ]
        if isinstance(case, AttentionCase):
            specific.append(("REJECTION_PASSES", case.rejection_passes))
        else:
            specific += [
                ("DYNAMIC", case.dynamic),
                ("FULLGRAPH", case.fullgraph),
                ("COMPILE_LIMITS", COMPILE_LIMITS),
                ("WORKAROUND", case.workaround),
            ]
        return common + specific
    if isinstance(case, DropoutCase):
        shape = case.shape
        return [
            *common,
            ("IMPL", case.impl),
            ("COMPILED", case.compiled),
            ("CASE", {"B": shape.B, "M": shape.M, "N": shape.N, "H": shape.H, "K": shape.K}),
            ("P", DROPOUT_P),
            ("STD_DEVIATIONS", DROPOUT_STD_DEVIATIONS),
            ("WORKAROUND", case.workaround),
        ]
    if isinstance(case, ModelCase):
        return [
            *common,
            ("BACKEND", "xformers" if case.impl == "xformers" else "native"),
            ("TRAINING", case.training),
            ("COMPILED", case.compiled),
            ("CONFIG", dict(case.config)),
            ("TEXT", case.text),
            ("IMAGE_SIDE", MODEL_IMAGE_SIDE),
            ("ATTENTION_GAIN", MODEL_ATTENTION_GAIN),
            ("LEARNING_RATE", MODEL_LEARNING_RATE),
            ("WORKAROUND", case.workaround),
            ("TRANSFORMER_MODULE", TRANSFORMER_MODULE),
        ]
    shape = case.shape
    return [
        *common,
        ("BACKEND", case.backend),
        ("FORM", case.form),
        ("CASE", {"B": shape.B, "M": shape.M, "N": shape.N, "H": shape.H, "K": shape.K}),
        ("CASE_LABEL", f"B{shape.B} M{shape.M} N{shape.N} H{shape.H} K{shape.K}"),
        ("SEED", case.seed),
        ("MASK_SEED", case.mask_seed),
        ("PATTERN_KEEP", MASKS_PATTERN_KEEP),
        ("RECORDED_MASK", _recorded_mask(origin.numbers)),
    ]


def _recorded_mask(numbers: Mapping[str, object]) -> str:
    """The mask the check recorded handing diffusers, for the script to compare with its own."""
    if "mask_shape" not in numbers:
        return "not recorded"
    return (
        f"{numbers.get('mask_shape')} {numbers.get('mask_dtype', '?')}, masked keys fraction"
        f" {numbers.get('masked_keys_fraction', '?')}"
    )


def _case_dict(seeded: Seeded) -> dict[str, object]:
    s = seeded.shape
    return {
        "B": s.B,
        "M": s.M,
        "N": s.N,
        "H": s.H,
        "K": s.K,
        "mask": s.mask,
        "seqlens": list(s.seqlens),
        "seed": seeded.seed,
        "grad_seed": seeded.grad_seed,
    }


def _body(case: ReproCase) -> str:
    if isinstance(case, AttentionCase | CompileCase):
        build = _snippets.ATTENTION_IMPL[(case.impl, case.mask)]
        if case.impl == "xformers":
            impl = _snippets.XFORMERS_FN.replace("{build}", build)
        else:
            impl = _snippets.SDPA_FN.replace("{build}", build).replace(
                "{causal}", str(case.mask == "causal")
            )
        if isinstance(case, AttentionCase):
            return _snippets.INPUTS + _snippets.REFERENCE + impl + _snippets.ATTENTION_MAIN
        return (
            _snippets.INPUTS
            + _snippets.REFERENCE
            + impl
            + _disabled(case.workaround)
            + _snippets.COMPILE_MAIN
        )
    if isinstance(case, DropoutCase):
        dropout = _snippets.DROPOUT.replace("{body}", _snippets.DROPOUT_BODY[case.impl])
        return _disabled(case.workaround) + dropout
    if isinstance(case, ModelCase):
        return _disabled(case.workaround) + _snippets.MODEL
    return _snippets.MASKS


def _disabled(workaround: str | None) -> str:
    return _snippets.DISABLED if workaround == "dynamo-disable" else ""


def render(case: ReproCase, origin: Origin, *, filename: str | None = None) -> str:
    """The script's text for ``case`` as ``origin`` recorded it."""
    name = filename or default_filename(origin.check)
    constants = "\n".join(f"{key} = {value!r}" for key, value in _constants(case, origin))
    head = f'#!/usr/bin/env python3\n{_header(case, origin, name)}\n"""Reproducer of {origin.check}."""\n'
    tail = _snippets.ENTRY
    return (
        head
        + _snippets.IMPORTS
        + "\n# The case, as the suite ran it.\n"
        + constants
        + "\n"
        + _snippets.COMMON
        + _body(case)
        + tail
    )
