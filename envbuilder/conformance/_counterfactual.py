"""Experiments that decide whether a wrong answer from diffusers' xformers backend is
diffusers' wrapper or xformers' kernel.

diffusers keeps each attention backend's function in
``_AttentionBackendRegistry._backends`` (``AttentionBackendName.XFORMERS`` ->
``_xformers_attention``), looked up on every ``dispatch_attention_fn`` call. That
function converts the mask (the glue) and calls ``xops.memory_efficient_attention``,
where ``xops`` is a global of ``diffusers.models.attention_dispatch`` read at call
time. Each experiment re-runs the failing computation (``run``: the check's own call
through diffusers, returning the tensors it compares) with one thing changed:

- ``exact_kernel`` (`kernel_swapped`): ``xops`` in that module's globals replaced by a
  stand-in whose ``memory_efficient_attention`` is `exact_attention`, float64
  textbook attention honouring a tensor bias and xformers' bias objects; the wrapper
  is untouched. Still wrong: the wrapper is at fault. Right: the kernel.
- ``direct_kernel`` (`backend_replaced` with `direct_backend`): the wrapper bypassed,
  the kernel called directly with a correct bias (``[B,H,M,N]``, additive 0/-inf, rows
  8-aligned in storage). Right: the kernel is fine. It needs the real kernel, which has
  no CPU implementation: on a CPU it records that it could not run.
- ``patched_glue`` (`glue_patched`): the wrapper with a boolean 4-D mask converted the
  way its 2-D path converts one (diffusers' own ``_prepare_additive_attn_mask``: True
  -> 0, False -> -inf) and, where its rows are not, placed in 8-aligned storage, before
  the unchanged wrapper runs; with the real kernel where it runs, else the exact one.
  Right: that is the upstream fix (``upstream_fix``, evidence and not advice).

Each run records ``cf_<name>`` (``pass``, ``fail: …``, ``could not run here: …``) and,
where it ran, ``cf_<name>_error``: the largest error against the check's float64
reference of the quantity worst against its bound. `decide` names the component at
fault only when the exact-kernel and direct-kernel runs agree; anything else stays
``undecided`` with what ran.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from envbuilder.conformance import _fault
from envbuilder.conformance._record import Number, describe_error

__all__ = [
    "Judge",
    "Kernel",
    "Reference",
    "Trial",
    "backend_replaced",
    "correct_bias",
    "counterfactuals",
    "decide",
    "direct_backend",
    "exact_attention",
    "glue_patched",
    "kernel_swapped",
    "real_kernel",
    "trial",
]

#: what ``xformers.ops.memory_efficient_attention`` is: ``(q, k, v, attn_bias, p, scale)``
Kernel = Callable[..., torch.Tensor]
Tensors = Mapping[str, torch.Tensor]
#: what a run returns (a check's tensors, a model step)
Result = TypeVar("Result")
#: a check's judge of a run: the quantity worst against its bound, its error and bound
Judge = Callable[[Result], tuple[str, float, float]]

#: the wrapper and the kernel: who an experiment can find at fault
WRAPPER: _fault.Component = "diffusers"
KERNEL: _fault.Component = "xformers"

UPSTREAM_FIX = (
    "diffusers (models/attention_dispatch.py, _xformers_attention): convert a boolean 4-D"
    " attn_mask as the 2-D path does, _prepare_additive_attn_mask(attn_mask, query.dtype,"
    " reshape_4d=False) (True -> 0, False -> -inf), before .expand(...), instead of"
    " .type_as(query), which turns True into 1.0 and False into 0.0"
)
ALIGN_FIX = "; and place the 4-D mask in storage whose rows are 8-aligned, as the 2-D path does"


def exact_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: Any = None,
    p: float = 0.0,
    scale: float | None = None,
    **_: Any,
) -> torch.Tensor:
    """``xformers.ops.memory_efficient_attention``'s contract computed exactly: float64
    ``softmax(q kᵀ · scale + bias) v`` in BMHK (or BMK) layout, returned in the query's
    dtype. ``attn_bias`` is a tensor broadcastable to ``[B,H,M,N]`` or one of xformers'
    bias objects (``LowerTriangularMask``, …: their ``materialize``); no dropout."""
    if p:
        raise ValueError(f"the exact attention has no dropout (p={p!r})")
    three = query.dim() == 3
    if three:
        query, key, value = (t.unsqueeze(2) for t in (query, key, value))
    if query.dim() != 4:
        raise ValueError(f"the exact attention takes BMHK or BMK inputs, not {query.dim()}-D")
    qh, kh, vh = (t.double().transpose(1, 2) for t in (query, key, value))
    factor = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = (qh @ kh.transpose(-1, -2)) * factor
    if isinstance(attn_bias, torch.Tensor):
        bias = attn_bias.double()
        scores = scores + (bias.unsqueeze(1) if three and bias.dim() == 3 else bias)
    elif attn_bias is not None:
        materialize = getattr(attn_bias, "materialize", None)
        if materialize is None:
            raise TypeError(f"no dense form for the bias {type(attn_bias).__name__}")
        scores = scores + materialize(tuple(scores.shape), dtype=torch.float64, device=qh.device)
    out = (scores.softmax(dim=-1) @ vh).transpose(1, 2)
    return (out.squeeze(2) if three else out).to(query.dtype)


def _registry() -> tuple[Any, Any]:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    return _AttentionBackendRegistry, AttentionBackendName.XFORMERS


class _KernelStandIn:
    """``xformers.ops`` as the wrapper sees it, with ``memory_efficient_attention`` replaced."""

    def __init__(self, real: Any, kernel: Kernel) -> None:
        self._real = real
        self.memory_efficient_attention = kernel

    def __getattr__(self, name: str) -> Any:
        if self._real is None:
            raise AttributeError(f"xformers.ops is not importable here: no {name}")
        return getattr(self._real, name)


@contextlib.contextmanager
def kernel_swapped(kernel: Kernel) -> Iterator[None]:
    """diffusers' xformers backend calling ``kernel`` where it calls
    ``xops.memory_efficient_attention``: the ``xops`` global its registered function reads
    at call time, replaced for the block only."""
    registry, name = _registry()
    scope = registry._backends[name].__globals__
    had = "xops" in scope
    original = scope.get("xops")
    scope["xops"] = _KernelStandIn(original, kernel)
    try:
        yield
    finally:
        if had:
            scope["xops"] = original
        else:
            del scope["xops"]


@contextlib.contextmanager
def backend_replaced(fn: Callable[..., torch.Tensor]) -> Iterator[None]:
    """``fn`` registered as diffusers' xformers backend for the block only (it is called
    with the registered function's keyword arguments)."""
    registry, name = _registry()
    original = registry._backends[name]
    registry._backends[name] = fn
    try:
        yield
    finally:
        registry._backends[name] = original


def _aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous values) in storage whose last dimension is padded to a multiple of 8."""
    n = t.shape[-1]
    buf = torch.zeros(*t.shape[:-1], (n + 7) // 8 * 8, dtype=t.dtype, device=t.device)
    buf[..., :n].copy_(t)
    return buf[..., :n]


def correct_bias(attn_mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The bias xformers' kernel takes for a diffusers ``attn_mask`` (2-D ``[B,N]`` or 4-D,
    boolean True = attend, or additive): ``[B,H,M,N]`` in the query's dtype, 0 where
    attended (or the additive value), -inf where masked, rows 8-aligned in storage."""
    b, m, h = query.shape[0], query.shape[1], query.shape[2]
    n = key.shape[1]
    mask = attn_mask[:, None, None, :] if attn_mask.dim() == 2 else attn_mask
    if mask.dtype == torch.bool:
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        additive = additive.masked_fill(~mask.to(query.device), -math.inf)
    else:
        additive = mask.to(query.device, query.dtype)
    return _aligned_rows(additive.expand(b, h, m, n).contiguous())


def direct_backend(kernel: Kernel) -> Callable[..., torch.Tensor]:
    """A backend that bypasses diffusers' conversion: `correct_bias`, then ``kernel``."""

    def direct(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        scale: float | None = None,
        **_: Any,
    ) -> torch.Tensor:
        bias = None if attn_mask is None else correct_bias(attn_mask, query, key)
        return kernel(query, key, value, bias, dropout_p, scale)

    return direct


@contextlib.contextmanager
def glue_patched(aligned: list[bool] | None = None) -> Iterator[None]:
    """diffusers' xformers backend with its 4-D boolean mask conversion patched: such a mask
    is converted by diffusers' ``_prepare_additive_attn_mask`` (as its 2-D path does) and,
    when its rows are not 8-aligned, put in aligned ``[B,H,M,N]`` storage, before the
    unchanged wrapper runs (which then leaves it as it is). ``aligned`` gets True appended
    when a mask needed the alignment."""
    from diffusers.models import attention_dispatch

    registry, name = _registry()
    original = registry._backends[name]
    convert = attention_dispatch._prepare_additive_attn_mask

    def patched(**kwargs: Any) -> torch.Tensor:
        mask = kwargs.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.dtype == torch.bool:
            query, key = kwargs["query"], kwargs["key"]
            additive = convert(mask, target_dtype=query.dtype, reshape_4d=False)
            b, m, h = query.shape[0], query.shape[1], query.shape[2]
            full = additive.expand(b, h, m, key.shape[1])
            if key.shape[1] % 8:
                full = _aligned_rows(full.contiguous())
                if aligned is not None:
                    aligned.append(True)
            kwargs["attn_mask"] = full
        result: torch.Tensor = original(**kwargs)
        return result

    with backend_replaced(patched):
        yield


def real_kernel(device: str) -> Kernel | str:
    """xformers' ``memory_efficient_attention`` where it can run, else why not."""
    if not device.startswith("cuda"):
        return "could not run here: xformers' kernels have no CPU implementation"
    try:
        import xformers.ops as xops
    except ImportError as e:
        return f"could not run here: xformers does not import: {e}"
    kernel: Kernel = xops.memory_efficient_attention
    return kernel


@dataclass(frozen=True, kw_only=True)
class Reference:
    """What a check compares against: float64 results and each quantity's bound."""

    expected: Tensors
    bounds: Mapping[str, float]

    def worst(self, got: Tensors) -> tuple[str, float, float]:
        """The quantity worst against its bound: its name, error and bound."""
        rows: list[tuple[float, str, float, float]] = []
        for name, bound in self.bounds.items():
            diff = (got[name].double() - self.expected[name].double()).abs().max().item()
            error = float(diff)
            ratio = math.inf if error != error else error / bound
            rows.append((ratio, name, error, bound))
        _, name, error, bound = max(rows)
        return name, error, bound


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One experiment: ``said`` is ``pass``, ``fail: …`` or ``could not run here: …``;
    ``error`` is set when it ran to numbers (``wrong``: above the bound)."""

    said: str
    error: float | None = None
    wrong: bool = False

    @property
    def right(self) -> bool:
        return self.said == "pass"


def trial(run: Callable[[], Result], judge: Judge[Result]) -> Trial:
    """``run`` judged by ``judge`` (`Reference.worst` for a mapping of tensors); an exception
    is recorded, not raised."""
    try:
        got = run()
    except Exception as e:  # what the changed computation does is the measurement
        return Trial(said=f"fail: {describe_error(e, 300)}")
    name, error, bound = judge(got)
    if error <= bound:
        return Trial(said="pass", error=error)
    return Trial(
        said=f"fail: {name} error {error:.3g} > bound {bound:.3g}", error=error, wrong=True
    )


def decide(exact: Trial, direct: Trial) -> dict[str, Number]:
    """Who is at fault: the wrapper when the exact kernel inside it is still wrong and the
    kernel called directly is right; the kernel when the reverse; else ``undecided``."""
    said = f"exact kernel in the wrapper: {exact.said}; kernel called directly: {direct.said}"
    if exact.wrong and direct.right:
        return _fault.decided(
            WRAPPER,
            f"the wrapper's mask conversion: with the kernel swapped for exact float64"
            f" attention the answer is still wrong, the kernel called directly with a correct"
            f" bias is right ({said})",
        )
    if exact.right and direct.wrong:
        return _fault.decided(
            KERNEL,
            f"the kernel: the wrapper with an exact float64 kernel is right, the kernel called"
            f" directly with a correct bias is wrong ({said})",
        )
    return {"fault_component": "undecided", "fault_evidence": f"no deciding pair: {said}"[:400]}


def counterfactuals(
    run: Callable[[], Result], judge: Judge[Result], *, kernel: Kernel | str
) -> dict[str, Number]:
    """The three experiments on ``run`` (the failing computation through diffusers' xformers
    backend) and what they decide. ``kernel`` is the real kernel (`real_kernel`), or why
    it cannot run here; the patched glue then runs with the exact kernel."""
    numbers: dict[str, Number] = {}
    with kernel_swapped(exact_attention):
        exact = trial(run, judge)
    if isinstance(kernel, str):
        direct = Trial(said=kernel)
    else:
        with backend_replaced(direct_backend(kernel)):
            direct = trial(run, judge)
    aligned: list[bool] = []
    glue_kernel = "exact float64" if isinstance(kernel, str) else "xformers"
    with (
        glue_patched(aligned),
        kernel_swapped(exact_attention if isinstance(kernel, str) else kernel),
    ):
        glue = trial(run, judge)
    for key, found in (("exact_kernel", exact), ("direct_kernel", direct), ("patched_glue", glue)):
        numbers[f"cf_{key}"] = found.said[:300]
        if found.error is not None:
            numbers[f"cf_{key}_error"] = found.error
    numbers["cf_patched_glue_kernel"] = glue_kernel
    numbers |= decide(exact, direct)
    if glue.right and exact.wrong:
        numbers["upstream_fix"] = UPSTREAM_FIX + (ALIGN_FIX if aligned else "")
    return numbers
