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
from pathlib import Path

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
