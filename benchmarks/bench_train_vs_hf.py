"""Training tokens/s: normlab (pre + RMSNorm + SwiGLU) vs HF LlamaForCausalLM, identical shapes.

Both models hold the same weights (model.hf.to_hf), run eager (no torch.compile) in fp32 on the
same batches, with the same loss (mean cross-entropy) and torch.optim.AdamW. Rounds alternate
between the two models so that background load hits both alike; the median step time is reported.
Prints a ratio (normlab / HF); the target on CPU is >= 1.0.

    python benchmarks/bench_train_vs_hf.py [--threads 2] [--rounds 5] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from normlab.model import ModelConfig, Transformer
from normlab.model.hf import to_hf

SIZES = {
    # name: (model fields, batch, seq_len)
    "tiny": (dict(n_layers=4, d_model=128, n_heads=4, d_ff=384, vocab_size=4096), 8, 128),
    "small": (dict(n_layers=6, d_model=384, n_heads=6, d_ff=1024, vocab_size=8192), 8, 256),
}


def step_fn(model: torch.nn.Module, logits_of: Callable, tokens: torch.Tensor) -> Callable:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        logits = logits_of(model, inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_steps(step: Callable, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


def bench(name: str, rounds: int, steps: int) -> tuple[float, float]:
    fields, batch, seq = SIZES[name]
    cfg = ModelConfig(**fields, max_seq_len=seq, placement="pre", norm="rmsnorm", mlp="swiglu")
    torch.manual_seed(0)
    ours = Transformer(cfg).train()
    theirs = to_hf(ours).train()
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    runs = {
        "normlab": step_fn(ours, lambda m, x: m(x), tokens),
        "hf": step_fn(theirs, lambda m, x: m(input_ids=x, use_cache=False).logits, tokens),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for step in runs.values():  # warm-up: allocator, first-call dispatch
        time_steps(step, 2)
    for _ in range(rounds):
        for k, step in runs.items():
            times[k].append(time_steps(step, steps))
    tok = batch * seq
    ours_tps, hf_tps = (tok / statistics.median(times[k]) for k in ("normlab", "hf"))
    attn = getattr(theirs.config, "_attn_implementation", "?")
    print(
        f"{name:6s} L={cfg.n_layers} d={cfg.d_model} V={cfg.vocab_size} B={batch} T={seq} "
        f"params={ours.num_params() / 1e6:.1f}M | normlab {ours_tps:9,.0f} tok/s | "
        f"HF Llama ({attn}) {hf_tps:9,.0f} tok/s | ratio {ours_tps / hf_tps:.3f}"
    )
    return ours_tps, hf_tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--sizes", default="tiny,small")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, fp32, eager, training step")
    for name in args.sizes.split(","):
        bench(name, args.rounds, args.steps)


if __name__ == "__main__":
    main()
