"""Layers sent from the trees they were hashed from (envbuilder/docker/layers.py): the
same bytes as a written layer, and a tree changed after hashing is refused, not sent."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from envbuilder.docker.build import LayerGone, load_image
from envbuilder.docker.layers import (
    LayerChanged,
    LayerTree,
    archive_chunks,
    hash_layer,
    write_layer,
)

OWNERS = {"home/envbuilder": (10001, 10001)}


def tree(root: Path) -> Path:
    (root / "opt/venv/lib").mkdir(parents=True)
    (root / "home/envbuilder").mkdir(parents=True)
    (root / "opt/venv/lib/mod.py").write_text("x = 1\n")
    (root / "opt/venv/bin").mkdir()
    (root / "opt/venv/bin/python").symlink_to("/usr/bin/python3")
    return root


def config_of(diff_id: str) -> bytes:
    document = {"rootfs": {"type": "layers", "diff_ids": [diff_id]}, "config": {}}
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def test_hashing_a_tree_gives_the_layer_that_writing_it_gives(tmp_path: Path) -> None:
    root = tree(tmp_path / "t")
    written = io.BytesIO()
    assert hash_layer(root, owners=OWNERS) == write_layer(root, written, owners=OWNERS)
    sent = LayerTree(root=root, layer=hash_layer(root, owners=OWNERS), owners=OWNERS)
    assert b"".join(sent.chunks()) == written.getvalue()


def test_a_load_archive_from_a_tree_holds_the_layer_s_bytes(tmp_path: Path) -> None:
    root = tree(tmp_path / "t")
    written = io.BytesIO()
    layer = write_layer(root, written, owners=OWNERS)
    config = config_of(layer.diff_id)
    trees = {layer.diff_id: LayerTree(root=root, layer=layer, owners=OWNERS)}
    data = b"".join(archive_chunks(config, tag="envbuilder/x:abc", layer_trees=trees))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile("000/layer.tar")
        assert member is not None and member.read() == written.getvalue()
        manifest = archive.extractfile("manifest.json")
        assert manifest is not None
        assert json.loads(manifest.read())[0]["Layers"] == ["000/layer.tar"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda root: (root / "opt/venv/lib/mod.py").write_text("x = 2\n"), id="same-size"
        ),
        pytest.param(
            lambda root: (root / "opt/venv/lib/zz.pth").write_text("import os\n"), id="added"
        ),
        pytest.param(lambda root: (root / "opt/venv/lib/mod.py").unlink(), id="removed"),
    ],
)
def test_a_tree_changed_after_hashing_is_refused(tmp_path: Path, change: object) -> None:
    root = tree(tmp_path / "t")
    layer = hash_layer(root, owners=OWNERS)
    change(root)  # type: ignore[operator]
    with pytest.raises(LayerChanged, match="no longer makes the layer"):
        b"".join(LayerTree(root=root, layer=layer, owners=OWNERS).chunks())


class _Api:
    def load_image(self, data: object, **kwargs: object) -> object:
        for _ in data:  # type: ignore[attr-defined]
            pass
        return iter([{"stream": "Loaded image"}])


class _Client:
    api = _Api()


def test_a_changed_tree_is_a_build_that_makes_every_layer_again(tmp_path: Path) -> None:
    root = tree(tmp_path / "t")
    layer = hash_layer(root, owners=OWNERS)
    (root / "opt/venv/lib/mod.py").write_text("x = 3\n")
    trees = {layer.diff_id: LayerTree(root=root, layer=layer, owners=OWNERS)}
    chunks = archive_chunks(config_of(layer.diff_id), tag="envbuilder/x:abc", layer_trees=trees)
    with pytest.raises(LayerGone, match="changed after it was hashed"):
        load_image(_Client(), chunks)  # type: ignore[arg-type]
