"""Muon for the hidden matrices, AdamW for everything else, in one optimizer step (SCIENCE.md 6).

Muon (Jordan et al. 2024; Moonlight, Liu et al. 2025): for a weight W with gradient G,

    M = mu M + (1 - mu) G            (EMA momentum; the same direction as M = mu M + G)
    D = (1 - mu) G + mu M            (Nesterov)
    O = NewtonSchulz5(D)             (bf16, (a, b, c) = (3.4445, -4.7750, 2.0315))

Newton-Schulz runs in bf16 as in the paper (`optim.muon_ns_dtype: bf16`). `fp32` is offered for
exact comparisons across engines (a bf16 rounding flip from a different gradient-reduction order
moves the update by a bf16 ulp) and for CPUs without bf16 matmul units (about 20x slower there).
    W = W - lr * wd * W - lr * scale(W) * O

with scale `match_rms_adamw` = 0.2 sqrt(max(n, m)) (Moonlight: AdamW's lr and wd carry over) or
`original` = sqrt(max(1, n / m)) (Keller Jordan). Embeddings, the output head and every 1-D gain
or bias are AdamW groups of the same optimizer (torch.optim.AdamW's own step), so one set_lr and
one checkpoint cover both.

Sharded matrices (FSDP2 DTensors, Shard(0)): Newton-Schulz needs the whole matrix. The momentum
is elementwise and stays on the local shard; the Nesterov direction of matrix i is gathered to its
owner rank i % world, each owner orthogonalises its own matrices (the work is spread over ranks,
never repeated, never done per shard), and the result is scattered back as shards. DeepSpeed ZeRO
hands the optimizer flat fp32 partitions instead: the engine registers each one's `FlatLayout`
(which range of which matrix it holds, launch.optim.fragments) and every matrix is orthogonalised
whole by one owner rank the same way; momentum and weight decay are elementwise on the partition.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7
MuonScale = Literal["match_rms_adamw", "original"]
NSDtype = Literal["bf16", "fp32"]
NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

if TYPE_CHECKING:
    from normlab.launch.optim.fragments import FlatLayout


def shape_of(p: torch.Tensor) -> tuple[int, ...]:
    """A parameter's logical shape (ZeRO-3 partitions keep it in ds_shape; the storage is 1-D)."""
    return tuple(getattr(p, "ds_shape", p.shape))


def newton_schulz5(d: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Approximate U V^T of D = U S V^T with 5 quintic Newton-Schulz steps in bf16.

    X = D / (||D||_F + eps), transposed if tall; repeat A = X X^T; X = a X + (b A + c A A) X.
    The result has singular values in about [0.7, 1.2] (not exactly 1: the coefficients trade
    convergence for speed). Returns `dtype` (bf16 as in the paper) with D's shape.
    """
    a, b, c = NS_COEFFICIENTS
    x = d.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + NS_EPS)
    for _ in range(NS_STEPS):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A A
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A A) X
    return x.T if tall else x


def update_scale(shape: torch.Size | tuple[int, ...], kind: MuonScale) -> float:
    """Multiplier of the orthogonalised update of an (n, m) matrix (SCIENCE.md section 6)."""
    n, m = shape[0], shape[1]
    if kind == "match_rms_adamw":
        return 0.2 * math.sqrt(max(n, m))
    return math.sqrt(max(1.0, n / m))


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer: groups with `use_muon` True run Muon, the others torch.optim.AdamW.

    Muon groups take lr, weight_decay, momentum, nesterov, scale, ns_dtype; AdamW groups take lr,
    betas, eps, weight_decay. State: `momentum_buffer` per Muon matrix, AdamW's own per other
    tensor.
    """

    def __init__(
        self,
        groups: list[dict[str, Any]],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        momentum: float = 0.95,
        nesterov: bool = True,
        scale: MuonScale = "match_rms_adamw",
        ns_dtype: NSDtype = "bf16",
    ) -> None:
        for g in groups:
            if g["use_muon"]:
                g.setdefault("momentum", momentum)
                g.setdefault("nesterov", nesterov)
                g.setdefault("scale", scale)
                g.setdefault("ns_dtype", ns_dtype)
                bad = [shape_of(p) for p in g["params"] if len(shape_of(p)) != 2]
                if bad:
                    raise ValueError(f"Muon groups hold 2-D matrices only, got shapes {bad}")
        adam_groups = [g for g in groups if not g["use_muon"]]
        # torch's AdamW fills its defaults into these same dicts and steps them
        self._adamw = (
            torch.optim.AdamW(adam_groups, lr=lr, betas=betas, eps=eps) if adam_groups else None
        )
        super().__init__(groups, {"lr": lr, "weight_decay": 0.0})
        # id(flat ZeRO partition) -> its layout; registered by the DeepSpeed engine
        self.flat_layouts: dict[int, FlatLayout] = {}

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_group(group)
        if self._adamw is not None:
            # load_state_dict replaces the group dicts and the state: point AdamW at them again
            self._adamw.param_groups = [g for g in self.param_groups if not g["use_muon"]]
            self._adamw.state = self.state
            self._adamw.step()
        return loss

    def _muon_group(self, group: dict[str, Any]) -> None:
        mu = group["momentum"]
        params = [p for p in group["params"] if p.grad is not None]
        directions = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)
            directions.append(p.grad.lerp(buf, mu) if group["nesterov"] else buf)
        dtype = NS_DTYPES[group["ns_dtype"]]
        lr = group["lr"]
        if params and id(params[0]) in self.flat_layouts:
            for p, d in zip(params, directions, strict=True):
                self._flat_update(p, d, self.flat_layouts[id(p)], group, dtype)
            return
        for p, o in zip(params, orthogonalise_all(directions, dtype), strict=True):
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(o.to(p.dtype), alpha=-lr * update_scale(p.shape, group["scale"]))

    def _flat_update(
        self,
        p: torch.Tensor,
        direction: torch.Tensor,
        layout: FlatLayout,
        group: dict[str, Any],
        dtype: torch.dtype,
    ) -> None:
        """A ZeRO partition: each matrix's range gets its share of the whole-matrix update, with
        the same elementwise operations (and roundings) as the unpartitioned step."""
        from normlab.launch.optim.fragments import orthogonalise_flat

        outs = orthogonalise_flat(direction, layout, partial(newton_schulz5, dtype=dtype))
        lr = group["lr"]
        p.mul_(1 - lr * group["weight_decay"])
        for f, o in zip(layout.fragments, outs, strict=True):
            if f.numel:
                alpha = -lr * update_scale(f.shape, group["scale"])
                p.narrow(0, f.offset, f.numel).add_(o, alpha=alpha)


def orthogonalise_all(
    directions: list[torch.Tensor], dtype: torch.dtype = torch.bfloat16
) -> list[torch.Tensor]:
    """Newton-Schulz of each matrix: plain tensors here, DTensor shards through their owners."""
    if directions and hasattr(directions[0], "device_mesh"):
        from normlab.launch.optim.sharded import orthogonalise_sharded

        return orthogonalise_sharded(directions, partial(newton_schulz5, dtype=dtype))
    return [newton_schulz5(d, dtype) for d in directions]


def split_for_muon(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Muon: every 2-D hidden matrix (q, k, v, o, MLP). AdamW: the output head (decayed, as in
    AdamW's grouping), embeddings and every 1-D gain or bias (not decayed). Empty groups dropped.
    """
    embeds = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    head = getattr(model, "head", None)
    heads = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    muon, head_params, rest = [], [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if len(shape_of(p)) < 2 or id(p) in embeds:
            rest.append(p)
        elif id(p) in heads:
            head_params.append(p)
        else:
            muon.append(p)
    groups = [
        {"params": muon, "use_muon": True, "weight_decay": weight_decay, "group": "muon"},
        {"params": head_params, "use_muon": False, "weight_decay": weight_decay, "group": "decay"},
        {"params": rest, "use_muon": False, "weight_decay": 0.0, "group": "no_decay"},
    ]
    return [g for g in groups if g["params"]]
