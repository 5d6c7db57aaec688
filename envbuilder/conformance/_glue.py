"""Experiments that decide whether a compiled xformers failure is the glue around an
operator or a bias object built in compiled code, not the compiler or the kernel.

Glue isolation (`isolate_glue`), for an error naming an ``aten`` operator: the
arguments xformers hands that operator are captured in an eager run (a dispatch
mode, `capture_op_args`), and the operator alone is run three ways:

- ``cf_fake_xformers_args``: under ``FakeTensorMode`` with xformers' arguments
  (what the compiler does while tracing);
- ``cf_fake_scalar_philox``: the same with every CPU tensor of more than zero
  dimensions, beside tensors on another device, made a 0-dim CPU tensor (what
  torch's SDPA passes as ``philox_seed``/``philox_offset``; a 0-dim CPU tensor is a
  scalar that fake device propagation allows);
- ``cf_eager``: eagerly with xformers' arguments.

Fake fails, fake with 0-dim tensors passes, eager passes: the trigger is how
xformers prepared those arguments (decided ``xformers``, with the upstream fix as
``upstream_fix``; beside it, torch's fake rule is stricter than its eager kernel).
Any other pattern decides nothing: a kernel that fails eagerly too, or that fails
under fake tensors whatever the arguments' shape, is not the glue.

Bias objects (`decide_mask_outside`): the compiled function run again with the bias
object built outside it and passed in, with ``fullgraph=True``; right there while it
fails when built inside: building xformers' bias class inside compiled code is the
trigger (decided ``xformers``).

Each run is a number: ``pass``, ``fail: …`` or ``could not run here: …``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from envbuilder.conformance import _fault
from envbuilder.conformance._record import Number, describe_error

__all__ = [
    "Captured",
    "capture_op_args",
    "decide_glue",
    "decide_mask_outside",
    "isolate_glue",
    "loose_cpu_args",
    "run_fake",
    "scalarised",
]

#: what an error of fake device propagation says (torch 2.11: "Unhandled FakeTensor
#: Device Propagation … found two different devices"; 2.13: FakeTensorDeviceMismatchError)
_DEVICE_RULE = re.compile(
    r"FakeTensor Device Propagation|FakeTensorDeviceMismatch|two different devices"
    r"|at least two devices",
    re.I,
)


@dataclass(frozen=True)
class Captured:
    """One operator call as xformers made it: the operator and snapshots of its arguments."""

    op: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.op)


def _snapshot(value: Any) -> Any:
    """A copy of a tensor argument with its strides kept: xformers hands the kernel a bias
    sliced from 8-aligned storage, and a contiguous copy is one the kernel refuses. An
    expanded view (a stride of 0) cannot be copied into with its strides; nothing writes
    into one either, so it is kept as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if any(
        stride == 0 and size > 1 for size, stride in zip(value.size(), value.stride(), strict=True)
    ):
        return value.detach()
    copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)
    return copy.copy_(value.detach())


def capture_op_args(run: Callable[[], object], op_name: str) -> Captured | None:
    """The first call of the operator ``op_name`` (``aten._efficient_attention_backward``,
    any overload) made while ``run`` runs eagerly, or None when it made none."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    found: list[Captured] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            name = str(func)
            if not found and (name == op_name or name.startswith(op_name + ".")):
                found.append(
                    Captured(
                        op=func,
                        args=tuple(tree_map(_snapshot, list(args))),
                        kwargs=dict(tree_map(_snapshot, dict(kwargs or {}))),
                    )
                )
            return func(*args, **(kwargs or {}))

    with Recorder():
        run()
    return found[0] if found else None


def loose_cpu_args(args: tuple[Any, ...]) -> list[int]:
    """Positions of the CPU tensors with more than zero dimensions among ``args`` when
    another tensor argument is on another device: what fake device propagation rejects
    (a 0-dim CPU tensor is a scalar it allows) and an eager kernel may take."""
    tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if not any(t.device.type != "cpu" for _, t in tensors):
        return []
    return [i for i, t in tensors if t.device.type == "cpu" and t.dim() > 0 and t.numel() <= 1]


def scalarised(args: tuple[Any, ...], positions: list[int]) -> tuple[Any, ...]:
    """``args`` with the tensors at ``positions`` made 0-dim CPU int64 tensors (a one-value
    tensor keeps its value), as torch's SDPA passes ``philox_seed``/``philox_offset``."""
    out = list(args)
    for i in positions:
        t = args[i]
        value = int(t.reshape(()).item()) if t.numel() == 1 else 0
        out[i] = torch.tensor(value, dtype=torch.int64)
    return tuple(out)


def _arg_names(op: Any, positions: list[int]) -> list[str]:
    schema = getattr(op, "_schema", None)
    arguments = getattr(schema, "arguments", [])
    return [arguments[i].name if i < len(arguments) else f"argument {i}" for i in positions]


def _describe(t: torch.Tensor) -> str:
    shape = "x".join(str(n) for n in t.shape) or "scalar"
    return f"{t.dim()}-D {str(t.dtype).removeprefix('torch.')} {t.device.type} tensor ({shape})"


def run_fake(op: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """``op`` under ``FakeTensorMode`` with every tensor argument made fake (as the
    compiler traces it): ``pass`` or ``fail: <error>``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    mode = FakeTensorMode()

    def fake(value: Any) -> Any:
        return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value

    try:
        fake_args = tree_map(fake, list(args))
        fake_kwargs = tree_map(fake, dict(kwargs))
        with mode:
            op(*fake_args, **fake_kwargs)
    except Exception as e:  # the op's fake rule refusing is what is measured
        return f"fail: {describe_error(e, 300)}"
    return "pass"


def run_eager(op: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """``op`` run eagerly: ``pass``, ``fail: <error>``, or ``could not run here: …`` when
    its tensors are on a CUDA device this machine does not have."""
    devices = {a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    if "cuda" in devices and not torch.cuda.is_available():
        return "could not run here: the arguments are CUDA tensors and there is no CUDA device"
    try:
        op(*args, **kwargs)
        if "cuda" in devices:
            torch.cuda.synchronize()
    except Exception as e:  # the kernel refusing the inputs is what is measured
        return f"fail: {describe_error(e, 300)}"
    return "pass"


def isolate_glue(
    captured: Captured,
    *,
    eager: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], str] = run_eager,
) -> dict[str, Number]:
    """The glue isolation's runs on ``captured`` and what they decide (`decide_glue`)."""
    op, args, kwargs = captured.op, captured.args, captured.kwargs
    positions = loose_cpu_args(args)
    names = _arg_names(op, positions)
    numbers: dict[str, Number] = {"cf_glue_op": captured.name}
    if positions:
        numbers["cf_glue_args"] = ", ".join(
            f"{name}: {_describe(args[i])}" for name, i in zip(names, positions, strict=True)
        )
    numbers["cf_fake_xformers_args"] = run_fake(op, args, kwargs)
    if positions:
        numbers["cf_fake_scalar_philox"] = run_fake(op, scalarised(args, positions), kwargs)
    numbers["cf_eager"] = eager(op, args, kwargs)
    return numbers | decide_glue(numbers, names)


def decide_glue(runs: Mapping[str, Number], names: list[str]) -> dict[str, Number]:
    """Who is at fault from the glue isolation's ``runs`` (`isolate_glue`'s numbers):
    ``xformers`` only when fake fails on the device rule with xformers' arguments, passes
    with ``names`` made 0-dim, and eager passes; else ``undecided`` saying what ran."""
    op = str(runs.get("cf_glue_op", "the operator")).rsplit(".", 1)[0]
    fake = str(runs.get("cf_fake_xformers_args", ""))
    scalar = str(runs.get("cf_fake_scalar_philox", ""))
    eager = str(runs.get("cf_eager", ""))
    said = "; ".join(
        f"{key.removeprefix('cf_')}: {value}"[:120]
        for key, value in runs.items()
        if key in ("cf_fake_xformers_args", "cf_fake_scalar_philox", "cf_eager")
    )
    why: str | None = None
    if not names:
        why = "no CPU tensor of more than 0 dimensions beside another device's tensors"
    elif fake == "pass":
        why = "the op passes under FakeTensorMode with xformers' arguments"
    elif not _DEVICE_RULE.search(fake):
        why = "the op fails under FakeTensorMode, not on the device rule"
    elif scalar != "pass":
        why = f"the op fails under FakeTensorMode with {', '.join(names)} 0-dim too"
    elif eager != "pass":
        why = "the op in eager with xformers' arguments did not pass"
    if why is not None:
        return {
            "fault_component": "undecided",
            "fault_evidence": f"glue isolation decided nothing ({why}): {said}"[:400],
        }
    listed = " and ".join(names)
    evidence = (
        f"{op} under FakeTensorMode fails on the device rule with xformers' {listed}"
        f" (CPU tensors of more than 0 dimensions beside another device's) and passes with"
        f" them 0-dim; eager accepts xformers' arguments: xformers' glue preparing the op's"
        f" inputs triggers it (beside it, torch's fake device rule is stricter than its kernel)"
    )
    return _fault.decided("xformers", evidence) | {
        "upstream_fix": f"xformers: pass {listed} to {op} as 0-dim tensors, as torch's SDPA does"
    }


def decide_mask_outside(outside: str, inside_failure: str, bias_class: str) -> dict[str, Number]:
    """Who is at fault for a check whose ``bias_class`` is built inside compiled code,
    from ``outside`` (``pass`` / ``fail: …``: the same attention with the object built
    outside and passed in, compiled with ``fullgraph=True``, against float64)."""
    if outside == "pass":
        return _fault.decided(
            "xformers",
            f"its {bias_class} constructed inside compiled code is the trigger ({inside_failure}):"
            " the same attention with the object built outside and passed in compiles with"
            " fullgraph=True and is right",
        )
    return {
        "fault_component": "undecided",
        "fault_evidence": f"mask built outside, fullgraph=True: {outside}"[:400],
    }
