"""The fork server's read-ahead: which mapped files it reads, and the process reading them."""

from __future__ import annotations

import os
import time
from pathlib import Path

from envbuilder.conformance._warm import Readahead, mapped_files


def _maps(*paths: str) -> str:
    lines = [
        f"7f{i:04x}000-7f{i:04x}fff r-xp 00000000 fd:01 {100 + i}                     {p}"
        for i, p in enumerate(paths)
    ]
    return "\n".join([*lines, "7ffd0000-7ffd1000 rw-p 00000000 00:00 0 ", ""])


def test_mapped_files_are_the_regular_files_each_once_in_map_order(tmp_path: Path) -> None:
    first, second, gone = (tmp_path / n for n in ("libtorch_cuda.so", "libc10.so.2", "old.so"))
    first.write_bytes(b"a")
    second.write_bytes(b"b")
    maps = _maps(
        str(first),
        "[heap]",
        str(second),
        str(first),  # its next segment
        f"{gone} (deleted)",
        "/dev/nvidiactl",
        str(tmp_path / "never-there.so"),
        "",
    )
    assert mapped_files(maps) == [str(first), str(second)]


def test_the_reading_process_reads_every_file_whole_and_says_what_it_could_not(
    tmp_path: Path,
) -> None:
    sizes = {"big.so": 3 << 20, "small.so": 10, "empty.so": 0}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(size))
    unreadable = tmp_path / "a-folder.so"
    unreadable.mkdir()
    work = Readahead([str(tmp_path / n) for n in sizes] + [str(unreadable)], name="readahead x")
    work.start()
    deadline = time.monotonic() + 60
    while not work.done():
        assert time.monotonic() < deadline, "the reading process never answered"
        time.sleep(0.01)
    report = work.report()
    assert report["files"] == 3 and report["bytes"] == sum(sizes.values())
    assert report["unreadable"] == 1
    assert report["seconds"] >= report["read_s"] >= 0
    assert work.name == "readahead x"


def test_a_reading_process_that_fails_reports_an_error(tmp_path: Path) -> None:
    class Broken(Readahead):
        def _work(self) -> dict[str, object]:
            raise OSError("no pages for you")

    work = Broken([str(tmp_path)])
    work.start()
    deadline = time.monotonic() + 60
    while not work.done():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert work.report() == {"error": "OSError: no pages for you"}
