"""The check groups: one ``GroupSpec`` each, the one table the runner, the worker and the
fork server read.

Adding a group is a module with ``specs(ctx) -> list[CheckSpec]`` and one ``GroupSpec``
here (or :func:`register` at run time, for a group that lives outside the suite):

- ``module``: the module whose ``specs`` plans the group's checks;
- ``timeout_s`` / ``quick_timeout_s``: the time limit of one process of the group;
- ``imports``: the slow modules that ``module`` imports (dynamo, diffusers), which the
  fork server preloads before it so that the group's processes are forked with them;
- ``shard_unit_parts``: checks whose names agree in that many dotted parts share state
  (one compilation, one model) and stay in one process; None: the group is never split;
- ``runs_alone``: its checks time kernels, so it runs with no other group beside it;
- ``full_only``: a ``--quick`` run does not start it.

Stdlib only: the runner reads this without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "GroupSpec",
    "builtin_groups",
    "group",
    "group_names",
    "groups",
    "preload_order",
    "register",
    "registered",
    "unregister",
]


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """How the suite runs one check group."""

    name: str
    module: str
    timeout_s: float
    quick_timeout_s: float
    imports: tuple[str, ...] = ()
    shard_unit_parts: int | None = None
    runs_alone: bool = False
    full_only: bool = False

    def __post_init__(self) -> None:
        if not self.name or "." in self.name or not self.name.isidentifier():
            raise ValueError(f"group name {self.name!r}: give one identifier (no dots)")
        if self.shard_unit_parts is not None and self.shard_unit_parts < 1:
            raise ValueError(f"group {self.name!r}: shard_unit_parts must be 1 or more")
        if self.timeout_s <= 0 or self.quick_timeout_s <= 0:
            raise ValueError(f"group {self.name!r}: time limits must be positive")

    def timeout(self, *, quick: bool) -> float:
        return self.quick_timeout_s if quick else self.timeout_s

    @property
    def preload_after(self) -> str:
        """The fork server's preload module a process of this group waits for."""
        return self.module


_COMPILER = ("torch._dynamo", "torch._inductor.compile_fx")
_DIFFUSERS = ("diffusers.models.transformers.transformer_qwenimage",)
_PACKAGE = "envbuilder.conformance"

#: the suite's groups, in the order their results are listed (and run, one at a time).
_BUILTIN: tuple[GroupSpec, ...] = (
    GroupSpec(
        name="environment",
        module=f"{_PACKAGE}.checks_environment",
        timeout_s=180,
        quick_timeout_s=120,
    ),
    GroupSpec(
        name="attention",
        module=f"{_PACKAGE}.checks_attention",
        timeout_s=300,
        quick_timeout_s=120,
        shard_unit_parts=3,  # attention.<impl>.<mask>: one mask kind's cases
    ),
    GroupSpec(
        name="compile",
        module=f"{_PACKAGE}.checks_compile",
        timeout_s=600,
        quick_timeout_s=300,
        imports=_COMPILER,
        # compile.<impl>.<mask>.<static|dynamic>.<fullgraph|nobreaks>: one compiled function
        shard_unit_parts=5,
    ),
    GroupSpec(
        name="performance",
        module=f"{_PACKAGE}.checks_performance",
        timeout_s=300,
        quick_timeout_s=120,
        runs_alone=True,
    ),
    GroupSpec(
        name="model",
        module=f"{_PACKAGE}.checks_model",
        timeout_s=300,
        quick_timeout_s=180,
        imports=_DIFFUSERS,
        # model.diffusers.qwenimage.<impl>.<inference|training>.<eager|compiled>: one use,
        # its workaround checks with it (each check builds its own model)
        shard_unit_parts=6,
    ),
    GroupSpec(
        name="masks",
        module=f"{_PACKAGE}.checks_masks",
        timeout_s=180,
        quick_timeout_s=120,
        imports=_DIFFUSERS,
    ),
    GroupSpec(
        name="multigpu",
        module=f"{_PACKAGE}.checks_multigpu",
        timeout_s=300,
        quick_timeout_s=180,
    ),
)

_registry: dict[str, GroupSpec] = {g.name: g for g in _BUILTIN}


def builtin_groups() -> tuple[GroupSpec, ...]:
    """The suite's own groups."""
    return _BUILTIN


def groups() -> tuple[GroupSpec, ...]:
    """Every registered group, in order (the suite's, then those registered later)."""
    return tuple(_registry.values())


def group_names() -> tuple[str, ...]:
    return tuple(_registry)


def group(name: str) -> GroupSpec:
    """The group called ``name``; KeyError naming the groups there are."""
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"no check group {name!r}; the groups are {', '.join(_registry)}") from None


def register(spec: GroupSpec) -> GroupSpec:
    """Add a group after the others; ValueError when the name is taken."""
    if spec.name in _registry:
        raise ValueError(f"a check group {spec.name!r} is already registered")
    _registry[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a group registered with :func:`register`; the suite's own stay."""
    if any(g.name == name for g in _BUILTIN):
        raise ValueError(f"{name!r} is one of the suite's own groups")
    _registry.pop(name, None)


@contextmanager
def registered(spec: GroupSpec) -> Iterator[GroupSpec]:
    """The group registered for the duration of a ``with`` block."""
    register(spec)
    try:
        yield spec
    finally:
        unregister(spec.name)


def preload_order(specs: tuple[GroupSpec, ...] | None = None) -> tuple[str, ...]:
    """The fork server's preload list: torch; the modules of the groups that need nothing
    more; then, group by group, the slow imports of a group followed by its module. A
    group's processes wait only for what comes up to its module."""
    chosen = builtin_groups() if specs is None else specs
    order: list[str] = ["torch"]
    light = [g for g in chosen if not g.imports]
    heavy = [g for g in chosen if g.imports]
    for spec in light + heavy:
        for name in (*spec.imports, spec.module):
            if name not in order:
                order.append(name)
    return tuple(order)
