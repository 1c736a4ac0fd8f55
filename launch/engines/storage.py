"""Where an engine keeps each parameter: the one accessor that Muon's start-up self-check, QK-Clip
and the instruments share, so a feature that reads or edits weights does not widen the engine.

`ParamStorage` covers plain tensors (one process) and FSDP2 DTensors (each rank its Shard(0) rows of
every parameter and gradient); DeepSpeed ZeRO keeps flat partitions and fp32 master copies and has
its own (`launch.engines.deepspeed_storage.DeepSpeedStorage`). Every engine holds one as
`engine.storage`:

    local(params, kind)        this rank's part of each weight or gradient; is it a shard
    adam_state(opt, param)     this rank's part of the parameter's Adam moments, its step and group
    full(param)                the whole weight on every rank (a collective where sharded)
    scale_rows_(param, f)      row r of the weight times f[r], in every copy the engine steps
    probe_step(probe, opt, g)  one optimizer step on a probe held as the weights are
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import nn

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
Parts = list[tuple[torch.Tensor | None, bool]]  # (this rank's part or None, is a shard)
Kind = Literal["param", "grad"]


@torch.no_grad()
def scale_rows_(param: torch.Tensor, factors: torch.Tensor) -> None:
    """param[r, ...] *= factors[r]: plain tensors, and FSDP2 DTensors (each rank its own rows)."""
    factors = factors.to(param.dtype).reshape(-1, *([1] * (param.ndim - 1)))
    param.mul_(_like(factors.expand(param.shape).contiguous(), param))


def _like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`value` (the whole tensor, the same on every rank) placed as `param` is: a DTensor with its
    mesh and placements (each rank keeps its own part, no communication), else itself."""
    mesh = getattr(param, "device_mesh", None)
    if mesh is None:
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value, mesh, cast(Any, param).placements, src_data_rank=None)


@dataclass(frozen=True)
class AdamPart:
    """This rank's part of one parameter's AdamW state: the moments (flat or shaped, aligned with
    `local(..., "grad")`'s part), the step count, the group's betas and eps, and whether parts are
    shards to sum across ranks."""

    m: torch.Tensor  # exp_avg
    v: torch.Tensor  # exp_avg_sq
    step: float
    betas: tuple[float, float]
    eps: float
    sharded: bool


class ParamStorage:
    """Parameters as plain tensors or FSDP2 DTensors. `wrap` places a probe module the way the
    model's parameters are placed (identity for one process, `fully_shard` for FSDP2)."""

    def __init__(self, wrap: Callable[[nn.Module], nn.Module] | None = None) -> None:
        self._wrap = wrap or (lambda module: module)

    def local(self, params: list[nn.Parameter], kind: Kind) -> Parts:
        """This rank's part of each parameter (or of its gradient, between the backward and the
        step) and whether the parts are shards to sum across ranks (True) or full replicas to
        count once (False); None where there is no gradient. A DTensor gives its local shard."""
        out: Parts = []
        for p in params:
            t = p if kind == "param" else p.grad
            sharded = t is not None and hasattr(t, "to_local")
            out.append((t.to_local() if sharded else t, sharded))  # type: ignore[union-attr]
        return out

    def adam_state(self, optimizer: torch.optim.Optimizer, param: nn.Parameter) -> AdamPart | None:
        """The AdamW state of `param` in the torch optimizer (None before its first step, or for
        a parameter without a second moment, e.g. one of Muon's matrices)."""
        state = optimizer.state.get(param)
        if not state or "exp_avg_sq" not in state:
            return None
        group = next(g for g in optimizer.param_groups if any(q is param for q in g["params"]))
        m, v = state["exp_avg"], state["exp_avg_sq"]
        sharded = hasattr(m, "to_local")
        if sharded:
            m, v = m.to_local(), v.to_local()
        return AdamPart(m, v, float(state["step"]), tuple(group["betas"]), group["eps"], sharded)

    @torch.no_grad()
    def full(self, param: torch.Tensor) -> torch.Tensor:
        """The whole parameter, detached, on every rank (a DTensor is gathered: call it on every
        rank in the same order)."""
        whole = param.full_tensor() if hasattr(param, "full_tensor") else param
        return whole.detach()

    def scale_rows_(self, param: nn.Parameter, factors: torch.Tensor) -> None:
        """Multiply row r of `param` by factors[r] (QK-Clip, after the step)."""
        scale_rows_(param, factors)

    def probe_step(
        self, make_probe: Callable[[], nn.Module], factory: OptimizerFactory, grad: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """One step of the run's optimizer on a probe (one parameter, `weight`, zero) held as the
        model's parameters are, with gradient `grad` on every rank. Returns the whole weight
        after the step (fp32, CPU) and the optimizer's lr."""
        probe = self._wrap(make_probe())
        opt = factory(probe)
        w = probe.weight
        assert isinstance(w, torch.Tensor)
        w.grad = _like(grad.to(w.device, w.dtype), w)
        opt.step()
        return self.full(w).float().cpu(), opt.param_groups[0]["lr"]
