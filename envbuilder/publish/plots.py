"""Inline SVG bar charts: xformers vs SDPA, speed and memory, per combination."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from envbuilder.lockfile.model import Entry

__all__ = ["Bench", "benchmarks", "svg_chart"]

#: Number keys read for the plots, first found wins (the conformance suite's names first).
TIME_KEYS = ("fwd_bwd_ms_median", "fwd_ms_median", "compiled_step_ms_median", "median_ms", "ms")
MEMORY_KEYS = ("fwd_bwd_peak_mib", "fwd_peak_mib", "peak_mib", "memory_mib")
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


def benchmarks(entry: Entry, keys: Sequence[str]) -> list[Bench]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for run in entry.runs:
        for check in run.checks:
            if check.group != "performance" or check.impl not in COLOURS:
                continue
            value = _first(dict(check.numbers), keys)
            if value is None or check.status != "pass":
                continue
            parts = [p for p in check.name.split(".") if p not in (check.impl, "performance")]
            label = ".".join(parts) or check.name
            out.setdefault((label, run.gpu), {})[check.impl] = value
    return [
        Bench(label=label, gpu=gpu, values=values)
        for (label, gpu), values in sorted(out.items())
        if len(values) == 2
    ]


def svg_chart(title: str, unit: str, benches: Sequence[Bench]) -> str:
    """Horizontal grouped bars, one group per (benchmark, GPU); the ratio xformers/SDPA labelled."""
    if not benches:
        return ""
    bar, gap, left, width = 12, 10, 230, 220
    height = 28 + len(benches) * (2 * bar + gap) + 18
    top = max(max(b.values.values()) for b in benches) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" role="img" width="{left + width + 90}" '
        f'height="{height}" viewBox="0 0 {left + width + 90} {height}">',
        f"<title>{escape(title)}</title>",
        f'<text x="4" y="14" class="plot-title">{escape(title)} ({escape(unit)})</text>',
    ]
    y = 28
    for b in benches:
        gpu = b.gpu.replace("NVIDIA ", "")
        parts.append(
            f'<text x="{left - 6}" y="{y + bar + 4}" text-anchor="end">'
            f"{escape(b.label)} · {escape(gpu)}</text>"
        )
        for impl in ("xformers", "sdpa"):
            value = b.values[impl]
            w = max(1.0, width * value / top)
            parts.append(
                f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 1}" '
                f'fill="{COLOURS[impl]}"><title>{impl}: {value:g} {escape(unit)}</title></rect>'
            )
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + bar - 2}">{impl} {value:g}</text>')
            y += bar
        ratio = b.values["xformers"] / b.values["sdpa"] if b.values["sdpa"] else float("nan")
        parts.append(
            f'<text x="{left + width + 86}" y="{y - 2}" text-anchor="end" class="ratio">'
            f"×{ratio:.2f}</text>"
        )
        y += gap
    parts.append(
        f'<text x="4" y="{height - 4}" class="legend">bars: xformers (blue), SDPA (orange); '
        "×: xformers / SDPA</text></svg>"
    )
    return "".join(parts)
