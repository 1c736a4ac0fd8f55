"""Benchmark normlab's Triton norm kernels against torch eager, torch.compile and Liger-Kernel.

For each op, tokens x hidden, the forward and the backward time (median, triton.testing.do_bench)
and the achieved bandwidth counted as in SCIENCE.md §10: the (tokens, hidden) tensors an op must
read and write, at the dtype's element size (RMSNorm bf16: forward 4 B/element, backward 6 B plus
the small dg partials). Two ratios: to the device's peak memory bandwidth (NVIDIA's datasheet
figure, PEAK_GBS, or --peak-gbs) and to a device-to-device copy measured in the same run.
Targets on an H100/H200 (issue 50): forward >= 85% of peak bandwidth, backward >= 70%, for
RMSNorm at hidden >= 4096 (QuACK's RMSNorm reaches 87-90% of H100 bandwidth); and backward
>= 1.2x torch.compile. Without a known peak the targets are judged against the copy.

    python benchmarks/bench_norm_kernels.py [--ops rmsnorm pre_rms] [--out results.jsonl]
"""

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F


@dataclass(frozen=True)
class Op:
    """A benchmarked pattern: which fused form, which norm, and its (reads, writes) of (T, H)."""

    pattern: str  # norm | add_then_norm | add_norm | norm_add
    rms: bool
    alpha: float
    fwd_io: tuple[int, int]
    bwd_io: tuple[int, int]


OPS = {
    "rmsnorm": Op("norm", True, 1.0, (1, 1), (2, 1)),  # x -> y; x, dy -> dx
    "layernorm": Op("norm", False, 1.0, (1, 1), (2, 1)),
    "pre_rms": Op("add_then_norm", True, 1.0, (2, 2), (3, 1)),  # x, f -> y, h; h, dy, dh -> dx=df
    "post_rms": Op("add_norm", True, 1.0, (2, 1), (3, 1)),  # x, f -> y; x, f, dy -> dx=df
    "deepnorm_rms": Op("add_norm", True, 2.0, (2, 1), (3, 2)),  # ... -> dx=alpha*dh, df=dh
    "peri_rms": Op("norm_add", True, 1.0, (2, 1), (2, 1)),  # x, f -> y; f, dy -> df (dx=dy)
}
EPS = 1e-6
TARGETS = {"fwd_pct": 85.0, "bwd_pct": 70.0, "bwd_vs_compile": 1.2}
# peak HBM bandwidth in GB/s by torch.cuda.get_device_name() (NVIDIA datasheets: H200 4.8 TB/s,
# H100 SXM 3.35, H100 NVL 3.9, H100 PCIe 2.0, A100 80GB SXM 2.039, PCIe 1.935, A100 40GB 1.555)
PEAK_GBS = {
    "NVIDIA H200": 4800.0,
    "NVIDIA H100 80GB HBM3": 3350.0,
    "NVIDIA H100 NVL": 3900.0,
    "NVIDIA H100 PCIe": 2000.0,
    "NVIDIA A100-SXM4-80GB": 2039.0,
    "NVIDIA A100 80GB PCIe": 1935.0,
    "NVIDIA A100-SXM4-40GB": 1555.0,
}


def peak_bandwidth(name: str, given: float | None) -> float | None:
    """GB/s: `given`, else the datasheet figure of a known device (None when unknown)."""
    return given if given is not None else PEAK_GBS.get(name)


def eager_fn(op: Op, w: torch.Tensor, b: torch.Tensor | None) -> Callable:
    """The unfused PyTorch form of `op` (also what torch.compile is given)."""

    def n(t: torch.Tensor) -> torch.Tensor:
        if op.rms:
            return F.rms_norm(t, t.shape[-1:], w, EPS)
        return F.layer_norm(t, t.shape[-1:], w, b, EPS)

    def run(x: torch.Tensor, f: torch.Tensor):
        if op.pattern == "norm":
            return (n(x),)
        if op.pattern == "add_then_norm":
            h = x + f
            return n(h), h
        if op.pattern == "add_norm":
            return (n(x + f if op.alpha == 1.0 else op.alpha * x + f),)
        return (x + n(f),)

    return run


def triton_fn(op: Op, w: torch.Tensor, b: torch.Tensor | None) -> Callable:
    from normlab.model.kernels import functions as fn

    def run(x: torch.Tensor, f: torch.Tensor):
        if op.pattern == "norm":
            return (fn.norm(x, w, b, EPS, op.rms),)
        if op.pattern == "add_then_norm":
            return fn.add_then_norm(x, f, w, b, EPS, op.rms)
        if op.pattern == "add_norm":
            return (fn.add_norm(x, f, w, b, EPS, op.rms, op.alpha),)
        return (fn.norm_add(x, f, w, b, EPS, op.rms),)

    return run


def liger_fn(op: Op, w: torch.Tensor, b: torch.Tensor | None) -> Callable | None:
    """Liger-Kernel's module for the patterns it has (plain norms, Pre-LN fused add + RMSNorm)."""
    try:
        import liger_kernel.transformers as lt
    except ImportError:
        return None
    hidden = w.numel()
    if op.pattern == "norm" and op.rms:
        mod = lt.LigerRMSNorm(hidden, eps=EPS, in_place=False)
    elif op.pattern == "norm":
        mod = lt.LigerLayerNorm(hidden, eps=EPS)
    elif op.pattern == "add_then_norm" and op.rms and hasattr(lt, "LigerFusedAddRMSNorm"):
        mod = lt.LigerFusedAddRMSNorm(hidden, eps=EPS)
    else:
        return None
    mod.weight = w  # share the benchmark's parameters, so dg/db are the ones timed
    if b is not None and hasattr(mod, "bias"):
        mod.bias = b
    if op.pattern == "add_then_norm":
        return lambda x, f: tuple(mod(f, x))  # (hidden_states, residual) -> (N(x + f), x + f)
    return lambda x, f: (mod(x),)


def make_impls(op: Op, w, b, names: list[str]) -> dict[str, Callable]:
    impls: dict[str, Callable] = {}
    for name in names:
        if name == "triton":
            impls[name] = triton_fn(op, w, b)
        elif name == "eager":
            impls[name] = eager_fn(op, w, b)
        elif name == "compile":
            # the backward is timed on a retained graph (time_impl); AOTAutograd's donated
            # buffers refuse retain_graph=True (seen on torch 2.11 on an H200), so keep them
            functorch_config.donated_buffer = False
            impls[name] = torch.compile(eager_fn(op, w, b))
        elif name == "liger" and (liger := liger_fn(op, w, b)) is not None:
            impls[name] = liger
    return impls


def copy_bandwidth(rep_ms: int) -> float:
    """GB/s of a device-to-device copy of 1 GiB (read + write counted)."""
    from triton.testing import do_bench

    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=rep_ms, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def time_impl(run: Callable, x, f, params, upstream, rep_ms: int) -> tuple[float, float]:
    """Median forward and backward ms. Backward: torch.autograd.grad on a retained graph."""
    from triton.testing import do_bench

    fwd = do_bench(lambda: run(x, f), warmup=10, rep=rep_ms, return_mode="median")
    outs = run(x, f)
    grads_of = [t for t in (x, f, *params) if t is not None and t.requires_grad]
    ups = upstream[: len(outs)]
    bwd = do_bench(
        lambda: torch.autograd.grad(outs, grads_of, ups, retain_graph=True),
        warmup=10, rep=rep_ms, return_mode="median",
    )  # fmt: skip
    return fwd, bwd


def bench_shape(
    name, op, tokens, hidden, dtype, impl_names, rep_ms, copy_gbs, peak_gbs=None
) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, req=True):
        t = torch.randn(*shape, generator=gen, device="cuda", dtype=dtype)
        return t.requires_grad_(req)

    x = rand(tokens, hidden)
    f = rand(tokens, hidden, req=op.pattern != "norm")
    # One torch.compile graph per (op, hidden) whatever the token count.
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(f, 0)
    w = torch.nn.Parameter(1 + 0.1 * rand(hidden, req=False))
    b = None if op.rms else torch.nn.Parameter(rand(hidden, req=False))
    upstream = [rand(tokens, hidden, req=False) for _ in range(2)]
    impls = make_impls(op, w, b, impl_names)
    with torch.no_grad():
        ref = eager_fn(op, w, b)(x, f)
    elem = torch.empty((), dtype=dtype).element_size()
    rows = []
    for impl, run in impls.items():
        out = run(x, f)
        for o, r in zip(out, ref, strict=True):  # guard: a fast wrong kernel is no result
            torch.testing.assert_close(o.float(), r.float(), atol=6e-2, rtol=2e-2)
        fwd_ms, bwd_ms = time_impl(run, x, f, (w, b), upstream, rep_ms)
        fwd_gbs = sum(op.fwd_io) * elem * tokens * hidden / (fwd_ms * 1e-3) / 1e9
        bwd_gbs = sum(op.bwd_io) * elem * tokens * hidden / (bwd_ms * 1e-3) / 1e9
        rows.append(
            dict(op=name, tokens=tokens, hidden=hidden, impl=impl, fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                 fwd_gbs=fwd_gbs, bwd_gbs=bwd_gbs, fwd_pct=100 * fwd_gbs / copy_gbs,
                 bwd_pct=100 * bwd_gbs / copy_gbs, copy_gbs=copy_gbs, peak_gbs=peak_gbs)
        )  # fmt: skip
        if peak_gbs:
            rows[-1].update(
                fwd_peak_pct=100 * fwd_gbs / peak_gbs, bwd_peak_pct=100 * bwd_gbs / peak_gbs
            )
        del out
    del x, f, w, b, upstream, ref, impls
    torch.cuda.empty_cache()
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """One line per (op, tokens, hidden): the triton kernel and its speed-ups over the others."""
    lines = []
    for r in (r for r in rows if r["impl"] == "triton"):
        same = {o["impl"]: o for o in rows if (o["op"], o["tokens"], o["hidden"]) == (
            r["op"], r["tokens"], r["hidden"])}  # fmt: skip
        line = dict(r)
        for other in ("compile", "eager", "liger"):
            if other in same:
                line[f"fwd_vs_{other}"] = same[other]["fwd_ms"] / r["fwd_ms"]
                line[f"bwd_vs_{other}"] = same[other]["bwd_ms"] / r["bwd_ms"]
        fwd, bwd = r.get("fwd_peak_pct", r["fwd_pct"]), r.get("bwd_peak_pct", r["bwd_pct"])
        line["meets"] = (
            fwd >= TARGETS["fwd_pct"]
            and bwd >= TARGETS["bwd_pct"]
            and line.get("bwd_vs_compile", 0.0) >= TARGETS["bwd_vs_compile"]
        )
        lines.append(line)
    return lines


def print_table(lines: list[dict], copy_gbs: float) -> None:
    from rich.console import Console
    from rich.table import Table

    peak = lines[0].get("peak_gbs")
    title = f"Triton norm kernels; device copy {copy_gbs:.0f} GB/s, peak "
    table = Table(title=title + (f"{peak:.0f} GB/s" if peak else "unknown"))
    cols = [
        "op",
        "tokens",
        "hidden",
        "fwd_ms",
        "fwd_GB/s",
        "fwd_%peak",
        "fwd_%copy",
        "bwd_ms",
        "bwd_GB/s",
        "bwd_%peak",
        "bwd_%copy",
        "bwd_x_compile",
        "bwd_x_eager",
        "bwd_x_liger",
        "fwd_x_compile",
        "targets",
    ]
    for c in cols:
        table.add_column(c, justify="right")

    def ratio(line, key):
        return f"{line[key]:.2f}" if key in line else "-"

    def pct(line, key):
        return f"{line[key]:.0f}%" if key in line else "-"

    for ln in lines:
        table.add_row(
            ln["op"], f"{ln['tokens'] // 1024}K", str(ln["hidden"]), f"{ln['fwd_ms']:.3f}",
            f"{ln['fwd_gbs']:.0f}", pct(ln, "fwd_peak_pct"), f"{ln['fwd_pct']:.0f}%",
            f"{ln['bwd_ms']:.3f}", f"{ln['bwd_gbs']:.0f}", pct(ln, "bwd_peak_pct"),
            f"{ln['bwd_pct']:.0f}%", ratio(ln, "bwd_vs_compile"),
            ratio(ln, "bwd_vs_eager"), ratio(ln, "bwd_vs_liger"), ratio(ln, "fwd_vs_compile"),
            "yes" if ln["meets"] else "no",
        )  # fmt: skip
    Console(width=200).print(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--tokens", nargs="+", type=int, default=[16384, 32768, 65536])
    p.add_argument("--hidden", nargs="+", type=int, default=[2048, 4096, 8192])
    p.add_argument("--impls", nargs="+", default=["triton", "eager", "compile", "liger"],
                   choices=["triton", "eager", "compile", "liger"])  # fmt: skip
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--rep-ms", type=int, default=60, help="timing budget per measurement")
    p.add_argument("--bwd-programs-per-sm", type=int, default=None, help="backward grid knob")
    p.add_argument("--bwd-stages", type=int, default=None, help="backward rows in flight knob")
    p.add_argument("--peak-gbs", type=float, default=None, help="peak memory GB/s (else PEAK_GBS)")
    p.add_argument("--out", default=None, help="append one JSON line per measurement here")
    p.add_argument("--from-jsonl", default=None, help="only print the table of an --out file")
    return p.parse_args(argv)


def run_all(args: argparse.Namespace) -> list[dict]:
    """Measure every (op, hidden, tokens, impl); rows are printed and appended to --out as made."""
    from normlab.model.kernels import functions

    functions.BWD_PROGRAMS_PER_SM = args.bwd_programs_per_sm
    functions.BWD_STAGES = args.bwd_stages
    dtype = getattr(torch, args.dtype)
    copy_gbs = copy_bandwidth(args.rep_ms)
    device = torch.cuda.get_device_name()
    peak_gbs = peak_bandwidth(device, args.peak_gbs)
    peak = f"{peak_gbs:.0f} GB/s" if peak_gbs else "unknown (--peak-gbs)"
    print(f"{device}: device copy {copy_gbs:.0f} GB/s, peak {peak}", flush=True)
    # Every op's eager form shares one code object: allow a graph per (op, hidden) and start
    # each op afresh, or dynamo would silently fall back to eager after its recompile limit.
    cfg = torch._dynamo.config
    setattr(cfg, "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit", 64)
    rows: list[dict] = []
    for name in args.ops:
        torch._dynamo.reset()
        for hidden in args.hidden:
            for tokens in args.tokens:
                new = bench_shape(name, OPS[name], tokens, hidden, dtype, args.impls, args.rep_ms,
                                  copy_gbs, peak_gbs)  # fmt: skip
                rows += new
                print("\n".join(json.dumps(r) for r in new), flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.writelines(json.dumps(r) + "\n" for r in new)
    return rows


def report(rows: list[dict]) -> None:
    lines = summarize(rows)
    if not lines:
        print("no triton measurements to summarise")
        return
    print_table(lines, lines[0]["copy_gbs"])
    met = sum(ln["meets"] for ln in lines)
    basis = "peak" if "fwd_peak_pct" in lines[0] else "copy"
    print(f"targets met (fwd >= 85% {basis}, bwd >= 70%, bwd >= 1.2x compile): {met}/{len(lines)}")
    wide = [ln for ln in lines if ln["op"] == "rmsnorm" and ln["hidden"] >= 4096]
    if wide and "fwd_peak_pct" in wide[0]:
        fwd = min(ln["fwd_peak_pct"] for ln in wide)
        bwd = min(ln["bwd_peak_pct"] for ln in wide)
        print(f"RMSNorm at hidden >= 4096: forward >= {fwd:.0f}% of peak (goal 85), backward >= "
              f"{bwd:.0f}% (goal 70), over {len(wide)} shapes")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_jsonl:
        try:
            with open(args.from_jsonl) as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
        except (OSError, json.JSONDecodeError) as err:
            print(f"bench_norm_kernels: cannot read {args.from_jsonl}: {err}", file=sys.stderr)
            return 1
        report(rows)
        return 0
    if not torch.cuda.is_available():
        print("bench_norm_kernels: no CUDA device here; nothing to benchmark.", file=sys.stderr)
        return 0
    if importlib.util.find_spec("triton") is None:
        print("bench_norm_kernels: triton is not installed.", file=sys.stderr)
        return 1
    report(run_all(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
