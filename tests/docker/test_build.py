"""Images built from locks against a real Docker daemon: the image is the lock, nothing else."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbuilder import __version__
from envbuilder.docker.build import ensure_image, measure_manifest
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import image_tag, load_lock, lock_digest
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


def probe(client: Any, tag: str, code: str = PROBE) -> dict[str, Any]:
    out = client.containers.run(tag, ["python", "-c", code], network_mode="none", remove=True)
    result: dict[str, Any] = json.loads(out)
    return result


def build(locked: Locked, cache: WheelCache, base: str, tmp_path: Path, **kwargs: Any) -> str:
    return ensure_image(
        locked.resolved,
        locked.lock,
        base_image=base,
        log_dir=tmp_path / "logs",
        cache=cache,
        reporter=Reporter(verbose=1),
        **kwargs,
    )


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
    assert {str(canonicalize_name(n)): v for n, v in facts["dists"].items()} == locked
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
    assert labels["io.envbuilder.layers"] == f"cuda=0,runtime=0,torch=1,rest={len(locked) - 1}"
    manifest = measure_manifest(docker_client, tag)
    assert labels["io.envbuilder.manifest.sha256"] == manifest.sha256
    assert manifest.files > 1000  # torch's tree, not an empty venv

    base_layers = docker_client.images.get(base_image).attrs["RootFS"]["Layers"]
    layers = image.attrs["RootFS"]["Layers"]
    assert layers[: len(base_layers)] == base_layers
    assert len(layers) == len(base_layers) + 5  # venv + cuda + runtime + torch + rest


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


def runtime_wheels(directory: Path) -> list[BuiltWheel]:
    return [
        build_wheel(directory, "nvidia-fake-runtime-cu12", "12.4.1", padding=2 * 2**20, seed=1),
        build_wheel(directory, "nvidia-fake-blas-cu12", "12.4.2", padding=2**20, seed=2),
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
    venv, cuda_layer, runtime_layer = base, base + 1, base + 2
    torch_layer, rest_layer = base + 3, base + 4
    la, lb, lc = (layer_ids(docker_client, t) for t in (a, b, c))
    # same runtime and torch wheels -> same layers, whatever the lock's order or the rest
    assert la[:rest_layer] == lb[:rest_layer]
    assert la[rest_layer] != lb[rest_layer]
    # same runtime, other torch -> the runtime layer is shared, torch's is not
    assert la[:torch_layer] == lc[:torch_layer]
    assert la[torch_layer] != lc[torch_layer]
    assert la[venv] == lb[venv] == lc[venv]
    assert la[cuda_layer] == lb[cuda_layer] == lc[cuda_layer]  # the fake CUDA libraries
    assert la[runtime_layer] == lb[runtime_layer] == lc[runtime_layer]


def test_a_build_without_cache_installs_the_same_tree(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    scripts = {
        "demo_tool-1.0.dist-info/entry_points.txt": b"[console_scripts]\ndemo-tool = demo_tool:main\n"
    }
    locked = synthetic_lock(
        "test-reproducible",
        [*runtime_wheels(wheels), build_wheel(wheels, "demo-tool", "1.0", members=scripts)],
    )
    # A build without cache starts new cache chains from its base image; a base of its own
    # (the same layers, one more label) keeps the other tests' chains as they were.
    base = f"{base_image}-no-cache-test"
    docker_client.images.build(
        fileobj=io.BytesIO(f"FROM {base_image}\nLABEL io.envbuilder.test=no-cache\n".encode()),
        tag=base,
        network_mode="none",
    )
    first = build(locked, wheel_cache, base, tmp_path)
    before = docker_client.images.get(first)
    second = build(locked, wheel_cache, base, tmp_path, force=True, no_cache=True)
    after = docker_client.images.get(second)
    assert second == first
    assert after.id != before.id  # it really was built again
    manifest = after.labels["io.envbuilder.manifest.sha256"]
    assert manifest == before.labels["io.envbuilder.manifest.sha256"]
    assert manifest == measure_manifest(docker_client, second).sha256
    # the dependency layers (cuda, runtime, torch, rest) are the same bytes without any cache
    layers_before, layers_after = (i.attrs["RootFS"]["Layers"] for i in (before, after))
    assert layers_before[-4:] == layers_after[-4:]
    where = probe(docker_client, second, "import json, shutil; print(json.dumps({'tool': shutil.which('demo-tool')}))")  # fmt: skip
    assert where == {"tool": "/opt/venv/bin/demo-tool"}
