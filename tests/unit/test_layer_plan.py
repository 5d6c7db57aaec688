"""The layer plan, lock reading, tags and labels of envbuilder's images (no Docker here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from envbuilder.docker.build import Manifest, image_labels, lock_path
from envbuilder.docker.plan import (
    GROUPS,
    LockedWheel,
    group_of,
    install_requirements,
    load_lock,
    plan_layers,
)
from envbuilder.errors import InputError
from envbuilder.model import ResolvedCombination, ResolvedTorch, image_tag
from envbuilder.target import library_path
from tests.support.cells import cell

SHA_A = "a" * 64
SHA_B = "b" * 64


def wheel(name: str, version: str = "1.0", sha256: str = SHA_A) -> LockedWheel:
    filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    return LockedWheel(
        name=name, version=version, filename=filename, url=f"https://x/{filename}", sha256=sha256
    )


@pytest.mark.parametrize(
    ("project", "group"),
    [
        ("nvidia-cuda-runtime-cu12", "cuda"),  # versioned with the CUDA toolkit
        ("nvidia-cudnn-cu12", "cuda"),
        ("NVIDIA-cublas-cu12", "cuda"),
        ("nvidia-cublas", "cuda"),  # CUDA 13 naming
        ("cuda-toolkit", "cuda"),
        ("nvidia_nccl_cu12", "runtime"),  # released on its own cadence, moves with torch
        ("nvidia-nvshmem-cu12", "runtime"),
        ("cuda-bindings", "runtime"),
        ("cuda-pathfinder", "runtime"),
        ("torch", "torch"),
        ("triton", "torch"),
        ("pytorch-triton", "torch"),
        ("xformers", "rest"),
        ("sympy", "libs"),  # what torch requires, and what that requires
        ("MarkupSafe", "libs"),
        ("typing_extensions", "libs"),
        ("numpy", "rest"),  # torch does not require it
        ("torchvision", "rest"),
        ("nvidiax", "rest"),  # only the `nvidia-` prefix marks the runtime
        ("cudax", "rest"),
    ],
)
def test_each_project_has_a_layer(project: str, group: str) -> None:
    assert group_of(project) == group


def test_the_plan_orders_layers_cuda_runtime_torch_libs_rest_and_sorts_within_each() -> None:
    plan = plan_layers(
        [
            wheel("xformers"),
            wheel("torch"),
            wheel("sympy"),
            wheel("numpy"),
            wheel("networkx"),
            wheel("nvidia-nccl-cu12"),
            wheel("nvidia-cudnn-cu12"),
            wheel("triton"),
            wheel("nvidia-cublas-cu12"),
        ]
    )
    assert GROUPS == ("cuda", "runtime", "torch", "libs", "rest")
    assert [w.name for w in plan.groups["cuda"]] == ["nvidia-cublas-cu12", "nvidia-cudnn-cu12"]
    assert [w.name for w in plan.groups["runtime"]] == ["nvidia-nccl-cu12"]
    assert [w.name for w in plan.groups["torch"]] == ["torch", "triton"]
    assert [w.name for w in plan.groups["libs"]] == ["networkx", "sympy"]
    assert [w.name for w in plan.groups["rest"]] == ["numpy", "xformers"]
    assert plan.describe() == (
        "cuda: 2 wheel(s), runtime: 1 wheel(s), torch: 2 wheel(s), libs: 2 wheel(s), "
        "rest: 2 wheel(s)"
    )


def test_a_layer_depends_only_on_its_own_wheels() -> None:
    """Two locks that share the CUDA toolkit's libraries get the same cuda group, whatever
    else differs (here NCCL too, as between torch 2.8 and 2.9 for CUDA 12.8)."""
    toolkit = [wheel("nvidia-cudnn-cu12", "9.1"), wheel("nvidia-cublas-cu12", "12.4")]
    a = plan_layers(
        [wheel("torch", "2.5.1", SHA_A), *toolkit, wheel("nvidia-nccl-cu12", "2.27.3"),
         wheel("xformers", "0.0.28")]
    )  # fmt: skip
    b = plan_layers(
        [
            *reversed(toolkit),
            wheel("nvidia-nccl-cu12", "2.27.5", SHA_B),
            wheel("torch", "2.6.0", SHA_B),
        ]
    )
    assert install_requirements(a.groups["cuda"]) == install_requirements(b.groups["cuda"])
    assert install_requirements(a.groups["runtime"]) != install_requirements(b.groups["runtime"])
    assert install_requirements(a.groups["torch"]) != install_requirements(b.groups["torch"])


def test_requirements_pin_every_wheel_by_hash() -> None:
    text = install_requirements(
        [wheel("torch", "2.13.0+cpu", SHA_A), wheel("sympy", "1.14", SHA_B)]
    )
    assert text == (f"torch==2.13.0+cpu --hash=sha256:{SHA_A}\nsympy==1.14 --hash=sha256:{SHA_B}\n")
    assert install_requirements([]) == ""


@pytest.mark.parametrize(
    ("combination", "sha", "tag"),
    [
        ("py3.11-cpu-torch2.13.0", "0123456789ab" + "c" * 52, "envbuilder/py3.11-cpu-torch2.13.0:0123456789ab"),
        ("py3.12-cu130-torch2.11.0-xformers0.0.35-cudart", SHA_A, "envbuilder/py3.12-cu130-torch2.11.0-xformers0.0.35-cudart:aaaaaaaaaaaa"),
    ],
)  # fmt: skip
def test_the_tag_is_the_id_and_the_lock_hash(combination: str, sha: str, tag: str) -> None:
    assert image_tag(combination, sha) == tag


@pytest.mark.parametrize(
    ("combination", "sha", "problem"),
    [
        ("py3.11-cpu-torch2.13.0", "abc", "'abc' is not 64 lowercase hex digits"),
        ("py3.11-cpu-torch2.13.0", "A" * 64, "is not 64 lowercase hex digits"),
        ("Py3.11", SHA_A, "combination id 'Py3.11' cannot name an image repository"),
        ("py3.11-torch2.5.1+cu121", SHA_A, "cannot name an image repository"),
        ("py3.11--", SHA_A, "cannot name an image repository"),
    ],
)
def test_a_bad_tag_input_is_refused(combination: str, sha: str, problem: str) -> None:
    with pytest.raises(InputError, match=problem.replace("(", r"\(").replace(".", r"\.")):
        image_tag(combination, sha)


TORCH_SHA = hashlib.sha256(b"torch").hexdigest()
LOCK_HEAD = 'lock-version = "1.0"\ncreated-by = "test"\n'


def package(name: str, version: str, wheels: str) -> str:
    return f'\n[[packages]]\nname = "{name}"\nversion = "{version}"\n{wheels}\n'


def test_a_lock_becomes_its_wheels(tmp_path: Path) -> None:
    text = (
        LOCK_HEAD
        + package(
            "torch",
            "2.13.0+cpu",
            f'wheels = [{{ url = "file:///w/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl", size = 5, hashes = {{ sha256 = "{TORCH_SHA}" }} }}]',
        )
        + package(
            "jinja2",
            "3.1.6",
            f'wheels = [{{ path = "wheels/jinja2-3.1.6-py3-none-any.whl", hashes = {{ sha256 = "{SHA_B}" }} }}]',
        )
    )
    lock = tmp_path / "pylock.x.toml"
    wheels = load_lock(text.encode(), source=lock)
    assert wheels == (
        LockedWheel(
            name="torch",
            version="2.13.0+cpu",
            filename="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            url="file:///w/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            sha256=TORCH_SHA,
            size=5,
        ),
        LockedWheel(
            name="jinja2",
            version="3.1.6",
            filename="jinja2-3.1.6-py3-none-any.whl",
            url=(tmp_path / "wheels" / "jinja2-3.1.6-py3-none-any.whl").as_uri(),
            sha256=SHA_B,
        ),
    )


TWO_WHEELS = f'wheels = [{{ url = "https://x/torch-2.5.1-py3-none-any.whl", hashes = {{ sha256 = "{SHA_A}" }} }}, {{ url = "https://x/torch-2.5.1-cp311-cp311-linux_x86_64.whl", hashes = {{ sha256 = "{SHA_B}" }} }}]'
ONE_WHEEL = f'wheels = [{{ url = "https://x/torch-2.5.1-py3-none-any.whl", hashes = {{ sha256 = "{SHA_A}" }} }}]'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("lock-version = ", "not a TOML file"),
        ('lock-version = "1.0"\n', "not a valid PEP 751 lock"),
        (LOCK_HEAD, "not a valid PEP 751 lock (Missing required value in 'packages')"),
        (LOCK_HEAD + "packages = []\n", "the lock has no packages"),
        (LOCK_HEAD + package("torch", "2.5.1", 'sdist = { url = "https://x/torch-2.5.1.tar.gz", hashes = { sha256 = "' + SHA_A + '" } }'), "torch is locked as a source distribution"),
        (LOCK_HEAD + package("torch", "2.5.1", TWO_WHEELS), "has 2 wheel(s)"),
        (LOCK_HEAD + package("torch", "2.5.1", ONE_WHEEL.replace("sha256", "md5")), "has no sha256 hash; re-resolve with --generate-hashes"),
        (LOCK_HEAD + package("torch", "2.5.1", ONE_WHEEL.replace("torch-2.5.1-", "sympy-1.0-")), "not a valid PEP 751 lock (Name in 'sympy-1.0-py3-none-any.whl' is not consistent"),
        (LOCK_HEAD + package("torch", "2.5.1", ONE_WHEEL.replace(".whl", ".zip")), "not a valid PEP 751 lock (Invalid wheel filename 'torch-2.5.1-py3-none-any.zip'"),
        (LOCK_HEAD + package("torch", "2.5.1", 'marker = "python_version < \'3.12\'"\n' + ONE_WHEEL), "has marker"),
    ],
)  # fmt: skip
def test_a_lock_envbuilder_cannot_build_from_is_refused(text: str, problem: str) -> None:
    with pytest.raises(InputError, match=r"pylock\.x\.toml") as raised:
        load_lock(text.encode(), source=Path("locks/pylock.x.toml"))
    assert problem in str(raised.value)


def test_labels_carry_the_combination_the_lock_and_the_manifest() -> None:
    resolved = ResolvedCombination(
        combination=cell("py3.11-cpu-torch2.13.0"),
        status="resolved",
        reason="",
        torch=ResolvedTorch(
            version="2.13.0+cpu",
            cuda=None,
            cuda_source="none",
            filename="t.whl",
            url="u",
            sha256=SHA_A,
        ),
    )
    labels = image_labels(
        resolved,
        lock_sha256=SHA_B,
        manifest=Manifest(sha256=SHA_A, files=3),
        base_image="python:3.11-slim",
        plan=plan_layers([wheel("torch"), wheel("sympy"), wheel("jinja2")]),
        revision="abc123",
        version="9.9",
        recipe=SHA_A,
    )
    assert labels == {
        "org.opencontainers.image.title": "envbuilder/py3.11-cpu-torch2.13.0",
        "org.opencontainers.image.version": SHA_B[:12],
        "org.opencontainers.image.revision": "abc123",
        "org.opencontainers.image.base.name": "python:3.11-slim",
        "io.envbuilder.version": "9.9",
        "io.envbuilder.combination.id": "py3.11-cpu-torch2.13.0",
        "io.envbuilder.combination.python": "3.11",
        "io.envbuilder.combination.cuda": "cpu",
        "io.envbuilder.combination.platform": "manylinux_2_28_x86_64",
        "io.envbuilder.combination.torch": "2.13.0+cpu",
        "io.envbuilder.combination.xformers": "",
        "io.envbuilder.lock.sha256": SHA_B,
        "io.envbuilder.recipe.sha256": SHA_A,
        "io.envbuilder.manifest.sha256": SHA_A,
        "io.envbuilder.manifest.files": "3",
        "io.envbuilder.layers": "cuda=0,runtime=0,torch=1,libs=2,rest=0",
    }


def test_without_resolver_details_the_versions_come_from_the_lock() -> None:
    resolved = ResolvedCombination(
        combination=cell("py3.11-cu128-torch2.9.1-xformers0.0.33.post2"), status="resolved", reason="",
    )  # fmt: skip
    labels = image_labels(
        resolved,
        lock_sha256=SHA_B,
        manifest=Manifest(sha256=SHA_A, files=3),
        base_image="python:3.11-slim",
        plan=plan_layers([wheel("torch", "2.9.1"), wheel("xformers", "0.0.33.post2")]),
        revision="abc123",
    )
    assert labels["io.envbuilder.combination.torch"] == "2.9.1"
    assert labels["io.envbuilder.combination.xformers"] == "0.0.33.post2"


@pytest.mark.parametrize(
    ("lock", "expected"),
    [
        ("locks/pylock.py3_11-cpu-torch2_13_0.toml", Path("out/locks/pylock.py3_11-cpu-torch2_13_0.toml")),
        ("/abs/pylock.x.toml", Path("/abs/pylock.x.toml")),
    ],
)  # fmt: skip
def test_the_lock_is_where_the_resolution_says(lock: str, expected: Path) -> None:
    resolved = ResolvedCombination(
        combination=cell("py3.11-cpu-torch2.13.0"), status="resolved", reason="", lock=lock,
    )  # fmt: skip
    assert lock_path(resolved, Path("out/locks")) == expected


def test_a_combination_without_a_lock_says_to_resolve() -> None:
    resolved = ResolvedCombination(
        combination=cell("py3.11-cpu-torch2.13.0"), status="resolved", reason="",
    )  # fmt: skip
    with pytest.raises(
        InputError, match=r"has no lock; run `nox -s resolve -- py3\.11-cpu-torch2\.13\.0`"
    ):
        lock_path(resolved, Path("locks"))


@pytest.mark.parametrize("status", ["unsatisfiable", "error"])
def test_an_unresolved_combination_has_no_image(tmp_path: Path, status: str) -> None:
    from envbuilder.docker.build import ImageRequest, ensure_image
    from envbuilder.docker.cache import WheelCache

    resolved = ResolvedCombination(
        combination=cell("py3.11-cpu-torch2.12.0"), status=status, reason="no torch 2.12.0 wheel for cp311",  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(
        InputError, match=f"is {status} \\(no torch 2.12.0 wheel for cp311\\); nothing to build"
    ):
        ensure_image(
            ImageRequest(
                resolved=resolved,
                lock_path=tmp_path / "pylock.toml",
                log_dir=tmp_path / "logs",
                cache=WheelCache(tmp_path / "wheels"),
            )
        )
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("extra_runtime", "python", "expected"),
    [
        ((), "3.12", ""),
        (
            ("nvidia-cuda-runtime-cu12==12.8.90",),
            "3.12",
            "/opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib",
        ),
        (
            ("Nvidia_Cuda_Runtime_Cu12 == 12.8.90",),
            "3.11",
            "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib",
        ),
        (
            ("nvidia-cuda-runtime==13.0.96",),
            "3.12",
            "/opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib",
        ),
        (("some-other-package==1.0",), "3.12", ""),
        # an unpinned nvidia-cuda-runtime names no CUDA major, so no directory
        (("nvidia-cuda-runtime>=13",), "3.12", ""),
        # a wildcard pin names its major; several runtimes, each directory once
        (
            (
                "nvidia-cuda-runtime==13.*",
                "nvidia-cuda-runtime-cu12==12.8.90",
                "nvidia-cuda-runtime==13.0.96",
            ),
            "3.12",
            "/opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib:"
            "/opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib",
        ),
        # a requirement with extras and a marker is read, not split by hand
        (
            ('nvidia-cuda-runtime-cu12[x] ==12.8.90; sys_platform == "linux"',),
            "3.12",
            "/opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib",
        ),
    ],
)
def test_an_added_cuda_runtime_is_put_on_the_loader_path(
    extra_runtime: tuple[str, ...], python: str, expected: str
) -> None:
    assert library_path(extra_runtime, python=python) == expected
