"""Worker of test_muon's sharded self-check test (not a test module), run by torchrun on 2 gloo
ranks: `dist_worker_muon_selfcheck.py OUT.json`.

For ZeRO 1, 2 and 3 the start-up self-check runs on normlab's Muon (it must pass, and the probe
matrix of 32 x 64 is split between the two ranks' partitions, so the whole-matrix gather is what
passes), then again with each silent failure forced (it must refuse): Newton-Schulz skipped (SGD),
each rank orthogonalising only its own range (shard-wise), and, on ZeRO-3, the Muon/AdamW split
reading the partitioned storage's shape instead of ds_shape (zero.Init switching Muon off). Rank 0
writes {case: singular values or the refusal} to OUT.json.

On FSDP2 (the probe's 32 rows split 16 / 16 between the ranks) the same: normlab's Muon must pass;
Newton-Schulz skipped (SGD), each rank orthogonalising its own row shard instead of the gathered
matrix, and the factory quietly building AdamW must each be refused.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import Any

import normlab.launch.optim.fragments as fragments
import normlab.launch.optim.muon as muon
import normlab.launch.optim.sharded as sharded
import torch
import torch.distributed as dist
from normlab.launch.config import OptimSection, RunConfig
from normlab.launch.engines.base import RunFacts
from normlab.launch.engines.deepspeed_engine import DeepSpeedEngine, ds_config, skip_shm_comm_build
from normlab.launch.engines.deepspeed_storage import DeepSpeedStorage
from normlab.launch.engines.fsdp import FSDPEngine, device_mesh
from normlab.launch.optim import build_optimizer
from normlab.launch.training.muon_selfcheck import SelfCheckError, check_orthogonalised
from torch.distributed.tensor import DTensor


def shardwise(direction: torch.Tensor, layout: Any, ns: Callable) -> list[torch.Tensor]:
    """Each rank orthogonalises its own rows of each matrix: the failure the gather prevents."""
    out = []
    for f in layout.fragments:
        local = direction.narrow(0, f.offset, f.numel)
        rows = local.view(-1, f.shape[1])
        out.append(ns(rows).to(direction.dtype).flatten() if f.numel else local)
    return out


def dtensor_shardwise(directions: list[DTensor], ns: Callable) -> list[DTensor]:
    """Each FSDP2 rank orthogonalises its own row shard of each DTensor, no gather."""
    return [
        DTensor.from_local(
            ns(d.to_local()).to(d.dtype),
            d.device_mesh,
            d.placements,
            shape=d.shape,
            stride=d.stride(),
        )
        for d in directions
    ]


FAILURES: dict[str, tuple[Any, str, Any]] = {
    "sgd": (muon, "newton_schulz5", lambda d, dtype=None: d),
    "shardwise": (fragments, "orthogonalise_flat", shardwise),
    "zero_init_shape": (muon, "shape_of", lambda p: tuple(p.shape)),
    "fsdp_shardwise": (sharded, "orthogonalise_sharded", dtensor_shardwise),
}


@contextmanager
def forced(failure: str | None):
    if failure is None:
        yield
        return
    module, name, value = FAILURES[failure]
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def engine_for(stage: int) -> tuple[DeepSpeedEngine, OptimSection]:
    cfg = RunConfig()
    cfg.engine.name, cfg.engine.zero_stage = "deepspeed", stage
    cfg.optim = OptimSection(name="muon", lr=0.02, muon_ns_dtype="fp32")
    cfg.data.batch_size, cfg.training.grad_accum = 1, 1
    engine = DeepSpeedEngine.for_run(cfg)
    engine._device, engine._rank, engine._world = torch.device("cpu"), dist.get_rank(), 2
    engine._config = ds_config(cfg.engine, cfg.precision, RunFacts.of(cfg), 2)
    # what setup() gives the engine: the probe steps through DeepSpeed of the same ZeRO stage
    engine.storage = DeepSpeedStorage(stage, engine._rank, 2, engine._config)
    return engine, cfg.optim


def self_check(engine: Any, optim: OptimSection, failure: str | None) -> Any:
    """The start-up self-check through `engine` with `failure` forced: sv or the refusal."""
    with forced(failure):
        try:
            factory = partial(build_optimizer, cfg=optim)
            sv = check_orthogonalised(engine, factory, "match_rms_adamw")
        except SelfCheckError as exc:
            return {"refused": str(exc)}
    return {"sv": sv.tolist()}


def run_case(stage: int, failure: str | None) -> Any:
    engine, optim = engine_for(stage)
    return self_check(engine, optim, failure)


def fsdp_case(failure: str | None) -> Any:
    """The self-check through an FSDP2 engine on the 2-rank mesh, with `failure` forced
    ('adamw': the factory builds AdamW, nothing patched)."""
    cfg = RunConfig()
    cfg.engine.name = "fsdp"
    name = "adamw" if failure == "adamw" else "muon"
    cfg.optim = OptimSection(name=name, lr=0.02, muon_ns_dtype="fp32")
    engine = FSDPEngine.for_run(cfg)
    engine._device, engine._rank, engine._world = torch.device("cpu"), dist.get_rank(), 2
    engine._mesh = device_mesh("cpu", 2, 1)
    return self_check(engine, cfg.optim, None if failure == "adamw" else failure)


def main() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    skip_shm_comm_build()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for stage in (1, 2, 3):
        failures = [None, "sgd", "shardwise"] + (["zero_init_shape"] if stage == 3 else [])
        for failure in failures:
            results[f"zero{stage}/{failure or 'muon'}"] = run_case(stage, failure)
    for failure in (None, "sgd", "fsdp_shardwise", "adamw"):
        results[f"fsdp/{failure or 'muon'}"] = fsdp_case(failure)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)
    dist.barrier()
    # the FSDP/DeepSpeed state built above sits in reference cycles that still hold the process
    # group: destroyed at interpreter exit, gloo aborts ('terminate called without an active
    # exception', seen under load). Collected first, as DistributedEngine.shutdown does.
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    main()
