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
from normlab.launch.engines.storage import AdamPart, Kind, OptimizerFactory, ParamStorage, Parts
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
        self._zero: Any = None  # DeepSpeed's ZeRO optimizer and the torch optimizer it steps
        self._client: torch.optim.Optimizer | None = None
        self._sub_of: dict[int, int] = {}  # ZeRO-3: id(param) -> its sub-group

    def attach(self, zero_optimizer: Any, client: torch.optim.Optimizer) -> None:
        """Keep ZeRO's optimizer and the torch optimizer it steps, and tell a MuonAdamW `client`
        which matrix ranges each of ZeRO's flat partitions holds on this rank (collective)."""
        self._zero, self._client = zero_optimizer, client
        if self.stage == 3:
            for sub, params in enumerate(zero_optimizer.fp16_groups):
                self._sub_of.update((id(p), sub) for p in params)
        register_flat_layouts(zero_optimizer, client, self.stage)

    def adam_state(self, optimizer: torch.optim.Optimizer, param: nn.Parameter) -> AdamPart | None:
        """This rank's fragment of `param`'s moments in ZeRO's flat fp32 state (ZeRO-1/2: the
        fragment `_hp_mapping` links, None where this rank holds none; ZeRO-3: its partition
        without the last rank's padding), with the step and group of its flat partition."""
        zero, client = self._zero, self._client
        if zero is None or client is None:
            return None
        p: Any = param
        if self.stage == 3:
            sub = self._sub_of.get(id(param))
            if sub is None:
                return None
            flat = zero.fp32_partitioned_groups_flat[sub]
            group = client.param_groups[zero.sub_group_to_group_id[sub]]
            _, offset, part = zero.grad_position[zero.get_param_id(p)]
            own = max(0, min(p.ds_numel - self.rank * part, part))
            moments = [client.state.get(flat, {}).get(k) for k in ("exp_avg", "exp_avg_sq")]
            if moments[0] is None or moments[1] is None:
                return None
            m, v = (x.narrow(0, offset, own) for x in moments)
        else:
            mapping = getattr(p, "_hp_mapping", None)
            if mapping is None:
                return None
            index = mapping.param_group_index
            flat = zero.single_partition_of_fp32_groups[index]
            group = client.param_groups[index]
            state = client.state.get(flat, {})
            if "exp_avg_sq" not in state:
                return None
            address = mapping.hp_fragment_address  # this parameter's range in the partition
            m, v = (
                state[k].narrow(0, address.start, address.numel) for k in ("exp_avg", "exp_avg_sq")
            )
        step = float(client.state[flat]["step"])
        return AdamPart(m, v, step, tuple(group["betas"]), group["eps"], True)

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
