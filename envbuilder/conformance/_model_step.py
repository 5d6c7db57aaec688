"""What one step of the model check produced, in float64, and how far it lies from the
reference's, quantity by quantity (`envbuilder.conformance.checks_model`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

import torch

__all__ = ["Difference", "Named", "Step", "named_difference", "nonfinite", "step_differences"]


#: a training step's tensors per parameter name (None: no gradient reached it)
Named: TypeAlias = Mapping[str, "torch.Tensor | None"]


@dataclass(frozen=True, kw_only=True)
class Step:
    """What one forward (``output``) or training step (``gradients`` and ``updated``
    parameters too, by parameter name) produced, in float64."""

    output: torch.Tensor
    gradients: dict[str, torch.Tensor | None] | None = None
    updated: dict[str, torch.Tensor | None] | None = None

    def quantities(self) -> dict[str, torch.Tensor | Named]:
        """What the check compares: ``output``, ``gradients``, ``updated parameters``."""
        found: dict[str, torch.Tensor | Named] = {"output": self.output}
        if self.gradients is not None:
            found["gradients"] = self.gradients
        if self.updated is not None:
            found["updated parameters"] = self.updated
        return found


@dataclass(frozen=True, kw_only=True)
class Difference:
    """How far one quantity of a step lies from the reference's: the largest absolute
    difference (``worst``: the parameter it is in), or the problems that keep it from
    being compared (a parameter on one side only, shapes that differ)."""

    error: float
    worst: str | None = None
    problems: tuple[str, ...] = ()


def _shape(t: torch.Tensor) -> str:
    return "x".join(str(n) for n in t.shape) or "scalar"


def named_difference(got: Named, expected: Named, what: str) -> Difference:
    """``got`` against ``expected`` parameter by parameter: None and an exact-zero tensor
    are the same "no gradient" (a graph break leaves zeros where eager leaves None), a
    parameter on one side only or a shape mismatch is a problem naming the parameter,
    anything else is compared (None as zeros)."""
    problems = [
        f"{what}: parameter {name} is missing from {'the run' if name in expected else 'the reference'}"
        for name in sorted(set(got) ^ set(expected))
    ]
    error, worst = 0.0, None
    for name in sorted(set(got) & set(expected)):
        a, b = got[name], expected[name]
        if a is None and b is None:
            continue
        if a is not None and b is not None and a.shape != b.shape:
            problems.append(
                f"{what}: parameter {name} has shape {_shape(a)} in the run,"
                f" {_shape(b)} in the reference"
            )
            continue
        a = a if a is not None else torch.zeros_like(b)  # type: ignore[arg-type]
        b = b if b is not None else torch.zeros_like(a)
        diff = float((a.double() - b.double()).abs().max().item()) if a.numel() else 0.0
        if worst is None or not diff <= error:  # NaN counts as the worst
            error, worst = diff, name
    return Difference(error=error, worst=worst, problems=tuple(problems))


def step_differences(got: Step, expected: Step) -> dict[str, Difference]:
    """Each quantity of ``got`` against ``expected`` (`named_difference` for the named ones)."""
    found: dict[str, Difference] = {}
    theirs = expected.quantities()
    for what, value in got.quantities().items():
        reference = theirs.get(what)
        if reference is None:
            found[what] = Difference(error=math.nan, problems=(f"{what}: not in the reference",))
        elif isinstance(value, torch.Tensor) and isinstance(reference, torch.Tensor):
            if value.shape != reference.shape:
                problem = f"{what}: shape {_shape(value)} vs {_shape(reference)} in the reference"
                found[what] = Difference(error=math.nan, problems=(problem,))
            else:
                found[what] = Difference(error=float((value - reference).abs().max().item()))
        elif isinstance(value, Mapping) and isinstance(reference, Mapping):
            found[what] = named_difference(value, reference, what)
    return found


def nonfinite(value: torch.Tensor | Named) -> int:
    """The NaN/inf values in a quantity of a step."""
    tensors = [value] if isinstance(value, torch.Tensor) else list(value.values())
    return sum(int((~torch.isfinite(t)).sum().item()) for t in tensors if t is not None)
