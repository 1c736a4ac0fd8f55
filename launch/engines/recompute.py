"""Activation checkpointing (torch.utils.checkpoint, non-reentrant) that tells instruments when a
block's forward is a recomputation inside the backward, not a new forward.

The recompute re-fires every forward hook of the block; a hook that counts events (fp16 clamps)
would count each one twice. `recomputing()` is True only while checkpoint re-runs a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

_RECOMPUTING = False


def recomputing() -> bool:
    """True while a checkpointed block re-runs its forward during the backward."""
    return _RECOMPUTING


@contextlib.contextmanager
def _recompute() -> Iterator[None]:
    global _RECOMPUTING
    before, _RECOMPUTING = _RECOMPUTING, True
    try:
        yield
    finally:
        _RECOMPUTING = before


def _contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """checkpoint's context_fn: (around the forward, around the recomputation)."""
    return contextlib.nullcontext(), _recompute()


def apply_activation_checkpointing(model: nn.Module, *, compiled: bool = False) -> None:
    """Recompute each block in backward. Eager: `recomputing()` is set during the recompute.
    Compiled blocks (engine.compile) take no context_fn (compile refuses one that is not a
    dispatch mode), and their recompute replays no Python hook, so nothing counts twice."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    extra = {} if compiled else {"context_fn": _contexts}
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=True, **extra)
