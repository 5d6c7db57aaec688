"""Reproducible image layers and configs, loaded into Docker without ``docker build``.

A layer is a tar of an installed tree written the same way every time:
entries sorted by path, every timestamp 0, owner root (or as told), no user
or group names, modes as installed. Its sha256 (the diff id) therefore
depends only on the files, so two builds of one lock on two machines give
the same layers, and a registry or a host stores them once.

The image config is canonical JSON whose timestamps are the base image's,
so the image id (the sha256 of the config) is fixed by the inputs too.
``archive_chunks`` makes the ``docker load`` archive; layers the daemon
already holds are left out of it (the daemon does not read a layer whose
chain it has), so a rebuild whose layers exist sends a few kilobytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "BaseImage",
    "Layer",
    "LayerChanged",
    "LayerTree",
    "archive_chunks",
    "chain_ids",
    "hash_layer",
    "image_config",
    "image_env",
    "image_id",
    "layer_chunks",
    "write_layer",
]

_BLOCK = 512
_CHUNK = 1 << 20
#: Fields of the base's container config that the image keeps (the rest is set here or unused).
_KEPT_CONFIG = ("Entrypoint", "ExposedPorts", "Volumes", "StopSignal", "Shell", "Healthcheck")


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One layer: its diff id (sha256 of the uncompressed tar) and size in bytes."""

    diff_id: str
    size: int


@dataclass(frozen=True, kw_only=True)
class BaseImage:
    """What the image takes from its base: the layers, the config, the creation time."""

    ref: str
    id: str
    diff_ids: tuple[str, ...]
    config: Mapping[str, Any]
    created: str
    os: str
    architecture: str
    history: tuple[Mapping[str, Any], ...]
    #: the manifest digest of the base in its repository (``sha256:…``); "" for an image
    #: that was built or imported here, which no registry names
    digest: str = ""

    @classmethod
    def from_inspect(
        cls, ref: str, attrs: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
    ) -> BaseImage:
        """From ``docker image inspect`` and ``docker history`` (newest first) of ``ref``."""
        diff_ids = tuple(str(d) for d in (attrs.get("RootFS") or {}).get("Layers") or ())
        return cls(
            ref=ref,
            id=str(attrs["Id"]),
            diff_ids=diff_ids,
            config=dict(attrs.get("Config") or {}),
            created=str(attrs.get("Created") or "1970-01-01T00:00:00Z"),
            os=str(attrs.get("Os") or "linux"),
            architecture=str(attrs.get("Architecture") or "amd64"),
            history=_base_history(ref, history, len(diff_ids)),
            digest=_repo_digest(ref, attrs.get("RepoDigests") or ()),
        )


def _repo_digest(ref: str, repo_digests: Sequence[str]) -> str:
    """The manifest digest of ``ref``'s repository among ``RepoDigests``, else the first."""
    repository = ref.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    pairs = [str(d).partition("@")[::2] for d in repo_digests if "@" in str(d)]
    ours = [digest for name, digest in pairs if name == repository]
    return (ours or [digest for _, digest in pairs] or [""])[0]


def _base_history(
    ref: str, history: Sequence[Mapping[str, Any]], layers: int
) -> tuple[Mapping[str, Any], ...]:
    """The base's history, oldest first, one non-empty entry per layer.

    ``docker history`` does not say which entries made a layer; an entry of
    size 0 is taken as empty. When that does not add up to the base's layer
    count, each layer gets one plain entry instead.
    """
    entries: list[dict[str, Any]] = []
    for item in reversed(history):
        entry: dict[str, Any] = {"created_by": str(item.get("CreatedBy") or "")}
        if item.get("Comment"):
            entry["comment"] = str(item["Comment"])
        if not int(item.get("Size") or 0):
            entry["empty_layer"] = True
        entries.append(entry)
    if sum(1 for e in entries if not e.get("empty_layer")) == layers:
        return tuple(entries)
    return tuple({"created_by": f"layer {i + 1} of the base image {ref}"} for i in range(layers))


def _pad(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


class _Counting:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        self._out.write(data)
        return len(data)


def write_layer(
    root: Path, out: IO[bytes], *, owners: Mapping[str, tuple[int, int]] | None = None
) -> Layer:
    """Write the tree under ``root`` as a layer tar to ``out``.

    Paths are relative to ``root``, parents before children, sorted; owners are
    root:root unless ``owners`` names the path; hard links are written as files.
    """
    counting = _Counting(out)
    for chunk in layer_chunks(root, owners=owners):
        counting.write(chunk)
    return Layer(diff_id=f"sha256:{counting.digest.hexdigest()}", size=counting.size)


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def hash_layer(root: Path, *, owners: Mapping[str, tuple[int, int]] | None = None) -> Layer:
    """The layer the tree under ``root`` makes, hashed without writing it anywhere."""
    return write_layer(root, _Discard(), owners=owners)  # type: ignore[arg-type]


def layer_chunks(
    root: Path, *, owners: Mapping[str, tuple[int, int]] | None = None
) -> Iterator[bytes]:
    """The layer tar of the tree under ``root`` (as `write_layer` writes it), in chunks."""
    owners = owners or {}
    for rel in _walk(root):
        path = root / rel
        st = os.lstat(path)
        info = tarfile.TarInfo(rel)
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = 0
        info.uid, info.gid = owners.get(rel, (0, 0))
        info.uname = info.gname = ""
        if stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = str(path.readlink())
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
        elif stat.S_ISREG(st.st_mode):
            info.size = st.st_size
        else:
            raise ValueError(f"{path}: neither file, directory nor symbolic link")
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if info.isreg():
            written = 0
            with path.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    yield chunk
                    written += len(chunk)
            if written != info.size:
                raise ValueError(f"{path} changed while it was written into a layer")
            yield _pad(written)
    yield b"\0" * (2 * _BLOCK)


@dataclass(frozen=True, kw_only=True)
class LayerTree:
    """A layer to send as the tree it was hashed from: its tar is made again while it is
    sent, and must come out as ``layer`` (else `LayerChanged`)."""

    root: Path
    layer: Layer
    owners: Mapping[str, tuple[int, int]] | None = None

    def chunks(self) -> Iterator[bytes]:
        digest = hashlib.sha256()
        size = 0
        for chunk in layer_chunks(self.root, owners=self.owners):
            digest.update(chunk)
            size += len(chunk)
            if size > self.layer.size:
                break
            yield chunk
        if size != self.layer.size or f"sha256:{digest.hexdigest()}" != self.layer.diff_id:
            raise LayerChanged(f"{self.root} no longer makes the layer {self.layer.diff_id}")


class LayerChanged(ValueError):
    """A layer's tree changed between hashing it and sending it."""


def _walk(root: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            found.append(name if base == "." else f"{base}/{name}")
    return sorted(found, key=lambda p: p.split("/"))


def chain_ids(diff_ids: Sequence[str]) -> tuple[str, ...]:
    """The chain id of each layer prefix: how the daemon names a stack of layers."""
    chains: list[str] = []
    for diff_id in diff_ids:
        if not chains:
            chains.append(diff_id)
        else:
            joined = f"{chains[-1]} {diff_id}".encode()
            chains.append(f"sha256:{hashlib.sha256(joined).hexdigest()}")
    return tuple(chains)


def _env_dict(env: Sequence[str]) -> dict[str, str]:
    pairs = (item.partition("=") for item in env)
    return {name: value for name, _, value in pairs}


def image_env(base_env: Sequence[str], *, venv: str, library_path: str) -> list[str]:
    """The base's environment with the venv first on ``PATH`` and ``library_path`` appended
    to ``LD_LIBRARY_PATH``; what the base sets stays (a CUDA base's paths included)."""
    env = _env_dict(base_env)
    base_path = env.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["PATH"] = f"{venv}/bin:{base_path}"
    libraries = [p for p in (env.get("LD_LIBRARY_PATH", ""), library_path) if p]
    if libraries:
        env["LD_LIBRARY_PATH"] = ":".join(libraries)
    env["VIRTUAL_ENV"] = venv
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return [f"{k}={v}" for k, v in env.items()]


def image_config(
    base: BaseImage,
    layers: Sequence[tuple[str, Layer]],
    *,
    env: Sequence[str],
    labels: Mapping[str, str],
    user: str,
    workdir: str,
    cmd: Sequence[str],
) -> bytes:
    """The image config (canonical JSON): the base's layers, then ``layers`` (description, layer)."""
    config: dict[str, Any] = {k: base.config[k] for k in _KEPT_CONFIG if base.config.get(k)}
    config.update(
        Env=list(env),
        Cmd=list(cmd),
        User=user,
        WorkingDir=workdir,
        Labels={**(base.config.get("Labels") or {}), **labels},
    )
    history = [{**entry, "created": base.created} for entry in base.history]
    history += [{"created": base.created, "created_by": what} for what, _ in layers]
    document = {
        "architecture": base.architecture,
        "os": base.os,
        "created": base.created,
        "config": config,
        "history": history,
        "rootfs": {
            "type": "layers",
            "diff_ids": [*base.diff_ids, *(layer.diff_id for _, layer in layers)],
        },
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.USTAR_FORMAT)


def archive_chunks(
    config: bytes,
    *,
    tag: str,
    layer_files: Mapping[str, Path] | None = None,
    layer_trees: Mapping[str, LayerTree] | None = None,
) -> Iterator[bytes]:
    """The ``docker load`` archive of the image ``config`` tagged ``tag``, in chunks.

    ``layer_files`` maps diff ids to layer tars, ``layer_trees`` to the trees they are
    made from while they are sent; a layer with neither must already be on the daemon
    (with every layer below it). The config comes last: the daemon reads the archive
    whole before it looks at it.
    """
    document = json.loads(config)
    diff_ids: list[str] = document["rootfs"]["diff_ids"]
    names = [f"{i:03d}/layer.tar" for i in range(len(diff_ids))]
    files, trees = layer_files or {}, layer_trees or {}
    for name, diff_id in zip(names, diff_ids, strict=True):
        path, tree = files.get(diff_id), trees.get(diff_id)
        if path is not None:
            size = path.stat().st_size
            yield _member(name, size)
            with path.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    yield chunk
        elif tree is not None:
            size = tree.layer.size
            yield _member(name, size)
            yield from tree.chunks()
        else:
            continue
        yield _pad(size)
    config_name = f"{image_id(config).removeprefix('sha256:')}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode()
    for name, data in ((config_name, config), ("manifest.json", manifest)):
        yield _member(name, len(data)) + data + _pad(len(data))
    yield b"\0" * (2 * _BLOCK)


def image_id(config: bytes) -> str:
    """The id Docker gives the image of this config: its sha256."""
    return f"sha256:{hashlib.sha256(config).hexdigest()}"
