"""Newton-Schulz of row-sharded matrices (FSDP2 DTensors), one owner rank per matrix.

Moonlight's distributed Muon (SCIENCE.md section 6) gathers the whole momentum matrix before
orthogonalising: a shard is not the matrix. Here matrix i is gathered to owner rank i % world of
its shard group, every owner orthogonalises only its own matrices (all owners at once: the gathers
are issued first, then the work, then the scatters), and the result is scattered back in the
DTensor's own Shard(0) layout (torch.chunk row blocks: ceil(n / world) rows per rank, the last
ranks possibly fewer or none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


def shard_group(t: DTensor) -> tuple[dist.ProcessGroup, int, int]:
    """(group, rank in it, its size) of the mesh dimension that shards t's rows."""
    dims = [i for i, pl in enumerate(t.placements) if isinstance(pl, Shard)]
    if len(dims) != 1 or t.placements[dims[0]] != Shard(0):
        raise ValueError(f"sharded Muon expects rows sharded once (Shard(0)), got {t.placements}")
    group = t.device_mesh.get_group(dims[0])
    return group, dist.get_rank(group), dist.get_world_size(group)


def row_counts(n: int, world: int) -> list[int]:
    """Rows each rank holds under Shard(0) (torch.chunk): ceil(n / world) until they run out."""
    c = -(-n // world)
    return [max(0, min(n, (r + 1) * c) - r * c) for r in range(world)]


def orthogonalise_sharded(
    directions: list[DTensor], orthogonalise: Callable[[torch.Tensor], torch.Tensor]
) -> list[DTensor]:
    """orthogonalise(full matrix) for every DTensor, each computed once, by its owner rank."""
    jobs = []
    for i, d in enumerate(directions):
        group, rank, world = shard_group(d)
        jobs.append((d, group, rank, world, i % world))
    gathered = [_gather_to_owner(d.to_local(), d.shape, g, r, w, o) for d, g, r, w, o in jobs]
    for work in (w for _, w in gathered if w is not None):
        work.wait()
    outs = []
    for (d, group, rank, world, owner), (pieces, _) in zip(jobs, gathered, strict=True):
        full = None
        if rank == owner:
            counts = row_counts(d.shape[0], world)
            full = orthogonalise(torch.cat([p[:k] for p, k in zip(pieces, counts, strict=True)]))
        outs.append(_scatter_from_owner(full, d, group, rank, world, owner))
    for _, work in outs:
        work.wait()
    return [
        DTensor.from_local(local, d.device_mesh, d.placements, shape=d.shape, stride=d.stride())
        for (local, _), d in zip(outs, directions, strict=True)
    ]


def _gather_to_owner(
    local: torch.Tensor,
    shape: torch.Size,
    group: dist.ProcessGroup,
    rank: int,
    world: int,
    owner: int,
) -> tuple[list[torch.Tensor] | None, dist.Work | None]:
    rows = -(-shape[0] // world)
    padded = local.new_zeros((rows, *shape[1:]))
    padded[: local.shape[0]] = local
    pieces = [torch.empty_like(padded) for _ in range(world)] if rank == owner else None
    work = dist.gather(padded, pieces, group=group, group_dst=owner, async_op=True)
    return pieces, work


def _scatter_from_owner(
    full: torch.Tensor | None,
    d: DTensor,
    group: dist.ProcessGroup,
    rank: int,
    world: int,
    owner: int,
) -> tuple[torch.Tensor, dist.Work]:
    local_rows = d.to_local().shape[0]
    rows = -(-d.shape[0] // world)
    out = torch.empty((rows, *d.shape[1:]), dtype=d.dtype, device=d.to_local().device)
    pieces = None
    if rank == owner:
        assert full is not None
        padded = full.to(d.dtype).new_zeros((rows * world, *d.shape[1:]))
        padded[: d.shape[0]] = full
        pieces = list(padded.split(rows))
    work = dist.scatter(out, pieces, group=group, group_src=owner, async_op=True)
    return out[:local_rows], work
