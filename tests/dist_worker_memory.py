"""Worker of test_memory_plan (not a test module): peak memory of training steps on one rank.

`[torchrun ...] dist_worker_memory.py RECIPE OUT.json [overrides]`. Method: run with glibc's
MALLOC_MMAP_THRESHOLD_ low (the test sets it) so every tensor-sized block is its own mapping and
returns to the OS when freed: the resident set then follows live tensors. First a throwaway
engine on a 1-layer model trains one step (loads torch's lazy modules and thread pools, which
are not training memory); then the baseline resident set is read, the kernel's high-water mark is
reset (`5` into /proc/self/clear_refs) and the real engine is set up and trains 3 steps. The peak
is VmHWM - baseline: everything the setup and the steps held at once.
"""

from __future__ import annotations

import gc
import json
import sys
from functools import partial
from pathlib import Path

import torch
from normlab.launch.config import load_config
from normlab.launch.optim import build_optimizer
from normlab.launch.registry import ENGINES, resolve


def status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def train(cfg, steps: int):
    engine = resolve(ENGINES, cfg.engine.name).for_run(cfg)
    engine.setup(cfg.model_config(), partial(build_optimizer, cfg=cfg.optim))
    per = cfg.data.batch_size
    gen = torch.Generator().manual_seed(engine.rank)
    for _ in range(steps):
        x = torch.randint(0, cfg.data.vocab_size, (per, cfg.data.seq_len + 1), generator=gen)
        engine.zero_grad()
        for _ in range(cfg.training.grad_accum):
            engine.forward_backward(x[:, :-1], x[:, 1:])
        engine.clip_and_step(cfg.optim.grad_clip)
    return engine


def main() -> None:
    recipe, out, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.set_num_threads(1)
    warm = train(load_config(recipe, [*overrides, "model.n_layers=1"]), 1)
    getattr(warm, "release", lambda: None)()
    del warm
    gc.collect()
    base = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    engine = train(load_config(recipe, overrides), 3)
    peak = status_bytes("VmHWM") - base
    result = {"rank": engine.rank, "peak": peak}
    engine.shutdown()
    if result["rank"] == 0:
        Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
