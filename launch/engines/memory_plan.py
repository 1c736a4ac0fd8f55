"""Will a recipe fit (the work of `normlab plan`)? Per-rank memory of every engine and ZeRO
stage, with and without activation checkpointing (launch/engines/memory.py), and a verdict on the
configured one with what to change.
"""

from __future__ import annotations

import re
from dataclasses import replace

from normlab.launch.config import RunConfig
from normlab.launch.engines.memory import GIB, Estimate, Layout, estimate
from normlab.launch.errors import ConfigError
from normlab.model.config import ModelConfig
from normlab.model.presets import count_params

HEADROOM = 0.9  # of each GPU for the model: the rest is CUDA context, NCCL buffers, fragmentation
UNITS = {
    "": GIB,
    "g": GIB,
    "gb": GIB,
    "gib": GIB,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}


def parse_memory(text: str) -> float:
    """'80GB', '80GiB', '141G', '40960MiB' -> bytes. GB means GiB: GPUs are sold in binary units
    (an 80 GB A100 holds 81920 MiB)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"--gpu-memory must look like 80GB, 141GiB or 40960MiB, got {text!r}")
    return float(m.group(1)) * UNITS[m.group(2).lower()]


def layouts(cfg: RunConfig, world: int, nodes: int) -> list[tuple[str, Layout]]:
    """Every engine and stage the cluster can run, named as a recipe would set them."""
    base = Layout(
        engine="single",
        world=1,
        batch=cfg.data.batch_size,
        seq_len=cfg.data.seq_len,
        dtype=cfg.precision.dtype,
        optimizer=cfg.optim.name,
        cuda=cfg.training.device != "cpu",
        grad_accum=cfg.training.grad_accum,
    )
    fp8 = cfg.precision.fp8
    if fp8 is not None:
        gather = fp8.fsdp_float8_all_gather and not cfg.model_config().smooth_swiglu
        base = replace(base, fp8=fp8.recipe, fp8_gather=gather)
    out = [("single", base)] if world == 1 else []
    fsdp = replace(base, engine="fsdp", world=world)
    replicas = sorted({cfg.engine.replicate, nodes} - {1})
    shardings = [("fsdp", fsdp)] + [
        (f"fsdp replicate={r}", replace(fsdp, replicate=r))
        for r in replicas
        if world % r == 0 and r < world
    ]
    for name, lay in shardings:
        out.append((name, lay))
        if base.grad_accum > 1:  # where the gradients accumulate matters only then
            out.append((f"{name} grad_sync=step", replace(lay, grad_sync="step")))
    out += [  # Muon included: it runs on ZeRO 1-3 (launch/engines/deepspeed_muon.py)
        (f"deepspeed zero_stage={s}", replace(base, engine="deepspeed", world=world, zero_stage=s))
        for s in (1, 2, 3)
    ]
    return out


def configured(cfg: RunConfig, world: int) -> str:
    e = cfg.engine
    if e.name == "deepspeed":
        return f"deepspeed zero_stage={e.zero_stage}"
    name = f"fsdp replicate={e.replicate}" if e.name == "fsdp" and e.replicate > 1 else "fsdp"
    if e.name == "fsdp" and e.grad_sync == "step" and cfg.training.grad_accum > 1:
        name += " grad_sync=step"
    return name if e.name == "fsdp" or world > 1 else e.name


def plan_report(cfg: RunConfig, nodes: int, gpus_per_node: int, gpu_memory: str) -> list[str]:
    """The lines `normlab plan` prints: the setting, per-GPU memory of every engine and ZeRO stage
    with and without activation checkpointing, and the verdict on the configured layout."""
    if nodes < 1 or gpus_per_node < 1:
        raise ConfigError(
            f"--nodes and --gpus-per-node must be >= 1, got {nodes} and {gpus_per_node}"
        )
    capacity = parse_memory(gpu_memory)
    world = nodes * gpus_per_node
    if world % cfg.engine.replicate:
        raise ConfigError(
            f"engine.replicate ({cfg.engine.replicate}) must divide the world size ({world})"
        )
    lines = [header(cfg, nodes, gpus_per_node, capacity)]
    rows = layouts(cfg, world, nodes)
    mc = cfg.model_config()
    lines.append(
        f"{'GiB per GPU':<34}{'params':>8}{'grads':>8}{'optim':>8}{'gather':>8}"
        f"{'activ':>8}{'accum':>8}{'peak':>8}{'act+AC':>8}{'peak+AC':>9}"
    )
    lines += [table_line(name, lay, mc) for name, lay in rows]
    lines.append(PEAK_NOTE)
    lines.append(verdict(cfg, dict(rows), configured(cfg, world), capacity * HEADROOM))
    return lines


# `peak` is not the row's sum: the gradients are written as the backward frees the activations
PEAK_NOTE = (
    "peak = params + optim + gather + max(activ + accum, grads + step temporaries): the grads "
    "column is not added to activ"
)


def table_line(name: str, lay: Layout, mc: ModelConfig) -> str:
    """GiB per kind, the peak, and activations and peak with activation checkpointing."""
    plain = estimate(mc, lay)
    cells = [plain.params, plain.grads, plain.optimizer, plain.working, plain.activations]
    line = "".join(f"{v / GIB:8.1f}" for v in [*cells, plain.held, plain.total])
    if lay.engine == "single":  # activation checkpointing is an fsdp/deepspeed option
        return f"{name:<34}{line}{'-':>8}{'-':>9}"
    ac = estimate(mc, replace(lay, checkpointing=True))
    return f"{name:<34}{line}{ac.activations / GIB:8.1f}{ac.total / GIB:9.1f}"


def header(cfg: RunConfig, nodes: int, gpus_per_node: int, capacity: float) -> str:
    mc = cfg.model_config()
    return (
        f"{cfg.name}: {count_params(mc) / 1e9:.2f}B parameters, {cfg.precision.dtype}"
        f"{'' if cfg.precision.fp8 is None else ' + fp8 ' + cfg.precision.fp8.recipe}, "
        f"{cfg.optim.name}, micro-batch {cfg.data.batch_size} x {cfg.data.seq_len} tokens per "
        f"rank, grad_accum {cfg.training.grad_accum}; {nodes} node(s) x "
        f"{gpus_per_node} GPU(s) of {capacity / GIB:.0f} GiB "
        f"({HEADROOM:.0%} usable: {capacity * HEADROOM / GIB:.1f} GiB)"
    )


def verdict(cfg: RunConfig, rows: dict[str, Layout], mine: str, usable: float) -> str:
    """'fits' for the configured layout, or the smallest change that makes it fit: checkpointing
    on the same layout, another engine or stage as configured, another with checkpointing."""
    mc = cfg.model_config()
    ac_now = cfg.engine.activation_checkpointing
    need = estimate(mc, replace(rows[mine], checkpointing=ac_now)) if mine in rows else None
    if need is not None and need.total <= usable:
        return f"verdict: fits: {describe(mine, ac_now)} peaks at {gib(need)} of {usable / GIB:.1f}"
    head = (
        f"verdict: does not fit: {describe(mine, ac_now)} peaks at {gib(need)}"
        if need is not None
        else f"verdict: {mine} cannot run on this cluster"
    )
    options = [(mine, True)] if mine in rows else []
    if mine in rows and not ac_now and rows[mine].engine != "single":
        alone = estimate(mc, replace(rows[mine], checkpointing=True))  # said before the rest
        head += f" ({gib(alone)} with checkpointing)"
    options += [(name, ac_now) for name in rows] + [(name, True) for name in rows]
    for name, ac in options:
        if ac and rows[name].engine == "single":
            continue  # activation checkpointing is an fsdp/deepspeed option
        lay = replace(rows[name], checkpointing=ac)
        est = estimate(mc, lay)
        if est.total <= usable:
            return f"{head}; use {describe(name, ac)} ({gib(est)}): {changes(cfg, lay)}"
    return f"{head}; {smaller_batch(cfg, rows, usable)}"


def changes(cfg: RunConfig, lay: Layout) -> str:
    """The settings the advised layout changes, as overrides with the value each replaces:
    nothing the user set is dropped without a word (grad_sync=step among them)."""
    e = cfg.engine
    want: dict[str, tuple[object, object]] = {"engine.name": (lay.engine, e.name)}
    if lay.engine == "deepspeed":
        want["engine.zero_stage"] = (lay.zero_stage, e.zero_stage)
    if lay.engine == "fsdp":
        want["engine.replicate"] = (lay.replicate, e.replicate)
        if lay.grad_accum > 1:  # grad_sync matters only with accumulation
            want["engine.grad_sync"] = (lay.grad_sync, e.grad_sync)
    if lay.engine != "single":
        want["engine.activation_checkpointing"] = (lay.checkpointing, e.activation_checkpointing)
    if lay.batch != cfg.data.batch_size:
        want["data.batch_size"] = (lay.batch, cfg.data.batch_size)
    if lay.grad_accum != cfg.training.grad_accum:
        want["training.grad_accum"] = (lay.grad_accum, cfg.training.grad_accum)
    diff = [f"{k}={_text(new)} (was {_text(old)})" for k, (new, old) in want.items() if new != old]
    return "set " + ", ".join(diff) if diff else "as configured"


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def smaller_batch(cfg: RunConfig, rows: dict[str, Layout], usable: float) -> str:
    """The largest micro-batch that fits on some layout with checkpointing, with the gradient
    accumulation that keeps the global batch (estimated with that accumulation: the gradients
    it holds between micro-batches count), or more GPUs."""
    mc = cfg.model_config()
    per_rank = cfg.data.batch_size * cfg.training.grad_accum  # sequences per rank and step
    for batch in range(cfg.data.batch_size - 1, 0, -1):
        if per_rank % batch:
            continue  # the global batch would change
        accum = per_rank // batch
        for name, lay in rows.items():
            if lay.engine == "single":
                continue
            advised = replace(lay, checkpointing=True, batch=batch, grad_accum=accum)
            if advised.engine == "fsdp" and "grad_sync=" not in name:  # the user's, if it matters
                advised = replace(advised, grad_sync=cfg.engine.grad_sync)
            est = estimate(mc, advised)
            if est.total <= usable:
                return (
                    f"use {describe(name, True)} with data.batch_size={batch} and "
                    f"training.grad_accum={accum} to keep the global batch ({gib(est)}): "
                    f"{changes(cfg, advised)}"
                )
    return "nothing fits even at micro-batch 1 with ZeRO-3 and checkpointing: add GPUs"


def describe(name: str, ac: bool) -> str:
    return name + (" with activation checkpointing" if ac else "")


def gib(est: Estimate | None) -> str:
    return "?" if est is None else f"{est.total / GIB:.1f} GiB"
