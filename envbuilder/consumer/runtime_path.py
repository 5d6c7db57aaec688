"""A ``-cudart`` combination's runtime path, found by the environment itself.

xformers' extension built for CUDA 12 beside a CUDA 13 torch needs ``libcudart.so.12``,
which the lock adds as a wheel (``nvidia-cuda-runtime-cu12``) but which the loader finds
only through ``LD_LIBRARY_PATH`` (torch preloads its own CUDA only). Rather than asking
the user to export it, ``install`` hooks the environment's activation:

========================  =====================================================
environment               mechanism
========================  =====================================================
a venv                    ``bin/activate`` (bash, zsh), ``activate.fish`` and
                          ``activate.csh`` prepend the directory on activation;
                          ``deactivate`` restores the earlier value (or unsets it)
a conda environment       ``etc/conda/activate.d/`` and ``deactivate.d/`` scripts,
                          conda's own hook, doing the same
anything else             none: the ``export`` line to run is printed
========================  =====================================================

The hook prepends, never replaces, and never leaves an empty entry (``LIB:``, which
the loader reads as the current directory) for an empty or unset variable; installing
again replaces the hook instead of adding a second. The directory is written in each
shell's own quoting (`sh_quoted`, `fish_quoted`, `csh_quoted`), so a venv path holding
``$(…)``, backticks, quotes, ``$HOME`` or a newline stays a literal. Running the venv's ``python`` without activating it gets no hook, so
the ``export`` line is printed as well. ``envbuilder doctor`` loads the extension in
the user's environment and says what is missing when it does not load.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from envbuilder.files import write_atomic
from envbuilder.lockfile.model import Entry

__all__ = [
    "RuntimeHook",
    "announce",
    "csh_quoted",
    "export_line",
    "fish_quoted",
    "hook_environment",
    "sh_quoted",
    "unhook_text",
]

BEGIN = "# >>> envbuilder: CUDA runtime of a -cudart lock >>>"
END = "# <<< envbuilder: CUDA runtime of a -cudart lock <<<"
_OLD = "_ENVBUILDER_OLD_LD_LIBRARY_PATH"
_NONE = "_ENVBUILDER_NO_LD_LIBRARY_PATH"
_CONDA_SCRIPT = "envbuilder-cuda-runtime.sh"


@dataclass(frozen=True, kw_only=True)
class RuntimeHook:
    """What makes an environment find the runtime: the scripts changed, in words."""

    mechanism: str
    files: tuple[Path, ...]


def _block(lines: list[str]) -> str:
    return "\n".join([BEGIN, *lines, END]) + "\n"


# Each shell's own quoting: the directory is a literal in every one of them, whatever it
# holds ($(…), backticks, quotes, $HOME, !, newlines), as uv's activate scripts quote it.


def sh_quoted(text: str) -> str:
    """*text* as one POSIX shell word (bash, zsh, dash): single quotes, a ``'`` as ``'\''``."""
    return "'" + text.replace("'", "'\\''") + "'"


def fish_quoted(text: str) -> str:
    """*text* as one fish word: single quotes, in which only ``\\`` and ``\'`` are escapes."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def csh_quoted(text: str) -> str:
    """*text* as one csh/tcsh word: single quotes, a ``'`` written in double quotes; history's
    ``!`` and a newline need a backslash even inside single quotes."""
    quoted = text.replace("'", "'\"'\"'").replace("!", "\\!").replace("\n", "\\\n")
    return "'" + quoted + "'"


def export_line(libdir: str) -> str:
    """The POSIX shell line that prepends *libdir* to ``LD_LIBRARY_PATH`` (an empty or unset
    one gets no empty entry: the loader would read it as the current directory)."""
    return f'export LD_LIBRARY_PATH={sh_quoted(libdir)}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"'


def _sh_revert(old: str = _OLD, none: str = _NONE) -> list[str]:
    return [
        f'if [ -n "${{{old}+x}}" ]; then export LD_LIBRARY_PATH="${old}"; unset {old}; fi',
        f'if [ -n "${{{none}+x}}" ]; then unset LD_LIBRARY_PATH {none}; fi',
    ]


def _sh_apply(libdir: str, old: str = _OLD, none: str = _NONE) -> list[str]:
    return [
        f'if [ -n "${{LD_LIBRARY_PATH+x}}" ]; then {old}="$LD_LIBRARY_PATH"; else {none}=1; fi',
        export_line(libdir),
    ]


def _fish_revert() -> list[str]:
    return [
        f"    if set -q {_OLD}; set -gx LD_LIBRARY_PATH ${_OLD}; set -e {_OLD}; end",
        f"    if set -q {_NONE}; set -e LD_LIBRARY_PATH; set -e {_NONE}; end",
    ]


def _fish_apply(libdir: str) -> list[str]:
    quoted = fish_quoted(libdir)
    return [
        f"if set -q LD_LIBRARY_PATH; set -g {_OLD} $LD_LIBRARY_PATH; else; set -g {_NONE} 1; end",
        'if test -n "$LD_LIBRARY_PATH"',
        f"    set -gx LD_LIBRARY_PATH {quoted} $LD_LIBRARY_PATH",
        "else",
        f"    set -gx LD_LIBRARY_PATH {quoted}",
        "end",
        "true  # fish's set passes on the status before it: sourcing the script ends with 0",
    ]


#: csh's ``deactivate`` is one single-quoted alias: its revert goes inside it, on one line
_CSH_REVERT = (
    f"test $?{_OLD} != 0 && setenv LD_LIBRARY_PATH ${_OLD}:q && unset {_OLD}; "
    f"test $?{_NONE} != 0 && unsetenv LD_LIBRARY_PATH && unset {_NONE}; "
)
_CSH_REVERT_BEFORE = (  # what earlier installs wrote, taken out when installing again
    f'test $?{_OLD} != 0 && setenv LD_LIBRARY_PATH "${_OLD}" && unset {_OLD}; '
    f"test $?{_NONE} != 0 && unsetenv LD_LIBRARY_PATH && unset {_NONE}; "
)


def _csh_apply(libdir: str) -> list[str]:
    quoted = csh_quoted(libdir)
    return [
        "if ($?LD_LIBRARY_PATH) then",
        f"    set {_OLD}=$LD_LIBRARY_PATH:q",
        "    if ($%LD_LIBRARY_PATH) then",
        f"        setenv LD_LIBRARY_PATH {quoted}:$LD_LIBRARY_PATH:q",
        "    else",
        f"        setenv LD_LIBRARY_PATH {quoted}",
        "    endif",
        "else",
        f"    set {_NONE}",
        f"    setenv LD_LIBRARY_PATH {quoted}",
        "endif",
    ]


def unhook_text(text: str) -> str:
    """*text* (an activate script) without envbuilder's blocks and csh revert."""
    text = re.sub(rf"{re.escape(BEGIN)}\n.*?{re.escape(END)}\n", "", text, flags=re.S)
    return text.replace(_CSH_REVERT, "").replace(_CSH_REVERT_BEFORE, "")


def _insert_after(text: str, anchor: str, block: str, script: Path) -> str:
    match = re.search(anchor, text, flags=re.M)
    if match is None:
        raise ValueError(f"{script}: no deactivate function to restore LD_LIBRARY_PATH in")
    return text[: match.end()] + "\n" + block + text[match.end() + 1 :]


def _hook_venv(prefix: Path, libdir: str) -> tuple[Path, ...]:
    bindir = prefix / "bin"
    changed: list[Path] = []
    sh = bindir / "activate"
    if sh.is_file():
        text = unhook_text(sh.read_text(encoding="utf-8"))
        text = _insert_after(text, r"^deactivate\s*\(\)\s*\{\s*$", _block(_sh_revert()), sh)
        write_atomic(sh, text + _block(_sh_apply(libdir)))
        changed.append(sh)
    fish = bindir / "activate.fish"
    if fish.is_file():
        text = unhook_text(fish.read_text(encoding="utf-8"))
        text = _insert_after(text, r"^function deactivate\b.*$", _block(_fish_revert()), fish)
        write_atomic(fish, text + _block(_fish_apply(libdir)))
        changed.append(fish)
    csh = bindir / "activate.csh"
    if csh.is_file():
        text = unhook_text(csh.read_text(encoding="utf-8"))
        if "alias deactivate '" not in text:
            raise ValueError(f"{csh}: no deactivate alias to restore LD_LIBRARY_PATH in")
        text = text.replace("alias deactivate '", "alias deactivate '" + _CSH_REVERT, 1)
        write_atomic(csh, text + _block(_csh_apply(libdir)))
        changed.append(csh)
    return tuple(changed)


def _hook_conda(prefix: Path, libdir: str) -> tuple[Path, ...]:
    """conda's hook scripts. Environments stack (``conda activate --stack``), each one's
    scripts running in turn, so each environment saves the earlier value under names of
    its own: B's deactivation restores what B found (A's), then A's what A found."""
    on = prefix / "etc" / "conda" / "activate.d" / _CONDA_SCRIPT
    off = prefix / "etc" / "conda" / "deactivate.d" / _CONDA_SCRIPT
    on.parent.mkdir(parents=True, exist_ok=True)
    off.parent.mkdir(parents=True, exist_ok=True)
    own = hashlib.sha256(str(prefix.absolute()).encode()).hexdigest()[:12]
    names = (f"{_OLD}_{own}", f"{_NONE}_{own}")
    write_atomic(on, _block(_sh_apply(libdir, *names)))
    write_atomic(off, _block(_sh_revert(*names)))
    return (on, off)


def hook_environment(prefix: Path, libdir: str, *, apply: bool = True) -> RuntimeHook | None:
    """Make the environment at *prefix* prepend *libdir* to ``LD_LIBRARY_PATH`` when it is
    activated (only said, not written, unless *apply*); None where it has no activation
    of its own to hook."""
    if (prefix / "pyvenv.cfg").is_file():
        names = ("activate", "activate.fish", "activate.csh")
        files = tuple(prefix / "bin" / n for n in names if (prefix / "bin" / n).is_file())
        if apply:
            files = _hook_venv(prefix, libdir)
        elif not (prefix / "bin").is_dir():  # a venv --venv creates: the usual scripts
            files = tuple(prefix / "bin" / n for n in names)
        shown = ", ".join(f.name for f in files) or "its activate scripts"
        return RuntimeHook(
            mechanism=f"the venv's {shown} prepend it on activation (deactivate restores it)",
            files=files,
        )
    if (prefix / "conda-meta").is_dir():
        files = _hook_conda(prefix, libdir) if apply else ()
        return RuntimeHook(
            mechanism="the conda environment's activate.d/deactivate.d scripts prepend it on "
            "`conda activate` (and restore it)",
            files=files,
        )
    return None


def announce(entry: Entry, prefix: str, *, apply: bool) -> str | None:
    """Hook the environment at *prefix* for *entry*'s added CUDA runtime (only say how,
    unless *apply*) and the lines saying which mechanism it is."""
    from envbuilder.target import library_path

    if not entry.extra_runtime:
        return None
    libdir = library_path(entry.extra_runtime, python=entry.python, venv=prefix)
    if not libdir:
        return None
    export = export_line(libdir)
    new_venv = not Path(prefix).exists()
    hook = hook_environment(Path(prefix), libdir, apply=apply) if not new_venv else None
    if new_venv:  # --venv, created by this install: a venv with the usual scripts
        hook = RuntimeHook(
            mechanism="the venv's activate, activate.fish, activate.csh prepend it on "
            "activation (deactivate restores it)",
            files=(),
        )
    verb = "will find" if not apply else "finds"
    if hook is None:
        return (
            f"! {entry.id} adds a CUDA runtime for xformers' extension; {prefix} has no "
            f"activate script to hook, so before running: {export} "
            "(prepended; `envbuilder doctor` checks that the extension loads)"
        )
    return "\n".join(
        [
            f"runtime path: {entry.id} {verb} its added CUDA runtime: {hook.mechanism}",
            f"  the runtime's directory: {libdir}",
            f"  running {prefix}/bin/python without activating: {export}",
            "  `envbuilder doctor` checks that xformers' extension loads",
        ]
    )
