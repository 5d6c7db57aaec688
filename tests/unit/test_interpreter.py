"""``--python VERSION|PATH`` and the interpreter a consumer command acts on."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuilder.consumer.interpreter import (
    BrokenInterpreter,
    Interpreter,
    choose,
    has_pip,
    interpreter_version,
    parse_python,
)
from envbuilder.errors import InputError, MissingToolError


def _venv(root: Path, version: str, *, pip: bool = False) -> Path:
    """A venv as its files show it: ``pyvenv.cfg`` and ``bin/python``."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").touch(mode=0o755)
    (root / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion_info = {version}\n"
    )
    if pip:
        site = root / "lib" / f"python{version[:4]}" / "site-packages" / "pip"
        site.mkdir(parents=True)
        (site / "__init__.py").touch()
    return root / "bin" / "python"


def _nothing(name: str) -> str | None:
    return None


@pytest.mark.parametrize(
    ("text", "version"), [("3.12", "3.12"), ("3.11.9", "3.11"), (" 3.13 ", "3.13")]
)
def test_a_version_is_a_version(text: str, version: str) -> None:
    assert parse_python(text, which=_nothing).version == version


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("three", "bad --python 'three': not a version, a path or a command"),
        ("2.7", "envbuilder knows only Python 3"),
        ("./nowhere/python", "no such file"),
        ("", "give a Python version (3.12) or an interpreter"),
    ],
)
def test_anything_else_is_refused_saying_what_to_pass(text: str, said: str) -> None:
    with pytest.raises(InputError, match="give a Python version") as e:
        parse_python(text, which=_nothing)
    assert said in str(e.value)


def test_a_path_a_venv_directory_and_a_command_are_interpreters(tmp_path: Path) -> None:
    python = _venv(tmp_path / "env", "3.12.4")
    assert parse_python(str(python)).path == python
    assert parse_python(str(tmp_path / "env")).path == python
    found = parse_python("python3.12", which=lambda name: f"/opt/{name}")
    assert found.path == Path("/opt/python3.12")
    with pytest.raises(InputError, match="a directory without bin/python"):
        parse_python(str(tmp_path))


def test_a_venvs_version_is_read_from_its_pyvenv_cfg(tmp_path: Path) -> None:
    assert interpreter_version(_venv(tmp_path / "a", "3.12.4")) == "3.12"
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert interpreter_version(Path(sys.executable)) == running


def test_pip_is_looked_up_in_a_venv_that_sees_no_system_packages(tmp_path: Path) -> None:
    assert has_pip(_venv(tmp_path / "with", "3.12.1", pip=True))
    assert not has_pip(_venv(tmp_path / "without", "3.12.1"))


def _version_of(path: Path) -> str:
    return interpreter_version(path)


@pytest.mark.parametrize(
    ("environ", "on_path", "source"),
    [
        ({"VIRTUAL_ENV": "venv", "CONDA_PREFIX": "conda"}, True, "$VIRTUAL_ENV"),
        ({"CONDA_PREFIX": "conda"}, True, "$CONDA_PREFIX"),
        ({}, True, "the first python3 on PATH"),
    ],
)
def test_the_active_environment_in_pips_and_uvs_order(
    tmp_path: Path, environ: dict[str, str], on_path: bool, source: str
) -> None:
    pythons = {name: _venv(tmp_path / name, "3.12.0") for name in ("venv", "conda", "path")}
    env = {k: str(tmp_path / v) for k, v in environ.items()}
    which = {"python3": str(pythons["path"])}.get
    chosen = choose(None, env, which=which, version_of=_version_of)
    expected = {"$VIRTUAL_ENV": "venv", "$CONDA_PREFIX": "conda"}.get(source, "path")
    assert chosen == Interpreter(executable=pythons[expected], version="3.12", source=source)


def test_nothing_active_and_no_python3_says_what_to_do() -> None:
    with pytest.raises(MissingToolError, match="activate the environment, or pass --python"):
        choose(None, {}, which=_nothing)


def test_an_active_venv_without_python_is_said(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"\$VIRTUAL_ENV is .* which has no bin/python"):
        choose(None, {"VIRTUAL_ENV": str(tmp_path)}, which=_nothing)


def test_a_version_takes_the_active_one_when_it_is_that_version(tmp_path: Path) -> None:
    active = _venv(tmp_path / "venv", "3.12.3")
    other = _venv(tmp_path / "other", "3.11.2")
    env = {"VIRTUAL_ENV": str(tmp_path / "venv")}
    chosen = choose(parse_python("3.12"), env, which=_nothing, version_of=_version_of)
    assert (chosen.executable, chosen.source) == (active, "--python 3.12, $VIRTUAL_ENV")
    # another version: pythonX.Y on PATH
    which = {"python3.11": str(other)}.get
    chosen = choose(parse_python("3.11"), env, which=which, version_of=_version_of)
    assert (chosen.executable, chosen.source) == (other, "--python 3.11, python3.11 on PATH")
    with pytest.raises(
        MissingToolError, match=r"no Python 3\.10 found: .*`uv python install 3\.10`"
    ):
        choose(parse_python("3.10"), env, which=_nothing, version_of=_version_of)


def _uv_finds(found: dict[str, Path]) -> Callable[[str, Callable[[str], str | None]], Path | None]:
    return lambda version, which: found.get(version)


def test_a_version_prefers_what_uv_python_find_names(tmp_path: Path) -> None:
    by_uv = _venv(tmp_path / "uv-managed", "3.11.9")
    on_path = _venv(tmp_path / "path", "3.11.2")
    which = {"uv": "/opt/uv", "python3.11": str(on_path)}.get
    chosen = choose(
        parse_python("3.11"),
        {},
        which=which,
        version_of=_version_of,
        uv_find=_uv_finds({"3.11": by_uv}),
    )
    assert (chosen.executable, chosen.source) == (by_uv, "uv python find 3.11")
    # uv finds none: pythonX.Y on PATH, as before
    chosen = choose(
        parse_python("3.11"), {}, which=which, version_of=_version_of, uv_find=_uv_finds({})
    )
    assert (chosen.executable, chosen.source) == (on_path, "--python 3.11, python3.11 on PATH")


def test_an_interpreter_that_does_not_run_is_one_short_line_naming_it(tmp_path: Path) -> None:
    active = _venv(tmp_path / "venv", "3.11.7")
    shim = tmp_path / "shims" / "python3.10"

    def version_of(path: Path) -> str:
        if path == shim:
            raise BrokenInterpreter("--python", shim, "exit status 127")
        return _version_of(path)

    which = {"uv": "/opt/uv", "python3.10": str(shim)}.get
    with pytest.raises(MissingToolError) as caught:
        choose(
            parse_python("3.10"),
            {"VIRTUAL_ENV": str(active.parent.parent)},
            which=which,
            version_of=version_of,
            uv_find=_uv_finds({}),
        )
    said = str(caught.value)
    assert said == (
        "no Python 3.10 found: $VIRTUAL_ENV is Python 3.11; `uv python find 3.10` finds none; "
        f"{shim} does not run (exit status 127). Install one (`uv python install 3.10`) or "
        "pass --python PATH"
    )
    assert "\n" not in said
