"""Per-step cost of µP / CompleteP against sp, side by side in one process (issue 31: target
within 2 %).

`python benchmarks/bench_parametrization.py [--preset tiny --steps 20 --rounds 5]` builds the same
model three ways (sp; mup at twice the base width; completep at twice the base width and depth:
the same shapes, only the multipliers, the init and the optimizer groups differ) and times
forward + backward + AdamW step, interleaving the three every round so load drifts hit all
alike. Prints the median step time of each and the ratio to sp. `--device cuda` (bf16 autocast
there) is gpu_check.sh's `parametrization` part; on a GPU the clock is read after a synchronize.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from normlab.launch.config import OptimSection
from normlab.launch.optim import build_optimizer
from normlab.model import PRESETS, ModelConfig, Transformer, lm_loss


def configs(preset: str) -> dict[str, ModelConfig]:
    shape = dict(PRESETS[preset])
    d, n = shape["d_model"], shape["n_layers"]
    return {
        "sp": ModelConfig(**shape, init="normal"),
        "mup": ModelConfig(**shape, parametrization="mup", base_d_model=d // 2),
        "completep": ModelConfig(
            **shape, parametrization="completep", base_d_model=d // 2, base_n_layers=max(1, n // 2)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (bf16 autocast)")
    args = p.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    runs = {}
    for name, cfg in configs(args.preset).items():
        torch.manual_seed(0)
        model = Transformer(cfg).to(device)
        runs[name] = (model, build_optimizer(model, OptimSection()))
        print(f"built {name}", flush=True)  # progress, for gpu_check.sh's time cap
    vocab = next(iter(runs.values()))[0].config.vocab_size
    tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def clock() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, (model, opt) in runs.items():
            start = clock()
            for _ in range(args.steps):
                with autocast:
                    loss, _ = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            times[name].append((clock() - start) / args.steps)
        print(" ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in times.items()), flush=True)
    base = statistics.median(times["sp"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:10s} {med * 1e3:8.2f} ms/step  ratio to sp {med / base:.3f}")


if __name__ == "__main__":
    main()
