"""``torch.library.opcheck`` on every xformers operator that attention actually calls (an
info check of the compile group, `envbuilder.conformance.checks_compile`): an operator
whose fake (meta) implementation, schema or autograd registration is wrong fails under
``torch.compile`` wherever it is used."""

from __future__ import annotations

from typing import Any

import torch

from envbuilder.conformance._attn import attention_fn
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import Number, Outcome, describe_error

__all__ = ["opcheck_xformers"]


def opcheck_xformers(ctx: Context) -> Outcome:
    """``torch.library.opcheck`` on every xformers operator that attention actually calls."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    seen: dict[Any, tuple[Any, Any]] = {}

    def snapshot(value: Any) -> Any:
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            namespace = getattr(func, "namespace", "")
            if (
                namespace.startswith("xformers") or namespace == "flash_attn_3"
            ) and func not in seen:
                seen[func] = (tree_map(snapshot, args), tree_map(snapshot, kwargs or {}))
            return func(*args, **(kwargs or {}))

    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    for mask in ("none", "causal"):
        q, k, v = (
            torch.randn(2, 64, 4, 64, device=ctx.device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        try:
            with Recorder():
                attention_fn("xformers", mask)(q, k, v, None).sum().backward()
        except NotImplementedError as e:
            return Outcome.failed(f"attention itself fails: {describe_error(e, 1200)}", {})
    if not seen:
        return Outcome.passed(
            {"ops": "", "note": "attention called no xformers-registered operator"}
        )
    numbers: dict[str, Number] = {"ops": " ".join(sorted(str(f) for f in seen))}
    problems: list[str] = []
    for func, (args, kwargs) in seen.items():
        try:
            torch.library.opcheck(func, args, kwargs)
            numbers[str(func)] = "ok"
        except Exception as e:  # opcheck raises OpCheckError naming the failing test
            numbers[str(func)] = describe_error(e, 1200)
            problems.append(f"{func}: {describe_error(e, 300)}")
    return Outcome.judge(problems, numbers)
