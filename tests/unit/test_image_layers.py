"""Reproducible layers, image configs and load archives (envbuilder/docker/layers.py),
and the pure parts of a build: inputs, errors, manifests (no Docker here)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.build import (
    BuildFailed,
    LayerGone,
    base_labels,
    build_error,
    inputs_digest,
    load_image,
    manifest_of,
)
from envbuilder.docker.layers import (
    BaseImage,
    Layer,
    archive_chunks,
    chain_ids,
    image_config,
    image_env,
    image_id,
    write_layer,
)

D1, D2, D3 = (f"sha256:{c * 64}" for c in "123")


def tree(root: Path, *, mtime: int) -> Path:
    (root / "opt/venv/bin").mkdir(parents=True)
    (root / "opt/venv/lib").mkdir(parents=True)
    (root / "home/envbuilder").mkdir(parents=True)
    (root / "opt/venv/lib/mod.py").write_text("x = 1\n")
    tool = root / "opt/venv/bin/tool"
    tool.write_text("#!/opt/venv/bin/python\n")
    tool.chmod(0o755)
    (root / "opt/venv/bin/python").symlink_to("/usr/bin/python3")
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(Path(dirpath, name), (mtime, mtime), follow_symlinks=False)
    return root


def test_a_layer_depends_on_the_files_only(tmp_path: Path) -> None:
    a, b = io.BytesIO(), io.BytesIO()
    layer_a = write_layer(tree(tmp_path / "a", mtime=1_000_000), a, owners={"home/envbuilder": (10001, 10001)})  # fmt: skip
    layer_b = write_layer(tree(tmp_path / "b", mtime=2_000_000), b, owners={"home/envbuilder": (10001, 10001)})  # fmt: skip
    assert a.getvalue() == b.getvalue()
    assert (
        layer_a
        == layer_b
        == Layer(
            diff_id=f"sha256:{hashlib.sha256(a.getvalue()).hexdigest()}", size=len(a.getvalue())
        )
    )
    with tarfile.open(fileobj=io.BytesIO(a.getvalue())) as archive:
        members = archive.getmembers()
    assert [m.name for m in members] == [
        "home", "home/envbuilder", "opt", "opt/venv", "opt/venv/bin", "opt/venv/bin/python",
        "opt/venv/bin/tool", "opt/venv/lib", "opt/venv/lib/mod.py",
    ]  # fmt: skip
    by_name = {m.name: m for m in members}
    assert {m.mtime for m in members} == {0}
    assert {(m.uid, m.gid) for m in members if m.name != "home/envbuilder"} == {(0, 0)}
    assert (by_name["home/envbuilder"].uid, by_name["home/envbuilder"].gid) == (10001, 10001)
    assert by_name["opt/venv/bin/tool"].mode == 0o755
    assert by_name["opt/venv/bin/python"].issym()
    assert by_name["opt/venv/bin/python"].linkname == "/usr/bin/python3"


def test_a_changed_file_changes_the_layer(tmp_path: Path) -> None:
    first = write_layer(tree(tmp_path / "a", mtime=0), io.BytesIO())
    (tmp_path / "a/opt/venv/lib/mod.py").write_text("x = 2\n")
    assert write_layer(tmp_path / "a", io.BytesIO()).diff_id != first.diff_id


def test_chain_ids_name_each_stack_of_layers() -> None:
    second = "sha256:" + hashlib.sha256(f"{D1} {D2}".encode()).hexdigest()
    third = "sha256:" + hashlib.sha256(f"{second} {D3}".encode()).hexdigest()
    assert chain_ids([D1, D2, D3]) == (D1, second, third)
    assert chain_ids([]) == ()


@pytest.mark.parametrize(
    ("base_env", "library_path", "expected_path", "expected_libraries"),
    [
        ([], "", "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", None),
        (["PATH=/usr/local/cuda/bin:/usr/bin", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"], "",
         "/opt/venv/bin:/usr/local/cuda/bin:/usr/bin", "/usr/local/nvidia/lib64"),
        (["PATH=/usr/bin", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"], "/opt/venv/x/lib",
         "/opt/venv/bin:/usr/bin", "/usr/local/nvidia/lib64:/opt/venv/x/lib"),
        (["PATH=/usr/bin"], "/opt/venv/x/lib", "/opt/venv/bin:/usr/bin", "/opt/venv/x/lib"),
    ],
)  # fmt: skip
def test_the_image_keeps_the_base_paths(
    base_env: list[str], library_path: str, expected_path: str, expected_libraries: str | None
) -> None:
    env = dict(e.split("=", 1) for e in image_env([*base_env, "LANG=C.UTF-8"], venv="/opt/venv", library_path=library_path))  # fmt: skip
    assert env["PATH"] == expected_path
    assert env.get("LD_LIBRARY_PATH") == expected_libraries
    assert env["LANG"] == "C.UTF-8"
    assert env["VIRTUAL_ENV"] == "/opt/venv"


def base_image(history: list[dict[str, Any]] | None = None) -> BaseImage:
    attrs = {
        "Id": "sha256:" + "b" * 64,
        "RootFS": {"Layers": [D1]},
        "Config": {"Env": ["PATH=/usr/bin"], "Labels": {"base": "yes"}, "Entrypoint": None},
        "Created": "2026-01-02T03:04:05Z",
        "Os": "linux",
        "Architecture": "amd64",
    }
    default = [
        {"CreatedBy": "/bin/sh -c #(nop) CMD", "Size": 0},
        {"CreatedBy": "debootstrap", "Size": 100},
    ]
    return BaseImage.from_inspect("base:1", attrs, default if history is None else history)


def test_the_config_is_fixed_by_its_inputs() -> None:
    layers = [("venv", Layer(diff_id=D2, size=10)), ("torch", Layer(diff_id=D3, size=20))]
    kwargs: dict[str, Any] = dict(
        env=["PATH=/opt/venv/bin:/usr/bin"], labels={"a": "1"}, user="10001:10001",
        workdir="/home/envbuilder", cmd=["python"],
    )  # fmt: skip
    config = image_config(base_image(), layers, **kwargs)
    assert config == image_config(base_image(), layers, **kwargs)
    document = json.loads(config)
    assert document["created"] == "2026-01-02T03:04:05Z"
    assert document["rootfs"] == {"type": "layers", "diff_ids": [D1, D2, D3]}
    assert document["config"]["Labels"] == {"base": "yes", "a": "1"}
    assert "Entrypoint" not in document["config"]
    assert [h.get("empty_layer", False) for h in document["history"]] == [False, True, False, False]
    assert {h["created"] for h in document["history"]} == {"2026-01-02T03:04:05Z"}
    assert image_id(config) == "sha256:" + hashlib.sha256(config).hexdigest()
    other = image_config(base_image(), layers[:1], **kwargs)
    assert image_id(other) != image_id(config)


def test_a_base_history_that_does_not_match_its_layers_is_replaced() -> None:
    base = base_image([{"CreatedBy": "a", "Size": 5}, {"CreatedBy": "b", "Size": 7}])
    assert base.history == ({"created_by": "layer 1 of the base image base:1"},)


def test_the_archive_carries_only_the_layers_given(tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    layer.write_bytes(b"layer bytes")
    config = image_config(
        base_image(), [("venv", Layer(diff_id=D2, size=11))],
        env=[], labels={}, user="10001:10001", workdir="/", cmd=["python"],
    )  # fmt: skip
    data = b"".join(archive_chunks(config, tag="envbuilder/x:abc", layer_files={D2: layer}))
    config_name = image_id(config).removeprefix("sha256:") + ".json"
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert archive.getnames() == ["001/layer.tar", config_name, "manifest.json"]
        read = {name: archive.extractfile(name).read() for name in archive.getnames()}  # type: ignore[union-attr]
    assert json.loads(read["manifest.json"]) == [
        {"Config": config_name, "RepoTags": ["envbuilder/x:abc"], "Layers": ["000/layer.tar", "001/layer.tar"]}
    ]  # fmt: skip
    assert read[config_name] == config
    assert read["001/layer.tar"] == b"layer bytes"


SETTINGS: dict[str, Any] = {"user": "10001:10001", "workdir": "/home/envbuilder", "cmd": ["python"], "labels": {"a": "1"}}  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        {"base_id": "sha256:2"},
        {"recipe": "s"},
        {"lock_sha256": "b" * 64},
        {"library_path": "/x"},
        {"settings": SETTINGS | {"user": "0:0"}},
        {"settings": SETTINGS | {"workdir": "/"}},
        {"settings": SETTINGS | {"cmd": ["bash"]}},
        {"settings": SETTINGS | {"labels": {"a": "2"}}},
    ],
)
def test_the_inputs_of_an_image_include_the_base_the_recipe_and_its_settings(
    change: dict[str, Any],
) -> None:
    same: dict[str, Any] = dict(lock_sha256="a" * 64, base_id="sha256:1", recipe="r", library_path="", settings=SETTINGS)  # fmt: skip
    digest = inputs_digest(**same)
    assert digest == inputs_digest(**same)
    assert inputs_digest(**(same | change)) != digest


@pytest.mark.parametrize(
    ("repo_digests", "labels"),
    [
        (  # pulled: the manifest digest of the base's own repository
            ["other@sha256:" + "e" * 64, "base@sha256:" + "d" * 64],
            {"org.opencontainers.image.base.digest": "sha256:" + "d" * 64},
        ),
        (
            ["other@sha256:" + "e" * 64],
            {"org.opencontainers.image.base.digest": "sha256:" + "e" * 64},
        ),
        ([], {}),  # built or imported here: no manifest digest to name
    ],
)
def test_the_base_digest_label_is_a_manifest_digest_never_the_image_id(
    repo_digests: list[str], labels: dict[str, str]
) -> None:
    attrs = {"Id": "sha256:" + "f" * 64, "RepoDigests": repo_digests, "RootFS": {"Layers": [D1]}}
    base = BaseImage.from_inspect("base:1", attrs, [{"CreatedBy": "x", "Size": 1}])
    assert base_labels(base) == labels | {"io.envbuilder.base.id": "sha256:" + "f" * 64}


PIP_HASH_ERROR = """\
Processing /envbuilder/wheels/torch/torch-9.0.0-py3-none-any.whl
ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have tampered with them.
    torch==9.0.0 from file:///envbuilder/wheels/torch/torch-9.0.0-py3-none-any.whl:
        Expected sha256 aaaa
             Got        bbbb

"""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (PIP_HASH_ERROR, "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES"),
        (PIP_HASH_ERROR, "Expected sha256 aaaa\n               Got        bbbb"),
        ("".join(f"line {i}\n" for i in range(30)), "line 18\n  line 19"),
    ],
)
def test_a_failed_install_says_what_pip_said(output: str, expected: str) -> None:
    message = build_error(output)
    assert expected in message
    assert "Processing" not in message
    assert "line 17" not in message


def test_the_manifest_of_stacked_layers_lets_the_upper_entry_win() -> None:
    lower = [("bin", "dir", ""), ("bin/a", "file-", "1"), ("lib", "dir", "")]
    upper = [("bin", "dir", ""), ("bin/a", "filex", "2"), ("bin/b", "link", "a")]
    manifest = manifest_of([lower, upper])
    expected = hashlib.sha256(
        b"bin\0dir\0\nbin/a\0filex\x002\nbin/b\0link\0a\nlib\0dir\0\n"
    ).hexdigest()
    assert (manifest.sha256, manifest.files) == (expected, 1)


class LoadingApi:
    """The part of a Docker client that ``load_image`` uses, answering with ``items``."""

    def __init__(self, items: list[dict[str, str]]) -> None:
        self.items = items
        self.sent = b""

    def load_image(self, chunks: Any) -> list[dict[str, str]]:
        self.sent = b"".join(chunks)
        return self.items


@pytest.mark.parametrize(
    ("error", "raised", "message"),
    [
        ("open /var/lib/docker/tmp/docker-import-1/001/layer.tar: no such file or directory",
         LayerGone, "a layer that the daemon held when the build began is gone"),
        ("invalid diffID for layer 1", BuildFailed, "docker load failed: invalid diffID for layer 1"),
    ],
)  # fmt: skip
def test_a_failed_load_says_whether_a_layer_went_away(
    error: str, raised: type[BuildFailed], message: str
) -> None:
    api = LoadingApi([{"stream": "Loading layer"}, {"error": error}])
    client = type("Client", (), {"api": api})()
    with pytest.raises(raised, match=message) as caught:
        load_image(client, iter([b"archive"]))
    assert type(caught.value) is raised
    assert api.sent == b"archive"


def test_each_container_mounts_only_the_trees_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiler's container and the wheels' container run side by side and each hands its
    output to the user with ``chown -R`` over its writable mounts: a mount of the whole output
    directory walks the other container's tree while it still changes (a bytecode temp file
    vanishing under chown failed a build). Each writable mount is the container's own tree."""
    from types import SimpleNamespace

    from envbuilder.docker import base as base_module
    from envbuilder.docker import build as build_module
    from envbuilder.reporter import Reporter

    mounts: dict[str, list[str]] = {}

    def fake_run(client: object, image: str, command: list[str], **kw: Any) -> tuple[int, str]:
        role = kw.get("role", "check")
        writable = {host: v["bind"] for host, v in kw["volumes"].items() if v["mode"] == "rw"}
        mounts[role] = sorted(writable.values())
        for host, bind in writable.items():
            name = bind.rsplit("/", 1)[-1]
            assert Path(host).name == name, (host, bind)  # a group's tree, mounted as itself
            if name == "compiler":
                (Path(host) / "usr/share/envbuilder").mkdir(parents=True)
                (Path(host) / "usr/share/envbuilder/compiler.txt").write_text("cc: cc 12\n")
            else:
                (Path(host) / "opt/venv").mkdir(parents=True)
            if kw.get("on_line"):
                kw["on_line"](f"install-group.sh: {name} done")
        return 0, ""

    monkeypatch.setattr(base_module, "run_container", fake_run)
    monkeypatch.setattr(build_module, "run_container", fake_run)
    inputs = SimpleNamespace(
        base=SimpleNamespace(id="sha256:base", ref="base"),
        wheels_of=lambda name: (),
        resolved=SimpleNamespace(id="row"),
    )
    cache = SimpleNamespace(root=tmp_path / "wheels", fetch=lambda wheel: None)
    (tmp_path / "work").mkdir()
    records = build_module._make_layers(
        object(),  # type: ignore[arg-type]
        inputs,  # type: ignore[arg-type]
        ["compiler", "venv"],
        tmp_path / "work",
        cache=cache,  # type: ignore[arg-type]
        log=io.StringIO(),
        reporter=Reporter(stream=io.StringIO()),
    )
    assert sorted(records) == ["compiler", "venv"]
    assert mounts == {"compiler": ["/envbuilder/out/compiler"], "install": ["/envbuilder/out/venv"]}
