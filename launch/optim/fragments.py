"""Newton-Schulz of matrices that DeepSpeed ZeRO keeps as ranges of flat fp32 partitions.

ZeRO hands the client optimizer one flat 1-D fp32 tensor per parameter group and rank (ZeRO-1/2:
a contiguous slice of the group's concatenated parameters; ZeRO-3: each parameter's own equal
slice, concatenated). A matrix is then a set of contiguous ranges of its flattened elements, one
per rank that holds any of it. Moonlight's rule (SCIENCE.md section 6) is to orthogonalise the
WHOLE matrix, so every matrix gets one owner rank:

- the rank that holds all of it, when one does (most matrices under ZeRO-1/2): no communication;
- otherwise rank i % world (matrix i of the partition): the other ranks send it their ranges
  (gather), it runs Newton-Schulz once on the reassembled matrix and sends each rank its range
  of the result back (scatter). The work is spread over ranks and never repeated.

All gathers are issued before the work and all scatters after it, as in launch.optim.sharded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Fragment:
    """This rank's range of one matrix inside a flat partition."""

    shape: tuple[int, int]
    offset: int  # where the range starts in the flat partition
    start: int  # where it starts in the flattened matrix
    numel: int  # its length; 0 when this rank holds none of the matrix


class FlatLayout:
    """The matrices of one flat partition and every rank's range of each (exchanged once)."""

    def __init__(
        self,
        fragments: list[Fragment],
        group: dist.ProcessGroup | None,
        device: torch.device,
    ) -> None:
        self.fragments, self.group = fragments, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        local = torch.tensor([[f.start, f.numel] for f in fragments], dtype=torch.long)
        local = local.reshape(len(fragments), 2).to(device)
        table = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(table, local, group=group)
        # ranges[i][r] = (start, numel) of matrix i on rank r
        self.ranges = torch.stack(table, dim=1).cpu().tolist()
        self.owners = [self._owner(i, f) for i, f in enumerate(fragments)]

    def _owner(self, i: int, f: Fragment) -> int:
        total = f.shape[0] * f.shape[1]
        spans = sorted((s, n) for s, n in self.ranges[i] if n > 0)
        end = 0
        for s, n in spans:
            if s != end:
                raise ValueError(
                    f"matrix {i} ({f.shape}) is not covered exactly once by the ranks' ranges "
                    f"{self.ranges[i]}: cannot reassemble it for Newton-Schulz"
                )
            end = s + n
        if end != total:
            raise ValueError(f"matrix {i} ({f.shape}): the ranks hold {end} of {total} elements")
        whole = [r for r, (_, n) in enumerate(self.ranges[i]) if n == total]
        return whole[0] if whole else i % self.world


def orthogonalise_flat(
    direction: torch.Tensor,
    layout: FlatLayout,
    orthogonalise: Callable[[torch.Tensor], torch.Tensor],
) -> list[torch.Tensor]:
    """This rank's range of orthogonalise(whole matrix) for every fragment of `layout`, in the
    dtype of `direction` (empty where the rank holds none of the matrix)."""
    rank, world, group = layout.rank, layout.world, layout.group
    pieces: list[list[torch.Tensor] | None] = []
    works = []
    for i, f in enumerate(layout.fragments):
        local = direction.narrow(0, f.offset, f.numel)
        owner, width = layout.owners[i], max(n for _, n in layout.ranges[i])
        if width == f.shape[0] * f.shape[1]:  # one rank holds it all: nothing to move
            pieces.append([local] if rank == owner else None)
            continue
        padded = local.new_zeros(width)
        padded[: f.numel] = local
        got = [torch.empty_like(padded) for _ in range(world)] if rank == owner else None
        works.append(dist.gather(padded, got, group=group, group_dst=owner, async_op=True))
        pieces.append(got)
    for work in works:
        work.wait()
    outs, works = [], []
    for i, (f, got) in enumerate(zip(layout.fragments, pieces, strict=True)):
        owner, width = layout.owners[i], max(n for _, n in layout.ranges[i])
        full = None
        if got is not None:
            full = _reassemble(got, layout.ranges[i], f.shape, width == f.shape[0] * f.shape[1])
            full = orthogonalise(full.view(f.shape)).to(direction.dtype).flatten()
        if width == f.shape[0] * f.shape[1]:
            outs.append(full if full is not None else direction.new_zeros(0))
            continue
        out = direction.new_empty(width)
        send = None
        if full is not None:
            send = [_padded(full, s, n, width) for s, n in layout.ranges[i]]
        works.append(dist.scatter(out, send, group=group, group_src=owner, async_op=True))
        outs.append(out[: f.numel])
    for work in works:
        work.wait()
    return outs


def _reassemble(
    got: list[torch.Tensor], ranges: list[list[int]], shape: tuple[int, int], whole: bool
) -> torch.Tensor:
    if whole:
        return got[0]
    full = got[0].new_empty(shape[0] * shape[1])
    for piece, (start, numel) in zip(got, ranges, strict=True):
        full[start : start + numel] = piece[:numel]
    return full


def _padded(full: torch.Tensor, start: int, numel: int, width: int) -> torch.Tensor:
    out = full.new_zeros(width)
    out[:numel] = full[start : start + numel]
    return out
