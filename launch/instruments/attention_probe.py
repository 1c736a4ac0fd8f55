"""One recomputation of a block's attention on log steps, shared by every instrument that reads it.

The exact max logit (`attention_logits`), the attention entropy (`attn_entropy`) and the
attention stabilizers' statistics (`attention_stabilizers`) all read the training forward's
logits S = q k^T / sqrt(d_h) (B, H, T, T), and the last two its probabilities P = core.weights(S)
(soft-cap, causal mask and sinks as the core applies them). Each used to recompute them; now each
subscribes a reader to the attention's probe for the log step it is armed for, and one forward
hook on `Attention.qk_tap` (q, k as the logits see them) computes S and P once per training
forward and hands them to every reader. They are dropped when the hook returns: no T x T matrix
outlives the layer. When no reader needs P (the max logit alone), S is never formed whole: the
readers get `None` and stream (`causal_max_logits`). With no reader left the hook is removed, so
unlogged steps run the plain fused attention.

A reader is `read(q, k, s, p)`; it must treat its arguments as read-only.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from normlab.model.attention import Attention, causal_max_logits
from normlab.model.attention_cores import attention_logits, future_mask
from torch import nn
from torch.utils.hooks import RemovableHandle

Reader = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"], None]


class _Probe:
    """The readers of one attention and the one qk_tap hook that feeds them."""

    def __init__(self, att: Attention) -> None:
        self.core = att.core
        self.tap = att.qk_tap
        self.readers: list[tuple[Reader, bool]] = []  # (read, needs the weights P)
        self.handle: RemovableHandle | None = None

    def add(self, read: Reader, weights: bool) -> Reader:
        """Add a reader; returns the reader as held (what `remove` takes)."""
        # readers of P first: a reader without P finds S already there when another made it
        if weights:
            self.readers.insert(0, (read, weights))
        else:
            self.readers.append((read, weights))
        if self.handle is None:
            self.handle = self.tap.register_forward_hook(self._hook)
        return read

    def remove(self, read: Reader) -> None:
        self.readers = [(r, w) for r, w in self.readers if r is not read]
        if not self.readers and self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _hook(self, tap: nn.Module, args: Any, out: tuple[torch.Tensor, torch.Tensor]) -> None:
        if not tap.training:  # evaluation passes are not the training step's attention
            return
        with torch.no_grad():
            q, k = out
            s = p = None
            if any(weights for _, weights in self.readers):
                s = attention_logits(q, k)
                p = self.core.weights(s)  # type: ignore[operator]
            for read, _ in self.readers:
                read(q, k, s, p)


_PROBES: weakref.WeakKeyDictionary[Attention, _Probe] = weakref.WeakKeyDictionary()


class Subscription:
    """A reader subscribed to one attention's probe; `remove()` ends it."""

    def __init__(self, probe: _Probe, read: Reader) -> None:
        self._probe, self._read = probe, read

    def remove(self) -> None:
        self._probe.remove(self._read)


def subscribe(att: Attention, read: Reader, weights: bool) -> Subscription:
    """Call `read(q, k, S, P)` on each training forward of `att` until removed; S and P are the
    shared recomputation when `weights` (or another reader's need) made it, else None."""
    probe = _PROBES.get(att)
    if probe is None:
        probe = _PROBES[att] = _Probe(att)
    return Subscription(probe, probe.add(read, weights))


def max_logits(q: torch.Tensor, k: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
    """Per-head max of S over batch and the unmasked (i, j): from S when it is there, else
    streamed from q, k without forming S whole (`causal_max_logits`). (H,) in fp32."""
    if s is None:
        return causal_max_logits(q, k)
    masked = s.masked_fill(future_mask(s.shape[-1], s.device), float("-inf"))
    return masked.amax(dim=(0, 2, 3)).float()
