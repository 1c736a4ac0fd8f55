"""Training tokens/s: normlab (pre + RMSNorm + SwiGLU) vs HF Llama, x-transformers and OLMo-core,
identical shapes, side by side in one run.

HF's LlamaForCausalLM holds normlab's weights (model.hf.to_hf). x-transformers' TransformerWrapper
(Decoder: RMSNorm, SwiGLU, rotary, no biases, SDPA) and OLMo-core's Transformer
(TransformerConfig.llama_like, d_ff rounded to 384 like normlab's tiny) have the same shapes and
their own initialisations (parameter counts printed). All run eager (no torch.compile) in fp32
on the same batches, with the same loss (mean cross-entropy) and torch.optim.AdamW. Rounds
alternate between the models (the order reversed every other round) so that background load
hits them alike. Reported per model: median tokens/s (wall) and median CPU seconds per step of
this process (time.process_time: with 1 thread the steadier measure on a shared machine, where
the wall time also counts the waits for a core), each as normlab's speed over the model's
(issue 50: within 3 %, i.e. >= 0.97, on the CPU). x-transformers and OLMo-core are optional
(pip install x-transformers ai2-olmo-core); a missing one is named and left out.

    python benchmarks/bench_train_vs_hf.py [--threads 1] [--rounds 7] [--steps 5] [--sizes tiny]
"""

from __future__ import annotations

import argparse
import os
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


def time_steps(step: Callable, n: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) per step over n steps. On a shared machine the
    CPU time is the steadier of the two: waiting for a core counts in the wall time only."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def x_transformers_model(cfg: ModelConfig) -> torch.nn.Module | None:
    """x-transformers' decoder of cfg's shapes (None when not installed)."""
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError:
        return None
    head = cfg.d_model // cfg.n_heads
    layers = Decoder(
        dim=cfg.d_model, depth=cfg.n_layers, heads=cfg.n_heads, attn_dim_head=head,
        rotary_pos_emb=True, rotary_emb_dim=head, use_rmsnorm=True, ff_glu=True, ff_swish=True,
        ff_mult=cfg.d_ff / cfg.d_model, ff_no_bias=True, attn_flash=True,
    )  # fmt: skip
    return TransformerWrapper(
        num_tokens=cfg.vocab_size, max_seq_len=cfg.max_seq_len, attn_layers=layers,
        use_abs_pos_emb=False,
    )  # fmt: skip


def olmo_core_model(cfg: ModelConfig) -> torch.nn.Module | None:
    """OLMo-core's Llama-like transformer of cfg's shapes (None when not installed)."""
    try:
        from olmo_core.nn.transformer import TransformerConfig
    except ImportError:
        return None
    ocfg = TransformerConfig.llama_like(
        d_model=cfg.d_model, vocab_size=cfg.vocab_size, n_layers=cfg.n_layers,
        n_heads=cfg.n_heads, rope_theta=int(cfg.rope_theta), hidden_size_multiple_of=128,
    )  # fmt: skip
    model = ocfg.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    width = model.blocks["0"].feed_forward.w1.out_features
    assert width == cfg.d_ff, f"OLMo-core's d_ff {width} != {cfg.d_ff}"
    return model


def bench(name: str, rounds: int, steps: int) -> dict[str, float]:
    fields, batch, seq = SIZES[name]
    cfg = ModelConfig(**fields, max_seq_len=seq, placement="pre", norm="rmsnorm", mlp="swiglu")
    torch.manual_seed(0)
    ours = Transformer(cfg).train()
    theirs = to_hf(ours).train()
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    attn = getattr(theirs.config, "_attn_implementation", "?")
    models = {"normlab": ours, f"HF Llama ({attn})": theirs}
    forward = {f"HF Llama ({attn})": lambda m, x: m(input_ids=x, use_cache=False).logits}
    for label, build, package in (
        ("x-transformers", x_transformers_model, "x-transformers"),
        ("OLMo-core", olmo_core_model, "ai2-olmo-core"),
    ):
        model = build(cfg)
        if model is None:
            print(f"{label}: not installed (pip install {package}); left out")
        else:
            models[label] = model.train()
    runs = {k: step_fn(m, forward.get(k, lambda m, x: m(x)), tokens) for k, m in models.items()}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    for step in runs.values():  # warm-up: allocator, first-call dispatch
        time_steps(step, 2)
    for i in range(rounds):
        order = list(runs.items())
        for k, step in order if i % 2 == 0 else reversed(order):
            times[k].append(time_steps(step, steps))
    tok = batch * seq
    tps = {k: tok / statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    print(f"{name}: L={cfg.n_layers} d={cfg.d_model} V={cfg.vocab_size} B={batch} T={seq}; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"  {'model':<24} {'params':>7} {'tok/s':>10} {'wall ratio':>11} {'CPU s/step':>11} "
          f"{'CPU ratio':>10}   (ratios: normlab's speed over the model's)")  # fmt: skip
    for k, m in models.items():
        params = sum(p.numel() for p in m.parameters()) / 1e6
        print(f"  {k:<24} {params:6.2f}M {tps[k]:10,.0f} {tps['normlab'] / tps[k]:11.3f} "
              f"{cpu[k]:11.4f} {cpu[k] / cpu['normlab']:10.3f}")  # fmt: skip
    return tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--sizes", default="tiny")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, fp32, eager, training step")
    for name in args.sizes.split(","):
        bench(name, args.rounds, args.steps)


if __name__ == "__main__":
    main()
