"""The code of the generated scripts, as text: each piece restates one part of the suite
(`envbuilder.conformance`) with only torch, xformers and diffusers imported.

``script.render`` puts a header and a block of constants in front of the pieces a
check needs. Keep each piece in step with the suite function it names.
"""

from __future__ import annotations

__all__ = [
    "ATTENTION_IMPL",
    "ATTENTION_MAIN",
    "COMMON",
    "COMPILE_MAIN",
    "DISABLED",
    "DROPOUT",
    "ENTRY",
    "IMPORTS",
    "INPUTS",
    "MASKS",
    "MODEL",
    "REFERENCE",
]

IMPORTS = """
import math
import re
import sys
import traceback

import torch
"""

#: tolerance.py, the verdict of tolerance.assess, and how the script ends
COMMON = '''
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# The tolerance rule: a result's largest absolute error against the same computation in
# float64 must be at most max(K x the error of the plain math path in the same dtype,
# FLOOR[dtype]); the nearest plausible wrong answer (the mask dropped, ...) must lie at
# least SENSITIVITY_RATIO bounds from the reference, or the check cannot tell them apart.
K = 3.0
FLOOR = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-5, "float64": 1e-10}
SENSITIVITY_RATIO = 4.0
DTYPE = DTYPES[DTYPE_NAME]


def bound(math_error, dtype_name):
    return max(K * math_error, FLOOR[dtype_name])


def max_abs_error(got, ref):
    return float((got.double() - ref.double()).abs().max().item())


def nonfinite(t):
    return int((~torch.isfinite(t)).sum().item())


def error_line(error):
    """The exception's type and the first line of its message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def compare(what, error, math_error, dtype_name, sensitivity):
    c = {
        "what": what,
        "error": error,
        "bound": bound(math_error, dtype_name),
        "sensitivity": sensitivity,
        "math_error": math_error,
    }
    print(
        f"  {what}: error {error:.3g}, bound {c['bound']:.3g} (math path {math_error:.3g}),"
        f" wrong answer at {sensitivity:.3g}"
    )
    return c


def ratio(c):
    if c["error"] != c["error"]:  # NaN: the worst possible
        return math.inf
    return c["error"] / c["bound"] if c["bound"] > 0 else math.inf


def assess(comparisons, problems, wrong):
    """(status, reason, worst comparison): pass, fail or invalid, as the suite decides."""
    found = list(problems)
    for c in comparisons:
        if not c["error"] <= c["bound"]:  # NaN compares False
            math_part = "" if c["math_error"] is None else f" (math path {c['math_error']:.3g})"
            found.append(f"{c['what']} error {c['error']:.3g} > bound {c['bound']:.3g}{math_part}")
    if not comparisons:
        return "fail", "; ".join(found or ["nothing was compared"]), None
    worst = max(comparisons, key=ratio)
    if found:
        return "fail", "; ".join(found), worst
    seen = worst["sensitivity"] / worst["bound"] if worst["bound"] > 0 else math.inf
    if not seen >= SENSITIVITY_RATIO:
        return "invalid", (
            f"{worst['what']}: the wrong answer ({wrong}) lies {worst['sensitivity']:.3g} from"
            f" the reference, {seen:.2f} x the bound {worst['bound']:.3g} (at least"
            f" {SENSITIVITY_RATIO:g} x needed): this check cannot tell it from right"
        ), worst
    return "pass", "", worst


def _kind(text):
    """A failure's first clause with its numbers blanked, to tell one failure from another."""
    return re.sub(r"\\d+(\\.\\d+)?(e[-+]?\\d+)?", "#", text.split(" | ")[0].split("; ")[0])


def finish(status, reason, worst=None):
    """Print the verdict line; exit status 1 when the recorded failure reproduces."""
    recorded = f"{RECORDED_STATUS}: {RECORDED_REASON}" if RECORDED_REASON else RECORDED_STATUS
    if status == "pass":
        detail = ""
        if worst is not None:
            detail = (
                f" (worst: {worst['what']}: error {worst['error']:.3g} <= bound"
                f" {worst['bound']:.3g})"
            )
        print(f"recorded on {FAILED_ON}: {recorded}")
        print(f"NOT REPRODUCED: {CHECK} passes here{detail}")
        return 0
    line = reason.split(" | ")[0]
    if _kind(reason) == _kind(RECORDED_REASON):
        print(f"recorded on {FAILED_ON}: the same failure")
    else:
        print(f"recorded on {FAILED_ON}: {recorded}")
    print(f"REPRODUCED: {CHECK}: {status}: {line}")
    return 1
'''

#: _attn.make_inputs, Inputs.to / wrong, mask_input, run_attention; checks_attention.grad_out
INPUTS = '''

def aligned(t):
    """``t`` in storage whose rows are padded to a multiple of 8, as xformers requires."""
    n = t.shape[-1]
    buf = torch.zeros(*t.shape[:-1], (n + 7) // 8 * 8, dtype=t.dtype, device=t.device)
    buf[..., :n].copy_(t)
    return buf[..., :n]


def label(case):
    extra = f" seqlens={list(case['seqlens'])}" if case["seqlens"] else ""
    return f"B{case['B']} M{case['M']} N{case['N']} H{case['H']} K{case['K']} {case['mask']}{extra}"


def make_inputs(case, dtype, seed, scale=1.0, v_offset=0.0):
    """Random BMHK inputs from a CPU generator, rounded to ``dtype``; the mask's tensors."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dtype)

    b, m, n, h, k = (case[x] for x in "BMNHK")
    q = rand(b, m, h, k) * scale
    key = rand(b, n, h, k) * scale
    v = rand(b, n, h, k) + v_offset
    bias = keep = None
    if case["mask"] == "bias":  # a dense [B,H,M,N] bias
        bias = aligned(rand(b, h, m, n))
    elif case["mask"] in ("bias_b1mn", "bias_expanded"):
        bias = aligned(rand(b, 1, m, n))
    elif case["mask"] == "padding":  # key padding: a third to a half of each row's keys
        keep = torch.ones(b, n, dtype=torch.bool, device=DEVICE)
        for i in range(b):
            keep[i, n - (n // 3 + (i % 2) * (n // 6)) :] = False
    return dict(q=q.to(dtype), k=key.to(dtype), v=v.to(dtype), bias=bias, keep=keep, case=case)


def to_dtype(inp, dtype):
    bias = None if inp["bias"] is None else aligned(inp["bias"].to(dtype))
    return dict(inp, q=inp["q"].to(dtype), k=inp["k"].to(dtype), v=inp["v"].to(dtype), bias=bias)


def wrong_inputs(inp):
    """The nearest plausible wrong answer's inputs, and what it is."""
    mask = inp["case"]["mask"]
    if mask == "none":
        return dict(inp, case=dict(inp["case"], mask="causal")), "causal"
    if mask in ("causal", "blockdiag"):
        return dict(inp, case=dict(inp["case"], mask="none")), f"{mask} mask dropped"
    if mask == "padding":
        return dict(inp, keep=torch.ones_like(inp["keep"])), "padding mask dropped"
    return dict(inp, bias=aligned(torch.zeros_like(inp["bias"]))), "bias dropped"


def mask_input(kernel, inp):
    """What a training loop hands ``kernel``'s attention for the mask kind."""
    case = inp["case"]
    if case["mask"] == "blockdiag":
        if kernel == "xformers":
            return case["seqlens"]
        return torch.repeat_interleave(  # segment ids, as packed-batch collators give them
            torch.arange(len(case["seqlens"]), device=inp["q"].device),
            torch.tensor(case["seqlens"], device=inp["q"].device),
        )
    if case["mask"] == "padding":
        return inp["keep"]
    if case["mask"] in ("bias", "bias_b1mn", "bias_expanded"):
        return inp["bias"]
    return None


def grad_out(case, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (case["B"], case["M"], case["H"], case["K"])
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE)


def run_attention(fn, kernel, inp, grad, bias_grad=False):
    """Forward under no_grad (``grad`` None), or forward and backward: out (dq, dk, dv, dbias)."""
    m = mask_input(kernel, inp)
    if grad is None:
        with torch.no_grad():
            return {"out": fn(inp["q"], inp["k"], inp["v"], m).detach()}
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inp["q"], inp["k"], inp["v"]))
    if bias_grad:
        m = aligned(m.detach()).requires_grad_(True)
    out = fn(q, k, v, m)
    out.backward(grad.to(out.dtype))
    result = {"out": out.detach()}
    for name, t in (("dq", q), ("dk", k), ("dv", v)) + ((("dbias", m),) if bias_grad else ()):
        assert t.grad is not None, f"no gradient reached {name}"
        result[name] = t.grad.detach()
    return result


def is_refusal(error):
    """An implementation turning its inputs down (xformers or SDPA has no kernel for them)."""
    seen = error
    while seen is not None:
        if "No operator found" in str(seen) or "No available kernel" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
'''

#: _attn.math_fn and checks_attention.compare_attention
REFERENCE = '''

def math_attention(mask):
    """The textbook attention in the inputs' dtype (float64 for the reference)."""

    def fn(q, k, v, m):
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        scores = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        allowed = None
        if mask == "causal":
            allowed = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
        elif mask == "blockdiag":
            allowed = m[:, None] == m[None, :]
        elif mask == "padding":
            allowed = m[:, None, None, :]
        elif mask != "none":
            scores = scores + m
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        return (scores.softmax(dim=-1) @ vh).transpose(1, 2)

    return fn


def compare_attention(got, inp, grad, bias_grad, problems):
    """Each tensor against float64, with the math path's error and the wrong answer's distance."""
    mask = inp["case"]["mask"]
    ref = run_attention(math_attention(mask), "math", to_dtype(inp, torch.float64), grad, bias_grad)
    low = run_attention(math_attention(mask), "math", inp, grad, bias_grad)
    wrong_inp, wrong = wrong_inputs(to_dtype(inp, torch.float64))
    off = run_attention(
        math_attention(wrong_inp["case"]["mask"]), "math", wrong_inp, grad, bias_grad
    )
    found = []
    for name, value in got.items():
        bad = nonfinite(value)
        if bad:
            problems.append(f"{name} has {bad} NaN/inf values at {label(inp['case'])}")
            continue
        found.append(
            compare(
                f"{name} at {label(inp['case'])}",
                max_abs_error(value, ref[name]),
                max_abs_error(low[name], ref[name]),
                str(DTYPE).removeprefix("torch."),
                max_abs_error(off[name], ref[name]),
            )
        )
    return found, wrong
'''

#: _attn._xformers / _attn._sdpa, one function per (implementation, mask kind)
ATTENTION_IMPL: dict[tuple[str, str], str] = {
    ("sdpa", "none"): "attn_mask = None",
    ("sdpa", "causal"): "attn_mask = None  # is_causal=True below",
    ("sdpa", "blockdiag"): "attn_mask = m[:, None] == m[None, :]  # from segment ids",
    ("sdpa", "bias"): "attn_mask = m  # [B,H,M,N]",
    ("sdpa", "bias_b1mn"): "attn_mask = m  # [B,1,M,N] as it is",
    ("sdpa", "bias_expanded"): "attn_mask = m.expand(b, h, q.shape[1], n)",
    ("sdpa", "padding"): (
        "# key padding as an additive [B,1,1,N] bias (lowest value where padded), as\n"
        "    # transformers' _prepare_4d_attention_mask and diffusers build it\n"
        "    attn_mask = torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill(\n"
        "        ~m, torch.finfo(q.dtype).min\n"
        "    )[:, None, None, :]"
    ),
    ("xformers", "none"): "bias = None",
    ("xformers", "causal"): "bias = fmha.attn_bias.LowerTriangularMask()",
    ("xformers", "blockdiag"): "bias = fmha.attn_bias.BlockDiagonalMask.from_seqlens(list(m))",
    ("xformers", "bias"): "bias = m  # [B,H,M,N]",
    ("xformers", "bias_b1mn"): "bias = m  # [B,1,M,N] as it is",
    ("xformers", "bias_expanded"): "bias = m.expand(b, h, q.shape[1], n)",
    ("xformers", "padding"): (
        "# key padding as an additive bias (lowest value where padded), rows starting on\n"
        "    # 8-element boundaries in storage as xformers' kernels need, expanded to [B,H,M,N]\n"
        "    width = (n + 7) // 8 * 8\n"
        "    buf = torch.zeros(b, 1, 1, width, dtype=q.dtype, device=q.device)\n"
        "    buf[..., :n] = torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill(\n"
        "        ~m, torch.finfo(q.dtype).min\n"
        "    )[:, None, None, :]\n"
        "    bias = buf[..., :n].expand(b, h, q.shape[1], n)"
    ),
}

SDPA_FN = '''

def attention(q, k, v, m):
    """SDPA on BMHK tensors, the mask built inside (as a model's forward builds it)."""
    b, n, h = k.shape[0], k.shape[1], q.shape[2]
    {build}
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=attn_mask,
        is_causal={causal},
    )
    return out.transpose(1, 2)
'''

XFORMERS_FN = '''

def attention(q, k, v, m):
    """xformers' memory-efficient attention, the mask built inside (as a model builds it)."""
    import xformers.ops as xops
    from xformers.ops import fmha

    b, n, h = k.shape[0], k.shape[1], q.shape[2]
    {build}
    return xops.memory_efficient_attention(q, k, v, attn_bias=bias)
'''

#: checks_attention.correctness (and b1mn_bias, where a loud rejection passes)
ATTENTION_MAIN = """

def main():
    print(f"{CHECK}: eager {IMPL} attention, mask {MASK}, {DTYPE_NAME}, "
          f"{'forward + backward' if BACKWARD else 'forward under no_grad'}, on {DEVICE}")
    problems, unsupported, comparisons, wrong = [], [], [], ""
    for case in CASES:
        inp = make_inputs(case, DTYPE, case["seed"])
        grad = grad_out(case, case["grad_seed"]) if BACKWARD else None
        bias_grad = BACKWARD and MASK == "bias"  # a dense bias is learnt: its gradient too
        print(f"case {label(case)} (seed {case['seed']}, grad seed {case['grad_seed']}):")
        try:
            try:
                got = run_attention(attention, IMPL, inp, grad, bias_grad)
            except (NotImplementedError, RuntimeError) as e:
                if not (bias_grad and is_refusal(e)):
                    raise
                print(f"  bias gradient not supported, compared without it: {error_line(e)}")
                bias_grad = False
                got = run_attention(attention, IMPL, inp, grad)
        except (NotImplementedError, RuntimeError, ValueError) as e:
            if REJECTION_PASSES:
                traceback.print_exc()
                print(f"  rejected loudly: {error_line(e)}")
                return finish("pass", "")
            if isinstance(e, ValueError) or not is_refusal(e):
                raise
            traceback.print_exc()
            unsupported.append(f"{label(case)}: {error_line(e)}")
            print(f"  no kernel accepted it: {error_line(e)}")
            continue
        found, wrong = compare_attention(got, inp, grad, bias_grad, problems)
        comparisons += found
    if unsupported and len(unsupported) == len(CASES):
        problems.append("no kernel accepted any of the inputs: " + unsupported[0][:500])
    status, reason, worst = assess(comparisons, problems, wrong)
    if REJECTION_PASSES and status == "fail":
        reason = "a [B,1,M,N] bias is accepted but gives wrong results: " + reason
    return finish(status, reason, worst)
"""

#: checks_compile.compile_check
COMPILE_MAIN = """

def main():
    from collections import Counter

    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    print(f"{CHECK}: torch.compile({IMPL} attention, dynamic={DYNAMIC}, fullgraph={FULLGRAPH}),"
          f" mask {MASK}, {DTYPE_NAME}, "
          f"{'forward + backward' if BACKWARD else 'forward under no_grad'}, on {DEVICE}")
    for name, value in COMPILE_LIMITS.items():  # the suite never lets a limit hide a recompile
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)
    graphs = [0]

    def counting_backend(gm, example_inputs):  # inductor, counting the graphs it compiles
        graphs[0] += 1
        return compile_fx(gm, example_inputs)

    disabled, target = None, attention
    if WORKAROUND == "dynamo-disable":  # a compiled layer calling the disabled attention
        disabled = Disabled(KERNEL)
        target = projected(disabled.wrap(attention))
    compiled = torch.compile(target, backend=counting_backend, dynamic=DYNAMIC, fullgraph=FULLGRAPH)

    def versions():  # compiled versions of the attention function (or layer) itself
        return len(_debug_get_cache_entry_list(target.__code__))

    def graph_breaks():
        return Counter({str(k): int(v) for k, v in counters["graph_break"].items()})

    problems, comparisons, wrong = [], [], ""
    breaks_before = graph_breaks()
    try:
        for pass_no in (1, 2):  # the second pass runs the same shapes again: no compiling then
            if pass_no == 2:
                first_pass, graphs_compiled = versions(), graphs[0]
            if disabled is not None:  # the first pass gathers the workaround's evidence
                disabled.watching = pass_no == 1
            for case in CASES:
                inp = make_inputs(case, DTYPE, case["seed"])
                grad = grad_out(case, case["grad_seed"]) if BACKWARD else None
                bias_grad = BACKWARD and MASK == "bias"
                if pass_no == 1:
                    print(f"case {label(case)} (seed {case['seed']}, grad seed {case['grad_seed']}):")
                got = run_attention(compiled, KERNEL, inp, grad, bias_grad)
                if pass_no == 1:
                    found, wrong = compare_attention(got, inp, grad, bias_grad, problems)
                    comparisons += found
    except Exception as e:  # the compiler refusing the code is the finding
        traceback.print_exc()
        status, reason = "fail", f"compiled attention failed: {error_line(e)}"
        if disabled is not None:
            breaks = sum((graph_breaks() - breaks_before).values())
            print(f"graph breaks: {breaks}")
            status, reason, _ = disabled.settle(breaks, status, reason, None)
        return finish(status, reason)
    if disabled is not None:
        disabled.watching = False
    again = versions() - first_pass
    new_breaks = graph_breaks() - breaks_before
    breaks = sum(new_breaks.values())
    reasons = " || ".join(f"{n} x {r.splitlines()[0]}" for r, n in new_breaks.items())
    allowed = 1 if DYNAMIC else len(CASES)
    print(f"graph breaks: {breaks} {reasons}".rstrip())
    print(f"compiled versions: {first_pass} (at most {allowed}), graphs compiled: {graphs_compiled},"
          f" recompiled on shapes already seen: {again}")
    if breaks and disabled is None:  # the workaround's break at the disabled call is by design
        problems.append(f"{breaks} graph break(s): {reasons[:400]}")
    if again:
        problems.append(f"recompiled {again} time(s) on shapes already compiled (recompiles without end)")
    if first_pass > allowed:
        problems.append(
            f"compiled {first_pass} versions for {len(CASES)} shape(s)"
            f" ({'dynamic' if DYNAMIC else 'static'}; at most {allowed} expected)"
        )
    status, reason, worst = assess(comparisons, problems, wrong)
    if disabled is not None:
        status, reason, worst = disabled.settle(breaks, status, reason, worst)
    return finish(status, reason, worst)
"""

#: _workaround.disable, projected, Disabled and settle: the dynamo-disable workaround as
#: users apply it, and the evidence that it was applied
DISABLED = '''

def is_kernel_op(kernel, name):
    """Whether a dispatched operator is the kernel's: xformers' own namespaces and the aten
    memory-efficient operators it calls; SDPA's fused operators (or, on its math path, the
    softmax it computes)."""
    if "::" in name:
        namespace, _, rest = name.partition("::")
    else:
        namespace, _, rest = name.partition(".")
    op = rest.split(".", 1)[0]
    if kernel == "xformers":
        return (namespace.startswith("xformers") or namespace == "flash_attn_3"
                or (namespace == "aten" and op in ("_efficient_attention_forward",
                                                   "_efficient_attention_backward")))
    return namespace == "aten" and (op.startswith("_scaled_dot_product")
                                    or op in ("_safe_softmax", "_softmax"))


def disable(fn):
    """``fn`` behind torch.compiler.disable (torch._dynamo.disable on older torch)."""
    compiler = getattr(torch, "compiler", None)
    return (getattr(compiler, "disable", None) or torch._dynamo.disable)(fn)


def compiling():
    compiler = getattr(torch, "compiler", None)
    return bool((getattr(compiler, "is_compiling", None) or torch._dynamo.is_compiling)())


def projected(attention):
    """A model's attention layer around ``attention``: input projections of q, k and v, the
    attention call, an output projection (by the reversal permutation: exact in every dtype,
    the scores unchanged), so the layer computes what ``attention`` computes."""

    def layer(q, k, v, m):
        perm = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device).flip(0)
        out = attention(q @ perm, k @ perm, v @ perm, m)
        return out @ perm

    return layer


class Disabled:
    """An attention function behind the disable, counting its eager calls and (while
    ``watching``) the kernel's operators those calls dispatched; a call made while dynamo
    traces (the disable did not hold) counts nothing."""

    def __init__(self, kernel):
        self.kernel, self.calls, self.ops, self.watching = kernel, 0, 0, False

    def wrap(self, fn):
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if is_kernel_op(tracker.kernel, str(func)):
                    tracker.ops += 1
                return func(*args, **(kwargs or {}))

        def outside_graph(*args, **kwargs):
            if compiling():
                return fn(*args, **kwargs)
            tracker.calls += 1
            if not tracker.watching:
                return fn(*args, **kwargs)
            with Count():
                return fn(*args, **kwargs)

        return disable(outside_graph)

    def settle(self, graph_breaks, status, reason, worst):
        """The outcome with the evidence: ``invalid`` when the disable was not applied."""
        missing = []
        if graph_breaks < 1:
            missing.append("dynamo broke no graph at the disabled call")
        if self.calls < 1:
            missing.append("the disabled attention function never ran outside compiled code")
        elif self.ops < 1:
            missing.append(f"no {self.kernel} operator ran from the disabled function")
        print(f"workaround dynamo-disable: {graph_breaks} graph break(s), {self.calls} eager"
              f" call(s) of the disabled attention, {self.ops} {self.kernel} operator call(s)"
              " outside the compiled graph in the evidence step")
        if missing:
            found = f" (the run found: {reason})" if reason else ""
            return "invalid", f"workaround not applied: {'; '.join(missing)}{found}", worst
        return status, reason, worst
'''

#: _dropout.dropout_check and dropout_statistics
DROPOUT = '''

def attention(q, k, v):
    {body}


def dropout_statistics(out, q, k, v, p):
    """The mean and the mean square of (out - the p = 0 output) against their expectations."""
    qh, kh, vh = (t.double().transpose(1, 2) for t in (q, k, v))
    probs = ((qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])).softmax(-1)
    o0 = probs @ vh
    d = out.double().transpose(1, 2) - o0
    c = p / (1 - p)
    p2 = probs**2
    rows, width = d.shape[0] * d.shape[1] * d.shape[2], d.shape[3]
    var_rowsum = c * (p2 @ vh.sum(-1, keepdim=True) ** 2)
    sigma_mean = math.sqrt(float(var_rowsum.sum())) / (rows * width)
    expected_sq = c * (p2 @ (vh**2).sum(-1, keepdim=True))
    gram2 = (vh @ vh.transpose(-1, -2)) ** 2
    var_sq = 2 * c**2 * ((p2 @ gram2) * p2).sum(-1)
    total = float(expected_sq.sum())
    ratio_ = float((d**2).sum()) / total
    sigma_ratio = math.sqrt(float(var_sq.sum())) / total
    return [
        {"what": "mean of (out - p=0 output)", "error": abs(float(d.mean())),
         "bound": STD_DEVIATIONS * sigma_mean, "sensitivity": abs(p * float(o0.mean())),
         "math_error": None},
        {"what": "mean square of (out - p=0 output) / its expectation",
         "error": abs(ratio_ - 1.0), "bound": STD_DEVIATIONS * sigma_ratio, "sensitivity": 1.0,
         "math_error": None},
    ]


def main():
    print(f"{CHECK}: {IMPL} attention with dropout p={P} in training mode,"
          f" {'compiled (dynamic=False)' if COMPILED else 'eager'}, {DTYPE_NAME}, on {DEVICE}")
    b, m, n, h, k = (CASE[x] for x in "BMNHK")
    gen = torch.Generator(device="cpu").manual_seed(31)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, DTYPE)

    q0, k0, v0 = rand(b, m, h, k) * 1.0, rand(b, n, h, k) * 1.0, rand(b, n, h, k) + 0.5
    from torch._dynamo.utils import counters

    fn, disabled = attention, None
    if WORKAROUND == "dynamo-disable":  # a compiled layer calling the disabled attention
        disabled = Disabled(IMPL)
        layer = projected(disabled.wrap(lambda q, k, v, m: attention(q, k, v)))

        def fn(q, k, v):
            return layer(q, k, v, None)

    breaks_before = sum(counters["graph_break"].values())
    runner = torch.compile(fn, dynamic=False) if COMPILED else fn
    gen = torch.Generator(device="cpu").manual_seed(32)
    grad = torch.randn(b, m, h, k, generator=gen).to(DEVICE, DTYPE)
    outs, problems = [], []
    try:
        for repeat in range(3):
            torch.manual_seed(1234)
            q, key, v = (t.detach().clone().requires_grad_(True) for t in (q0, k0, v0))
            if disabled is not None:  # the first run gathers the workaround's evidence
                disabled.watching = repeat == 0
            out = runner(q, key, v)
            out.backward(grad)
            outs.append(out.detach())
            if repeat == 0:
                bad = sum(nonfinite(t.grad) for t in (q, key, v) if t.grad is not None)
                if bad:
                    problems.append(f"{bad} NaN/inf values in the gradients")
    except Exception as e:  # the kernel or the compiler refusing dropout is the finding
        traceback.print_exc()
        status, reason = "fail", f"dropout in training mode failed: {error_line(e)}"
        if disabled is not None:
            breaks = sum(counters["graph_break"].values()) - breaks_before
            status, reason, _ = disabled.settle(breaks, status, reason, None)
        return finish(status, reason)
    breaks = sum(counters["graph_break"].values()) - breaks_before
    print(f"graph breaks: {breaks}")
    if not all(torch.equal(o, outs[0]) for o in outs[1:]):
        problems.append("two runs after torch.manual_seed with one seed differ")
    if nonfinite(outs[0]):
        problems.append(f"{nonfinite(outs[0])} NaN/inf values in the output")
    comparisons = dropout_statistics(outs[0], q0, k0, v0, P)
    for c in comparisons:
        print(f"  {c['what']}: {c['error']:.3g}, bound {c['bound']:.3g} ({STD_DEVIATIONS:g} sd),"
              f" wrong answer at {c['sensitivity']:.3g}")
    status, reason, worst = assess(
        comparisons, problems, "p = 0, no dropout (for the mean: no 1/(1-p) rescale)"
    )
    if disabled is not None:
        status, reason, worst = disabled.settle(breaks, status, reason, worst)
    return finish(status, reason, worst)
'''

DROPOUT_BODY = {
    "xformers": (
        "import xformers.ops as xops\n\n    return xops.memory_efficient_attention(q, k, v, p=P)"
    ),
    "sdpa": (
        "out = torch.nn.functional.scaled_dot_product_attention(\n"
        "        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=P\n"
        "    )\n"
        "    return out.transpose(1, 2)"
    ),
}

#: checks_model.model_check
MODEL = '''
import copy


def build_model():
    """The Qwen-Image transformer at a tiny random config (no weights are downloaded)."""
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**CONFIG)
    model.eval()
    # scaled up so that the attention's output (and its mask) decides the output
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(("attn.to_out.0", "attn.to_add_out")):
                module.weight.mul_(ATTENTION_GAIN)
    return model


def make_inputs(dtype):
    """Two prompts padded to TEXT tokens (a text padding mask) and a latent of image tokens."""
    batch, side = 2, IMAGE_SIDE
    gen = torch.Generator(device="cpu").manual_seed(3)
    mask = torch.ones(batch, TEXT, dtype=torch.bool)
    mask[0, TEXT // 4 :] = False
    mask[1, 4:] = False
    prompts = torch.randn(batch, TEXT, CONFIG["joint_attention_dim"], generator=gen)
    prompts[~mask] = torch.randn(CONFIG["joint_attention_dim"], generator=gen)  # one pad token
    return {
        "hidden_states": torch.randn(
            batch, side * side, CONFIG["in_channels"], generator=gen
        ).to(DEVICE, dtype),
        "encoder_hidden_states": prompts.to(DEVICE, dtype),
        "encoder_hidden_states_mask": mask.to(DEVICE),
        "timestep": torch.tensor([0.3, 0.7], device=DEVICE, dtype=dtype),
        "img_shapes": [(1, side, side)] * batch,
        "return_dict": False,
    }


def set_backend(model, backend):
    if hasattr(model, "set_attention_backend"):
        model.set_attention_backend(backend)
    elif backend == "xformers":
        model.enable_xformers_memory_efficient_attention()
    elif backend == "_native_math":
        raise SystemExit("this diffusers has no attention backends (set_attention_backend)")
    else:
        model.disable_xformers_memory_efficient_attention()


def step(model, runner, inputs, training):
    """An inference forward, or one training step (loss, backward, SGD); in float64."""
    if not training:
        model.eval()
        with torch.no_grad():
            out = runner(**inputs)[0]
        return {"output": out.detach().double()}
    model.train()
    model.zero_grad(set_to_none=True)
    out = runner(**inputs)[0]
    gen = torch.Generator(device="cpu").manual_seed(5)
    weights = torch.randn(*out.shape, generator=gen, dtype=torch.float64).to(str(out.device))
    (out.double() * weights).sum().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.cat([p.grad.double().flatten() for p in params if p.grad is not None])
    torch.optim.SGD(params, lr=LEARNING_RATE).step()
    updated = torch.cat([p.detach().double().flatten() for p in params])
    return {"output": out.detach().double(), "gradients": grads, "updated parameters": updated}


def main():
    import diffusers
    from torch._dynamo.utils import counters

    print(f"{CHECK}: diffusers {diffusers.__version__} Qwen-Image transformer, attention backend"
          f" {BACKEND}, {'training step' if TRAINING else 'inference'},"
          f" {'compiled' if COMPILED else 'eager'}, {DTYPE_NAME}, text tokens {TEXT}, on {DEVICE}")
    low = build_model().to(DEVICE, DTYPE)
    inputs, inputs64 = make_inputs(DTYPE), make_inputs(torch.float64)

    def variant(backend, dtype):
        model = copy.deepcopy(low).to(dtype)
        set_backend(model, backend)
        return model

    reference = variant("native", torch.float64)
    expected = step(reference, reference, inputs64, TRAINING)
    unmasked = variant("native", torch.float64)  # the nearest plausible wrong answer
    wrong = step(unmasked, unmasked, inputs64 | {"encoder_hidden_states_mask": None}, TRAINING)
    textbook = variant("_native_math", DTYPE)  # the math path, for the bound
    math_path = step(textbook, textbook, inputs, TRAINING)
    model = variant(BACKEND, DTYPE)
    runner = model
    if COMPILED:
        torch._dynamo.reset()
        runner = torch.compile(model)
    disabled = module = original = None
    if WORKAROUND == "dynamo-disable":  # the transformer's attention call behind the disable
        import importlib

        disabled = Disabled("xformers" if BACKEND == "xformers" else "sdpa")
        module = importlib.import_module(TRANSFORMER_MODULE)
        original = module.dispatch_attention_fn
        module.dispatch_attention_fn = disabled.wrap(original)
    breaks_before = sum(counters["graph_break"].values())
    try:
        for n in range(3 if COMPILED else 2):  # compiled: the first step compiles
            stepped = copy.deepcopy(model) if TRAINING else model
            if disabled is not None:  # the first step gathers the workaround's evidence
                disabled.watching = n == 0
            got = step(model, runner, inputs, TRAINING)
            if TRAINING:  # every step starts from the same weights
                model.load_state_dict(stepped.state_dict())
    except Exception as e:  # the backend or the compiler refusing the model is the finding
        traceback.print_exc()
        status, reason = "fail", error_line(e)
        if disabled is not None:
            breaks = sum(counters["graph_break"].values()) - breaks_before
            status, reason, _ = disabled.settle(breaks, status, reason, None)
        return finish(status, reason)
    finally:
        if module is not None:
            module.dispatch_attention_fn = original
    breaks = sum(counters["graph_break"].values()) - breaks_before
    print(f"graph breaks: {breaks}")
    problems, comparisons = [], []
    for name, value in got.items():
        bad = nonfinite(value)
        if bad:
            problems.append(f"{bad} NaN/inf values in the {name}")
            continue
        comparisons.append(
            compare(
                name,
                float((value - expected[name]).abs().max().item()),
                float((math_path[name] - expected[name]).abs().max().item()),
                str(DTYPE).removeprefix("torch."),
                float((wrong[name] - expected[name]).abs().max().item()),
            )
        )
    status, reason, worst = assess(comparisons, problems, "the model without its padding mask")
    if disabled is not None:
        status, reason, worst = disabled.settle(breaks, status, reason, worst)
    return finish(status, reason, worst)
'''

#: checks_masks.masked_inputs, _textbook, _run and mask_check: one mask form through
#: diffusers' dispatch_attention_fn, output and q/k/v gradients against float64
MASKS = '''

def masked_inputs(dtype):
    """q, k, v (BMHK, rounded to ``dtype``), the output gradient, the mask handed to
    diffusers in this form, and what it means: ``allowed`` [B,1,M,N] (True: attend) and
    ``bias`` [B,1,M,N] added to the allowed scores (zero but for the additive form)."""
    b, m, n, h, k = (CASE[x] for x in "BMNHK")
    gen = torch.Generator(device="cpu").manual_seed(SEED)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(DEVICE, dtype)

    q, key, v = rand(b, m, h, k).to(dtype), rand(b, n, h, k).to(dtype), rand(b, n, h, k).to(dtype)
    gen = torch.Generator(device="cpu").manual_seed(MASK_SEED)
    keep = torch.ones(b, n, dtype=torch.bool)
    for i in range(b):  # a third, then a half of the keys are padding
        keep[i, n - (n // 3 + (i % 2) * (n // 6)) :] = False
    allowed = keep[:, None, None, :].expand(b, 1, m, n)
    bias = torch.zeros(b, 1, m, n)
    if FORM == "bool2d":
        attn_mask = keep  # [B,N] bool: True = attend
    elif FORM == "bool4d_b11n":
        attn_mask = keep[:, None, None, :]  # [B,1,1,N] bool
    elif FORM == "bool4d_b1mn":  # [B,1,M,N] bool differing per query row
        pattern = torch.rand(b, 1, m, n, generator=gen) < PATTERN_KEEP
        pattern[..., 0] = True  # every row keeps its first key
        allowed = allowed & pattern
        attn_mask = allowed
    else:  # additive [B,1,M,N]: random where attended, the dtype's lowest value where masked
        bias = torch.randn(b, 1, m, n, generator=gen).to(dtype).float()
        attn_mask = bias.to(dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    grad = torch.randn(b, m, h, k, generator=gen).to(dtype)
    return dict(
        q=q, k=key, v=v, grad=grad.to(DEVICE), attn_mask=attn_mask.contiguous().to(DEVICE),
        allowed=allowed.contiguous().to(DEVICE), bias=bias.to(DEVICE),
    )


def textbook(q, k, v, allowed, bias):
    """Attention in the inputs' dtype (BMHK), with the mask's meaning applied."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    scores = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    return (scores.softmax(dim=-1) @ vh).transpose(1, 2)


def run(fn, inp, dtype):
    """Output and q, k, v gradients of ``fn(q, k, v)`` on the inputs cast to ``dtype``."""
    q, k, v = (inp[x].detach().to(dtype).requires_grad_(True) for x in "qkv")
    out = fn(q, k, v)
    out.backward(inp["grad"].to(out.dtype))
    found = {"out": out.detach()}
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        assert t.grad is not None, f"no gradient reached {name}"
        found[name] = t.grad.detach()
    return found


def main():
    import diffusers
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    print(f"{CHECK}: diffusers {diffusers.__version__} dispatch_attention_fn, backend {BACKEND},"
          f" mask form {FORM}, {DTYPE_NAME}, case {CASE_LABEL} (seeds {SEED}/{MASK_SEED}),"
          f" forward + backward, on {DEVICE}")
    inp = masked_inputs(DTYPE)
    mask = inp["attn_mask"]
    shape = "x".join(str(d) for d in mask.shape)
    fraction = round(1.0 - float(inp["allowed"].float().mean()), 4)
    print(f"mask handed to diffusers: {shape} {str(mask.dtype).removeprefix('torch.')},"
          f" masked keys fraction {fraction} (recorded: {RECORDED_MASK})")
    backend = AttentionBackendName(BACKEND)

    def dispatched(q, k, v):
        return dispatch_attention_fn(q, k, v, attn_mask=mask, backend=backend)

    expected = run(lambda q, k, v: textbook(q, k, v, inp["allowed"], inp["bias"]), inp,
                   torch.float64)
    wrong = run(lambda q, k, v: textbook(q, k, v, None, None), inp, torch.float64)
    low_bias = inp["bias"].to(DTYPE)
    math_path = run(lambda q, k, v: textbook(q, k, v, inp["allowed"], low_bias), inp, DTYPE)
    try:
        got = run(dispatched, inp, DTYPE)
    except Exception as e:  # the backend refusing the mask form is the finding
        traceback.print_exc()
        return finish("fail", error_line(e))
    problems, comparisons = [], []
    for name, value in got.items():
        bad = nonfinite(value)
        if bad:
            problems.append(f"{bad} NaN/inf values in {name}")
            continue
        comparisons.append(
            compare(
                name,
                max_abs_error(value, expected[name]),
                max_abs_error(math_path[name], expected[name]),
                str(DTYPE).removeprefix("torch."),
                max_abs_error(wrong[name], expected[name]),
            )
        )
    status, reason, worst = assess(comparisons, problems, "the mask dropped")
    return finish(status, reason, worst)
'''

#: the script's entry: an error the check would not have caught is an ``error`` result
ENTRY = """

if __name__ == "__main__":
    try:
        code = main()
    except Exception as e:
        traceback.print_exc()
        code = finish("error", error_line(e))
    sys.exit(code)
"""
