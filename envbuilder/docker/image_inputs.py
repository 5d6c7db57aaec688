"""What one image is made from and what its layers say: the build's inputs (`Inputs`),
the layers envbuilder adds (`LAYERS`), the record of each layer made (`LayerRecord`,
hashed from its tree by `hash_tree`), and the labels and config they give the image.

``build.py`` makes the layers; this module names them and writes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envbuilder.docker.base import COMPILER_PACKAGES, _compiler_facts
from envbuilder.docker.identity import (
    LABEL_PREFIX,
    SUITE_GROUP,
    base_labels,
    image_labels,
    image_settings,
    layer_key,
    source_revision,
)
from envbuilder.docker.layers import (
    BaseImage,
    Layer,
    LayerTree,
    chain_ids,
    hash_layer,
    image_config,
    image_env,
)
from envbuilder.docker.manifest import (
    COMPILER_RECORD_DIR,
    VENV,
    Manifest,
    manifest_entries,
    manifest_of,
)
from envbuilder.docker.plan import GROUPS, LayerPlan, LockedWheel, install_requirements
from envbuilder.model import ResolvedCombination

__all__ = [
    "BYTECODE",
    "LAYERS",
    "OWNERS",
    "Inputs",
    "LayerRecord",
    "group_of_layer",
    "hash_tree",
    "image_config_of",
    "labels_of",
    "layer_keys",
    "trees_to_send",
]


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What one image is made from."""

    resolved: ResolvedCombination
    plan: LayerPlan
    suite: tuple[LockedWheel, ...]  # the suite lock's wheels that the lock does not hold
    suite_sha256: str  # "" without a suite lock
    base: BaseImage
    lock_sha256: str
    recipe: str
    inputs: str
    library_path: str
    revision: str | None = None  # `Settings.revision`; None: ask git

    def wheels_of(self, layer: str) -> tuple[LockedWheel, ...]:
        """The wheels a layer installs (none for ``compiler`` and ``venv``)."""
        if layer == SUITE_GROUP:
            return self.suite
        if layer in GROUPS:
            return self.plan.groups[layer]
        return ()

    def requirements(self, layer: str) -> str:
        """What a layer is made from, as its layer key takes it (a bytecode layer: its
        group's wheels)."""
        if layer == "compiler":
            return " ".join(COMPILER_PACKAGES)
        if layer == "venv":
            return ""
        return install_requirements(self.wheels_of(group_of_layer(layer)))


#: The suffix of the layer that holds a group's bytecode, right above the group's own.
BYTECODE = "-bytecode"

#: Every layer envbuilder adds, bottom to top: the compiler (shared by every image of a
#: base), the venv and user, the plan's groups, the suite's dependencies; above each
#: group, its bytecode (so that the group's layer is final, and can be sent to the
#: daemon, while its bytecode is still compiled).
LAYERS: tuple[str, ...] = (
    "compiler",
    "venv",
    *(name for group in (*GROUPS, SUITE_GROUP) for name in (group, group + BYTECODE)),
)


def group_of_layer(name: str) -> str:
    """The group whose wheels a layer comes from: itself, or the group a bytecode layer
    compiles (``torch-bytecode``: ``torch``)."""
    return name.removesuffix(BYTECODE)


#: Owners other than root:root in envbuilder's layers.
OWNERS = {"home/envbuilder": (10001, 10001)}


@dataclass(frozen=True, kw_only=True)
class LayerRecord:
    """A layer this process made: its diff id (hashed from the bytes it wrote), size and the
    manifest entries of its files."""

    layer: Layer
    entries: tuple[tuple[str, str, str], ...]
    #: what the layer says about itself (the compiler layer: cc, c++ and its packages)
    facts: Mapping[str, str] = field(default_factory=dict)
    #: the tree it was hashed from, while this process keeps it (sent again from there
    #: where the daemon needs the layer on another parent); checked again while sent
    tree: Path | None = None


def layer_keys(inputs: Inputs) -> dict[str, str]:
    """Each layer's `layer_key`: what a layer this process made is found again by."""
    return {
        name: layer_key(
            name, inputs.requirements(name), base_id=inputs.base.id, recipe=inputs.recipe
        )
        for name in LAYERS
    }


def labels_of(inputs: Inputs, records: Mapping[str, LayerRecord] | None) -> dict[str, str]:
    """The image's labels; without ``records``, those that the built layers do not decide
    (the manifest's and the compiler's are left out): what `inputs_digest` takes."""
    manifest = Manifest(sha256="", files=0)
    if records is not None:
        manifest = manifest_of(records[name].entries for name in LAYERS)
    labels = image_labels(
        inputs.resolved,
        lock_sha256=inputs.lock_sha256,
        manifest=manifest,
        base_image=inputs.base.ref,
        plan=inputs.plan,
        revision=source_revision(inputs.revision),
        recipe=inputs.recipe,
        compiler=records["compiler"].facts if records is not None else None,
        suite=inputs.suite,
        suite_sha256=inputs.suite_sha256,
    ) | base_labels(inputs.base)
    if records is None:
        return {k: v for k, v in labels.items() if not k.startswith(f"{LABEL_PREFIX}.manifest.")}
    return labels | {f"{LABEL_PREFIX}.inputs.sha256": inputs.inputs}


def image_config_of(inputs: Inputs, records: Mapping[str, LayerRecord]) -> bytes:
    """The image config of ``inputs`` over these layers: what the build loads, byte for byte."""
    base = inputs.base
    settings = image_settings(labels_of(inputs, records))
    return image_config(
        base,
        [(_describe(name, inputs), records[name].layer) for name in LAYERS],
        env=image_env(base.config.get("Env") or [], venv=VENV, library_path=inputs.library_path),
        labels=settings["labels"],
        user=settings["user"],
        workdir=settings["workdir"],
        cmd=settings["cmd"],
    )


def hash_tree(name: str, stage: Path) -> LayerRecord:
    """The record of the layer the tree ``stage`` makes (its bytes hashed, nothing written)."""
    return LayerRecord(
        layer=hash_layer(stage, owners=OWNERS),
        entries=tuple(manifest_entries(stage / VENV.lstrip("/")))
        + tuple(manifest_entries(stage / COMPILER_RECORD_DIR.lstrip("/"), prefix=COMPILER_RECORD_DIR)),
        facts=_compiler_facts(stage) if name == "compiler" else {},
        tree=stage,
    )  # fmt: skip


def trees_to_send(
    diff_ids: Sequence[str], records: Iterable[LayerRecord], present: Collection[str]
) -> dict[str, LayerTree]:
    """The layers of an image (``diff_ids``, bottom first) that the daemon lacks (``present``
    holds the chain ids it has), by diff id, each to be made again from its record's tree;
    a layer whose record keeps no tree is left out (the daemon must hold it)."""
    trees = {
        r.layer.diff_id: LayerTree(root=r.tree, layer=r.layer, owners=OWNERS)
        for r in records
        if r.tree is not None
    }
    return {
        diff_id: trees[diff_id]
        for diff_id, chain in zip(diff_ids, chain_ids(diff_ids), strict=True)
        if chain not in present and diff_id in trees
    }


def _describe(name: str, inputs: Inputs) -> str:
    if name == "compiler":
        return f"envbuilder: compiler, Debian packages {' '.join(COMPILER_PACKAGES)}"
    if name == "venv":
        return f"envbuilder: empty venv {VENV} and user envbuilder (10001)"
    if name.endswith(BYTECODE):
        return f"envbuilder: bytecode of the {group_of_layer(name)} layer"
    return f"envbuilder: {name} layer, {len(inputs.wheels_of(name))} wheel(s)"
