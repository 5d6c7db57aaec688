"""A whole resolution kept for the next run that would decide it again from the same pages.

A re-run of ``envbuilder resolve`` over an unchanged matrix makes no request: every
index page it reads is still fresh in the HTTP cache. It then decides every
combination again from those pages and re-checks every lock, which costs most of its
second and gives the answers it gave before. So a run that ended without an error
keeps its answers (`Memo`) in the cache directory, under a key
of everything else the answers depend on (`memo_key`: the matrix, the selection, the
index settings and variables, uv, the Python, envbuilder's own code), with the
identity and freshness of every cached page it read and the bytes of every lock it
answered with.

A later run with the same key uses them (`Memo.usable`) only while every one of
those pages is still fresh (before the earliest page's end of freshness) and
unchanged in the cache (same file size and modification time), and every lock is
either missing from ``--out`` (it is written from the memo, byte for byte what the
resolver would write: CI-warm runs are byte-identical to cold ones) or byte-identical
to the kept one. Anything else (an edited lock, a page revalidated or dropped,
``--upgrade``) runs the resolver as before. Offline runs read stale pages anyway, so
for them only the pages' identity counts.

A run whose every answer came from such pages (or from files named by their hash,
which do not change) keeps a memo, whether it read them from the cache or the
network. One that saw an answer the cache does not keep (a 404, an error, a HEAD)
keeps none: the next run asks again and may hear otherwise.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuilder.files import write_atomic
from envbuilder.model import ResolvedCombination

__all__ = ["MEMO_DIR", "Memo", "code_fingerprint", "memo_key"]

SCHEMA = "envbuilder.resolve-memo/1"
#: under the cache directory
MEMO_DIR = "resolve-memo"
#: memos kept in the cache directory, the newest first (`_prune`)
KEEP = 8
#: environment variables that change what uv or envbuilder resolve (hashed into the key)
SETTING_PREFIXES = ("UV_", "PIP_", "ENVBUILDER_")
#: the path fields of an answer, and of its source build: each names a file in --out as
#: ``<out name>/<file>``
PATH_FIELDS = ("lock", "requirements", "suite_lock", "suite_requirements")
BUILD_PATH_FIELDS = ("build_lock", "build_requirements")


def _path_fields(data: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Each (dict, field) of an answer's JSON that names a file in --out."""
    found = [(data, name) for name in PATH_FIELDS if data.get(name)]
    build = data.get("source_build")
    if isinstance(build, dict):
        found += [(build, name) for name in BUILD_PATH_FIELDS if build.get(name)]
    return found


def code_fingerprint() -> str:
    """envbuilder's own code, by each module's path, size and modification time."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def memo_key(
    *,
    matrix_sha256: str,
    selected: Sequence[str],
    index_url: str,
    offline: bool,
    uv: str,
    environ: Mapping[str, str],
) -> str:
    """What, beside the pages read, decides a resolution's answers: one sha256."""
    try:
        st = Path(uv).stat()
        uv_id = [uv, st.st_size, st.st_mtime_ns]
    except OSError:
        uv_id = [uv, None, None]
    material = {
        "schema": SCHEMA,
        "code": code_fingerprint(),
        "python": [sys.executable, sys.version],
        "matrix": matrix_sha256,
        "selected": list(selected),
        "index_url": index_url,
        "offline": offline,
        "uv": uv_id,
        "environ": sorted((k, v) for k, v in environ.items() if k.startswith(SETTING_PREFIXES)),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Page:
    url: str
    size: int
    mtime_ns: int


@dataclass(frozen=True, kw_only=True)
class Memo:
    key: str
    written: float  # seconds since the epoch
    fresh_until: float  # the earliest end of freshness among the pages
    pages: tuple[Page, ...]
    results: tuple[dict[str, Any], ...]  # answers, their paths relative to --out
    files: Mapping[str, str]  # path relative to --out -> the lock's text

    # -- writing ------------------------------------------------------------------------

    @classmethod
    def of_run(
        cls,
        key: str,
        results: Sequence[ResolvedCombination],
        out: Path,
        pages: Mapping[str, float | None],
        entry_of: Any,
    ) -> Memo | None:
        """The memo of a run, or None where it cannot vouch for the run's answers: an
        error, a page without freshness (a 404, a HEAD) or no longer cached, a lock not
        readable."""
        if any(r.status == "error" for r in results) or not pages:
            return None
        kept = []
        for url, until in sorted(pages.items()):
            entry = entry_of(url)
            if until is None or entry is None:
                return None
            kept.append(Page(url=url, size=entry[0], mtime_ns=entry[1]))
        files: dict[str, str] = {}
        answers = []
        for result in results:
            data = result.to_json()
            for holder, name in _path_fields(data):
                rel = _inside(out, holder[name])
                if rel is None:
                    return None
                try:
                    files[rel] = (out / rel).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    return None
                holder[name] = rel
            answers.append(data)
        return cls(
            key=key,
            written=time.time(),
            fresh_until=min(u for u in pages.values() if u is not None),
            pages=tuple(kept),
            results=tuple(answers),
            files=files,
        )

    def save(self, cache_dir: Path) -> str:
        """Write it beside earlier ones; "" when written, else why not (never fatal)."""
        doc = {
            "schema": SCHEMA,
            "key": self.key,
            "written": self.written,
            "fresh_until": self.fresh_until,
            "pages": [[p.url, p.size, p.mtime_ns] for p in self.pages],
            "results": list(self.results),
            "files": dict(self.files),
        }
        try:
            write_atomic(cache_dir / MEMO_DIR / f"{self.key}.json", json.dumps(doc))
        except OSError as e:
            return f"the resolution was not kept for the next run: {e}"
        _prune(cache_dir / MEMO_DIR)
        return ""

    # -- reading ------------------------------------------------------------------------

    @classmethod
    def load(cls, cache_dir: Path, key: str) -> Memo | None:
        path = cache_dir / MEMO_DIR / f"{key}.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("schema") != SCHEMA or doc.get("key") != key:
                return None
            return cls(
                key=key,
                written=float(doc["written"]),
                fresh_until=float(doc["fresh_until"]),
                pages=tuple(Page(url=u, size=s, mtime_ns=m) for u, s, m in doc["pages"]),
                results=tuple(doc["results"]),
                files={str(k): str(v) for k, v in doc["files"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # absent or unreadable: the resolver decides

    def usable(self, out: Path, entry_of: Any, *, offline: bool, now: float) -> str:
        """ "" when every page is still fresh (or offline) and unchanged and every lock is
        absent from *out* or identical; else why not."""
        if not offline and now >= self.fresh_until:
            return "a page it read is no longer fresh"
        for page in self.pages:
            if entry_of(page.url) != (page.size, page.mtime_ns):
                return f"the cached page {page.url} changed"
        for rel, text in self.files.items():
            try:
                if (out / rel).read_text(encoding="utf-8") != text:
                    return f"{out / rel} differs from the lock kept"
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError) as e:
                return f"{out / rel}: {e}"
        return ""

    def answers(self, out: Path) -> list[ResolvedCombination]:
        """The kept answers, their locks written into *out* where missing; paths as the
        resolver gives them (``<out name>/<file>``)."""
        for rel, text in self.files.items():
            if not (out / rel).exists():
                write_atomic(out / rel, text)
        prefix = Path(out.resolve().name)
        found = []
        for kept in self.results:
            data = json.loads(json.dumps(kept))  # a copy: the memo's stays relative
            for holder, name in _path_fields(data):
                holder[name] = (prefix / holder[name]).as_posix()
            found.append(ResolvedCombination.from_json(data))
        return found


def _prune(directory: Path, keep: int = KEEP) -> None:
    """Drop all but the *keep* newest memos: each matrix edit or selection leaves one
    (about 1.5 MB for the default matrix), and only the latest can still be used."""
    try:
        memos = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in memos[:-keep]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # another run pruned first, or the cache is read-only: nothing lost


def _inside(out: Path, path: str) -> str | None:
    """A path the resolver gave (relative to *out*'s parent) as one relative to *out*."""
    parts = Path(path).parts
    if len(parts) < 2 or parts[0] != out.resolve().name or ".." in parts:
        return None
    return Path(*parts[1:]).as_posix()
