"""Make a built wheel's bytes depend on its contents only.

A wheel is a zip: besides the files, it records their order, timestamps,
permissions and the compression. `normalise_wheel` rewrites it with the
entries sorted (``.dist-info`` last, ``RECORD`` at the very end, as the wheel
spec recommends), every timestamp at ``SOURCE_DATE_EPOCH``, permissions 0644
or 0755 (executables), one compression level, and ``RECORD`` regenerated from
the bytes written. Shared libraries go through `elf.normalise_elf` (nvcc's
temporary file names numbered, the build id a hash of the result). Compiled
files must otherwise be reproducible themselves (a fixed build path, no
embedded dates): the build environment sees to that.
"""

from __future__ import annotations

import base64
import hashlib
import io
import time
import zipfile

from envbuilder.sourcebuild.elf import is_elf, normalise_elf

__all__ = ["normalise_wheel"]

_ZIP_EPOCH = 315532800  # 1980-01-01: zip cannot store an earlier date


def normalise_wheel(data: bytes, *, source_date_epoch: int) -> bytes:
    """The wheel ``data`` rewritten deterministically (see the module's docstring)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = [i for i in archive.infolist() if not i.is_dir()]
        contents = {i.filename: (archive.read(i), i.external_attr >> 16) for i in infos}
    for name, (body, mode) in contents.items():
        if is_elf(body):
            contents[name] = (normalise_elf(body), mode)
    records = [n for n in contents if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise ValueError(f"not a wheel: {len(records)} .dist-info/RECORD file(s)")
    record_name = records[0]
    del contents[record_name]
    stamp = time.gmtime(max(source_date_epoch, _ZIP_EPOCH))[:6]

    def order(name: str) -> tuple[int, str]:
        return (1 if ".dist-info/" in name else 0, name)

    out = io.BytesIO()
    lines: list[str] = []
    with zipfile.ZipFile(out, "w") as archive:
        for name in sorted(contents, key=order):
            body, mode = contents[name]
            _write(archive, name, body, executable=bool(mode & 0o111), stamp=stamp)
            digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=")
            lines.append(f"{name},sha256={digest.decode()},{len(body)}")
        lines.append(f"{record_name},,")
        record = ("\n".join(lines) + "\n").encode()
        _write(archive, record_name, record, executable=False, stamp=stamp)
    return out.getvalue()


def _write(
    archive: zipfile.ZipFile,
    name: str,
    body: bytes,
    *,
    executable: bool,
    stamp: tuple[int, int, int, int, int, int],
) -> None:
    info = zipfile.ZipInfo(name, date_time=stamp)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix, so that the permissions below are read
    info.external_attr = ((0o100755 if executable else 0o100644) & 0xFFFF) << 16
    archive.writestr(info, body, compresslevel=6)
