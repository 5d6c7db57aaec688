"""Byte-compiles one installed group into a tree of its own, inside the install container:
``python3 bytecode.py STAGE OUT`` (envbuilder/docker/recipe/install-group.sh runs it).

STAGE is a group's installed tree (``STAGE/opt/venv``, as pip's ``--root`` wrote it); OUT
receives only the ``__pycache__`` directories, at the paths where the image's Python
looks for them (``OUT/opt/venv/.../__pycache__/NAME.cpython-XY.pyc``), and the
directories above them with their modes as STAGE has them. envbuilder writes OUT as its
own layer right above the group's, so the group's layer is final, and sent to the
daemon, while its bytecode is still compiled.

Each file is compiled as `compileall` would with ``--invalidation-mode unchecked-hash``:
the path recorded in the code is the one in the image, and the .pyc holds the source's
hash, no timestamp, so the same wheels give the same bytes. Test directories (``tests/``,
``test/``, ``testing/_internal/``), which no program imports, stay source only; a file
that does not compile stays source only and is counted. One worker process per CPU.
Standard library only: it runs with whatever Python the base image has.
"""

import importlib.util
import os
import py_compile
import re
import stat
import sys
from concurrent.futures import ProcessPoolExecutor

SKIPPED = re.compile(r"/(tests?|testing/_internal)/")


def sources(stage):
    """The image paths (``/opt/venv/...``) of the group's .py files, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(stage, "opt", "venv")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        image_dir = "/" + os.path.relpath(dirpath, stage)
        if SKIPPED.search(image_dir + "/"):
            dirnames[:] = []
            continue
        found += [f"{image_dir}/{name}" for name in sorted(filenames) if name.endswith(".py")]
    return found


def compile_one(job):
    """Compile the image path ``source`` (read from STAGE) to its .pyc under OUT; False
    when it does not compile."""
    stage, out, source = job
    target = out + importlib.util.cache_from_source(source)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        py_compile.compile(
            stage + source,
            cfile=target,
            dfile=source,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
    except (py_compile.PyCompileError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    return True


def copy_modes(stage, out):
    """Give each directory under OUT the mode its namesake under STAGE has (a directory
    of an upper layer replaces the lower one's mode)."""
    for dirpath, _, _ in os.walk(out):
        rel = os.path.relpath(dirpath, out)
        if rel == ".":
            continue
        source = os.path.join(stage, rel)
        if os.path.isdir(source):
            os.chmod(dirpath, stat.S_IMODE(os.lstat(source).st_mode))


def main(stage, out):
    stage, out = stage.rstrip("/"), out.rstrip("/")
    files = sources(stage)
    jobs = [(stage, out, f) for f in files]
    if len(jobs) > 64 and (os.cpu_count() or 1) > 1:
        with ProcessPoolExecutor() as pool:
            results = list(pool.map(compile_one, jobs, chunksize=32))
    else:
        results = [compile_one(job) for job in jobs]
    copy_modes(stage, out)
    failed = results.count(False)
    if failed:
        print(f"bytecode.py: {failed} of {len(files)} file(s) did not compile; they stay source only")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
