"""A checkpoint of any engine as one state dict keyed like `model.state_dict()`, in one process
without a process group: single-engine files directly, FSDP checkpoints through
torch.distributed.checkpoint (any saving world size), DeepSpeed ZeRO checkpoints through
DeepSpeed's own zero_to_fp32 consolidation (the fp32 master weights). Used by `normlab export`."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from normlab.launch.engines.fsdp import DCP_DIR, read_meta
from normlab.launch.engines.single import MODEL_FILE, check_compatible, read_file
from normlab.launch.errors import CheckpointError
from normlab.launch.extras import require
from normlab.launch.rundir.checkpoint import CheckpointManager, step_dir_name
from normlab.model import Transformer

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_key(key: str) -> str:
    """Parameter name without the wrappers of activation checkpointing, compile or DeepSpeed."""
    key = key.removeprefix("module.")
    for prefix in WRAPPER_PREFIXES:
        key = key.replace(prefix, "")
    return key


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    manager = CheckpointManager(run_dir, keep_last=1)
    if step is None:
        ckpt = manager.latest()
        if ckpt is None:
            raise CheckpointError(f"{run_dir} holds no checkpoint")
        return ckpt
    ckpt = manager.root / step_dir_name(step)
    if not ckpt.is_dir():
        found = ", ".join(p.name for p in manager.step_dirs()) or "none"
        raise CheckpointError(f"{run_dir} has no checkpoint at step {step} (found: {found})")
    return ckpt


def read_weights(ckpt: Path, model: Transformer) -> dict[str, torch.Tensor]:
    """The checkpoint's model weights keyed like `model.state_dict()`, whatever the engine."""
    meta = read_meta(ckpt)
    fmt = meta.get("format", "single")
    if fmt == "single":
        found = read_file(ckpt / MODEL_FILE, weights_only=True)
    elif fmt == "dcp":
        found = _read_dcp(ckpt / DCP_DIR, model)
    elif fmt == "deepspeed":
        found = _read_zero(ckpt, meta.get("tag", "deepspeed"))
    else:
        raise CheckpointError(f"{ckpt}: unknown checkpoint format {fmt!r}")
    found = {clean_key(k): v for k, v in found.items()}
    expected = model.state_dict()
    check_compatible(expected, found, ckpt)
    return {k: found[k].to(expected[k].dtype) for k in expected}


def _read_dcp(path: Path, model: Transformer) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    state = {"model": {k: v.clone() for k, v in model.state_dict().items()}}
    try:
        dcp.load(state, checkpoint_id=path, no_dist=True)
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        msg = str(exc).strip().splitlines()
        raise CheckpointError(f"cannot read {path}: {msg[-1] if msg else exc!r}") from None
    return state["model"]


def _read_zero(ckpt: Path, tag: str) -> dict[str, torch.Tensor]:
    require("deepspeed", f"reading the DeepSpeed checkpoint {ckpt}")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # consolidation runs on the host
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    try:
        return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag))
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"cannot consolidate the ZeRO checkpoint in {ckpt}: {exc}") from None
