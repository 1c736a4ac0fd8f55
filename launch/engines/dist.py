"""Process-group setup and teardown shared by the multi-process engines (FSDP2, DeepSpeed).

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without them (a plain
`normlab train` with a sharding engine) a one-process group on an in-memory store is created, so
the same recipe runs anywhere. The backend is gloo on CPU and NCCL on CUDA.

Teardown matters: a gloo rank whose process group is still alive at interpreter exit can abort
with `terminate called without an active exception`. `DistributedEngine.shutdown` therefore waits
for every rank, lets the engine drop its references and destroys the group, once.
"""

from __future__ import annotations

import atexit
import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from normlab.launch.engines.base import Engine, ReduceOp
from normlab.launch.engines.single import resolve_device
from normlab.launch.errors import ConfigError

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
EXPECTED_WORLD_ENV = "NORMLAB_EXPECTED_WORLD_SIZE"  # set by `normlab launch` on every node
TIMEOUT = timedelta(minutes=int(os.environ.get("NORMLAB_DIST_TIMEOUT_MIN", "30")))


def env_rank_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the launcher's environment; (0, 1, 0) without one."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def init_process_group(device_name: str) -> torch.device:
    """Join (or create) the default process group; return this rank's device."""
    rank, world, local = env_rank_world()
    expected = os.environ.get(EXPECTED_WORLD_ENV)
    if expected is not None and int(expected) != world:
        raise ConfigError(
            f"the rendezvous formed a world of {world} processes but this node was launched for "
            f"{expected} (--nnodes x --nproc-per-node): start every node with the same values"
        )
    device = resolve_device(device_name)
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ConfigError(
                f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices: lower "
                "--nproc-per-node to the number of GPUs per node"
            )
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        if dist.get_world_size() != world:
            raise ConfigError(
                f"process group has {dist.get_world_size()} ranks but WORLD_SIZE is {world}"
            )
        return device
    atexit.register(_destroy_at_exit)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=TIMEOUT)
    else:
        if world != 1:
            raise ConfigError(f"WORLD_SIZE={world} without MASTER_ADDR: start with normlab launch")
        for key in ("RANK", "LOCAL_RANK"):  # what torchrun would set; DeepSpeed reads them
            os.environ.setdefault(key, "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def _destroy_at_exit() -> None:
    """A rank leaving through an exception skips the barrier (its peers may never reach it) but
    still destroys the group before the interpreter tears down gloo's threads."""
    if dist.is_initialized():
        dist.destroy_process_group()


class DistributedEngine(Engine):
    """Rank bookkeeping, reductions, barrier and clean shutdown over the default process group.

    Rank and world size are cached at setup so `is_main` still answers after `shutdown`.
    """

    _rank: int = 0
    _world: int = 1
    _closed: bool = False

    def _join(self) -> torch.device:
        device = init_process_group(self.run.device)
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        return device

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        if not dist.is_initialized() or self._world == 1:
            return tensor
        out = tensor.detach().clone()
        # gloo has no AVG: sum, then divide
        dist.all_reduce(out, op=REDUCE_OPS["sum" if op == "mean" else op])
        return out / self._world if op == "mean" else out

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def release(self) -> None:
        """Drop the wrapped model and optimizer (subclasses); called before the group goes."""

    def shutdown(self) -> None:
        """Barrier, drop the engine's objects, then destroy the group. A process group that is
        still referenced after `destroy_process_group` (FSDP/DeepSpeed state lives in reference
        cycles) is destroyed during interpreter exit, where gloo aborts with `terminate called
        without an active exception`; collecting the cycles first destroys it here instead."""
        if self._closed:
            return
        self._closed = True
        try:
            if dist.is_initialized():
                dist.barrier()
            self.release()
            gc.collect()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            gc.collect()
