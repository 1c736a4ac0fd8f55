"""Resuming a ZeRO checkpoint on another number of ranks: DeepSpeed's universal checkpoint.

`ds_to_universal` (deepspeed/checkpoint/ds_to_universal.py) merges every rank's fp32 master
partitions and Adam moments into one file per parameter; an engine with `load_universal_checkpoint`
set re-partitions them for its own world size on load (ZeRO 1, 2 and 3). The DeepSpeed engine
converts automatically when the checkpoint's world size differs from the run's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from normlab.launch.errors import CheckpointError


def convert_to_universal(src: Path, dst: Path) -> None:
    """DeepSpeed's ds_to_universal in this process (its log lines kept off the terminal)."""
    from deepspeed.checkpoint import ds_to_universal

    shutil.rmtree(dst.parent, ignore_errors=True)
    args = argparse.Namespace(
        input_folder=str(src),
        output_folder=str(dst),
        num_extract_workers=1,  # in-process: a rank does not fork a worker pool
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # normlab's checkpoints carry no universal_checkpoint_info
    )
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ds_to_universal.main(args)
    except (AssertionError, ValueError, KeyError, RuntimeError, OSError) as exc:
        shutil.rmtree(dst.parent, ignore_errors=True)
        raise CheckpointError(
            f"cannot convert {src} to a universal checkpoint for another number of ranks "
            f"({type(exc).__name__}: {exc}); resume on {src.parent.name}'s number of ranks"
        ) from None


def universal_dir(ckpt_dir: Path, tag: str, is_main: bool, barrier: Callable[[], None]) -> Path:
    """`ckpt_dir` converted (once, by rank 0) into checkpoints/.universal-step_X, which any
    number of ranks loads; the verified checkpoint itself is left as it is."""
    out = ckpt_dir.parent / f".universal-{ckpt_dir.name}"
    if is_main and not (out / "done").is_file():
        convert_to_universal(ckpt_dir / tag, out / tag)
        (out / "done").write_text("ds_to_universal\n")
    barrier()
    return out


@contextlib.contextmanager
def universal_load(engine: object, optimizer: torch.optim.Optimizer, on: bool) -> Iterator[None]:
    """DeepSpeed's engine reads `load_universal_checkpoint` from its config when it loads; set it
    for this load only. DeepSpeed 0.19.8's ZeRO-3 universal load also copies group 0's
    hyperparameters (name and weight decay included) into every param group, empties their
    `params` and hands every group one shared `step` tensor, which Adam would then advance once
    per group and step: the groups are put back and each state gets its own step."""
    config = engine._config  # type: ignore[attr-defined]
    groups = [dict(g) for g in optimizer.param_groups]
    config.load_universal_checkpoint = on
    try:
        yield
    finally:
        config.load_universal_checkpoint = False
    if on:
        for group, saved in zip(optimizer.param_groups, groups, strict=True):
            group.clear()
            group.update(saved)
        for state in optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
