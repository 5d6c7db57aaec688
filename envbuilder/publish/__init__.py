"""The published site (``envbuilder publish`` / ``nox -s publish``).

Writes, into one directory: the lockfile (verified, copied byte for byte), the
pylocks it points at (same relative paths, so ``envbuilder export --lock
site/compat.lock.json`` works from the site), its JSON Schema, ``compat.md``
(the Markdown table, also appended to ``$GITHUB_STEP_SUMMARY``) and
``index.html``: a self-contained page (inline CSS, JS and SVG; nothing
fetched from elsewhere) with the grid coloured by verdict, filters for
Python, CUDA and GPU, install commands and xformers-vs-SDPA plots.

Performance numbers come from ``performance`` checks with ``impl`` =
``xformers`` or ``sdpa``; the two of one benchmark share a name apart from
the impl segment (``performance.xformers.bf16.s1024.d64`` and
``performance.sdpa.bf16.s1024.d64``). Speed is read from ``fwd_bwd_ms_median``
(else ``fwd_ms_median``, ``compiled_step_ms_median``, ``median_ms``), memory
from ``fwd_bwd_peak_mib`` (else ``fwd_peak_mib``, ``peak_mib``); see
`envbuilder.publish.plots`.
"""

from envbuilder.publish.site import build_site, markdown_table

__all__ = ["build_site", "markdown_table"]
