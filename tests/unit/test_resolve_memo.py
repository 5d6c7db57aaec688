"""The resolution kept for the next run (`envbuilder.resolve.memo`) and the freshness it
relies on (`envbuilder.index._httpcache.fresh_until`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from envbuilder.index._httpcache import fresh_until
from envbuilder.model import Combination, ResolvedCombination
from envbuilder.resolve.memo import KEEP, MEMO_DIR, Memo, memo_key

DATE = "Sat, 05 Dec 2026 12:00:00 GMT"
NOON = 1_796_472_000.0  # DATE in seconds since the epoch


@pytest.mark.parametrize(
    ("headers", "until"),
    [
        ({"date": DATE, "cache-control": "max-age=600"}, NOON + 600),
        ({"date": DATE, "cache-control": "public, max-age=600", "age": "100"}, NOON + 500),
        ({"date": DATE, "expires": "Sat, 05 Dec 2026 13:00:00 GMT"}, NOON + 3600),
        ({"date": DATE, "cache-control": "no-cache, max-age=600"}, None),
        ({"date": DATE, "cache-control": "max-age=600, no-store"}, None),
        ({"date": DATE, "etag": '"x"'}, None),  # validators only: asked every time
        ({"cache-control": "max-age=600"}, None),  # no date to count from
        ({"date": "yesterday", "cache-control": "max-age=600"}, None),
    ],
)
def test_a_page_is_fresh_until_its_date_plus_max_age_less_its_age(
    headers: dict[str, str], until: float | None
) -> None:
    assert fresh_until(headers) == until


def _answer(out: Path, cid: str = "py3.11-cu121-torch2.4.1", status: Any = "resolved") -> Any:
    combination = Combination.from_json(
        {
            "id": cid,
            "python": "3.11",
            "cuda": "cu121",
            "torch": "2.4.1",
            "xformers": "0.0.28",
            "platform": "manylinux_2_28_x86_64",
        }
    )
    lock = out / f"pylock.{cid}.toml"
    lock.write_text(f"# the lock of {cid}\n", encoding="utf-8")
    return ResolvedCombination(
        combination=combination, status=status, reason="ok", lock=f"{out.name}/{lock.name}"
    )


PAGES = {"https://index/simple/torch/": NOON + 600, "https://index/simple/x/": NOON + 300}
ENTRIES = {url: (100, 7) for url in PAGES}


def test_kept_answers_come_back_into_another_out_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "locks"
    out.mkdir()
    answer = _answer(out)
    memo = Memo.of_run("k", [answer], out, PAGES, ENTRIES.get)
    assert memo is not None and memo.fresh_until == NOON + 300  # the earliest page
    assert memo.save(tmp_path / "cache") == ""
    kept = Memo.load(tmp_path / "cache", "k")
    assert kept is not None
    assert (kept.pages, kept.files, kept.fresh_until) == (memo.pages, memo.files, memo.fresh_until)
    assert json.dumps(kept.results) == json.dumps(memo.results)
    assert Memo.load(tmp_path / "cache", "another key") is None

    fresh = tmp_path / "fresh"
    assert kept.usable(fresh, ENTRIES.get, offline=False, now=NOON) == ""
    (again,) = kept.answers(fresh)
    assert again.lock == f"fresh/pylock.{answer.id}.toml"
    assert (fresh / f"pylock.{answer.id}.toml").read_bytes() == (
        out / f"pylock.{answer.id}.toml"
    ).read_bytes()
    assert again == ResolvedCombination(**{**answer.__dict__, "lock": again.lock})


def test_kept_answers_are_refused_when_a_page_or_a_lock_no_longer_holds(tmp_path: Path) -> None:
    out = tmp_path / "locks"
    out.mkdir()
    memo = Memo.of_run("k", [_answer(out)], out, PAGES, ENTRIES.get)
    assert memo is not None
    assert memo.usable(out, ENTRIES.get, offline=False, now=NOON) == ""
    assert "no longer fresh" in memo.usable(out, ENTRIES.get, offline=False, now=NOON + 300)
    # offline runs read stale pages anyway: only their identity counts
    assert memo.usable(out, ENTRIES.get, offline=True, now=NOON + 86_400) == ""
    changed = {**ENTRIES, "https://index/simple/x/": (100, 8)}
    assert "changed" in memo.usable(out, changed.get, offline=False, now=NOON)
    assert "changed" in memo.usable(out, {}.get, offline=False, now=NOON)  # dropped from the cache
    lock = next(out.glob("pylock.*"))
    lock.write_text("# edited\n", encoding="utf-8")
    assert "differs from the lock kept" in memo.usable(out, ENTRIES.get, offline=False, now=NOON)


def test_a_run_that_cannot_vouch_for_its_answers_keeps_none(tmp_path: Path) -> None:
    out = tmp_path / "locks"
    out.mkdir()
    assert Memo.of_run("k", [_answer(out, status="error")], out, PAGES, ENTRIES.get) is None
    unfresh = {**PAGES, "https://index/simple/y/": None}
    assert Memo.of_run("k", [_answer(out)], out, unfresh, lambda url: (1, 1)) is None
    assert Memo.of_run("k", [_answer(out)], out, PAGES, {}.get) is None  # not in the cache
    assert Memo.of_run("k", [_answer(out)], out, {}, ENTRIES.get) is None  # read nothing


def test_the_key_changes_with_everything_else_the_answers_depend_on() -> None:
    base: dict[str, Any] = {
        "matrix_sha256": "m",
        "selected": ["a", "b"],
        "index_url": "https://index/simple",
        "offline": False,
        "uv": "/nonexistent/uv",
        "environ": {"HOME": "/root", "UV_INDEX_STRATEGY": "first-index"},
    }
    key = memo_key(**base)
    assert memo_key(**{**base, "environ": {**base["environ"], "HOME": "/x"}}) == key
    for change in (
        {"matrix_sha256": "n"},
        {"selected": ["a"]},
        {"index_url": "https://other/simple"},
        {"offline": True},
        {"uv": "/other/uv"},
        {"environ": {"UV_INDEX_STRATEGY": "unsafe-best-match"}},
        {"environ": {"PIP_INDEX_URL": "https://x"}},
    ):
        assert memo_key(**{**base, **change}) != key, change


def test_only_the_newest_memos_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "locks"
    out.mkdir()
    cache = tmp_path / "cache"
    for n in range(KEEP + 3):
        memo = Memo.of_run(f"key{n}", [_answer(out)], out, PAGES, ENTRIES.get)
        assert memo is not None and memo.save(cache) == ""
        path = cache / MEMO_DIR / f"key{n}.json"
        os.utime(path, ns=(n * 10**9, n * 10**9))  # one second apart, oldest first
    kept = sorted(p.stem for p in (cache / MEMO_DIR).glob("*.json"))
    assert kept == sorted(f"key{n}" for n in range(3, KEEP + 3))
