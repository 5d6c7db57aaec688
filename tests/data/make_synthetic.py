"""Writes the synthetic lockfile inputs under tests/data (run: python tests/data/make_synthetic.py).

``locks/``: a resolution with one combination per verdict and PEP 751 locks
whose wheels live on the reserved ``.invalid`` domain (the files are not
installable: they exist to be merged and published). ``results/``: results
files that cover every verdict, two GPUs and a conflict as older evidence
(``envbuilder.results/1``), and per-use verdicts (``envbuilder.results/2``):
a run broken only for compiled training, where a workaround was measured on
one failing case but not on the other, and a run whose workarounds compete on
cost. ``stale_results/``: runs on older locks of two combinations (one with
runs on its current lock, one without). ``retired_results/``: a run of a
combination the resolution does not have (kept as retired). ``bad_results/``:
one file per reason a results file is rejected.
Deterministic: running it again gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
BASE = "https://wheels.invalid/packages"
H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0",
    "memory_mib": 81559,
}
A100 = {
    "index": 0,
    "name": "NVIDIA A100-SXM4-80GB",
    "compute_capability": "8.0",
    "memory_mib": 81920,
}


def fake_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pylock(packages: list[tuple[str, str, str]]) -> str:
    lines = [
        "# Synthetic test data written by tests/data/make_synthetic.py: not installable.",
        'lock-version = "1.0"',
        'created-by = "envbuilder-tests"',
        'requires-python = ">=3.10"',
    ]
    for name, version, wheel in packages:
        lines += [
            "",
            "[[packages]]",
            f'name = "{name}"',
            f'version = "{version}"',
            f'wheels = [{{ url = "{BASE}/{wheel}", size = 1000, hashes = {{ sha256 = "{fake_sha(wheel)}" }} }}]',
        ]
    return "\n".join(lines) + "\n"


def combo(
    cid: str,
    python: str,
    torch: str | None,
    xformers: str | None,
    *,
    status: str = "resolved",
    reason: str = "",
    extra_runtime: tuple[str, ...] = (),
    arch: str = "8.0 9.0+PTX",
    requested: tuple[str, str | None] | None = None,
) -> tuple[dict[str, Any], str | None]:
    tag = f"cp{python.replace('.', '')}"
    asked = requested or (torch, xformers)
    if status != "resolved":
        return (
            {
                "id": cid,
                "status": status,
                "reason": reason,
                "python": python,
                "cuda": "default",
                "platform": "manylinux_2_28_x86_64",
                "requested": {"torch": asked[0], "xformers": asked[1]},
            },
            None,
        )
    assert torch is not None
    twheel = f"torch-{torch}-{tag}-{tag}-manylinux_2_28_x86_64.whl"
    pkgs = [("torch", torch, twheel), ("filelock", "3.16.1", "filelock-3.16.1-py3-none-any.whl")]
    xf = None
    if xformers:
        xwheel = f"xformers-{xformers}-cp39-abi3-manylinux_2_28_x86_64.whl"
        pkgs.append(("xformers", xformers, xwheel))
        xf = {
            "version": xformers,
            "filename": xwheel,
            "url": f"{BASE}/{xwheel}",
            "sha256": fake_sha(xwheel),
            "requires_torch": f"=={torch}",
            "built_with": {"torch": torch, "cuda": "12.4", "arch_list": arch},
            "size": 1000,
            "index": "default",
        }
    for req in extra_runtime:
        name, version = req.split("==")
        pkgs.append(
            (
                name,
                version,
                f"{name.replace('-', '_')}-{version}-py3-none-manylinux_2_28_x86_64.whl",
            )
        )
    text = pylock(sorted(pkgs))
    lock_sha = hashlib.sha256(text.encode()).hexdigest()
    record = {
        "id": cid,
        "status": "resolved",
        "reason": "",
        "python": python,
        "cuda": "default",
        "platform": "manylinux_2_28_x86_64",
        "torch": {
            "version": torch,
            "cuda": "12.4",
            "cuda_source": "requires-dist",
            "filename": twheel,
            "url": f"{BASE}/{twheel}",
            "sha256": fake_sha(twheel),
            "size": 1000,
            "index": "default",
        },
        "xformers": xf,
        "extra_runtime": list(extra_runtime),
        "notes": [],
        "rejected": [],
        "lock": f"locks/pylock.{cid}.toml",
        "lock_sha256": lock_sha,
        "requirements": f"locks/requirements.{cid}.txt",
        "requested": {"torch": asked[0], "xformers": asked[1]},
    }
    return record, text


def check(
    name: str,
    status: str = "pass",
    *,
    gate: bool = True,
    impl: str | None = None,
    workaround: str | None = None,
    reason: str = "",
    numbers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "group": name.split(".")[0],
        "name": name,
        "status": status,
        "reason": reason if status != "pass" else "",
        "gate": gate,
        "impl": impl,
        "workaround": workaround,
        "numbers": numbers or {},
        "duration_s": 0.5,
    }


ALL_USES = ["inference", "inference-compiled", "training", "training-compiled"]


def check2(
    name: str,
    status: str = "pass",
    *,
    uses: list[str],
    gate: bool = True,
    impl: str | None = None,
    workaround: str | None = None,
    covers: str | None = None,
    reason: str = "",
    numbers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A results/2 check: ``check`` plus the uses it speaks for and the case it covers."""
    return {
        **check(
            name,
            status,
            gate=gate,
            impl=impl,
            workaround=workaround,
            reason=reason,
            numbers=numbers,
        ),
        "uses": uses,
        "covers": covers,
    }


def numeric(error: float, bound: float, sensitivity: float) -> dict[str, Any]:
    return {
        "error": error,
        "bound": bound,
        "sensitivity": sensitivity,
        "sensitivity_ratio": sensitivity / bound,
    }


def direct_and_workarounds(
    name: str,
    status: str,
    uses: list[str],
    workarounds: dict[str, tuple[str, int, float]],
    *,
    reason: str = "",
) -> list[dict[str, Any]]:
    """A direct compiled check and the workarounds re-run on its case: {workaround: (status, breaks, ms)}."""
    out = [
        check2(
            name,
            status,
            uses=uses,
            impl="xformers",
            reason=reason,
            numbers=numeric(0.004 if status == "pass" else 0.9, 0.016, 0.5),
        )
    ]
    for workaround, (w_status, breaks, ms) in sorted(workarounds.items()):
        out.append(
            check2(
                f"{name}.{workaround.replace('-', '_')}",
                w_status,
                uses=uses,
                gate=False,
                impl="sdpa" if workaround == "sdpa-under-compile" else "xformers",
                workaround=workaround,
                covers=name,
                reason="wrong gradients" if w_status != "pass" else "",
                numbers={**numeric(0.003, 0.016, 0.5), "graph_breaks": breaks, "step_ms": ms},
            )
        )
    return out


def checks2(
    *, inference_compiled: list[dict[str, Any]], training_compiled: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A results/2 run: eager inference and training pass; the compiled ones as given."""
    return [
        check2("environment.gpu", uses=ALL_USES),
        check2("environment.xformers.extension_load", uses=ALL_USES),
        check2("environment.versions", gate=False, uses=[]),
        check2(
            "attention.xformers.fp16.bias_bhmn.fwd",
            uses=["inference"],
            impl="xformers",
            numbers=numeric(0.0004, 0.002, 0.31),
        ),
        check2(
            "attention.xformers.bf16.padding.fwd_bwd",
            uses=["training"],
            impl="xformers",
            numbers=numeric(0.004, 0.016, 0.42),
        ),
        check2(
            "model.qwen_image.xformers.train_step",
            uses=["training"],
            impl="xformers",
            numbers=numeric(0.002, 0.016, 0.2),
        ),
        *inference_compiled,
        *training_compiled,
        check2(
            "performance.xformers.bf16.s1024.d64",
            gate=False,
            uses=[],
            impl="xformers",
            numbers={"fwd_bwd_ms_median": 0.6, "fwd_bwd_peak_mib": 280},
        ),
        check2(
            "performance.sdpa.bf16.s1024.d64",
            gate=False,
            uses=[],
            impl="sdpa",
            numbers={"fwd_bwd_ms_median": 0.5, "fwd_bwd_peak_mib": 300},
        ),
    ]


def checks(
    *,
    attention: str = "pass",
    compile_xf: str = "pass",
    sdpa_compile: str = "pass",
    dynamo_disable: str | None = None,
    xf_ms: float = 1.0,
    sdpa_ms: float = 1.3,
    xf_mib: int = 300,
    sdpa_mib: int = 420,
) -> list[dict[str, Any]]:
    return [
        check("environment.import.torch"),
        check("environment.xformers.extension_load"),
        check(
            "attention.fp16.no_bias.xformers",
            attention,
            impl="xformers",
            reason="max abs error 0.31 > 0.002" if attention != "pass" else "",
            numbers={"max_abs_error": 0.31 if attention != "pass" else 0.0004, "tolerance": 0.002},
        ),
        check(
            "attention.bf16.bias_bh.xformers",
            impl="xformers",
            numbers={"max_abs_error": 0.001, "tolerance": 0.01},
        ),
        check(
            "compile.dynamic.xformers",
            compile_xf,
            impl="xformers",
            reason="graph break in memory_efficient_attention" if compile_xf != "pass" else "",
            numbers={"recompiles": 1, "graph_breaks": 0 if compile_xf == "pass" else 3},
        ),
        check(
            "compile.dynamic.sdpa",
            sdpa_compile,
            gate=False,
            impl="sdpa",
            workaround="sdpa-under-compile",
            reason="NaN in output" if sdpa_compile != "pass" else "",
            numbers={"recompiles": 1},
        ),
        *(
            []
            if dynamo_disable is None
            else [
                check(
                    "compile.dynamic.xformers_dynamo_disable",
                    dynamo_disable,
                    gate=False,
                    impl="xformers",
                    workaround="dynamo-disable",
                    reason="" if dynamo_disable == "pass" else "graph break not seen",
                    numbers={"graph_breaks": 1},
                )
            ]
        ),
        check(
            "performance.xformers.bf16.s1024.d64",
            gate=False,
            impl="xformers",
            numbers={"fwd_bwd_ms_median": xf_ms, "fwd_bwd_peak_mib": xf_mib},
        ),
        check(
            "performance.sdpa.bf16.s1024.d64",
            gate=False,
            impl="sdpa",
            numbers={"fwd_bwd_ms_median": sdpa_ms, "fwd_bwd_peak_mib": sdpa_mib},
        ),
    ]


def installed(cid: str) -> dict[str, Any]:
    """What a runner of combination *cid* finds installed: its Python, torch and xformers
    (the facts `lock` checks against the combination; see envbuilder/aggregate/claims.py)."""
    found = re.fullmatch(r"py(\d+\.\d+)-[^-]+-torch([^-]+)(?:-xformers([^-]+))?(?:-cudart)?", cid)
    assert found, cid
    python, torch, xformers = found.groups()
    return {
        "python": f"{python}.10",
        "torch": f"{torch}+cu124",
        "torch_cuda": "12.4",
        "xformers": xformers,
    }


def results(
    cid: str,
    lock_sha: str | None,
    gpu: dict[str, Any],
    day: str,
    check_list: list[dict[str, Any]],
    *,
    suite: str = "1.0.0",
    schema: str = "envbuilder.results/1",
) -> dict[str, Any]:
    return {
        "schema": schema,
        "suite_version": suite,
        "combination": cid,
        "lock_sha256": lock_sha,
        "started": f"2026-11-{day}T10:00:00Z",
        "finished": f"2026-11-{day}T10:04:00Z",
        "runner": {
            "hostname": f"gpu-runner-{day}",
            "platform": "Linux-x86_64",
            **installed(cid),
            "driver": "560.35.03",
            "gpus": [gpu],
        },
        "checks": check_list,
    }


def dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    specs = [
        combo("py3.11-default-torch2.5.1-xformers0.0.28.post3", "3.11", "2.5.1", "0.0.28.post3"),
        combo("py3.11-default-torch2.6.0-xformers0.0.29.post3", "3.11", "2.6.0", "0.0.29.post3"),
        combo(
            "py3.12-default-torch2.7.0-xformers0.0.30-cudart",
            "3.12",
            "2.7.0",
            "0.0.30",
            extra_runtime=("nvidia-cuda-runtime-cu12==12.8.90",),
        ),
        combo(
            "py3.10-default-torch2.4.1-xformers0.0.28.post1",
            "3.10",
            "2.4.1",
            "0.0.28.post1",
            arch="8.0",
        ),
        combo("py3.12-default-torch2.8.0-xformers0.0.32.post2", "3.12", "2.8.0", "0.0.32.post2"),
        combo("py3.11-default-torch2.9.0", "3.11", "2.9.0", None),
        combo("py3.12-default-torch2.10.0-xformers0.0.34", "3.12", "2.10.0", "0.0.34"),
        combo("py3.12-default-torch2.11.0-xformers0.0.35", "3.12", "2.11.0", "0.0.35"),
        combo(
            "py3.13-default-torch2.4.1-xformers0.0.28.post1",
            "3.13",
            None,
            None,
            status="unsatisfiable",
            reason="torch 2.4.1 has no wheel for cp313 (newest Python it supports is 3.12)",
            requested=("2.4.1", "0.0.28.post1"),
        ),
    ]
    records = []
    shas: dict[str, str] = {}
    for record, text in specs:
        records.append(record)
        if text is not None:
            (HERE / "locks").mkdir(exist_ok=True)
            (HERE / record["lock"]).write_text(text, encoding="utf-8")
            shas[record["id"]] = record["lock_sha256"]
    dump(
        HERE / "locks" / "resolution.json",
        {
            "schema": "envbuilder.resolution/1",
            "matrix": "tests/data/matrix.toml",
            "matrix_sha256": fake_sha("matrix"),
            "combinations": records,
        },
    )
    ok, ww, cudart, broken, conflict = (s[0]["id"] for s in specs[:5])
    unsat = specs[-1][0]["id"]
    per_use, cheapest = specs[6][0]["id"], specs[7][0]["id"]
    no_xformers = specs[5][0]["id"]
    good = {
        f"{ok}.h100.json": results(ok, shas[ok], H100, "20", checks()),
        f"{ok}.a100.json": results(
            ok, shas[ok], A100, "21", checks(xf_ms=2.1, sdpa_ms=2.9, xf_mib=310, sdpa_mib=450)
        ),
        f"{ww}.h100.json": results(
            ww,
            shas[ww],
            H100,
            "20",
            checks(compile_xf="fail", dynamo_disable="pass", xf_ms=0.9, sdpa_ms=1.1),
        ),
        f"{cudart}.h100.json": results(
            cudart, shas[cudart], H100, "22", checks(xf_ms=0.8, sdpa_ms=0.85)
        ),
        f"{broken}.a100.json": results(
            broken,
            shas[broken],
            A100,
            "19",
            checks(
                attention="fail", compile_xf="fail", sdpa_compile="fail", xf_ms=2.5, sdpa_ms=2.7
            ),
        ),
        f"{conflict}.h100.run1.json": results(
            conflict, shas[conflict], H100, "23", checks(xf_ms=0.7, sdpa_ms=0.9)
        ),
        f"{conflict}.h100.run2.json": results(
            conflict, shas[conflict], H100, "24", checks(attention="error", xf_ms=0.7, sdpa_ms=0.9)
        ),
    }
    # Broken only for compiled training: of its two failing cases one has a workaround measured
    # on it, the other none (a workaround elsewhere in the group does not count), and one case
    # could not see its padding mask (invalid). Compiled inference passes with the cheaper of two.
    good[f"{per_use}.h100.json"] = results(
        per_use,
        shas[per_use],
        H100,
        "26",
        checks2(
            inference_compiled=direct_and_workarounds(
                "compile.xformers.bf16.causal.fwd.dynamic",
                "fail",
                ["inference-compiled"],
                {"dynamo-disable": ("pass", 1, 2.0), "sdpa-under-compile": ("pass", 0, 1.5)},
                reason="graph break in memory_efficient_attention",
            ),
            training_compiled=[
                *direct_and_workarounds(
                    "compile.xformers.bf16.bias_bhmn.fwd_bwd.dynamic",
                    "fail",
                    ["training-compiled"],
                    {"dynamo-disable": ("pass", 1, 3.1)},
                    reason="grad_q max error 0.9 > bound 0.016",
                ),
                *direct_and_workarounds(
                    "compile.xformers.bf16.padding.fwd_bwd.dynamic",
                    "fail",
                    ["training-compiled"],
                    {},
                    reason="grad_k max error 0.7 > bound 0.016",
                ),
                check2(
                    "compile.sdpa.fp16.padding.fwd_bwd.static",
                    "invalid",
                    uses=["training-compiled"],
                    impl="sdpa",
                    reason="the output without the padding mask is within 1.5x the bound",
                    numbers=numeric(0.0005, 0.002, 0.003),
                ),
            ],
        ),
        suite="2.0.0",
        schema="envbuilder.results/2",
    )
    # Every failing compiled case has two working workarounds: the cheaper one is named.
    good[f"{cheapest}.h100.json"] = results(
        cheapest,
        shas[cheapest],
        H100,
        "27",
        checks2(
            inference_compiled=direct_and_workarounds(
                "compile.xformers.fp16.block_diagonal.fwd.dynamic",
                "fail",
                ["inference-compiled"],
                {"dynamo-disable": ("pass", 0, 1.2), "sdpa-under-compile": ("pass", 0, 1.4)},
                reason="recompiled on every new sequence length",
            ),
            training_compiled=direct_and_workarounds(
                "compile.xformers.bf16.bias_b1mn_expanded.fwd_bwd.dynamic",
                "fail",
                ["training-compiled"],
                {"dynamo-disable": ("pass", 2, 4.0), "sdpa-under-compile": ("pass", 0, 5.0)},
                reason="NaN in grad_v",
            ),
        ),
        suite="2.0.0",
        schema="envbuilder.results/2",
    )
    # A run for an unsatisfiable combination: evidence for the resolver's reason, no lock.
    good[f"{unsat}.h100.json"] = results(unsat, None, H100, "25", checks(attention="error"))
    for name, data in good.items():
        dump(HERE / "results" / name, data)
    # Runs on older locks (the lock moved since): stale evidence, kept but not counted.
    stale = {
        f"{ok}.h100.older-lock.json": results(ok, fake_sha("an older lock"), H100, "18", checks()),
        f"{no_xformers}.h100.older-lock.json": results(
            no_xformers, fake_sha("an older lock of torch 2.9.0"), H100, "12", checks()
        ),
        f"{no_xformers}.a100.oldest-lock.json": results(
            no_xformers,
            fake_sha("the oldest lock of torch 2.9.0"),
            A100,
            "05",
            checks(attention="fail"),
        ),
    }
    for name, data in stale.items():
        dump(HERE / "stale_results" / name, data)
    bad = {
        "newer-suite.json": results(ok, shas[ok], H100, "18", checks(), suite="4.0.0"),
        "newer-schema.json": results(
            ok, shas[ok], H100, "18", checks(), schema="envbuilder.results/4"
        ),
        "invalid-in-results1.json": results(
            ok,
            shas[ok],
            H100,
            "18",
            [check("attention.x", "invalid", reason="results/1 has no invalid status")],
        ),
        "covers-unknown-check.json": results(
            cheapest,
            shas[cheapest],
            H100,
            "18",
            [
                check2("environment.gpu", uses=ALL_USES),
                check2(
                    "compile.x.dynamo_disable",
                    gate=False,
                    uses=["training-compiled"],
                    workaround="dynamo-disable",
                    covers="compile.x",
                ),
            ],
            suite="2.0.0",
            schema="envbuilder.results/2",
        ),
        "workaround-without-covers.json": results(
            cheapest,
            shas[cheapest],
            H100,
            "18",
            [
                check2("environment.gpu", uses=ALL_USES),
                check2(
                    "compile.x.dynamo_disable",
                    gate=False,
                    uses=["training-compiled"],
                    workaround="dynamo-disable",
                ),
            ],
            suite="2.0.0",
            schema="envbuilder.results/2",
        ),
        "results2-without-uses.json": results(
            cheapest,
            shas[cheapest],
            H100,
            "18",
            [check("environment.gpu")],
            suite="2.0.0",
            schema="envbuilder.results/2",
        ),
        "null-lock.json": results(ok, None, H100, "18", checks()),
        "undated.json": {
            **results(ok, shas[ok], H100, "18", checks()),
            "finished": "last Tuesday",
        },
        "unsatisfiable-with-lock.json": results(unsat, shas[ok], H100, "18", checks()),
        "bad-status.json": results(
            ok, shas[ok], H100, "18", [check("attention.x", "passed", reason="not a status")]
        ),
    }
    for name, data in bad.items():
        dump(HERE / "bad_results" / name, data)
    # A row the matrix no longer has (a selector run, a matrix.toml change): retired, kept.
    retired = "py3.9-cu999-torch0.1"
    dump(
        HERE / "retired_results" / f"{retired}.h100.json",
        results(retired, fake_sha("the last lock of torch 0.1"), H100, "18", checks()),
    )
    text = json.dumps(good[f"{ok}.h100.json"], indent=2, sort_keys=True)
    (HERE / "bad_results" / "truncated.json").write_text(text[: len(text) // 2], encoding="utf-8")
    # json.loads recurses per level: this one exhausts the interpreter's stack
    (HERE / "bad_results" / "deeply-nested.json").write_text("[" * 100_000, encoding="utf-8")


if __name__ == "__main__":
    main()
