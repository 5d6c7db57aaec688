"""Inline SVG bar charts: xformers vs SDPA, speed and memory, per combination.

Each pair of bars says its ratio in words ("xformers 1.6× slower than SDPA");
benchmarks sort by their numbers (``s1024`` before ``s16384``); compile time
(``performance.*.compile_time``) is charted on its own, not among the kernels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Literal

from envbuilder.lockfile.model import Entry

__all__ = ["CHART_WIDTH", "Bench", "benchmarks", "natural_key", "ratio_words", "svg_chart"]

#: Number keys read for the plots, first found wins (the conformance suite's names first).
TIME_KEYS = ("fwd_bwd_ms_median", "fwd_ms_median", "compiled_step_ms_median", "median_ms", "ms")
MEMORY_KEYS = ("fwd_bwd_peak_mib", "fwd_peak_mib", "peak_mib", "memory_mib")
#: The compile-time panel: the first call under torch.compile (compiling included).
COMPILE_KEYS = ("first_call_s",)
COMPILE_CHECK = "compile_time"  # the last part of the performance checks that time compiling
#: Within this ratio of 1, two numbers are called the same.
SAME = 0.05
COLOURS = {"xformers": "#4c72b0", "sdpa": "#dd8452"}


@dataclass(frozen=True, kw_only=True)
class Bench:
    """One benchmark on one GPU: the value per impl (ms or MiB)."""

    label: str
    gpu: str
    values: dict[str, float]


def _first(numbers: object, keys: Sequence[str]) -> float | None:
    if not isinstance(numbers, dict):
        return None
    for key in keys:
        value = numbers.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sorts numbers inside labels as numbers: ``bf16.s2048`` before ``bf16.s16384``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part
    )


def ratio_words(xformers: float, sdpa: float, kind: Literal["time", "memory"]) -> str:
    """How xformers compares with SDPA, in words: lower is better for both kinds."""
    if sdpa <= 0 or xformers <= 0:
        return "no ratio (a zero measurement)"
    ratio = xformers / sdpa
    if abs(ratio - 1) <= SAME:
        return (
            "xformers about as fast as SDPA"
            if kind == "time"
            else ("xformers about the same memory as SDPA")
        )
    factor = ratio if ratio > 1 else 1 / ratio
    if kind == "time":
        return f"xformers {factor:.1f}× {'slower' if ratio > 1 else 'faster'} than SDPA"
    return f"xformers {factor:.1f}× {'more' if ratio > 1 else 'less'} memory than SDPA"


def benchmarks(entry: Entry, keys: Sequence[str], *, compile_time: bool = False) -> list[Bench]:
    """The (benchmark, GPU) pairs measured for both xformers and SDPA, sorted by benchmark
    (numbers as numbers); *compile_time* picks the compile-time checks instead of the rest."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for run in entry.runs:
        for check in run.checks:
            if check.group != "performance" or check.impl not in COLOURS:
                continue
            if check.name.endswith("." + COMPILE_CHECK) != compile_time:
                continue
            value = _first(dict(check.numbers), keys)
            if value is None or check.status != "pass":
                continue
            parts = [p for p in check.name.split(".") if p not in (check.impl, "performance")]
            label = ".".join(parts) or check.name
            out.setdefault((label, run.gpu), {})[check.impl] = value
    return [
        Bench(label=label, gpu=gpu, values=values)
        for (label, gpu), values in sorted(
            out.items(), key=lambda item: (natural_key(item[0][0]), item[0][1])
        )
        if len(values) == 2
    ]


#: The chart's own width (px): a phone's column (360 px) holds it at full size; wider boxes
#: show it as is, narrower ones scale it down (viewBox, ``max-width: 100%`` in the page).
CHART_WIDTH = 360


def svg_chart(
    title: str, unit: str, benches: Sequence[Bench], kind: Literal["time", "memory"] = "time"
) -> str:
    """Horizontal grouped bars, one group per (benchmark, GPU): its label, the two bars with
    their numbers, and in words how xformers compares with SDPA; 360 px wide."""
    if not benches:
        return ""
    bar, line, gap, left, values = 12, 14, 8, 4, 60
    width = CHART_WIDTH - left - values
    group = line + 2 * bar + line + gap
    height = 28 + len(benches) * group + 30
    full = CHART_WIDTH
    top = max(max(b.values.values()) for b in benches) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" role="img" width="{full}" '
        f'height="{height}" viewBox="0 0 {full} {height}">',
        f"<title>{escape(title)}</title>",
        f'<text x="4" y="14" class="plot-title">{escape(title)} ({escape(unit)})</text>',
    ]
    y = 28
    for b in benches:
        gpu = b.gpu.replace("NVIDIA ", "")
        parts.append(f'<text x="{left}" y="{y + 10}">{escape(b.label)} · {escape(gpu)}</text>')
        y += line
        for impl in ("xformers", "sdpa"):
            value = b.values[impl]
            w = max(1.0, width * value / top)
            parts.append(
                f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 1}" '
                f'fill="{COLOURS[impl]}"><title>{impl}: {value:g} {escape(unit)}</title></rect>'
            )
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + bar - 2}">{value:g}</text>')
            y += bar
        said = ratio_words(b.values["xformers"], b.values["sdpa"], kind)
        parts.append(f'<text x="{left}" y="{y + 11}" class="ratio">{escape(said)}</text>')
        y += line + gap
    parts.append(
        f'<text x="4" y="{height - 18}" class="legend">upper bar xformers (blue), lower bar '
        f'SDPA (orange);</text><text x="4" y="{height - 5}" class="legend">shorter is better'
        "</text></svg>"
    )
    return "".join(parts)
