"""`normlab export RUN_DIR --out DIR [--step N]`: one checkpoint of any engine -> one safetensors
file plus the resolved config, and a HF transformers model where the architecture exists there.

Runs in one process without a process group: single-engine checkpoints are read directly, FSDP
checkpoints through torch.distributed.checkpoint (any saving world size), DeepSpeed ZeRO
checkpoints through DeepSpeed's own zero_to_fp32 consolidation (the fp32 master weights).
The output is written into a temporary sibling and renamed, so a failed export leaves nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
import yaml

from launch.config import RunConfig, load_config
from launch.engines.fsdp import DCP_DIR, read_meta
from launch.engines.single import MODEL_FILE, check_compatible, read_file
from launch.errors import CheckpointError, RunDirError
from launch.training.checkpoint import CheckpointManager, step_dir_name
from model import Transformer

WEIGHTS, CONFIG, MODEL_CONFIG, HF_DIR = (
    "model.safetensors",
    "config.yaml",
    "model_config.json",
    "hf",
)
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="consolidate a run's checkpoint into safetensors (and HF format)"
    )
    p.add_argument("run_dir", help="a run directory (holding config.yaml and checkpoints/)")
    p.add_argument("--out", required=True, help="new output directory (must not exist)")
    p.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers export")
    p.set_defaults(func=run)


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
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # consolidation runs on the host
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    try:
        return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag))
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"cannot consolidate the ZeRO checkpoint in {ckpt}: {exc}") from None


def save_safetensors(model: Transformer, path: Path) -> None:
    """Every state_dict entry as its own tensor (a tied head is stored as a copy)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    meta = {"format": "pt", "model_config": json.dumps(model.config.to_dict())}
    save_file(tensors, str(path), metadata=meta)


def save_hf(model: Transformer, out: Path) -> str:
    """Write the HF model when a family matches; return a line saying what happened."""
    from model.hf import hf_family, to_hf

    try:
        family = hf_family(model.config)
    except ValueError as exc:
        return f"no HF export: {exc}"
    try:
        hf = to_hf(model)
    except ImportError:
        return "no HF export: transformers is not installed"
    hf.save_pretrained(str(out / HF_DIR))
    return f"HF {family} model -> {out / HF_DIR}"


def export(run_dir: Path, out: Path, step: int | None = None, hf: bool = True) -> list[str]:
    """Export one checkpoint of `run_dir` into the new directory `out`; return report lines."""
    if not (run_dir / CONFIG).is_file():
        raise RunDirError(f"{run_dir} is not a normlab run directory (no {CONFIG})")
    if out.exists():
        raise RunDirError(f"--out {out} already exists; choose a new directory")
    cfg: RunConfig = load_config(run_dir / CONFIG, [f"run_dir={run_dir}"])
    ckpt = find_checkpoint(run_dir, step)
    model = Transformer(cfg.model_config())
    model.load_state_dict(read_weights(ckpt, model))
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_safetensors(model, tmp / WEIGHTS)
        (tmp / CONFIG).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        (tmp / MODEL_CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        lines = [f"{ckpt.name} ({read_meta(ckpt).get('engine', 'single')}) -> {out / WEIGHTS}"]
        if hf:
            lines.append(save_hf(model, tmp).replace(str(tmp), str(out)))
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return lines


def run(args: argparse.Namespace) -> int:
    for line in export(Path(args.run_dir), Path(args.out), args.step, hf=not args.no_hf):
        print(line)
    return 0
