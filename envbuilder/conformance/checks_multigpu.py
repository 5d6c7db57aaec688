"""Every visible GPU, and data-parallel training across two of them.

The attention checks run on each GPU (a faulty or differently configured card
shows up by index), and a two-process DistributedDataParallel step over NCCL
trains a transformer block that uses xformers' attention: gradients must equal
the average of each rank's own gradients (fp32 master weights, bf16 autocast;
equal to 1e-5 relative, the reduction order being the only difference) and the
parameters must be bitwise identical on both ranks after the optimiser step.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0) unless the caller set it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec, Impl, Number, Outcome

__all__ = ["specs"]


def per_gpu_attention(ctx: Context, impl: Impl, index: int) -> Outcome:
    from envbuilder.conformance.checks_attention import correctness

    local = Context(device=f"cuda:{index}", quick=True)
    problems: list[str] = []
    numbers: dict[str, Number] = {
        "gpu": torch.cuda.get_device_name(index),
        "device": local.device,
    }
    for mask in ("causal", "bias"):
        outcome = correctness(local, impl, mask, "bf16", True)
        numbers[f"{mask}_bf16_status"] = outcome.status
        numbers[f"{mask}_bf16_error"] = outcome.numbers.get("error")
        numbers[f"{mask}_bf16_bound"] = outcome.numbers.get("bound")
        if outcome.status != "pass":
            problems.append(f"{mask} bf16: {outcome.reason}")
    return Outcome.judge(problems, numbers)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from envbuilder.conformance._block import Block, attn_xformers

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank)
        torch.manual_seed(0)
        model = Block(256, 4, attn_xformers).to(device)
        plain = Block(256, 4, attn_xformers).to(device)
        plain.load_state_dict(model.state_dict())
        ddp = DistributedDataParallel(model, device_ids=[rank])
        gen = torch.Generator(device="cpu").manual_seed(100 + rank)
        x = torch.randn(2, 128, 256, generator=gen).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ddp(x).float().pow(2).mean().backward()
            plain(x).float().pow(2).mean().backward()
        worst = 0.0
        for p_ddp, p_plain in zip(model.parameters(), plain.parameters(), strict=True):
            assert p_ddp.grad is not None and p_plain.grad is not None
            local = p_plain.grad.clone()
            dist.all_reduce(local)
            local /= world
            scale = float(local.abs().max().item()) or 1.0
            worst = max(worst, float((p_ddp.grad - local).abs().max().item()) / scale)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        identical = all(torch.equal(gathered[0], g) for g in gathered[1:])
        if rank == 0:
            Path(out).write_text(
                json.dumps(
                    {
                        "grad_rel_diff_max": worst,
                        "params_identical": identical,
                        "world_size": world,
                        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                    }
                ),
                encoding="utf-8",
            )
    finally:
        dist.destroy_process_group()


def ddp_step(ctx: Context) -> Outcome:
    from torch.multiprocessing.spawn import spawn

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ddp.json"
        start = time.perf_counter()
        spawn(_ddp_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
        elapsed = time.perf_counter() - start
        data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    numbers: dict[str, Number] = {
        **data,
        "seconds": round(elapsed, 2),
        "rule": "grad rel diff <= 1e-5",
    }
    problems = []
    if not data["grad_rel_diff_max"] <= 1e-5:
        problems.append(
            f"DDP gradients differ from the ranks' averaged gradients by {data['grad_rel_diff_max']:.3g} (relative)"
        )
    if not data["params_identical"]:
        problems.append("parameters differ between ranks after the optimiser step")
    return Outcome.judge(problems, numbers)


def specs(ctx: Context) -> list[CheckSpec]:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out: list[CheckSpec] = []
    impls: tuple[Impl, ...] = ("xformers", "sdpa")
    for impl in impls:
        if count == 0:
            out.append(
                CheckSpec(
                    name=f"multigpu.attention.{impl}.each_gpu",
                    gate=True,
                    uses=("inference", "training"),
                    impl=impl,
                    needs=frozenset({"cuda"}),
                    run=partial(per_gpu_attention, ctx, impl, 0),
                )
            )
        for index in range(count):
            out.append(
                CheckSpec(
                    name=f"multigpu.attention.{impl}.cuda{index}",
                    gate=True,
                    uses=("inference", "training"),
                    impl=impl,
                    needs=frozenset({"cuda"}),
                    run=partial(per_gpu_attention, ctx, impl, index),
                )
            )
    out.append(
        CheckSpec(
            name="multigpu.ddp.xformers",
            gate=True,
            uses=("training",),
            impl="xformers",
            needs=frozenset({"cuda", "gpus2"}),
            run=partial(ddp_step, ctx),
        )
    )
    return out
