"""The doctor's light probe links xformers' extension against the real torch's libraries,
without importing torch: a symbol torch defines binds, one it does not is a failure."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.consumer import _extload
from envbuilder.consumer.doctor import _report_of

TORCH = importlib.util.find_spec("torch")
pytestmark = [
    pytest.mark.skipif(TORCH is None, reason="needs torch installed"),
    pytest.mark.skipif(not (shutil.which("cc") and shutil.which("nm")), reason="needs cc and nm"),
]


def _a_function_of_libc10() -> str:
    assert TORCH is not None and TORCH.submodule_search_locations
    lib = Path(next(iter(TORCH.submodule_search_locations))) / "lib" / "libc10.so"
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return next(line.split()[2] for line in out.splitlines() if line.split()[1:2] == ["T"])


def _fake_xformers(root: Path, symbol: str) -> Path:
    """A site directory with an ``xformers`` whose ``_C`` calls ``symbol`` (left undefined
    in it, as a real extension leaves torch's symbols to the process)."""
    package = root / "xformers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    dist_info = root / "xformers-0.0.99.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.99\n")
    source = root / "ext.c"
    source.write_text(f"extern void {symbol}(void);\nvoid probe_entry(void) {{ {symbol}(); }}\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(package / "_C.so"), str(source)], check=True
    )
    return root


@pytest.mark.parametrize("defined", [True, False])
def test_the_extension_links_only_where_torch_defines_its_symbols(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defined: bool
) -> None:
    symbol = _a_function_of_libc10() if defined else "_ZN3c1017no_such_function_in_c10Ev"
    monkeypatch.setenv("PYTHONPATH", str(_fake_xformers(tmp_path, symbol)))
    report = _report_of(_extload, sys.executable, 120)
    assert report["light"] is True
    assert report["torch"] is not None, report
    xformers = report["xformers"]
    assert xformers["version"] == "0.0.99"
    assert xformers["extension_loaded"] is defined
    if not defined:
        assert "undefined symbol: _ZN3c1017no_such_function_in_c10Ev" in xformers["warnings"][0]
