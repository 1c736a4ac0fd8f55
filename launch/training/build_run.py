"""Setting a run up and restoring it: engine, data loaders, optimizer, schedule, checkpoints.

`build_parts` makes what one run needs from its config; `restore` puts the newest (or a named)
checkpoint's state into those parts and the callbacks; `extra_state` is what a checkpoint saves
beside the engine's model and optimizer state.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from normlab.data.mixture import MixtureLoader
from normlab.launch.callbacks import Callback
from normlab.launch.config import RunConfig
from normlab.launch.engines.base import Engine
from normlab.launch.errors import ConfigError
from normlab.launch.optim import build_optimizer
from normlab.launch.registry import ENGINES, resolve
from normlab.launch.rundir.checkpoint import CheckpointManager
from normlab.launch.rundir.resume import check_data_identity, check_global_batch, global_batch
from normlab.launch.rundir.rng import rng_state, seed_everything, set_rng_state
from normlab.launch.training.datasets import resolve_sources
from normlab.launch.training.muon_selfcheck import check_optimizer
from normlab.launch.training.schedule import lr_change, lr_plan, stable_end


@dataclass
class RunParts:
    engine: Engine
    loader: MixtureLoader  # train batches, and each source's validation batches
    lr_at: Callable[[int], float]  # the learning rate of a step: optim.lr times the schedule
    tokens_per_step: int
    ckpt: CheckpointManager
    global_batch: dict[str, int]  # sequences per step and how ranks and micro-batches split it
    stable_end: int | None  # WSD: the step checkpointed and kept for extending the run


@dataclass
class Restored:
    path: Path  # the checkpoint directory
    step: int
    stats: dict[str, Any]
    notices: list[str]  # lines for the user: recipe values that replace the checkpoint's, lr


def rank_world() -> tuple[int, int]:
    """Rank and world size before the engine is set up (from the launcher's environment)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def build_parts(cfg: RunConfig, run_dir: Path) -> RunParts:
    if cfg.training.threads:
        torch.set_num_threads(cfg.training.threads)
    seed_everything(cfg.training.seed)
    engine = resolve(ENGINES, cfg.engine.name).for_run(cfg)
    specs = resolve_sources(cfg.data, quiet=True)
    d = cfg.data
    rank, world = rank_world()
    loader = MixtureLoader(specs, d.seq_len, d.batch_size, cfg.training.seed, rank, world)
    model_cfg = cfg.model_config()
    if model_cfg.vocab_size < loader.vocab_size:
        raise ConfigError(
            f"model.vocab_size ({model_cfg.vocab_size}) is smaller than the tokenizer of "
            f"{specs[0].path} ({loader.vocab_size})"
        )
    factory = partial(build_optimizer, cfg=cfg.optim)
    engine.setup(model_cfg, factory)
    check_optimizer(engine, cfg.optim, factory)  # refuses a silent fallback
    stable = stable_end(cfg.schedule, cfg.training.steps)
    stable = stable if stable is not None and 0 < stable < cfg.training.steps else None
    return RunParts(
        engine=engine,
        loader=loader,
        lr_at=lr_plan(cfg.optim.lr, cfg.schedule, cfg.training.steps, model_cfg.d_model),
        tokens_per_step=d.batch_size * d.seq_len * cfg.training.grad_accum * world,
        ckpt=CheckpointManager(
            run_dir, cfg.checkpoint.keep_last, asynchronous=cfg.checkpoint.async_, pinned=stable
        ),
        global_batch=global_batch(cfg, world),
        stable_end=stable,
    )


def restore(
    cfg: RunConfig,
    parts: RunParts,
    callbacks: list[Callback],
    from_step: str | None,
    force: bool = False,
    changed_data: bool = False,
) -> Restored | None:
    """Load `from_step` (or `latest`) into the engine, the loader, the callbacks and the RNGs;
    None when the run has no checkpoint. The notices name what the recipe changed. Another
    global batch than the checkpoint's is refused (unless `force`); another number of ranks with
    the same global batch continues its sample order. A source whose tokenizer, shards or
    sequence count changed since the checkpoint is refused, `force` included, unless
    `changed_data` (--resume-on-changed-data)."""
    loaded = parts.ckpt.load(parts.engine, from_step)
    if loaded is None:
        return None
    path, extra = loaded
    check_global_batch(extra, parts.global_batch, force)
    notices = check_data_identity(extra, parts.loader.identity(), changed_data, path.name)
    parts.loader.load_state_dict(extra["loader"])
    for cb in callbacks:
        if cb.name in extra.get("callbacks", {}):
            cb.load_state_dict(extra["callbacks"][cb.name])
    set_rng_state(extra["rng"])
    if parts.ckpt.recipe_changes:
        changed = "; ".join(parts.ckpt.recipe_changes[:6])
        notices.append(f"recipe values replace the checkpoint's: {changed}")
    step = int(extra["step"])
    schedule = lr_change(extra.get("config") or {}, cfg, step)
    notices += [schedule] if schedule else []
    stats = dict(extra["stats"])
    saved = (extra.get("global_batch") or {}).get("world_size")
    stats["ranks"], resized = ranks_history(stats.get("ranks"), saved, step, parts.global_batch)
    notices += [resized] if resized else []
    return Restored(path, step, stats, notices)


def ranks_history(
    history: list[list[int]] | None, saved: int | None, step: int, now: dict[str, int]
) -> tuple[list[list[int]], str | None]:
    """[[first step, ranks], ...]: the number of ranks of each stretch of the run (summary.json,
    `compare`), extended when this resume runs on another number; and the notice saying so."""
    world = int(now["world_size"])
    history = [list(h) for h in history] if history else ([[0, int(saved)]] if saved else [])
    if history and history[-1][1] != world:
        before = history[-1][1]
        history.append([step, world])
        return history, f"resumed on {world} rank(s) from step {step} (written on {before})"
    return history or [[step, world]], None


def extra_state(
    cfg: RunConfig, step: int, loader: MixtureLoader, stats: dict, callbacks: list[Callback]
) -> dict[str, Any]:
    return {
        "step": step,
        "loader": loader.state_dict(),
        "data_identity": loader.identity(),
        "global_batch": global_batch(cfg, loader.world_size),
        "rng": rng_state(),
        "stats": dict(stats),
        "callbacks": {cb.name: cb.state_dict() for cb in callbacks},
        "config": cfg.to_dict(),
    }
