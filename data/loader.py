"""Packed fixed-length windows of a prepared directory (nanoGPT-style memmap loading).

Sequence k covers tokens[k*T : k*T + T + 1] (non-overlapping windows); inputs are its first T
tokens and targets its last T. `PackedSource` reads one directory's splits; `PackedLoader` is the
single-directory batch iterator: each epoch visits every sequence once, in the order
`default_rng([seed, epoch]).permutation(n_sequences)`. A global batch is `world_size * batch_size`
consecutive entries of that order and rank r takes the r-th block of `batch_size`, so N ranks with
batch B see exactly the samples of one rank with batch N*B. Partial global batches at the end of an
epoch are dropped so every rank takes the same number of steps. Training runs read through
`data.mixture.MixtureLoader`, of which one directory is the one-source case.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from normlab.data.errors import DataError
from normlab.data.prepare import read_meta

SPLITS = ("train", "val")


def check_layout(seq_len: int, batch_size: int, rank: int, world_size: int) -> None:
    if seq_len < 1 or batch_size < 1:
        raise DataError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"need 0 <= rank < world_size, got rank {rank}, world {world_size}")


class PackedSource:
    """One prepared directory cut into windows of seq_len + 1 tokens (memmaps opened once)."""

    def __init__(self, data_dir: str | Path, seq_len: int) -> None:
        self.data_dir = Path(data_dir)
        self.meta: dict[str, Any] = read_meta(self.data_dir)
        self.seq_len = seq_len
        self._tokens: dict[str, np.ndarray] = {}

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.meta["eos_id"])

    def tokens(self, split: str) -> np.ndarray:
        """The split's token array (read-only memmap, opened once)."""
        if split not in SPLITS:
            raise DataError(f"split must be one of {SPLITS}, got {split!r}")
        if split not in self._tokens:
            n = int(self.meta["tokens"][split])
            if n == 0:
                raise DataError(f"{self.data_dir}: the {split} split is empty")
            path = self.data_dir / f"{split}.bin"
            self._tokens[split] = np.memmap(path, dtype=self.meta["dtype"], mode="r", shape=(n,))
        return self._tokens[split]

    def num_sequences(self, split: str) -> int:
        n = len(self.tokens(split))
        if n < self.seq_len + 1:
            raise DataError(
                f"seq_len {self.seq_len} exceeds the {split} split of {self.data_dir} ({n} "
                "tokens); lower seq_len"
            )
        return (n - 1) // self.seq_len

    def gather(self, split: str, seq_idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the windows `seq_idx`, shape (len(seq_idx), T) each."""
        starts = np.asarray(seq_idx, dtype=np.int64) * self.seq_len
        window = self.tokens(split)[starts[:, None] + np.arange(self.seq_len + 1)]  # (B, T+1)
        t = torch.from_numpy(window.astype(np.int64))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def iter_eval(
        self, max_batches: int, batch_size: int, rank: int, world_size: int, split: str = "val"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Up to `max_batches` unshuffled batches per rank from `split`: global batch j is
        sequences [j*W*B, (j+1)*W*B) and this rank takes its block of B. Always the same."""
        global_batch = batch_size * world_size
        n_global = min(self.num_sequences(split) // global_batch, max_batches)
        if n_global == 0 and max_batches > 0:
            raise DataError(
                f"the {split} split of {self.data_dir} is smaller than one global batch of "
                f"{global_batch} sequences of {self.seq_len + 1} tokens; lower batch_size or "
                "seq_len (or prepare it with a larger --val-fraction)"
            )
        for j in range(n_global):
            lo = j * global_batch + rank * batch_size
            yield self.gather(split, np.arange(lo, lo + batch_size))


class PackedLoader:
    """Infinite iterator of `(inputs, targets)` LongTensors of shape (B, T), resumable exactly."""

    def __init__(
        self,
        data_dir: str | Path,
        split: str,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if split not in SPLITS:
            raise DataError(f"split must be one of {SPLITS}, got {split!r}")
        check_layout(seq_len, batch_size, rank, world_size)
        self.source = PackedSource(data_dir, seq_len)
        self.data_dir, self.meta = self.source.data_dir, self.source.meta
        self.split, self.seq_len, self.batch_size = split, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.global_batch = batch_size * world_size
        self.num_sequences = self.source.num_sequences(split)
        self.steps_per_epoch = self.num_sequences // self.global_batch
        if self.steps_per_epoch == 0:
            raise DataError(
                f"{split} split has {self.num_sequences} sequences of {seq_len + 1} tokens, fewer "
                f"than one global batch ({batch_size} x {world_size} ranks); lower batch_size"
            )
        self.epoch, self.step = 0, 0
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def vocab_size(self) -> int:
        return self.source.vocab_size

    @property
    def eos_id(self) -> int:
        return self.source.eos_id

    def tokens(self, split: str) -> np.ndarray:
        return self.source.tokens(split)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Sequence indices in the order epoch `epoch` visits them (same on every rank)."""
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = (epoch, rng.permutation(self.num_sequences))
        return self._order[1]

    def __iter__(self) -> PackedLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.step >= self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        lo = self.step * self.global_batch + self.rank * self.batch_size
        idx = self.epoch_order(self.epoch)[lo : lo + self.batch_size]
        self.step += 1
        return self.source.gather(self.split, idx)

    def iter_eval(
        self, max_batches: int, split: str = "val"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Up to `max_batches` unshuffled batches per rank from `split` (default val)."""
        return self.source.iter_eval(
            max_batches, self.batch_size, self.rank, self.world_size, split
        )

    def state_dict(self) -> dict[str, Any]:
        """Position in the global sample order; identical on every rank."""
        return {
            "split": self.split,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "epoch": self.epoch,
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("split", "seed", "seq_len", "global_batch"):
            if state[key] != getattr(self, key):
                raise DataError(
                    f"loader state has {key}={state[key]!r} but this loader has "
                    f"{getattr(self, key)!r}; resuming would not continue the same sample order"
                )
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
