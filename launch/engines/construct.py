"""Model construction for every engine: no rank ever holds more of the model than its own part.

torchtitan's order: build on the meta device (shapes only), wrap and shard, then `to_empty` on the
device and draw only the local part of each parameter. DeepSpeed ZeRO-3 instead constructs under
`deepspeed.zero.Init`, which partitions each module's parameters as soon as it is built, and then
draws each rank's flat partition. Values come from model.init's (seed, name, chunk) generators,
so every world size, shard layout and device starts from the same weights as one process.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from normlab.model import ModelConfig, Transformer
from normlab.model.attention import Attention
from normlab.model.init import Draw, canonical_name, init_plan
from torch import nn


def build_on_meta(model_cfg: ModelConfig) -> tuple[Transformer, dict[str, Draw]]:
    """The model with parameters on the meta device, and each parameter's distribution."""
    with torch.device("meta"):
        module = Transformer(model_cfg)
    return module, init_plan(module, model_cfg)


@torch.no_grad()
def materialize(module: nn.Module, plan: dict[str, Draw], seed: int, device: torch.device) -> None:
    """Allocate `module` (meta, possibly sharded) on `device` and draw its local values."""
    aliases = shared_parameters(module)
    module.to_empty(device=device)
    for sub, pname, owner, oname in aliases:  # to_empty gives each alias its own storage
        setattr(sub, pname, getattr(owner, oname))
    for sub in module.modules():
        if isinstance(sub, Attention):
            sub.reset_rope()  # non-persistent buffers: computed, not drawn
    for name, p in module.named_parameters():
        name = canonical_name(name)
        local, start = local_part(p)
        plan[name].fill_(local, seed, name, p.numel(), start)


def shared_parameters(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(module, name, owner, owner's name) for each parameter that is a second name of one seen
    before (a tied head: `head.weight is embed.weight`)."""
    first: dict[int, tuple[nn.Module, str]] = {}
    aliases = []
    for sub in module.modules():
        for pname, p in sub._parameters.items():
            if p is None:
                continue
            if id(p) in first:
                aliases.append((sub, pname, *first[id(p)]))
            else:
                first[id(p)] = (sub, pname)
    return aliases


def local_part(p: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this process's elements of p as a flat view, offset of the first in the flat whole).

    A DTensor sharded on dim 0 (FSDP2, HSDP) holds a block of whole rows: one flat range."""
    if not hasattr(p, "device_mesh"):
        return p.view(-1), 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if tuple(shape[1:]) != tuple(p.shape[1:]) or any(offset[1:]):
        raise NotImplementedError(f"sharding {p.placements} is not a block of rows")
    row = math.prod(p.shape[1:])  # from the shape: indexing a DTensor would gather it
    return p.to_local().view(-1), int(offset[0]) * row if shape[0] else 0


@torch.no_grad()
def build_zero3(model_cfg: ModelConfig, seed: int, ds_config: dict[str, Any]) -> Transformer:
    """Construct partitioned under deepspeed.zero.Init, then draw each rank's flat partition
    (ZeRO-3 splits the flattened parameter into equal contiguous parts, rank-ordered, the last
    padded). The global RNG is left as it was: zero.Init builds torch's default init first."""
    import deepspeed
    import torch.distributed as dist

    _, plan = build_on_meta(model_cfg)
    with torch.random.fork_rng(devices=[]), deepspeed.zero.Init(config_dict_or_path=ds_config):
        module = Transformer(model_cfg)
    for name, p in module.named_parameters():
        name = canonical_name(name)
        part = p.ds_tensor.view(-1)
        start = dist.get_rank(group=p.ds_process_group) * part.numel()
        count = max(0, min(p.ds_numel - start, part.numel()))
        plan[name].fill_(part[:count], seed, name, p.ds_numel, start)
    return module
