"""Images built from locks against a real Docker daemon: the image is the lock, nothing else."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

import envbuilder.docker.build as docker_build
from envbuilder import __version__
from envbuilder.docker.build import (
    OWNER_LABEL,
    BuildFailed,
    ImageRequest,
    ensure_image,
    load_image,
    measure_manifest,
    owner_token,
    source_revision,
    suite_lock_path,
)
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.image_inputs import LAYERS
from envbuilder.docker.plan import group_of, image_tag, load_lock, lock_digest
from envbuilder.errors import InputError
from envbuilder.reporter import Reporter
from tests.docker.conftest import Locked
from tests.support.wheels import BuiltWheel, build_wheel

#: Run inside the image: who we are, what is installed, what is lying around.
PROBE = """
import importlib.metadata as md, json, os, sys
print(json.dumps({
    "uid": os.getuid(),
    "python": "%d.%d" % sys.version_info[:2],
    "prefix": sys.prefix,
    "dists": {d.metadata["Name"]: d.version for d in md.distributions(path=sys.path)},
    "leftovers": [p for p in ("/wheels", "/stage", "/root/.cache", "/usr/local/lib/envbuilder") if os.path.exists(p)],
    "venv_wheels": [f for _, _, fs in os.walk("/opt/venv") for f in fs if f.endswith(".whl")],
}))
"""


#: Run inside the image: torch's bytecode file and its pyc flags (1 = hash-based, unchecked).
PYC_PROBE = """
import importlib.util, json, os
spec = importlib.util.find_spec("torch")
path = spec.cached
flags = int.from_bytes(open(path, "rb").read()[4:8], "little") if os.path.exists(path) else None
print(json.dumps({"exists": os.path.exists(path), "flags": flags,
                  "dir_writable": os.access(os.path.dirname(path), os.W_OK)}))
"""


#: Run inside the image: inductor compiles a C++ kernel for the CPU (g++ with OpenMP).
COMPILE_PROBE = """
import json, torch
f = torch.compile(lambda x: (x.sin() * 2).relu().sum(1))
x = torch.randn(64, 64)
print(json.dumps({"difference": float((f(x) - (x.sin() * 2).relu().sum(1)).abs().max())}))
"""


#: The checkout's revision (the image's revision label), read once: a commit made while
#: the tests run would otherwise change the image id between two builds of one lock.
REVISION = source_revision()


def probe(client: Any, tag: str, code: str = PROBE) -> dict[str, Any]:
    out = client.containers.run(tag, ["python", "-c", code], network_mode="none", remove=True)
    result: dict[str, Any] = json.loads(out)
    return result


def build(
    locked: Locked,
    cache: WheelCache,
    base: str,
    tmp_path: Path,
    *,
    reporter: Reporter | None = None,
    **kwargs: Any,
) -> str:
    request = ImageRequest(
        resolved=locked.resolved,
        lock_path=locked.lock,
        base_image=base,
        log_dir=tmp_path / "logs",
        cache=cache,
        revision=REVISION,
        **kwargs,
    )
    return ensure_image(request, reporter=reporter or Reporter(verbose=1))


def test_the_torch_image_holds_exactly_its_lock(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    torch_combination: Locked,
    tmp_path: Path,
) -> None:
    tag = build(torch_combination, wheel_cache, base_image, tmp_path)
    lock_bytes = torch_combination.lock.read_bytes()
    assert tag == image_tag("py3.11-cpu-torch2.13.0", lock_digest(lock_bytes))

    facts = probe(docker_client, tag)
    locked = {w.name: w.version for w in load_lock(lock_bytes, source=torch_combination.lock)}
    suite_lock = suite_lock_path(torch_combination.resolved, torch_combination.lock)
    assert suite_lock is not None and suite_lock.is_file()
    suite = {w.name: w.version for w in load_lock(suite_lock.read_bytes(), source=suite_lock, python="3.11")}  # fmt: skip
    assert "diffusers" in suite and not suite.keys() & locked.keys()
    # the lock's wheels and, in a layer of their own, the suite's
    assert {str(canonicalize_name(n)): v for n, v in facts["dists"].items()} == locked | suite
    assert facts["uid"] != 0
    assert facts["prefix"] == "/opt/venv"
    assert facts["python"] == "3.11"
    assert facts["leftovers"] == []
    assert facts["venv_wheels"] == []
    torch_facts = probe(docker_client, tag, "import json, torch; print(json.dumps({'v': torch.__version__, 's': float(torch.arange(4.).sum())}))")  # fmt: skip
    assert torch_facts == {"v": "2.13.0+cpu", "s": 6.0}

    image = docker_client.images.get(tag)
    labels = image.labels
    assert image.attrs["Config"]["User"] == "10001:10001"
    assert {k: labels[k] for k in labels if k.startswith("io.envbuilder.combination.")} == {
        "io.envbuilder.combination.id": "py3.11-cpu-torch2.13.0",
        "io.envbuilder.combination.python": "3.11",
        "io.envbuilder.combination.cuda": "cpu",
        "io.envbuilder.combination.platform": "manylinux_2_28_x86_64",
        "io.envbuilder.combination.torch": "2.13.0+cpu",
        "io.envbuilder.combination.xformers": "",
    }
    assert labels["io.envbuilder.lock.sha256"] == lock_digest(lock_bytes)
    assert labels["io.envbuilder.version"] == __version__
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    libs = sum(group_of(name) == "libs" for name in locked)
    assert libs >= 5  # sympy, networkx, jinja2, … beside torch, in their own layer
    assert labels["io.envbuilder.layers"] == (
        f"cuda=0,runtime=0,torch=1,libs={libs},rest={len(locked) - 1 - libs},suite={len(suite)}"
    )
    assert labels["io.envbuilder.suite.lock.sha256"] == lock_digest(suite_lock.read_bytes())
    # the compiler triton and inductor need, recorded where people and the manifest see it
    assert labels["io.envbuilder.compiler.cc"].startswith("cc (Debian 12.")
    assert labels["io.envbuilder.compiler.cxx"].startswith("c++ (Debian 12.")
    assert "gcc-12=" in labels["io.envbuilder.compiler.packages"]
    compiled = probe(docker_client, tag, COMPILE_PROBE)
    assert compiled["difference"] < 1e-4  # inductor's C++ kernel ran (float reassociation)
    assert labels["io.envbuilder.base.id"] == docker_client.images.get(base_image).id
    # imported here, the base has no manifest digest: the OCI label is left out, not faked
    assert "org.opencontainers.image.base.digest" not in labels
    # bytecode was compiled at build time, hash-based and unchecked: no timestamps in it
    cached = probe(docker_client, tag, PYC_PROBE)
    assert cached == {"exists": True, "flags": 1, "dir_writable": False}
    manifest = measure_manifest(docker_client, tag)
    assert labels["io.envbuilder.manifest.sha256"] == manifest.sha256
    assert manifest.files > 1000  # torch's tree, not an empty venv

    base_layers = docker_client.images.get(base_image).attrs["RootFS"]["Layers"]
    layers = image.attrs["RootFS"]["Layers"]
    assert layers[: len(base_layers)] == base_layers
    # compiler, venv, then cuda, runtime, torch, libs, rest and suite, each with its bytecode
    assert len(layers) == len(base_layers) + 14


def test_a_later_build_makes_every_layer_again_from_the_lock(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing a process finds on the host vouches for an image: a later process (no layers
    made here yet) installs every layer again, and the lock's layers come out the same."""
    locked = synthetic_lock("test-kept", [*runtime_wheels(tmp_path / "wheels", seed=60), demo_tool(tmp_path / "wheels")])  # fmt: skip
    first = build(locked, wheel_cache, base_image, tmp_path / "a")
    image_id = docker_client.images.get(first).id
    before = layer_ids(docker_client, first)
    monkeypatch.setattr(docker_build, "_MADE_HERE", {})  # a later process
    out = io.StringIO()
    again = build(locked, wheel_cache, base_image, tmp_path / "b", reporter=Reporter(out))
    assert again == first
    assert f"make layer(s) {', '.join(LAYERS)}; reuse none" in out.getvalue()
    # the compiler layer is apt's work and not always the same bytes; the lock's layers are
    below = len(layer_ids(docker_client, base_image)) + 1
    assert layer_ids(docker_client, again)[below:] == before[below:]
    kept = f"✓ {first} existed and is what this build made (the same image id)"
    assert (kept in out.getvalue()) == (docker_client.images.get(again).id == image_id)
    assert (tmp_path / "b" / "logs" / "test-kept.log").is_file()


def runtime_wheels(directory: Path, *, seed: int = 1) -> list[BuiltWheel]:
    return [
        build_wheel(directory, "nvidia-fake-runtime-cu12", "12.4.1", padding=2 * 2**20, seed=seed),
        build_wheel(directory, "nvidia-fake-blas-cu12", "12.4.2", padding=2**20, seed=seed + 1),
    ]


def layer_ids(client: Any, tag: str) -> Sequence[str]:
    layers: list[str] = client.images.get(tag).attrs["RootFS"]["Layers"]
    return layers


def test_combinations_that_share_a_runtime_share_its_layer(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    runtime = runtime_wheels(wheels)
    torch_a = build_wheel(wheels / "a", "torch", "9.0.0", padding=2**20, seed=3)
    torch_b = build_wheel(wheels / "b", "torch", "9.1.0", padding=2**20, seed=4)
    extra_a = build_wheel(wheels, "demo-extra", "1.0")
    extra_b = build_wheel(wheels, "demo-other", "2.0")
    a = build(
        synthetic_lock("test-share-a", [*runtime, torch_a, extra_a]),
        wheel_cache,
        base_image,
        tmp_path,
    )
    b = build(synthetic_lock("test-share-b", [torch_a, extra_b, *reversed(runtime)]), wheel_cache, base_image, tmp_path)  # fmt: skip
    c = build(
        synthetic_lock("test-share-c", [*runtime, torch_b, extra_a]),
        wheel_cache,
        base_image,
        tmp_path,
    )
    base = len(docker_client.images.get(base_image).attrs["RootFS"]["Layers"])
    at = {name: base + i for i, name in enumerate(LAYERS)}
    compiler, venv, cuda_layer, runtime_layer = (
        at["compiler"],
        at["venv"],
        at["cuda"],
        at["runtime"],
    )
    torch_layer, libs_layer, rest_layer = at["torch"], at["libs"], at["rest"]
    la, lb, lc = (layer_ids(docker_client, t) for t in (a, b, c))
    # same runtime and torch wheels -> same layers, whatever the lock's order or the rest
    assert la[:rest_layer] == lb[:rest_layer]
    assert la[libs_layer] == lb[libs_layer] == lc[libs_layer]  # none of torch's libraries
    assert la[rest_layer] != lb[rest_layer]
    # same runtime, other torch -> the runtime layer is shared, torch's is not
    assert la[:torch_layer] == lc[:torch_layer]
    assert la[torch_layer] != lc[torch_layer]
    assert la[compiler] == lb[compiler] == lc[compiler]  # one compiler layer per base image
    assert la[venv] == lb[venv] == lc[venv]
    assert la[cuda_layer] == lb[cuda_layer] == lc[cuda_layer]  # the fake CUDA libraries
    assert la[runtime_layer] == lb[runtime_layer] == lc[runtime_layer]


@pytest.fixture
def derived_base(docker_client: Any, base_image: str) -> Iterator[Callable[[str, str], str]]:
    """Make ``<base>-<suffix>``: the test base plus some Dockerfile lines; removed afterwards."""
    made: list[str] = []

    def make(suffix: str, lines: str) -> str:
        tag = f"{base_image}-{suffix}"
        docker_client.images.build(
            fileobj=io.BytesIO(f"FROM {base_image}\n{lines}\n".encode()),
            tag=tag,
            network_mode="none",
            rm=True,
        )
        made.append(tag)
        return tag

    yield make
    for tag in made:
        for image in docker_client.images.list(name=tag.rsplit(":", 1)[0]):
            if tag in image.tags:
                docker_client.images.remove(tag, force=True)


def demo_tool(wheels: Path) -> BuiltWheel:
    scripts = {
        "demo_tool-1.0.dist-info/entry_points.txt": b"[console_scripts]\ndemo-tool = demo_tool:main\n",
        "demo_tool/__init__.py": b"def main():\n    return {'a', 'b', 'c', 'd'}\n",
    }
    return build_wheel(wheels, "demo-tool", "1.0", members=scripts)


def demo_tool_path(client: Any, tag: str) -> str | None:
    """Where ``demo-tool`` is on the image's PATH, as a container of ``tag`` finds it."""
    found = probe(client, tag, "import json, shutil; print(json.dumps({'tool': shutil.which('demo-tool')}))")  # fmt: skip
    tool: str | None = found["tool"]
    return tool


def test_two_builds_without_cache_give_the_same_layers_and_image_id(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    locked = synthetic_lock(
        "test-reproducible",
        [*runtime_wheels(wheels, seed=40), build_wheel(wheels, "torch", "9.5.0", padding=2**20, seed=41), demo_tool(wheels)],
    )  # fmt: skip
    first = build(locked, wheel_cache, base_image, tmp_path, force=True, no_cache=True)
    before = docker_client.images.get(first)
    # Without the image the daemon drops the layers no other image holds; the second build
    # installs and writes every layer again, and the bytes must come out the same (the
    # daemon checks each loaded layer against the digest in the config).
    docker_client.images.remove(first)
    out = io.StringIO()
    second = build(locked, wheel_cache, base_image, tmp_path, force=True, no_cache=True, reporter=Reporter(out))  # fmt: skip
    after = docker_client.images.get(second)
    assert second == first
    # every layer of the lock made again; the compiler is the base's, made once per process
    assert f"make layer(s) {', '.join(LAYERS[1:])}; reuse compiler" in out.getvalue()
    assert "docker load" in out.getvalue()
    assert after.attrs["RootFS"]["Layers"] == before.attrs["RootFS"]["Layers"]  # venv layer too
    assert after.id == before.id  # the config's times are the base's: the same image id
    manifest = after.labels["io.envbuilder.manifest.sha256"]
    assert manifest == measure_manifest(docker_client, second).sha256
    assert demo_tool_path(docker_client, second) == "/opt/venv/bin/demo-tool"


def test_a_forced_rebuild_without_change_reuses_every_layer(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    locked = synthetic_lock("test-force", [*runtime_wheels(wheels), demo_tool(wheels)])
    first = build(locked, wheel_cache, base_image, tmp_path)
    image_id = docker_client.images.get(first).id
    out = io.StringIO()
    again = build(locked, wheel_cache, base_image, tmp_path, force=True, reporter=Reporter(out))
    assert again == first
    assert docker_client.images.get(again).id == image_id
    assert "make layer" not in out.getvalue()  # nothing installed, nothing loaded
    assert "docker load" not in out.getvalue()


def test_a_change_of_rest_only_sends_the_layer_above_again_without_installing_it(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    """The suite layer's digest does not depend on the rest group below it: a lock that
    changes only ``rest`` installs ``rest``, and the suite layer this process made is sent
    again from its tree (the daemon needs it on the new parent)."""
    wheels = tmp_path / "wheels"
    common = [*runtime_wheels(wheels, seed=80), demo_tool(wheels)]
    first = build(synthetic_lock("test-rest-a", common), wheel_cache, base_image, tmp_path)
    out = io.StringIO()
    changed = [*common, build_wheel(wheels, "demo-extra", "1.0")]
    second = build(synthetic_lock("test-rest-b", changed), wheel_cache, base_image, tmp_path, reporter=Reporter(out))  # fmt: skip
    reused = [n for n in LAYERS if n not in ("rest", "rest-bytecode")]
    assert f"make layer(s) rest, rest-bytecode; reuse {', '.join(reused)}" in out.getvalue()
    # rest and its bytecode, the suite and its bytecode
    assert "docker load" in out.getvalue() and "(4 new layer(s))" in out.getvalue()
    a, b = layer_ids(docker_client, first), layer_ids(docker_client, second)
    assert a[:-4] == b[:-4]  # up to torch's libraries' bytecode
    assert a[-4] != b[-4]  # rest
    assert a[-2:] == b[-2:]  # the suite and its bytecode: the same bytes, on another parent
    assert demo_tool_path(docker_client, second) == "/opt/venv/bin/demo-tool"
    assert measure_manifest(docker_client, second).sha256 == docker_client.images.get(second).labels["io.envbuilder.manifest.sha256"]  # fmt: skip


def test_another_base_image_is_another_input(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    derived_base: Callable[[str, str], str],
    tmp_path: Path,
) -> None:
    locked = synthetic_lock("test-base-change", [demo_tool(tmp_path / "wheels")])
    other = derived_base("other", "LABEL io.envbuilder.test=other-base")
    first = build(locked, wheel_cache, base_image, tmp_path)
    replaced = docker_client.images.get(first).id
    out = io.StringIO()
    second = build(locked, wheel_cache, other, tmp_path, reporter=Reporter(out))
    assert second == first  # the tag names the lock
    image = docker_client.images.get(second)
    assert image.labels["io.envbuilder.base.id"] == docker_client.images.get(other).id
    assert f"{first} was {replaced}, not what this lock's build makes; replaced by {image.id}" in out.getvalue()  # fmt: skip
    # the image the rebuild replaced is gone, not left dangling
    assert replaced not in docker_client.api.images(all=True, quiet=True)


def test_the_image_extends_the_base_paths(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    derived_base: Callable[[str, str], str],
    tmp_path: Path,
) -> None:
    base = derived_base(
        "paths", "ENV PATH=/opt/base-tools/bin:/usr/bin:/bin LD_LIBRARY_PATH=/opt/base-lib"
    )
    tag = build(synthetic_lock("test-paths", [demo_tool(tmp_path / "wheels")]), wheel_cache, base, tmp_path)  # fmt: skip
    env = dict(e.split("=", 1) for e in docker_client.images.get(tag).attrs["Config"]["Env"])
    assert env["PATH"] == "/opt/venv/bin:/opt/base-tools/bin:/usr/bin:/bin"
    assert env["LD_LIBRARY_PATH"] == "/opt/base-lib"
    seen = probe(docker_client, tag, "import json, os; print(json.dumps({k: os.environ[k] for k in ('PATH', 'LD_LIBRARY_PATH')}))")  # fmt: skip
    assert seen == {"PATH": env["PATH"], "LD_LIBRARY_PATH": "/opt/base-lib"}


def test_pip_comes_from_ensurepip_s_own_wheel_where_the_base_keeps_it_there(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    derived_base: Callable[[str, str], str],
    tmp_path: Path,
) -> None:
    """The python:X-slim images keep pip's wheel in ensurepip's ``_bundled`` directory,
    Debian's Python in /usr/share/python-wheels: the install's pip comes from either, and
    the same wheel installs the same bytes."""
    bundled = derived_base(
        "bundled-pip",
        "RUN d=$(python3 -c 'import ensurepip, os; print(os.path.dirname(ensurepip.__file__))')"
        " && mkdir -p $d/_bundled && mv /usr/share/python-wheels/pip-*.whl $d/_bundled/",
    )
    locked = synthetic_lock("test-bundled-pip", [demo_tool(tmp_path / "wheels")])
    said: dict[str, list[str]] = {}
    ours: dict[str, Sequence[str]] = {}
    for name, base in (("debian", base_image), ("bundled", bundled)):
        tag = build(locked, wheel_cache, base, tmp_path / name)  # one tag: the lock's
        log = tmp_path / name / "logs" / "test-bundled-pip.log"
        said[name] = [
            line
            for line in log.read_text(encoding="utf-8").splitlines()
            if line.startswith("install-group.sh: pip from ")
        ]
        # venv, cuda, runtime, torch, libs, rest and suite: the lock's own layers
        ours[name] = layer_ids(docker_client, tag)[-7:]
    assert len(said["debian"]) == 1 and "/usr/share/python-wheels/pip-" in said["debian"][0]
    assert len(said["bundled"]) == 1 and "/ensurepip/_bundled/pip-" in said["bundled"][0]
    assert ours["debian"] == ours["bundled"]  # the same pip installs the same bytes
    assert demo_tool_path(docker_client, tag) == "/opt/venv/bin/demo-tool"


def test_a_base_with_another_python_is_refused_before_any_download(
    docker_client: Any,
    base_image: str,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    locked = synthetic_lock("test-wrong-python", [demo_tool(tmp_path / "wheels")])
    resolved = locked.resolved
    for_312 = Locked(
        resolved=dataclasses.replace(
            resolved, combination=dataclasses.replace(resolved.combination, python="3.12")
        ),
        lock=locked.lock,
    )
    cache = WheelCache(tmp_path / "empty-cache")
    with pytest.raises(
        InputError, match=r"has Python 3\.11, the lock is for Python 3\.12; choose a base"
    ):
        build(for_312, cache, base_image, tmp_path)
    assert not (cache.root / "sha256").exists()  # nothing was fetched


def test_a_hash_mismatch_in_the_build_is_the_message_and_the_good_log_stays(
    docker_client: Any,
    base_image: str,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    tool = demo_tool(tmp_path / "wheels")
    locked = synthetic_lock("test-hash-mismatch", [tool])
    cache = WheelCache(tmp_path / "cache")
    build(locked, cache, base_image, tmp_path)
    good_log = (tmp_path / "logs" / "test-hash-mismatch.log").read_text(encoding="utf-8")
    cached = cache.path_for(tool.sha256)
    data = bytearray(cached.read_bytes())
    data[-30] ^= 0xFF  # same size, other bytes: only pip's check inside the build sees it
    before = cached.stat()
    cached.write_bytes(bytes(data))  # in place: the same inode
    # and the same mtime, so that the cache's stamp still vouches for the file: what a
    # writer between the cache's check and the install can do
    os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(BuildFailed) as raised:
        build(locked, cache, base_image, tmp_path, force=True, no_cache=True)
    message = str(raised.value)
    assert "DO NOT MATCH THE HASHES" in message
    assert f"Expected sha256 {tool.sha256}" in message
    assert "test-hash-mismatch.failed.log" in message
    assert (tmp_path / "logs" / "test-hash-mismatch.log").read_text(encoding="utf-8") == good_log
    assert "DO NOT MATCH THE HASHES" in (tmp_path / "logs" / "test-hash-mismatch.failed.log").read_text(encoding="utf-8")  # fmt: skip


def test_a_build_leaves_no_stage_container_or_dangling_image(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    locked = synthetic_lock("test-no-leftovers", [demo_tool(tmp_path / "wheels")])
    images = set(docker_client.api.images(all=True, quiet=True))
    containers = {c.id for c in docker_client.containers.list(all=True)}
    tag = build(locked, wheel_cache, base_image, tmp_path, force=True, no_cache=True)
    assert set(docker_client.api.images(all=True, quiet=True)) - images == {docker_client.images.get(tag).id}  # fmt: skip
    # (the daemon is shared: others' containers may come and go meanwhile)
    ours = [c.id for c in docker_client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_token()}"})]  # fmt: skip
    assert set(ours) - containers == set()
    assert not list(wheel_cache.root.glob("envbuilder-build-*"))
    # the layer trees this process keeps to send again, in one directory it owns
    kept_dirs = list(wheel_cache.root.glob("envbuilder-kept-*"))
    assert [(d / "owner").read_text().strip() for d in kept_dirs] == [owner_token()]
    out = io.StringIO()
    build(locked, wheel_cache, base_image, tmp_path, force=True, no_cache=True, keep_stages=True, reporter=Reporter(out))  # fmt: skip
    kept = [Path(line.split("stages kept in ", 1)[1].strip()) for line in out.getvalue().splitlines() if "stages kept in " in line]  # fmt: skip
    assert len(kept) == 1
    # the layers this build made (the compiler's was made by the first)
    assert sorted(p.name for p in kept[0].glob("*.tar")) == sorted(f"{name}.tar" for name in LAYERS[1:])  # fmt: skip
    assert (kept[0] / "out" / "rest" / "opt" / "venv" / ".envbuilder" / "rest.txt").is_file()
    shutil.rmtree(kept[0])


@pytest.mark.parametrize(
    "forged_from",
    [
        "base",  # other content entirely, with the genuine image's labels and tag
        "genuine",  # the genuine layers under another entrypoint: not what was built either
    ],
)
def test_a_relabelled_image_with_the_lock_s_tag_is_not_trusted(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
    forged_from: str,
) -> None:
    locked = synthetic_lock("test-forged", [demo_tool(tmp_path / "wheels")])
    tag = build(locked, wheel_cache, base_image, tmp_path)
    genuine = docker_client.images.get(tag)
    source = base_image if forged_from == "base" else genuine.id
    forged, _ = docker_client.images.build(
        fileobj=io.BytesIO(
            f'FROM {source}\nENTRYPOINT ["python3", "-c", "print(\'forged results\')"]\n'.encode()
        ),
        labels=genuine.labels,  # every label, the inputs' sha256 included
        tag=tag,
        network_mode="none",
        rm=True,
    )
    assert forged.id != genuine.id
    assert forged.labels == genuine.labels
    assert docker_client.images.get(tag).id == forged.id

    out = io.StringIO()
    again = build(locked, wheel_cache, base_image, tmp_path, reporter=Reporter(out))

    assert again == tag
    replaced = f"{tag} was {forged.id}, not what this lock's build makes; replaced by {genuine.id}"
    assert replaced in out.getvalue()
    assert docker_client.images.get(tag).id == genuine.id  # the build's image, made again
    assert forged.id not in docker_client.api.images(all=True, quiet=True)  # and the fake gone


def saved_image(client: Any, image: str) -> tuple[bytes, list[bytes]]:
    """``docker save`` of ``image``: its config's bytes and its layer tars, bottom to top."""
    import tarfile

    archive = io.BytesIO(b"".join(client.images.get(image).save(named=False)))
    with tarfile.open(fileobj=archive) as tar:

        def member(name: str) -> bytes:
            extracted = tar.extractfile(name)
            assert extracted is not None, name
            return extracted.read()

        (manifest,) = json.loads(member("manifest.json"))
        return member(manifest["Config"]), [member(name) for name in manifest["Layers"]]


def planted_layer(genuine: bytes, root: Path) -> Path:
    """The genuine top layer's tree plus a ``.pth`` file that runs at every interpreter
    start, written as a reproducible layer like the build's own."""
    import tarfile

    from envbuilder.docker.layers import write_layer

    with tarfile.open(fileobj=io.BytesIO(genuine)) as tar:
        tar.extractall(root / "tree", filter="tar")
    site = root / "tree" / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / "zz-planted.pth").write_text(
        "import sys; sys.stdout.write('planted code ran\\n')\n", encoding="utf-8"
    )
    path = root / "planted.tar"
    with path.open("wb") as f:
        write_layer(root / "tree", f)
    return path


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_planted_image_with_a_matching_forged_layer_record_is_not_measured(
    docker_client: Any,
    base_image: str,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
    force: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the runner's user can do between jobs: rewrite the build's layer records in the
    envbuilder cache and load an image that matches them, under the lock's tag. The forged
    top layer carries a ``.pth`` file; the manifest label and every other label stay genuine."""
    from envbuilder.docker.build import layer_key, recipe_digest
    from envbuilder.docker.layers import archive_chunks, image_id

    cache = WheelCache(tmp_path / "cache" / "wheels")
    locked = synthetic_lock(f"test-planted-{'force' if force else 'plain'}", [demo_tool(tmp_path / "wheels")])  # fmt: skip
    tag = build(locked, cache, base_image, tmp_path / "genuine")
    genuine = docker_client.images.get(tag)
    config, layers = saved_image(docker_client, tag)
    assert image_id(config) == genuine.id
    planted = planted_layer(layers[-1], tmp_path / "planted")
    diff_id = "sha256:" + hashlib.sha256(planted.read_bytes()).hexdigest()
    document = json.loads(config)
    document["rootfs"]["diff_ids"][-1] = diff_id
    forged = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    genuine.tag("envbuilder-test/kept", "genuine")  # its lower layers stay for the load
    load_image(docker_client, archive_chunks(forged, tag=tag, layer_files={diff_id: planted}))
    docker_client.images.remove("envbuilder-test/kept:genuine")  # the genuine image is gone
    # the record of the top (suite) layer now names the planted layer; what it lists of the
    # venv stays the genuine layer's, so the manifest label is genuine too
    key = layer_key("suite", "", base_id=docker_client.images.get(base_image).id, recipe=recipe_digest())  # fmt: skip
    record = cache.root.parent / "layers" / f"{key}.json"
    entries = json.loads(record.read_text(encoding="utf-8"))["entries"] if record.is_file() else []
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(
        json.dumps({"diff_id": diff_id, "size": planted.stat().st_size, "entries": entries, "facts": {}}),
        encoding="utf-8",
    )  # fmt: skip
    assert docker_client.images.get(tag).id == image_id(forged)
    assert docker_client.images.get(tag).labels == genuine.labels
    assert "planted code ran" in probe_text(docker_client, tag)

    monkeypatch.setattr(docker_build, "_MADE_HERE", {})  # the next job: another process
    out = io.StringIO()
    again = build(
        locked, cache, base_image, tmp_path / "again", force=force, reporter=Reporter(out)
    )

    assert again == tag
    assert docker_client.images.get(tag).id != image_id(forged), out.getvalue()
    assert layer_ids(docker_client, tag)[-1] == genuine.attrs["RootFS"]["Layers"][-1]
    assert "planted code ran" not in probe_text(docker_client, tag)
    assert image_id(forged) not in docker_client.api.images(all=True, quiet=True)


def probe_text(client: Any, tag: str) -> str:
    out: bytes = client.containers.run(
        tag, ["python", "-c", "print('suite')"], network_mode="none", remove=True
    )
    return out.decode()
