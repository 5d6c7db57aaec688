"""Images built from locks against a real Docker daemon: the image is the lock, nothing else."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from envbuilder import __version__
from envbuilder.docker.build import (
    OWNER_LABEL,
    BuildFailed,
    ImageRequest,
    ensure_image,
    measure_manifest,
    owner_token,
    suite_lock_path,
)
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import image_tag, load_lock, lock_digest
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
    assert labels["io.envbuilder.layers"] == (
        f"cuda=0,runtime=0,torch=1,rest={len(locked) - 1},suite={len(suite)}"
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
    assert len(layers) == len(base_layers) + 7  # compiler, venv, cuda, runtime, torch, rest, suite


def test_an_image_with_the_lock_tag_is_not_rebuilt(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    torch_combination: Locked,
    tmp_path: Path,
) -> None:
    first = build(torch_combination, wheel_cache, base_image, tmp_path / "a")
    image_id = docker_client.images.get(first).id
    again = build(torch_combination, wheel_cache, base_image, tmp_path / "b")
    assert again == first
    assert docker_client.images.get(again).id == image_id
    assert not (tmp_path / "b" / "logs").exists()  # no build ran, so no build log


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
    compiler, venv, cuda_layer, runtime_layer = base, base + 1, base + 2, base + 3
    torch_layer, rest_layer = base + 4, base + 5
    la, lb, lc = (layer_ids(docker_client, t) for t in (a, b, c))
    # same runtime and torch wheels -> same layers, whatever the lock's order or the rest
    assert la[:rest_layer] == lb[:rest_layer]
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
    assert (
        "make layer(s) compiler, venv, cuda, runtime, torch, rest, suite; reuse none"
        in out.getvalue()
    )
    assert "docker load" in out.getvalue()
    assert after.attrs["RootFS"]["Layers"] == before.attrs["RootFS"]["Layers"]  # venv layer too
    assert after.id == before.id  # the config's times are the base's: the same image id
    manifest = after.labels["io.envbuilder.manifest.sha256"]
    assert manifest == measure_manifest(docker_client, second).sha256
    where = probe(docker_client, second, "import json, shutil; print(json.dumps({'tool': shutil.which('demo-tool')}))")  # fmt: skip
    assert where == {"tool": "/opt/venv/bin/demo-tool"}


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
    assert "is not trusted: no build of these inputs is recorded here" in out.getvalue()
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
    cached.write_bytes(bytes(data))
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
    out = io.StringIO()
    build(locked, wheel_cache, base_image, tmp_path, force=True, no_cache=True, keep_stages=True, reporter=Reporter(out))  # fmt: skip
    kept = [Path(line.split("stages kept in ", 1)[1].strip()) for line in out.getvalue().splitlines() if "stages kept in " in line]  # fmt: skip
    assert len(kept) == 1
    assert sorted(p.name for p in kept[0].glob("*.tar")) == [f"{g}.tar" for g in sorted(("compiler", "venv", "cuda", "runtime", "torch", "rest", "suite"))]  # fmt: skip
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
    below = len(layer_ids(docker_client, base_image))
    doubt = {
        "base": f"its layers ({below}) are not the {below + 7} that this lock's build makes",
        "genuine": "its layers are the build's but its config is not",
    }[forged_from]
    assert f"{tag} is not trusted: {doubt}" in out.getvalue()
    assert docker_client.images.get(tag).id == genuine.id  # the build's image, made again
    assert forged.id not in docker_client.api.images(all=True, quiet=True)  # and the fake gone
