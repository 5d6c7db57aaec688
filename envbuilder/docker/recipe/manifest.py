"""Manifest of installed trees, run inside an image:
``python3 manifest.py /opt/venv [/usr/share/envbuilder ...]``.

Prints JSON ``{"sha256": ..., "files": N}``. The hash covers every entry's path
(sorted; relative to the first root, absolute under the others, which are
skipped when absent: the compiler layer's record ``compiler.txt`` names the
compiler and its Debian packages), its kind, for files the sha256 of the content and the executable
bit, for links the target. ``__pycache__`` and ``*.pyc`` are left out:
byte-compilation happens at run time and is not part of what was installed.
Standard library only: it runs with whatever Python the base image has.
"""

import hashlib
import json
import os
import stat
import sys


def entries(root, prefix=""):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in dirnames + sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if prefix:
                rel = prefix.rstrip("/") + "/" + rel
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                yield rel, "link", os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                yield rel, "dir", ""
            elif name.endswith(".pyc"):
                continue
            else:
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
                mode = "x" if st.st_mode & 0o111 else "-"
                yield rel, "file" + mode, digest.hexdigest()


def main(root, *more):
    total = hashlib.sha256()
    count = 0
    found = list(entries(root))
    for extra in more:
        if os.path.isdir(extra):
            found += entries(extra, extra)
    for rel, kind, value in sorted(found):
        total.update(("%s\0%s\0%s\n" % (rel, kind, value)).encode("utf-8", "surrogateescape"))
        count += kind.startswith("file")
    json.dump({"sha256": total.hexdigest(), "files": count}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*(sys.argv[1:] or ["/opt/venv"]))
