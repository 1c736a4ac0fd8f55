"""Training time blocked by checkpoint saves: synchronous vs asynchronous (FSDP2, DCP).

`python benchmarks/bench_checkpoint.py [--d-model 512 --layers 8 --steps 24 --every 4]` trains the
same model twice in one process group (one rank, gloo), saving every `--every` steps: once with
`checkpoint.async: false`, once with `true`. It prints, side by side, the seconds the training
loop spent inside save calls (for async: staging the state to host memory plus any wait for the
previous save), the total wall time, and the ratio. The files written are identical in both runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from normlab.launch.config import from_dict
from normlab.launch.engines.fsdp import FSDPEngine
from normlab.launch.optim import build_optimizer
from normlab.launch.rundir.checkpoint import CheckpointManager


def config(args: argparse.Namespace, run_dir: Path):  # type: ignore[no-untyped-def]
    d = args.d_model
    return from_dict(
        {
            "run_dir": str(run_dir),
            "model": {
                "n_layers": args.layers,
                "d_model": d,
                "n_heads": 8,
                "d_ff": 8 * d // 3 // 64 * 64,
                "vocab_size": 8192,
                "max_seq_len": 128,
            },
            "data": {"vocab_size": 8192, "seq_len": 128, "batch_size": 4},
            "training": {"device": "cpu", "steps": args.steps},
            "schedule": {"warmup_steps": 0},
            "engine": {"name": "fsdp"},
            "checkpoint": {"async": True, "keep_last": 2},
        }
    )


def timed_run(
    engine: FSDPEngine, ckpt: CheckpointManager, args: argparse.Namespace
) -> tuple[float, float]:
    """(seconds blocked in saves, wall seconds) over args.steps steps."""
    gen = torch.Generator().manual_seed(0)
    blocked, start = 0.0, time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randint(0, 8192, (4, 129), generator=gen)
        engine.zero_grad()
        engine.forward_backward(x[:, :-1], x[:, 1:])
        engine.clip_and_step(1.0)
        ckpt.poll(engine)
        if step % args.every == 0:
            t = time.perf_counter()
            ckpt.save(engine, step, {"step": step})
            blocked += time.perf_counter() - t
    t = time.perf_counter()
    ckpt.wait(engine)  # the last save must land before the run may end
    blocked += time.perf_counter() - t
    return blocked, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--every", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(args, Path(tmp))
        engine = FSDPEngine.for_run(cfg)
        engine.setup(cfg.model_config(), partial(build_optimizer, cfg=cfg.optim))
        for mode in ("sync", "async"):
            ckpt = CheckpointManager(Path(tmp) / mode, keep_last=2, asynchronous=mode == "async")
            results[mode] = timed_run(engine, ckpt, args)
        engine.shutdown()
    saves = args.steps // args.every
    print(f"{saves} saves of a {args.layers}-layer d{args.d_model} model + AdamW state, one rank")
    print(f"{'':<28}{'sync':>10}{'async':>10}{'async/sync':>12}")
    for i, label in enumerate(("blocked in saves (s)", "wall time (s)")):
        s, a = results["sync"][i], results["async"][i]
        print(f"{label:<28}{s:10.2f}{a:10.2f}{a / s:12.2f}")


if __name__ == "__main__":
    main()
