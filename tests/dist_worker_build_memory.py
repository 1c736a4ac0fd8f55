"""Worker of test_scale's construction-memory test (not a test module), 2 gloo ranks.

`dist_worker_build_memory.py OUT.json`: the peak growth of each rank's resident set while
(1) the FSDP2 engine sets up the 350m preset (fp32) and (2) ZeRO-3 constructs it under
zero.Init. Method: MALLOC_MMAP_THRESHOLD_ (set by the test) gives each tensor-sized block its own
mapping, returned to the OS when freed, so the resident set follows live tensors; before each
measurement the baseline resident set is read and the kernel's high-water mark reset (`5` into
/proc/self/clear_refs); the peak growth is VmHWM - baseline.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from normlab.launch.config import load_config
from normlab.launch.engines.base import RunFacts
from normlab.launch.engines.construct import build_zero3
from normlab.launch.engines.deepspeed_engine import ds_config, skip_shm_comm_build
from normlab.launch.engines.fsdp import FSDPEngine
from normlab.launch.optim import build_optimizer
from normlab.model.presets import count_params

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "presets" / "350m.yaml"
CPU_FP32 = ["training.device=cpu", "precision.dtype=fp32", "data.dataset=bundled"]


def status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_growth(build) -> tuple[int, object]:  # type: ignore[no-untyped-def]
    gc.collect()
    base = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    made = build()
    return status_bytes("VmHWM") - base, made


def gather(value: int) -> list[int]:
    out = [torch.zeros((), dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor(value))
    return [int(v) for v in out]


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_config(RECIPE, [*CPU_FP32, "engine.name=fsdp"])
    engine = FSDPEngine.for_run(cfg)
    fsdp, _ = peak_growth(
        lambda: engine.setup(cfg.model_config(), partial(build_optimizer, cfg=cfg.optim))
    )
    engine.release()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    skip_shm_comm_build()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    z3cfg = load_config(RECIPE, [*CPU_FP32, "engine.name=deepspeed", "engine.zero_stage=3"])
    config = ds_config(z3cfg.engine, z3cfg.precision, RunFacts.of(z3cfg), dist.get_world_size())
    zero3, module = peak_growth(lambda: build_zero3(z3cfg.model_config(), 0, config))
    result = {
        "full_bytes": count_params(cfg.model_config()) * 4,
        "fsdp": gather(fsdp),
        "zero3": gather(zero3),
    }
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(result))
    del module
    engine.shutdown()


if __name__ == "__main__":
    main()
