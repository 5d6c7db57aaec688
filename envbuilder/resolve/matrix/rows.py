"""``[[pairs]]`` and ``[[combinations]]`` into rows: each key checked, defaults filled in,
the source-build keys, and the platform in the ids of a matrix for several platforms."""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbuilder.gpus import GPU_COMPUTE_CAPABILITY, CudaArch, arch_of, gpu_capability
from envbuilder.model import Combination, IndexSpec, XformersSource
from envbuilder.resolve.matrix.fields import (
    _COMBINATION_KEYS,
    _PAIR_KEYS,
    _SOURCE_POLICIES,
    _Fields,
    _kind,
)
from envbuilder.resolve.matrix.records import (
    MatrixDefaults,
    Runners,
    _Row,
    _RowKeys,
    combination_id,
)
from envbuilder.target import (
    CudaBuild,
)

__all__: list[str] = []  # read through the package


@dataclass
class _RowBuilder:
    """Turns ``[[pairs]]`` and ``[[combinations]]`` tables into rows, checking each key."""

    loader: _Fields
    defaults: MatrixDefaults | None
    indexes: Mapping[str, IndexSpec]
    runners: Runners

    def pair(self, table: Mapping[str, Any], where: str, axis: list[str] | None) -> list[_Row]:
        ld = self.loader
        ld.keys(table, _PAIR_KEYS, where)
        pythons = axis or []
        subset = pythons
        if "python" in table:
            values = ld.located_strings(table["python"], f"{where}.python") or []
            subset = []
            for at, v in values:
                p = ld.python(v, at)
                if p is None:
                    continue
                if p not in pythons:
                    ld.problem(
                        at,
                        f"{p!r} is not in axes.python {pythons!r}; add it there or drop it here",
                    )
                subset.append(p)
        elif axis is None:
            ld.problem(where, "no Python to expand over; set axes.python or python in this pair")
        cudas: list[CudaBuild] = []
        for at, v in ld.located_strings(table.get("cuda", "default"), f"{where}.cuda") or []:
            c = ld.cuda(v, at)
            if c is not None:
                cudas.append(c)
        common = self.common(table, where)
        if common is None:
            return []
        return [
            self.row(
                common, python=p, cuda=c, origin=f"{where} (python {p}, cuda {c})", where=where
            )
            for c, p in itertools.product(cudas, subset)
        ]

    def explicit(self, table: Mapping[str, Any], where: str) -> list[_Row]:
        ld = self.loader
        ld.keys(table, _COMBINATION_KEYS, where)
        python = None
        if "python" not in table:
            ld.problem(where, "missing key 'python'")
        elif (s := ld.string(table["python"], f"{where}.python")) is not None:
            python = ld.python(s, f"{where}.python")
        cuda = None
        if (s := ld.string(table.get("cuda", "default"), f"{where}.cuda")) is not None:
            cuda = ld.cuda(s, f"{where}.cuda")
        common = self.common(table, where)
        if common is None or python is None or cuda is None:
            return []
        return [self.row(common, python=python, cuda=cuda, origin=where, where=where)]

    def common(self, table: Mapping[str, Any], where: str) -> _RowKeys | None:
        """The keys a pair and an explicit row share; None when any is invalid."""
        ld = self.loader
        before = len(ld.problems)
        d = self.defaults or MatrixDefaults()
        torch: str | None = None
        if "torch" not in table:
            ld.problem(where, "missing key 'torch'")
        elif (s := ld.string(table["torch"], f"{where}.torch")) is not None:
            torch = ld.version(s, f"{where}.torch")
        xformers = None
        if "xformers" in table and (s := ld.string(table["xformers"], f"{where}.xformers")):
            xformers = ld.version(s, f"{where}.xformers")
        add_cuda_runtime = d.add_cuda_runtime
        if "add-cuda-runtime" in table:
            b = ld.boolean(table["add-cuda-runtime"], f"{where}.add-cuda-runtime")
            add_cuda_runtime = d.add_cuda_runtime if b is None else b
        platform: str | None = d.platform
        if "platform" in table and (s := ld.string(table["platform"], f"{where}.platform")):
            platform = ld.platform(s, f"{where}.platform")
        base_image: str | None = d.base_image
        if "base-image" in table and (s := ld.string(table["base-image"], f"{where}.base-image")):
            base_image = ld.template(s, f"{where}.base-image")
        note = ""
        if "note" in table and (s := ld.string(table["note"], f"{where}.note")) is not None:
            note = s
        xformers_source: XformersSource = "never"
        if "xformers-source" in table:
            xformers_source = self.source_policy(table["xformers-source"], where)
        cuda_archs = None
        if "cuda-archs" in table:
            cuda_archs = self.cuda_archs(table["cuda-archs"], f"{where}.cuda-archs")
        index = d.index
        if "index" in table and (s := ld.string(table["index"], f"{where}.index")) is not None:
            index = s
        # an unknown defaults.index is reported once, by the loader
        known = (
            index in self.indexes
            if "index" not in table
            else self.known_index(index, f"{where}.index")
        )
        chosen = {"torch": "default", "xformers": "default"}
        if known:
            chosen = {p: self.serving(index, p) for p in chosen}
        for project in ("torch", "xformers"):
            key = f"{project}-index"
            s = ld.string(table[key], f"{where}.{key}") if key in table else None
            if s is not None and self.known_index(s, f"{where}.{key}"):
                chosen[project] = s
                spec = self.indexes[s]
                if spec.projects and project not in spec.projects:
                    ld.problem(
                        f"{where}.{key}",
                        f"index {s!r} serves only {', '.join(spec.projects)}, not {project!r}",
                    )
        if len(ld.problems) > before or torch is None or platform is None or base_image is None:
            return None
        return _RowKeys(
            torch=torch,
            xformers=xformers,
            add_cuda_runtime=add_cuda_runtime,
            platform=platform,
            base_image=base_image,
            note=note,
            xformers_source=xformers_source,
            cuda_archs=cuda_archs,
            torch_index=chosen["torch"],
            xformers_index=chosen["xformers"],
        )

    def source_policy(self, value: Any, where: str) -> XformersSource:
        """``xformers-source``: true (always), false (never) or a policy by name."""
        at = f"{where}.xformers-source"
        if isinstance(value, bool):
            return "always" if value else "never"
        if isinstance(value, str) and value in _SOURCE_POLICIES:
            return value
        hint = difflib.get_close_matches(str(value), _SOURCE_POLICIES, n=1, cutoff=0.6)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        self.loader.problem(
            at,
            f"expected true, false or one of {', '.join(map(repr, _SOURCE_POLICIES))}, "
            f"got {_kind(value)} {value!r}{suggestion}",
        )
        return "never"

    def cuda_archs(self, value: Any, where: str) -> tuple[str, ...] | None:
        """``cuda-archs``: compute capabilities ("9.0", "10.0+PTX") or GPU names ("H200")."""
        located = self.loader.located_strings(value, where)
        if located is None:
            return None
        archs: set[CudaArch] = set()
        bad = False
        for at, text in located:
            arch = arch_of(text)
            if arch is None:
                known = ", ".join(sorted(GPU_COMPUTE_CAPABILITY))
                self.loader.problem(
                    at,
                    f"invalid CUDA architecture {text!r}; write a compute capability as "
                    f"TORCH_CUDA_ARCH_LIST does ('9.0', '8.6+PTX', '10.0a') or a GPU ({known})",
                )
                bad = True
            else:
                archs.add(arch)
        return None if bad else tuple(map(str, sorted(archs)))

    def source_build(self, common: _RowKeys, cuda: CudaBuild, where: str) -> tuple[str, ...]:
        """Check a row's source-build keys; its architectures (from the matrix's GPUs
        when the row names none)."""
        ld = self.loader
        policy = common.xformers_source
        archs = common.cuda_archs
        if policy == "never":
            if archs is not None:
                ld.problem(
                    f"{where}.cuda-archs",
                    "is only used by a source build; set xformers-source too, or remove it",
                )
            return ()
        if common.xformers is None:
            ld.problem(
                f"{where}.xformers-source",
                "the row has no xformers to build; set xformers or remove xformers-source",
            )
        if common.add_cuda_runtime:
            ld.problem(
                f"{where}.xformers-source",
                "with add-cuda-runtime = true: a source build is made for torch's own CUDA and "
                "needs no other runtime; choose one of the two",
            )
        if cuda == "cpu":
            ld.problem(
                f"{where}.xformers-source",
                "with cuda = 'cpu': xformers is built from source for a CUDA torch; "
                "set a CUDA (e.g. 'cu130') or remove xformers-source",
            )
        if archs is not None:
            return archs
        found = self.gpu_archs(cuda)
        if not found:
            ld.problem(
                f"{where}.cuda-archs",
                "a source build needs the CUDA architectures to compile for, and the matrix "
                "names no GPU ([runners.gpus] or a runner label such as 'h100'); "
                "set cuda-archs, e.g. ['9.0']",
            )
        return found

    def gpu_archs(self, cuda: CudaBuild) -> tuple[str, ...]:
        """The compute capabilities of the GPUs the matrix's runners name for ``cuda``."""
        names = [*self.runners.gpus, *self.runners.labels_for(cuda)]
        for labels in self.runners.gpus.values():
            names += labels
        archs = {arch for name in names if (arch := arch_of(gpu_capability(name) or ""))}
        return tuple(map(str, sorted(archs)))

    def known_index(self, name: str, where: str) -> bool:
        if name in self.indexes:
            return True
        names = sorted(self.indexes)
        hint = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        suggestion = f"did you mean {hint[0]!r}?" if hint else f"declared: {', '.join(names)}"
        self.loader.problem(where, f"unknown index {name!r}; {suggestion}")
        return False

    def serving(self, name: str, project: str) -> str:
        """``index = X`` means X for each project X serves, the default index for the rest."""
        spec = self.indexes[name]
        return name if not spec.projects or project in spec.projects else "default"

    def row(
        self, common: _RowKeys, *, python: str, cuda: CudaBuild, origin: str, where: str
    ) -> _Row:
        if cuda == "cpu" and common.add_cuda_runtime:
            self.loader.problem(
                where,
                "cuda = 'cpu' with add-cuda-runtime = true: a CPU build has no CUDA runtime to add",
            )
        archs = self.source_build(common, cuda, where)
        cid = combination_id(
            python=python,
            cuda=cuda,
            torch=common.torch,
            xformers=common.xformers,
            add_cuda_runtime=common.add_cuda_runtime,
        )
        fields = {
            "python": python,
            "cuda": cuda,
            "torch": common.torch,
            "xformers": common.xformers or "",
        }
        combination = Combination(
            id=cid,
            python=python,
            cuda=cuda,
            torch=common.torch,
            xformers=common.xformers,
            platform=common.platform,
            torch_index=common.torch_index,
            xformers_index=common.xformers_index,
            add_cuda_runtime=common.add_cuda_runtime,
            base_image=common.base_image.format_map(fields),
            runner=self.runners.labels_for(cuda),
            note=common.note,
            xformers_source=common.xformers_source,
            cuda_archs=archs,
        )
        return _Row(origin=origin, combination=combination)


def _platform_in_ids(rows: list[_Row]) -> list[_Row]:
    """*rows*, with the platform in every id when they are for more than one platform: the
    versions alone cannot tell an x86_64 row from an aarch64 one."""
    if len({r.combination.platform for r in rows}) < 2:
        return rows
    return [
        _Row(
            origin=r.origin,
            combination=replace(
                r.combination,
                id=combination_id(
                    python=r.combination.python,
                    cuda=r.combination.cuda,
                    torch=r.combination.torch,
                    xformers=r.combination.xformers,
                    add_cuda_runtime=r.combination.add_cuda_runtime,
                    platform=r.combination.platform,
                ),
            ),
        )
        for r in rows
    ]
