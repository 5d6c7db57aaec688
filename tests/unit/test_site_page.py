"""The site's first screen (the picker and its answer), its order and its charts' words."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from envbuilder.conformance._record import Impl
from envbuilder.gpus import GPU_COMPUTE_CAPABILITY
from envbuilder.lockfile.model import USES, CheckOutcome, CompatLock
from envbuilder.publish.plots import (
    COMPILE_KEYS,
    TIME_KEYS,
    Bench,
    benchmarks,
    natural_key,
    ratio_words,
    svg_chart,
)
from envbuilder.publish.site import html_page, picker_data

DATA = Path(__file__).parents[1] / "data"
BEST = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.fixture(scope="module")
def page(compat: CompatLock) -> str:
    return html_page(compat, "ab" * 32)


@pytest.mark.parametrize(
    ("xformers", "sdpa", "kind", "words"),
    [
        (2.1565, 1.3489, "time", "xformers 1.6× slower than SDPA"),
        (1.0, 1.9, "time", "xformers 1.9× faster than SDPA"),
        (1.02, 1.0, "time", "xformers about as fast as SDPA"),
        (390.0, 388.0, "memory", "xformers about the same memory as SDPA"),
        (600.0, 400.0, "memory", "xformers 1.5× more memory than SDPA"),
        (200.0, 400.0, "memory", "xformers 2.0× less memory than SDPA"),
        (1.0, 0.0, "time", "no ratio (a zero measurement)"),
    ],
)
def test_ratio_words(xformers: float, sdpa: float, kind: str, words: str) -> None:
    assert ratio_words(xformers, sdpa, kind) == words  # type: ignore[arg-type]


def test_labels_sort_numbers_as_numbers() -> None:
    labels = ["bf16.s16384.d64", "bf16.s1024.d128", "bf16.s2048.d64", "bf16.s1024.d64"]
    assert sorted(labels, key=natural_key) == [
        "bf16.s1024.d64",
        "bf16.s1024.d128",
        "bf16.s2048.d64",
        "bf16.s16384.d64",
    ]
    assert sorted(["3.9", "3.13", "3.10"], key=natural_key) == ["3.9", "3.10", "3.13"]


def test_a_chart_says_each_ratio_in_words() -> None:
    benches = [
        Bench(label="bf16.s16384", gpu="NVIDIA H200", values={"xformers": 3.8, "sdpa": 2.0}),
        Bench(label="bf16.s1024", gpu="NVIDIA H200", values={"xformers": 1.0, "sdpa": 1.0}),
    ]
    svg = svg_chart("speed", "ms", benches)
    assert "xformers 1.9× slower than SDPA" in svg
    assert "xformers about as fast as SDPA" in svg
    assert "×1.90" not in svg  # no bare ratio to decode


def _timed(impl: Impl, name: str, numbers: dict[str, float]) -> CheckOutcome:
    return CheckOutcome(
        name=f"performance.{impl}.{name}",
        group="performance",
        status="pass",
        reason="",
        gate=False,
        impl=impl,
        workaround=None,
        numbers=numbers,
        duration_s=1.0,
    )


def test_compile_time_is_charted_apart_from_the_kernels(compat: CompatLock) -> None:
    entry = compat.by_id()[BEST]
    run = entry.runs[0]
    checks = (
        *run.checks,
        _timed("xformers", "compile_time", {"first_call_s": 4.184, "compiled_step_ms_median": 3.9}),
        _timed("sdpa", "compile_time", {"first_call_s": 7.242, "compiled_step_ms_median": 2.0}),
    )
    timed = replace(entry, runs=(replace(run, checks=checks), *entry.runs[1:]))
    kernels = benchmarks(timed, TIME_KEYS)
    assert kernels and all(b.label != "compile_time" for b in kernels)
    assert benchmarks(timed, TIME_KEYS) == benchmarks(entry, TIME_KEYS)
    (compiled,) = benchmarks(timed, COMPILE_KEYS, compile_time=True)
    assert compiled.values == {"xformers": 4.184, "sdpa": 7.242}
    page = html_page(replace(compat, combinations=(timed,)), "ab" * 32)
    panel = page[page.index('id="compile-plots"') :]
    assert "first call under torch.compile" in panel
    assert "xformers 1.7× faster than SDPA" in panel
    assert "compile_time" not in page[page.index('id="plots"') : page.index('id="compile-plots"')]


def test_rows_are_verified_first_and_options_sorted_as_versions(page: str) -> None:
    ids = re.findall(r'<tr class="combo" data-filtered data-id="([^"]+)"', page)
    assert ids[0] == BEST
    verdicts = re.findall(r'<tr class="combo"[^>]* data-verdict="([^"]+)"', page)
    order = ["verified", "verified-with-workaround", "unverified", "broken", "unsatisfiable"]
    assert verdicts == sorted(verdicts, key=order.index)
    pythons = re.findall(r'<option value="(3\.\d+)">', page.split('id="pick-python"')[1])
    assert pythons[:4] == ["3.10", "3.11", "3.12", "3.13"]


def test_the_picker_offers_every_known_gpu_and_answers_before_any_choice(page: str) -> None:
    picker = page[page.index('<section id="picker"') : page.index("</section>")]
    gpu_select = picker[picker.index('id="pick-gpu"') :]
    for name in GPU_COMPUTE_CAPABILITY:
        assert f">{name} (sm_" in gpu_select
    assert 'data-arch="aarch64">GH200 (sm_90)' in gpu_select
    assert f'<span id="answer-id">{BEST}</span>' in picker
    assert f'<code class="cmd" id="answer-cmd">envbuilder install {BEST}</code>' in picker
    # the picker comes before the grid: the answer is on the first screen
    assert page.index('id="picker"') < page.index('id="grid"')


def test_the_picker_data_is_the_query_ranking(compat: CompatLock, page: str) -> None:
    data = picker_data(compat)
    ranked = data["ranked"]
    assert isinstance(ranked, dict)
    assert ranked["|"][0][:2] == (BEST, "verified")
    # on an sm_80 GPU only the A100-run combination is verified; the others have no results
    assert ranked["8.0|"][0][:2] == (BEST, "verified")
    assert ranked["8.0|"][1][1] == "unverified"
    # per use: compiled training ranks a combination broken only for that use last among its
    training = [row[0] for row in ranked["|training"]]
    compiled = [row[0] for row in ranked["|training-compiled"]]
    torch210 = "py3.12-default-torch2.10.0-xformers0.0.34"
    assert training.index(torch210) < compiled.index(torch210)
    entries = data["entries"]
    assert isinstance(entries, dict)
    assert entries[BEST] == {
        "python": "3.11",
        "cuda": "12.4",
        "arch": "x86_64",
        "driver": "550.54.14",
        "installable": True,
    }
    embedded = page[page.index('id="picker-data">') + len('id="picker-data">') :]
    embedded = embedded[: embedded.index("</script>")]
    assert json.loads(embedded) == json.loads(json.dumps(data))


def test_the_picker_shows_the_whole_way_and_each_use_without_javascript(page: str) -> None:
    picker = page[page.index('<section id="picker"') : page.index("</section>")]
    steps = picker[picker.index('<ol id="answer-steps">') :]
    assert "<code>uv tool install gpu-envbuilder</code>" in steps
    assert "<code>pip install gpu-envbuilder</code>" in steps
    assert f'<code id="step-install">envbuilder install {BEST}</code>' in steps
    assert "<code>envbuilder doctor</code>" in steps
    uses = re.findall(r'<li data-use="([^"]+)">', picker)
    assert uses == list(USES)
    assert picker.index('id="answer-uses"') < picker.index('id="answer-steps"')


def test_a_rows_failing_checks_are_folded_behind_counts() -> None:
    from envbuilder.lockfile.read import load_lockfile

    committed = Path(__file__).parents[2] / "envbuilder" / "data" / "compat.lock.json"
    page = html_page(load_lockfile(committed), "ab" * 32)
    rows = re.findall(r'<tr class="combo".*?</tr>', page, flags=re.S)
    folded = [r for r in rows if '<details class="causes">' in r]
    assert any("-cudart" in r for r in folded)  # the H200 row with failing checks
    for row in folded:
        summary = re.search(
            r"<summary>(\d+) failing in the worst use, (\d+) causes?"
            r"(?:, (\d+) advisor(?:y|ies))?</summary>",
            row,
        )
        assert summary is not None, row[:200]
        items = row[row.index('<details class="causes">') :].count("<li>")
        assert items == int(summary.group(2)) + int(summary.group(3) or 0)
        # the count is one use's, never a union over uses: the H200 rows' compiled training
        assert "-xformers" not in row or summary.group(1) == "32"


def test_a_chart_is_360_px_wide_and_scales_by_its_viewbox() -> None:
    bench = Bench(
        label="bf16.s16384.causal", gpu="NVIDIA H200", values={"xformers": 2.0, "sdpa": 1.0}
    )
    svg = svg_chart("speed", "ms", [bench] * 5)
    found = re.search(r'<svg [^>]*width="(\d+)" height="(\d+)" viewBox="0 0 (\d+) (\d+)"', svg)
    assert found is not None
    assert found.groups() == ("360", found.group(2), "360", found.group(2))
