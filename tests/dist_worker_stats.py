"""Worker of test_distributed's statistics test, run by torchrun on 2 ranks (not a test module).

`python -m torch.distributed.run ... dist_worker_stats.py RECIPE OUT.json [overrides]`: one
forward/backward of a fixed global batch of 4 (2 per rank), then the global sum of squares of
every parameter and gradient assembled from `engine.storage.local`, and of every parameter as
`engine.storage.full` gathers it, written by rank 0.
"""

from __future__ import annotations

import json
import sys
from functools import partial

import torch
from normlab.launch.config import load_config
from normlab.launch.optim import build_optimizer
from normlab.launch.registry import ENGINES, resolve

GLOBAL_BATCH, VOCAB, SEQ = 4, 512, 32


def batch() -> torch.Tensor:
    return torch.randint(
        0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1)
    )


def main() -> None:
    cfg = load_config(sys.argv[1], sys.argv[3:])
    torch.manual_seed(0)
    engine = resolve(ENGINES, cfg.engine.name).for_run(cfg)
    engine.setup(cfg.model_config(), partial(build_optimizer, cfg=cfg.optim))
    per = GLOBAL_BATCH // engine.world_size
    x = batch()[engine.rank * per : (engine.rank + 1) * per]
    engine.zero_grad()
    engine.forward_backward(x[:, :-1], x[:, 1:])
    named = list(engine.model.named_parameters())

    def squares(kind: str) -> dict[str, float]:
        parts = engine.storage.local([p for _, p in named], kind)  # type: ignore[arg-type]
        out = {}
        for (name, _), (t, sharded) in zip(named, parts, strict=True):
            v = torch.zeros(()) if t is None else t.detach().float().square().sum()
            out[name] = float(engine.all_reduce(v, "sum") if sharded else v)
        return out

    result = {"grad": squares("grad"), "param": squares("param")}
    full = {name: engine.storage.full(p).float().square().sum() for name, p in named}
    result["full"] = {name: float(v) for name, v in full.items()}
    engine.clip_and_step(cfg.optim.grad_clip)
    engine.shutdown()
    if engine.rank == 0:
        with open(sys.argv[2], "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
