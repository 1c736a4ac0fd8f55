"""Step time of the attention stabilizers against Pre-LN, side by side in one run (CPU or GPU).

Each variant is the same Pre-LN decoder with one switch on; a step is forward, backward and an
AdamW update on a fixed batch. The variants are timed round-robin, one step each per round, so
machine load hits all alike; the table gives the median seconds per step, the ratio to `pre`, and
the attention kernel each uses (SDPA cannot take a score modifier or a sink column, so caps and
sinks run the eager fp32 core). `pre (inline SDPA)` is the attention forward as it was before
the switches existed (SDPA called in place, no core or gate module): the default path's cost of
the new seams.

    python benchmarks/bench_stabilizers.py                    # tiny and small, 30 rounds
    python benchmarks/bench_stabilizers.py --sizes tiny --rounds 10 --json out.json
    python benchmarks/bench_stabilizers.py --device cuda --sizes small   # bf16 autocast (gpu_check)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from normlab.model import ModelConfig, Transformer, lm_loss
from normlab.model.attention import Attention
from normlab.model.rope import apply_rope

SIZES = {
    "tiny": dict(n_layers=4, d_model=128, n_heads=4, d_ff=384, seq=128, batch=8),
    "small": dict(n_layers=8, d_model=256, n_heads=8, d_ff=704, seq=256, batch=8),
}
VARIANTS = {
    "pre": {},
    "pre (inline SDPA)": {},
    "gate headwise": dict(attn_gate="headwise"),
    "gate elementwise": dict(attn_gate="elementwise"),
    "sinks": dict(attn_sinks=True),
    "attn softcap 50": dict(attn_softcap=50.0),
    "final softcap 30": dict(final_softcap=30.0),
    "gate+sinks+caps": dict(attn_gate="elementwise", attn_sinks=True, attn_softcap=50.0,
                            final_softcap=30.0),
}


def inline_forward(self: Attention, x: torch.Tensor) -> torch.Tensor:
    """The attention forward before the stabilizer seams: SDPA in place, no core, no gate."""
    B, T, _ = x.shape
    q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim))
    k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim))
    v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
    cos, sin = self.rope_cos[:T], self.rope_sin[:T]
    q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
    y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
    return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def build(size: dict, name: str, device: str) -> tuple[Transformer, torch.optim.Optimizer, str]:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=size["n_layers"], d_model=size["d_model"], n_heads=size["n_heads"],
                      d_ff=size["d_ff"], vocab_size=4096, max_seq_len=size["seq"],
                      **VARIANTS[name])
    model = Transformer(cfg).to(device)
    att = model.blocks[0].attn.branch
    kernel = att.core.kernel
    if name == "pre (inline SDPA)":
        for block in model.blocks:
            block.attn.branch.forward = inline_forward.__get__(block.attn.branch)
        kernel = "sdpa (inline)"
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), kernel


def step(model: Transformer, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    cuda = tokens.is_cuda
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    # on a GPU the step runs under bf16 autocast (as precision.dtype bf16 does); on a CPU in fp32
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        loss, _ = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench(sizes: list[str], rounds: int, threads: int, device: str = "cpu") -> list[dict]:
    torch.set_num_threads(threads)
    results = []
    for size_name in sizes:
        size = SIZES[size_name]
        tokens = torch.randint(0, 4096, (size["batch"], size["seq"] + 1),
                               generator=torch.Generator().manual_seed(1)).to(device)
        built = {name: build(size, name, device) for name in VARIANTS}
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(rounds + 2):  # two warm-up rounds
            for name, (model, opt, _) in built.items():
                t = step(model, opt, tokens)
                if r >= 2:
                    times[name].append(t)
        base = statistics.median(times["pre"])
        for name, (_, _, kernel) in built.items():
            med = statistics.median(times[name])
            results.append({"size": size_name, "variant": name, "kernel": kernel,
                            "median_s": med, "min_s": min(times[name]), "ratio": med / base})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (bf16 autocast)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    results = bench(args.sizes, args.rounds, args.threads, args.device)
    print(f"{'size':6} {'variant':20} {'kernel':14} {'median s':>9} {'min s':>8} {'x pre':>6}")
    for r in results:
        print(f"{r['size']:6} {r['variant']:20} {r['kernel']:14} {r['median_s']:9.4f} "
              f"{r['min_s']:8.4f} {r['ratio']:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "threads": args.threads, "device": args.device,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
