"""Optimizers with parameter groups: no weight decay on norms, biases or embeddings.

`adamw`: torch.optim.AdamW. `muon` (SCIENCE.md 6): Muon on the hidden matrices and AdamW on the
rest in one optimizer (launch.optim.muon), proved to orthogonalise by a start-up self-check
(launch.training.muon_selfcheck, run from the training build). `optim.qk_clip` adds QK-Clip after
every step (launch.instruments.qk_clip, a callback beside the instruments).

The learning rate has one source, `optim.lr`: the schedule (launch.training.schedule) turns it into
the rate of each step, and `set_lr` writes that rate times the group's `lr_mult` (µP/CompleteP's
class factor, SCIENCE.md 21; 1 under sp) into each group's `lr`, which torch's step reads. A group
holds no absolute rate of its own, so a resume with a new optim.lr needs nothing but the recipe.
"""

from __future__ import annotations

import torch
from normlab.launch.config import OptimSection
from normlab.launch.registry import OPTIMIZERS, resolve
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices of Linear layers decay; every 1-D tensor and every embedding does not.

    Embedding tables are excluded as in GPT-2/OLMo practice (rows of rare tokens would shrink to
    zero); with tied embeddings the shared matrix counts as an embedding.
    """
    embed_ids = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # ZeRO-3 builds partitioned (1-D storage); the parameter's shape is kept in ds_shape
        ndim = len(getattr(p, "ds_shape", p.shape))
        (no_decay if ndim < 2 or id(p) in embed_ids else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "group": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "group": "no_decay"},
    ]


def build_adamw(model: nn.Module, cfg: OptimSection) -> torch.optim.Optimizer:
    """torch.optim.AdamW over the two parameter groups (split by class under µP/CompleteP)."""
    groups = transfer_groups(model, param_groups(model, cfg.weight_decay), cfg)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def build_muon(model: nn.Module, cfg: OptimSection) -> torch.optim.Optimizer:
    """Muon on every 2-D hidden matrix, AdamW on embeddings, head, gains and biases."""
    from normlab.launch.optim.muon import MuonAdamW, split_for_muon

    return MuonAdamW(
        transfer_groups(model, split_for_muon(model, cfg.weight_decay), cfg),
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        momentum=cfg.muon_momentum,
        scale=cfg.muon_scale,
        ns_dtype=cfg.muon_ns_dtype,
    )


def transfer_groups(model: nn.Module, groups: list[dict], cfg: OptimSection) -> list[dict]:
    """Under µP/CompleteP (model.parametrization, SCIENCE.md 21): each sp group split by parameter
    class, with its lr, weight decay and AdamW eps multiplied by the class's factors. Under sp the
    groups are returned as they are. The base-lr classes come first (the logged lr is group 0's).
    """
    from normlab.model.init import canonical_name
    from normlab.model.parametrization import CLASSES, group_factors, param_class

    model_cfg = getattr(model, "config", None)
    if model_cfg is None or model_cfg.parametrization == "sp":
        return groups
    names = {id(p): canonical_name(n) for n, p in model.named_parameters()}
    order = ("embed", "head", "outer_vector", "block_vector", "hidden")
    assert sorted(order) == sorted(CLASSES)
    out = []
    for klass in order:
        for group in groups:
            params = [
                p
                for p in group["params"]
                if param_class(names[id(p)], len(getattr(p, "ds_shape", p.shape))) == klass
            ]
            if not params:
                continue
            f = group_factors(model_cfg, klass, bool(group.get("use_muon")), cfg.muon_scale)
            out.append(
                group
                | {
                    "params": params,
                    "group": f"{group['group']}/{klass}",
                    "lr": cfg.lr * f.lr,
                    "lr_mult": f.lr,
                    "weight_decay": group["weight_decay"] * f.weight_decay,
                    "eps": cfg.eps * f.eps,
                }
            )
    return out


def build_optimizer(model: nn.Module, cfg: OptimSection) -> torch.optim.Optimizer:
    """The recipe's optimizer; each group's `lr_mult` is its factor on the step's rate."""
    opt = resolve(OPTIMIZERS, cfg.name)(model, cfg)
    for group in opt.param_groups:
        group.setdefault("lr_mult", 1.0)
    return opt


def set_lr(opt: torch.optim.Optimizer, lr: float) -> float:
    """This step's rate `lr` (optim.lr times the schedule) into every group, times its lr_mult;
    returns the first group's lr for logging."""
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_mult"]
    return opt.param_groups[0]["lr"]
