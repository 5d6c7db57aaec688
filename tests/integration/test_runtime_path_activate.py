"""A ``-cudart`` lock's runtime directory is on ``LD_LIBRARY_PATH`` once the environment is
activated, prepended to what was there, and deactivating puts back exactly what was there
(or unsets it): real venvs made by uv (as ``install --venv`` makes them), real shells (bash
always; zsh, fish and tcsh where installed), and conda's hook scripts of stacked
environments sourced in conda's order. The venv's path may hold anything a directory name
can: it stays a literal in every shell, never a command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuilder.consumer.runtime_path import (
    csh_quoted,
    fish_quoted,
    hook_environment,
    sh_quoted,
)

#: a directory name that runs commands, expands or breaks quoting if it is pasted unquoted
#: (no ``!``, no trailing backslash: uv's own activate.csh and activate.fish break on those)
HOSTILE = 'we ird $(touch pwned-a) `touch pwned-b` "q" \'s $HOME ; touch pwned-c \\z'
NAMES = {"plain": "env", "hostile": HOSTILE, "newline": "new\nline $(touch pwned-n)"}
CASES = [
    (None, "{lib}", "<unset>"),
    ("", "{lib}", ""),
    ("/usr/local/cuda/lib64", "{lib}:/usr/local/cuda/lib64", "/usr/local/cuda/lib64"),
]
CASE_IDS = ["unset", "empty", "set"]


def _lib(prefix: Path) -> str:
    return f"{prefix}/lib/python3.12/site-packages/nvidia/cuda_runtime/lib"


@pytest.fixture(params=sorted(NAMES), ids=sorted(NAMES))
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    prefix = tmp_path / NAMES[request.param]
    subprocess.run(
        [uv, "venv", "-q", "--python", sys.executable, str(prefix)],
        check=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    assert hook_environment(prefix, _lib(prefix)) is not None
    return prefix


def _shell(
    argv: list[str], script: str, old: str | None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/nobody-here"}
    if old is not None:
        env["LD_LIBRARY_PATH"] = old
    return subprocess.run(
        [*argv, script], capture_output=True, text=True, env=env, timeout=60, cwd=cwd, check=False
    )


def _nothing_ran(directory: Path) -> None:
    assert [p.name for p in directory.rglob("pwned*")] == []


def _expect(case: tuple[str | None, str, str], prefix: Path) -> tuple[str, str]:
    return case[1].format(lib=_lib(prefix)), case[2]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_sh_activate_prepends_and_deactivate_restores(
    env: Path, shell: str, case: tuple[str | None, str, str]
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    during, after = _expect(case, env)
    activate = "'" + str(env / "bin" / "activate").replace("'", "'\\''") + "'"
    show = 'printf "%s|\\n" "${LD_LIBRARY_PATH-<unset>}"'
    script = f". {activate}; {show}; . {activate}; {show}; deactivate; {show}"
    done = _shell([shell, "-c"], script, case[0], env.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{during}|\n{during}|\n{after}|\n"  # again: no doubling
    _nothing_ran(env.parent)


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fish_activate_prepends_and_deactivate_restores(
    env: Path, case: tuple[str | None, str, str]
) -> None:
    during, after = _expect(case, env)
    activate = (
        "'" + str(env / "bin" / "activate.fish").replace("\\", "\\\\").replace("'", "\\'") + "'"
    )
    show = (
        'if set -q LD_LIBRARY_PATH; printf "%s|\\n" "$LD_LIBRARY_PATH"; else; echo "<unset>|"; end'
    )
    script = f"source {activate}; and echo sourced; {show}; deactivate; {show}"
    done = _shell(["fish", "-c"], script, case[0], env.parent)
    assert done.returncode == 0, done.stderr
    # `source activate.fish; and cmd` runs cmd: sourcing ends with status 0
    assert done.stdout == f"sourced\n{during}|\n{after}|\n"
    _nothing_ran(env.parent)


@pytest.mark.skipif(shutil.which("tcsh") is None, reason="tcsh is not installed")
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_csh_activate_prepends_and_deactivate_restores(
    env: Path, case: tuple[str | None, str, str]
) -> None:
    if "\n" in str(env):
        pytest.skip("`source` in csh takes no file name with a newline")
    during, after = _expect(case, env)
    # one command per line: csh expands an alias only on lines after the one defining it;
    # an interactive csh has a prompt, which the stock activate.csh reads
    quoted = (
        "'" + str(env / "bin" / "activate.csh").replace("'", "'\"'\"'").replace("!", "\\!") + "'"
    )
    show = 'if ($?LD_LIBRARY_PATH) then\nprintf "%s|\\n" "$LD_LIBRARY_PATH:q"\nelse\necho "<unset>|"\nendif'
    script = "\n".join(['set prompt="> "', f"source {quoted}", show, "deactivate", show])
    done = _shell(["tcsh", "-f", "-c"], script, case[0], env.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{during}|\n{after}|\n"
    _nothing_ran(env.parent)


def _conda_env(directory: Path) -> Path:
    (directory / "conda-meta").mkdir(parents=True)
    assert hook_environment(directory, _lib(directory)) is not None
    return directory


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_stacked_conda_environments_restore_each_other(
    tmp_path: Path, case: tuple[str | None, str, str]
) -> None:
    """conda sources A's activate.d, then B's (``--stack``); deactivating B sources B's
    deactivate.d, then A's: each restores what it found."""
    a = _conda_env(tmp_path / "a $(touch pwned-a)")
    b = _conda_env(tmp_path / "b `touch pwned-b`")
    script = "/etc/conda/{}/envbuilder-cuda-runtime.sh"

    def source(prefix: Path, phase: str) -> str:
        return ". '" + str(prefix) + script.format(phase).replace("'", "'\\''") + "'"

    show = 'printf "%s|\\n" "${LD_LIBRARY_PATH-<unset>}"'
    steps = [
        source(a, "activate.d"), show,
        source(b, "activate.d"), show,
        source(b, "deactivate.d"), show,
        source(a, "deactivate.d"), show,
    ]  # fmt: skip
    done = _shell(["bash", "-c"], "; ".join(steps), case[0], tmp_path)
    assert done.returncode == 0, done.stderr
    on_a, original = _expect(case, a)
    assert done.stdout == f"{on_a}|\n{_lib(b)}:{on_a}|\n{on_a}|\n{original}|\n"
    _nothing_ran(tmp_path)


TRICKY = [HOSTILE, "ends in \\", "bang !x !! !$", "new\nline", "tab\there", "'", '"', "$", "`"]


@pytest.mark.parametrize(
    ("shell", "argv", "quote", "show"),
    [
        ("bash", ["bash", "-c"], sh_quoted, 'printf "%s|" {}'),
        ("zsh", ["zsh", "-c"], sh_quoted, 'printf "%s|" {}'),
        ("fish", ["fish", "-c"], fish_quoted, 'printf "%s|" {}'),
        ("tcsh", ["tcsh", "-f", "-c"], csh_quoted, 'printf "%s|" {}'),
    ],
    ids=["bash", "zsh", "fish", "tcsh"],
)
@pytest.mark.parametrize("text", TRICKY)
def test_each_shell_reads_its_quoted_word_back_as_the_literal(
    tmp_path: Path,
    shell: str,
    argv: list[str],
    quote: Callable[[str], str],
    show: str,
    text: str,
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    done = _shell(argv, show.format(quote(text)), None, tmp_path)
    assert (done.returncode, done.stdout) == (0, f"{text}|"), done.stderr
    _nothing_ran(tmp_path)


#: from unset: activate, deactivate; then the user sets the variable and activates again
CYCLE = ["<unset>", "{lib}", "<unset>", "/opt/x", "{lib}:/opt/x", "/opt/x"]


@pytest.mark.parametrize("shell", ["bash", "fish", "tcsh"])
def test_a_second_activation_restores_what_the_user_set_in_between(
    tmp_path: Path, shell: str
) -> None:
    """What deactivation saved of the first activation (the variable was unset) is gone with
    it: the second deactivation puts back the value set in between instead of unsetting it."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    prefix = tmp_path / "env"
    subprocess.run(
        [uv, "venv", "-q", "--python", sys.executable, str(prefix)],
        check=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    assert hook_environment(prefix, _lib(prefix)) is not None
    if shell == "bash":
        show = 'printf "%s|\\n" "${LD_LIBRARY_PATH-<unset>}"'
        on, off, put = (
            f". {sh_quoted(str(prefix / 'bin' / 'activate'))}",
            "deactivate",
            ("export LD_LIBRARY_PATH=/opt/x"),
        )
        script = "; ".join([show, on, show, off, show, put, show, on, show, off, show])
        argv = ["bash", "-c"]
    elif shell == "fish":
        show = 'if set -q LD_LIBRARY_PATH; printf "%s|\\n" "$LD_LIBRARY_PATH"; else; echo "<unset>|"; end'
        on, off = f"source {fish_quoted(str(prefix / 'bin' / 'activate.fish'))}", "deactivate"
        put = "set -gx LD_LIBRARY_PATH /opt/x"
        script = "; ".join([show, on, show, off, show, put, show, on, show, off, show])
        argv = ["fish", "-c"]
    else:
        show = 'if ($?LD_LIBRARY_PATH) then\nprintf "%s|\\n" "$LD_LIBRARY_PATH:q"\nelse\necho "<unset>|"\nendif'
        on, off = f"source {csh_quoted(str(prefix / 'bin' / 'activate.csh'))}", "deactivate"
        put = "setenv LD_LIBRARY_PATH /opt/x"
        steps = [show, on, show, off, show, put, show, on, show, off, show]
        script = "\n".join(['set prompt="> "', *steps])
        argv = ["tcsh", "-f", "-c"]
    done = _shell(argv, script, None, tmp_path)
    assert done.returncode == 0, done.stderr
    expected = "".join(line.format(lib=_lib(prefix)) + "|\n" for line in CYCLE)
    assert done.stdout == expected
