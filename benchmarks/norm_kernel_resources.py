"""Registers and spills of every launched norm-kernel variant, compiled for a GPU without one.

Triton compiles to a cubin with its bundled ptxas; cuobjdump reports the resource usage. This is
how the warp counts in model/kernels/functions.py were chosen (a spilling backward loses its
bandwidth), and tests/model/test_kernels.py runs it to catch compile-only errors the CPU interpreter
cannot see. Run it in a process without TRITON_INTERPRET.

    python benchmarks/norm_kernel_resources.py [--widths 2048 4096 8192] [--arch 90] [--json]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from normlab.model.kernels import functions, norm_kernels
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

FWD = {  # (HAS_F, HAS_Z, STORE_R), as functions.py launches the forward
    "norm": (False, False, False),
    "add_norm": (True, False, False),
    "add_then_norm": (True, False, True),
    "norm_add": (False, True, False),
}
BWD = {  # (HAS_F, HAS_DRES, STORE_DX2)
    "norm": (False, False, False),
    "add_norm": (True, False, False),
    "deepnorm": (True, False, True),
    "add_then_norm": (False, True, False),
}
TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resources(kernel, consts: dict, warps: int, arch: int, dtype: str) -> dict:
    """Compile one variant; return its registers and spill stack bytes per thread."""
    ints, floats = {"N", "M", "rows_per_program"}, {"eps", "alpha", "scale2"}
    f32_ptrs = {"W", "B", "Mean", "Rstd", "DW", "DB"}
    sig = {
        a: "constexpr" if a in consts else "i32" if a in ints else "fp32" if a in floats
        else "*fp32" if a in f32_ptrs else f"*{dtype}"
        for a in kernel.arg_names
    }  # fmt: skip
    src = ASTSource(kernel, sig, consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(compiled.asm["cubin"])
        fh.flush()
        out = subprocess.run(
            [TOOL, "--dump-resource-usage", fh.name], capture_output=True, text=True
        )
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", out.stdout).groups()
    ptx = compiled.asm["ptx"]
    return {
        "registers": int(regs), "spill_bytes": int(stack), "warps": warps,
        "shared_bytes": compiled.metadata.shared, "cp_async": ptx.count("cp.async.c"),
    }  # fmt: skip


def survey(widths: list[int], arch: int) -> list[dict]:
    rows = []
    for n in widths:
        for rms in (True, False):
            cfg = functions._launch(n, torch.bfloat16, rms)
            base = dict(IS_RMS=rms, HAS_BIAS=not rms, BLOCK_N=cfg.block_n)
            for op, (f, z, r) in FWD.items():
                consts = dict(base, HAS_F=f, HAS_Z=z, STORE_R=r)
                res = resources(norm_kernels.norm_fwd_kernel, consts, cfg.fwd_warps, arch, "bf16")
                rows.append(dict(res, pass_="fwd", op=op, rms=rms, width=n))
            for op, (f, d, x2) in BWD.items():
                consts = dict(base, HAS_F=f, HAS_DRES=d, STORE_DX2=x2, STAGES=cfg.bwd_stages)
                res = resources(norm_kernels.norm_bwd_kernel, consts, cfg.bwd_warps, arch, "bf16")
                rows.append(dict(res, pass_="bwd", op=op, rms=rms, width=n))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", nargs="+", type=int, default=[2048, 4096, 8192])
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    p.add_argument("--json", action="store_true", help="one JSON list on stdout")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter does not compile", file=sys.stderr)
        return 1
    if not os.path.exists(TOOL):
        print(f"triton's bundled cuobjdump is missing ({TOOL})", file=sys.stderr)
        return 1
    rows = survey(args.widths, args.arch)
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        kind = "rmsnorm" if r["rms"] else "layernorm"
        print(f"{r['pass_']} {r['op']:<14} {kind:<9} N={r['width']:<6} warps={r['warps']:<3} "
              f"regs={r['registers']:<4} spill={r['spill_bytes']} B shared={r['shared_bytes']} B "
              f"cp.async={r['cp_async']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
