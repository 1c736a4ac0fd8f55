"""Where DeepSpeed ZeRO keeps each parameter (the `ParamStorage` of `engine deepspeed`).

ZeRO-1/2 keep the model's weights whole on every rank and step this rank's fragment of one flat
fp32 master partition per group; the reduced gradient exists only as that fragment, between the
backward and the step. ZeRO-3 keeps each weight flattened and split into equal rank-ordered parts
(`ds_tensor`, the last padded) with its own fp32 master part. None of these are DTensors, so each
operation of the accessor reads DeepSpeed's own links (`_hp_mapping`, `ds_tensor`, the
`deepspeed.utils.safe_*` functions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from normlab.launch.engines.deepspeed_muon import probe_step, register_flat_layouts
from normlab.launch.engines.storage import Kind, OptimizerFactory, ParamStorage, Parts
from torch import nn


def _grad_fragment(p: Any) -> torch.Tensor:
    """The part of p's reduced gradient that ZeRO-1/2 keeps on this rank (empty if none)."""
    mapping = getattr(p, "_hp_mapping", None)
    if mapping is None:
        return p.new_zeros(0, dtype=torch.float32)
    frag = mapping.get_lp_grad_fragment(p._index_in_param_group).float().flatten()
    address = mapping.lp_fragment_address
    if frag.numel() == p.numel():  # some versions hand back the whole gradient
        frag = frag.narrow(0, address.start, address.numel)
    return frag


class DeepSpeedStorage(ParamStorage):
    """ZeRO stage `stage` on rank `rank` of `world`; `config` is the run's DeepSpeed config (the
    self-check's probe runs through an engine of the same stage)."""

    def __init__(self, stage: int, rank: int, world: int, config: dict[str, Any]) -> None:
        super().__init__()
        self.stage, self.rank, self.world, self.config = stage, rank, world, config

    def attach(self, zero_optimizer: Any, client: torch.optim.Optimizer) -> None:
        """Tell a MuonAdamW `client` which matrix ranges each of ZeRO's flat partitions holds on
        this rank (a no-op for other optimizers; collective)."""
        register_flat_layouts(zero_optimizer, client, self.stage)

    def local(self, params: list[nn.Parameter], kind: Kind) -> Parts:
        """ZeRO-3: each rank's partition of the weights and of the fp32 gradient (shards).
        ZeRO-1/2: full weight replicas; the gradient as this rank's fragment of the reduced
        fp32 gradient partition."""
        if self.stage == 3:
            from deepspeed.utils import safe_get_local_grad

            if kind == "param":
                return [(cast(Any, p).ds_tensor, True) for p in params]
            return [(safe_get_local_grad(p), True) for p in params]
        if kind == "param":
            return [(p, False) for p in params]
        return [(_grad_fragment(p), True) for p in params]

    @torch.no_grad()
    def full(self, param: torch.Tensor) -> torch.Tensor:
        """ZeRO-1/2: the replica itself; ZeRO-3: the weight gathered from every rank's part
        (collective), a copy that outlives the gather."""
        if self.stage != 3:
            return param.detach()
        import deepspeed

        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            return param.detach().clone()

    @torch.no_grad()
    def scale_rows_(self, param: Any, factors: torch.Tensor) -> None:
        """Row scaling on both copies ZeRO keeps: the model's weight (a full replica in ZeRO-1/2;
        in ZeRO-3 this rank's flat partition `ds_tensor`, plus the gathered tensor of a
        persistent small parameter) and this rank's piece of the fp32 master weight the optimizer
        steps, so the next forward and the next step both start from the scaled value."""
        shape = tuple(getattr(param, "ds_shape", param.shape))
        flat = factors.float().reshape(-1, 1).expand(shape[0], math.prod(shape[1:])).flatten()
        if self.stage == 3:
            from deepspeed.utils import safe_get_local_fp32_param, safe_set_local_fp32_param

            part = param.ds_tensor.numel()  # ZeRO-3 splits the flattened tensor, last one padded
            piece = flat.new_ones(part)
            own = flat[self.rank * part : (self.rank + 1) * part]
            piece[: own.numel()] = own
            piece = piece.to(param.ds_tensor.device)
            param.ds_tensor.mul_(piece.to(param.ds_tensor.dtype))
            master = safe_get_local_fp32_param(param)
            safe_set_local_fp32_param(param, master * piece.to(master.device))
            if param.numel() == flat.numel():  # a persistent (small) parameter stays gathered
                param.data.mul_(flat.view(shape).to(param.device, param.dtype))
            return
        param.mul_(flat.view(param.shape).to(param.device, param.dtype))
        mapping = getattr(param, "_hp_mapping", None)
        if mapping is not None:  # this rank's fragment of the fp32 master partition
            address = mapping.lp_fragment_address
            piece = flat.narrow(0, address.start, address.numel)
            mapping.hp_fragment.mul_(piece.to(mapping.hp_fragment.device))

    def probe_step(
        self, make_probe: Callable[[], nn.Module], factory: OptimizerFactory, grad: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """The self-check's probe through its own DeepSpeed engine of the run's ZeRO stage."""
        return probe_step(self.config, self.world, make_probe, factory, grad)
