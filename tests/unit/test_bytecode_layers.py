"""Each group's bytecode is a layer of its own, right above the group's: how the recipe's
``bytecode.py`` writes it, and that a group and its bytecode are always made together."""

from __future__ import annotations

import importlib.util
import marshal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import envbuilder.docker.build as build
from envbuilder.docker.image_inputs import BYTECODE, LAYERS, LayerRecord, group_of_layer
from envbuilder.docker.layers import Layer
from envbuilder.docker.manifest import DOCKER_DIR

SITE = "opt/venv/lib/python3.11/site-packages"


def bytecode_module() -> Any:
    spec = importlib.util.spec_from_file_location("envbuilder_bytecode", DOCKER_DIR / "bytecode.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its workers' jobs are pickled by name
    spec.loader.exec_module(module)
    return module


def run_bytecode(stage: Path, out: Path) -> None:
    assert bytecode_module().main(str(stage), str(out)) == 0


def pyc_path(out: Path, image_path: str) -> Path:
    return Path(str(out) + importlib.util.cache_from_source(image_path))


def test_the_bytecode_goes_beside_the_image_paths_not_into_the_group_s_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stage, out = tmp_path / "torch", tmp_path / "torch-bytecode"
    package = stage / SITE / "pkg"
    (package / "tests").mkdir(parents=True)
    (package / "testing" / "_internal").mkdir(parents=True)
    source = b"def f():\n    return 1\n"
    (package / "mod.py").write_bytes(source)
    (package / "tests" / "test_mod.py").write_text("x = 1\n")
    (package / "testing" / "_internal" / "helper.py").write_text("x = 1\n")
    (package / "broken.py").write_text("def f(:\n")
    package.chmod(0o750)
    run_bytecode(stage, out)

    assert "1 of 2 file(s) did not compile" in capsys.readouterr().out
    image_path = f"/{SITE}/pkg/mod.py"
    pyc = pyc_path(out, image_path).read_bytes()
    assert pyc[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(pyc[4:8], "little") == 0b01  # hash-based, not checked at import
    assert pyc[8:16] == importlib.util.source_hash(source)
    assert marshal.loads(pyc[16:]).co_filename == image_path
    made = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert made == [str(pyc_path(out, image_path).relative_to(out))]  # tests, broken: source only
    assert not list(stage.rglob("__pycache__"))  # the group's tree is final before this runs
    assert (out / SITE / "pkg").stat().st_mode & 0o777 == 0o750  # an upper layer's mode wins


def test_the_same_sources_give_the_same_bytes(tmp_path: Path) -> None:
    stage = tmp_path / "libs"
    for i in range(100):  # enough for the worker processes
        path = stage / SITE / f"p{i % 7}" / f"m{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {{'k{i}': ({i}, 'v')}}\n\ndef f(x):\n    return x + {i}\n")
    files: list[dict[str, bytes]] = []
    for n in range(2):
        out = tmp_path / f"out{n}"
        run_bytecode(stage, out)
        files.append({str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*.pyc")})
    assert len(files[0]) == 100 and files[0] == files[1]


def kept(name: str, tmp_path: Path) -> LayerRecord:
    tree = tmp_path / name
    tree.mkdir(exist_ok=True)
    return LayerRecord(layer=Layer(diff_id=f"sha256:{name:0>64}", size=1), entries=(), tree=tree)


@pytest.mark.parametrize("lost", ["libs", "libs-bytecode"])
def test_a_group_and_its_bytecode_are_made_together(
    lost: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their trees come from one install: a group whose bytecode layer this process no
    longer holds is installed again, and the other way round."""
    monkeypatch.setattr(build, "_daemon_chains", lambda client: set())
    monkeypatch.setattr(
        build, "_MADE_HERE", {f"key-{n}": kept(n, tmp_path) for n in LAYERS if n != lost}
    )
    inputs: Any = SimpleNamespace(base=SimpleNamespace(diff_ids=()))
    records, needed = build._reusable_layers(
        None,  # type: ignore[arg-type]
        inputs,
        {n: f"key-{n}" for n in LAYERS},
        no_cache=False,
        send_all=False,
    )
    assert needed == ["libs", "libs-bytecode"]
    assert set(records) == set(LAYERS) - {"libs", "libs-bytecode"}


def test_every_group_has_its_bytecode_right_above_it() -> None:
    for i, name in enumerate(LAYERS):
        if name.endswith(BYTECODE):
            assert LAYERS[i - 1] == group_of_layer(name) != name
        elif name not in ("compiler", "venv"):
            assert LAYERS[i + 1] == name + BYTECODE
