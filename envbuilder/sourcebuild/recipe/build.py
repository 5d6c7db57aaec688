"""Build one wheel from a locked sdist, offline; runs inside the builder (standard library only).

usage: python build.py --files DIR --sdist NAME --out DIR --work DIR
                       [--requirements FILE ...] [--toolchain wheels|host]

Installs the hash-pinned requirements from DIR alone (pip --no-index
--require-hashes), points CUDA_HOME at the compiler wheels (``--toolchain
wheels``), unpacks the sdist at WORK/src and runs ``pip wheel
--no-build-isolation --no-deps --no-index`` there. The environment (flags,
SOURCE_DATE_EPOCH, MAX_JOBS) is the caller's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path


def say(text: str) -> None:
    print(f"build.py: {text}", flush=True)


def run(argv: list[str]) -> None:
    say("+ " + " ".join(argv))
    subprocess.run(argv, check=True)


def cuda_home_from_wheels(work: Path) -> Path | None:
    """A CUDA_HOME of links into the installed nvidia-* wheels: bin, include, lib64, nvvm."""
    nvidia = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    if not nvidia.is_dir():
        return None
    home = work / "cuda"
    shutil.rmtree(home, ignore_errors=True)
    for part in ("bin", "include", "lib64", "nvvm"):
        (home / part).mkdir(parents=True)
    for package in sorted(p for p in nvidia.iterdir() if p.is_dir()):
        for part, links in (
            ("bin", "bin"),
            ("include", "include"),
            ("lib", "lib64"),
            ("lib64", "lib64"),
            ("nvvm", "nvvm"),
        ):
            source = package / part
            if not source.is_dir():
                continue
            for entry in sorted(source.iterdir()):
                target = home / links / entry.name
                if entry.is_dir() and part in ("include", "nvvm") and target.is_dir():
                    for inner in sorted(entry.iterdir()):  # merge include/crt, nvvm/lib64 ...
                        if not (target / inner.name).exists():
                            (target / inner.name).symlink_to(inner)
                elif not target.exists():
                    target.symlink_to(entry)
    for lib in sorted((home / "lib64").glob("*.so.*")):  # the linker's -lcudart needs libcudart.so
        plain = lib.with_name(lib.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(lib.name)
    if not (home / "bin" / "nvcc").exists():
        return None
    return home


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=Path, required=True)
    parser.add_argument("--sdist", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--requirements", type=Path, action="append", default=[])
    parser.add_argument("--toolchain", choices=("wheels", "host"), default="wheels")
    args = parser.parse_args()
    net = Path("/sys/class/net")
    if net.is_dir():
        say("network interfaces: " + " ".join(sorted(p.name for p in net.iterdir())))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    for requirements in args.requirements:
        run(
            [
                *pip,
                "install",
                "--no-index",
                "--find-links",
                str(args.files),
                "--require-hashes",
                "--no-deps",
                "-r",
                str(requirements),
            ]
        )
    if args.toolchain == "wheels" and os.environ.get("FORCE_CUDA") == "1":
        home = cuda_home_from_wheels(args.work)
        if home is None:
            say("no nvcc among the build group's wheels")
            return 3
        os.environ["CUDA_HOME"] = str(home)
        os.environ["PATH"] = f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        say(f"CUDA_HOME={home}")
    src = args.work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    sdist = args.files / args.sdist
    if args.sdist.endswith(".zip"):
        with zipfile.ZipFile(sdist) as archive:
            archive.extractall(src)
    else:
        with tarfile.open(sdist) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(src, filter="data")
            else:  # Python before 3.11.4
                archive.extractall(src)
    (top,) = [p for p in src.iterdir() if p.is_dir()]
    args.out.mkdir(parents=True, exist_ok=True)
    run(
        [
            *pip,
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
            str(args.out),
            str(top),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
