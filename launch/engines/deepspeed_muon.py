"""Muon on DeepSpeed ZeRO 1, 2 and 3 with normlab's own optimizer (SCIENCE.md section 6).

DeepSpeed 0.19's MuonWithAuxAdam fixes the `original` update scale and runs a fp16 "gram"
Newton-Schulz, so normlab hands ZeRO its MuonAdamW like any client optimizer. ZeRO then steps it
on one flat fp32 partition per parameter group (ZeRO-3: per sub-group). Here each Muon partition
gets a `FlatLayout`: which range of which matrix it holds on this rank (ZeRO-1/2 from DeepSpeed's
own lp -> hp fragment links, ZeRO-3 from its gradient positions and the equal per-rank split of
each flattened parameter). MuonAdamW then orthogonalises every matrix whole on one owner rank
(launch.optim.fragments). The start-up self-check's probe runs through a DeepSpeed engine of the
same stage (ZeRO-3: built under zero.Init, as the model is), so a silent fallback there is seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from normlab.launch.errors import ConfigError
from normlab.launch.optim.fragments import FlatLayout, Fragment
from normlab.launch.optim.muon import shape_of
from torch import nn

OFFLOADS = ("offload_optimizer", "offload_param")
FP32_NAMES = ("fp32", "float32", "float", "torch.float32")  # DeepSpeed's DtypeEnum.fp32 spellings


def check_muon_config(config: dict[str, Any]) -> None:
    """Refuse the ZeRO settings normlab's Muon does not run under (before any step)."""
    zero = config.get("zero_optimization", {})
    offloaded = [k for k in OFFLOADS if (zero.get(k) or {}).get("device", "none") != "none"]
    if offloaded:
        raise ConfigError(
            f"optim.name muon cannot run with zero_optimization.{offloaded[0]} in "
            "engine.deepspeed_config: Muon gathers each matrix to one rank on the accelerator, "
            "and offloaded partitions live on the host; remove the offload for Muon"
        )
    if _picks_bf16_optimizer(config):
        raise ConfigError(
            "optim.name muon cannot run on ZeRO-1 with bf16 and data_types.grad_accum_dtype "
            "fp32 in engine.deepspeed_config: DeepSpeed then wraps the optimizer in its "
            "BF16_Optimizer, which hides the fp32 partitions Muon reassembles; drop "
            "grad_accum_dtype or use engine.zero_stage 2"
        )


def _picks_bf16_optimizer(config: dict[str, Any]) -> bool:
    """DeepSpeed's own rule (engine._do_optimizer_sanity_check): ZeRO-1, bf16 weights, fp32
    gradient accumulation and no offload select BF16_Optimizer instead of the ZeRO optimizer."""
    stage = config.get("zero_optimization", {}).get("stage", 0)
    bf16 = (config.get("bf16") or {}).get("enabled", False)
    accum = str((config.get("data_types") or {}).get("grad_accum_dtype") or "").lower()
    return stage == 1 and bool(bf16) and accum in FP32_NAMES


def register_flat_layouts(zero_opt: Any, client: torch.optim.Optimizer, stage: int) -> None:
    """Tell a MuonAdamW which matrix ranges each of its ZeRO partitions holds (collective)."""
    layouts = getattr(client, "flat_layouts", None)
    if layouts is None:  # not Muon
        return
    if stage == 3:
        parts = _zero3_parts(zero_opt, client)
    elif hasattr(zero_opt, "single_partition_of_fp32_groups"):
        parts = _zero12_parts(zero_opt, client)
    else:
        raise ConfigError(
            f"optim.name muon cannot run under DeepSpeed's {type(zero_opt).__name__} (ZeRO-1 "
            "with bf16 and fp32 gradient accumulation): it hides the fp32 partitions Muon "
            "reassembles; drop data_types.grad_accum_dtype or use engine.zero_stage 2"
        )
    for flat, fragments, group in parts:
        layouts[id(flat)] = FlatLayout(fragments, group, flat.device)


def _muon_group(client: torch.optim.Optimizer, index: int) -> bool:
    return bool(client.param_groups[index].get("use_muon"))


def _zero12_parts(zero_opt: Any, client: torch.optim.Optimizer) -> list:
    """ZeRO-1/2: group i's flat partition; each parameter's `_hp_mapping` (None when this rank
    holds none of it) says where its range starts in the partition and in the parameter."""
    parts = []
    for i, params in enumerate(zero_opt.bit16_groups):
        if not _muon_group(client, i):
            continue
        fragments = []
        for p in params:
            mapping = getattr(p, "_hp_mapping", None)
            shape = shape_of(p)
            if mapping is None:
                fragments.append(Fragment(shape, 0, 0, 0))  # type: ignore[arg-type]
                continue
            hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
            fragments.append(Fragment(shape, hp.start, lp.start, lp.numel))  # type: ignore[arg-type]
        flat = zero_opt.single_partition_of_fp32_groups[i]
        parts.append((flat, fragments, zero_opt.real_dp_process_group[i]))
    return parts


def _zero3_parts(zero_opt: Any, client: torch.optim.Optimizer) -> list:
    """ZeRO-3: sub-group s's flat partition concatenates each parameter's partition (the
    flattened parameter split into equal rank-ordered parts, the last padded)."""
    rank = dist.get_rank(zero_opt.dp_process_group)
    parts = []
    for sub, params in enumerate(zero_opt.fp16_groups):
        if not _muon_group(client, zero_opt.sub_group_to_group_id[sub]):
            continue
        fragments = []
        for p in params:
            _, offset, part = zero_opt.grad_position[zero_opt.get_param_id(p)]
            start = rank * part
            numel = max(0, min(p.ds_numel - start, part))
            fragments.append(Fragment(shape_of(p), offset, start if numel else 0, numel))  # type: ignore[arg-type]
        flat = zero_opt.fp32_partitioned_groups_flat[sub]
        parts.append((flat, fragments, zero_opt.dp_process_group))
    return parts


def probe_config(config: dict[str, Any], world: int) -> dict[str, Any]:
    """The run's DeepSpeed config for a one-sample probe step: same ZeRO stage and bf16 setting;
    no clipping and no fp16 loss scaling (the probe's gradient is given, not learned)."""
    out = {k: v for k, v in config.items() if k not in ("fp16", "gradient_clipping")}
    out.update(
        train_batch_size=world,
        train_micro_batch_size_per_gpu=1,
        gradient_accumulation_steps=1,
        gradient_clipping=0.0,
        fp16={"enabled": False},
    )
    return out


def probe_step(
    config: dict[str, Any],
    world: int,
    make_probe: Callable[[], nn.Module],
    factory: Callable[[nn.Module], torch.optim.Optimizer],
    grad: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    """One DeepSpeed step of the run's optimizer on the probe with gradient `grad` (every rank
    the same, so the data-parallel mean is `grad`); the whole fp32 weight after it, and the lr."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    config = probe_config(config, world)
    stage = config["zero_optimization"]["stage"]
    if stage == 3:
        with torch.random.fork_rng(devices=[]), deepspeed.zero.Init(config_dict_or_path=config):
            probe = make_probe()
    else:
        probe = make_probe()
    opt = factory(probe)
    ds, *_ = deepspeed.initialize(model=probe, optimizer=opt, config=config)
    try:
        register_flat_layouts(ds.optimizer, opt, stage)
        weight = probe.weight  # type: ignore[union-attr]
        loss = ds(grad.to(device=ds.device, dtype=torch.float32))
        ds.backward(loss)
        ds.step()
        full = safe_get_full_fp32_param(weight)
        return full.detach().float().cpu().reshape(shape_of(weight)), opt.param_groups[0]["lr"]
    finally:
        ds.destroy()
