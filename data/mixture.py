"""A weighted mixture of prepared directories as one global stream of sequences.

Global sequence g (g = 0, 1, 2, ... over the whole run) comes from source s_g, drawn with
probability w_s / sum(w) independently per sequence: block b = g // BLOCK of the draws is
`default_rng([seed, MIX_KEY, b]).choice(K, BLOCK, p=w)`. The k-th draw of source s is its window
`order_s(k // n_s)[k % n_s]`, where n_s is the source's number of training sequences and
order_s(e) its epoch-e permutation, `default_rng([seed, e, s])` (source 0: `[seed, e]`, the order
of a single `data.dataset`, so a one-source mixture reads exactly that). A source that runs out
starts its next epoch; nothing is dropped.

The stream is a function of the seed, weights and sizes only: a global batch is `world_size *
batch_size` consecutive entries and rank r takes the r-th block of `batch_size`, so any number of
ranks (and any split of a global batch into micro-batches) reads the same sequences. The state is
the position g and the draws per source so far (which also give the tokens seen per source).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from normlab.data.errors import DataError
from normlab.data.identity import source_identity, tokenizer_id
from normlab.data.loader import PackedSource, check_layout

MIX_KEY = 0x6D6978  # "mix": separates the source draws from the permutations' streams
BLOCK = 4096  # draws generated together; the stream does not depend on it being cached
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a metric key: eval/<name>, tokens/<name>


@dataclass(frozen=True)
class SourceSpec:
    name: str
    path: Path
    weight: float


def check_same_tokenizer(specs: list[SourceSpec], metas: list[dict[str, Any]]) -> None:
    """Token ids only mean the same in every source when one tokenizer wrote them all."""
    first = tokenizer_id(metas[0])
    for spec, meta in zip(specs[1:], metas[1:], strict=True):
        other = tokenizer_id(meta)
        if other != first:
            raise DataError(
                f"data.sources {specs[0].name!r} ({specs[0].path}) and {spec.name!r} "
                f"({spec.path}) were prepared with different tokenizers (sha256 {first[:12]}... "
                f"vs {other[:12]}...); prepare every source with the same one: `normlab prepare "
                f"--tokenizer {specs[0].path}/{metas[0].get('tokenizer', {}).get('file', '')}`"
            )


def probabilities(weights: list[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise DataError(f"mixture weights must be finite and > 0, got {list(weights)}")
    return w / w.sum()


class MixtureLoader:
    """Infinite iterator of (inputs, targets) of shape (B, T) drawn from the weighted sources."""

    def __init__(
        self,
        specs: list[SourceSpec],
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_layout(seq_len, batch_size, rank, world_size)
        names = [s.name for s in specs]
        bad = [n for n in names if not NAME.match(n)]
        if bad or len(set(names)) != len(names):
            raise DataError(
                f"source names must be unique and of letters, digits, '_', '.', '-', got {names}"
            )
        self.specs = list(specs)
        self.names = names
        self.p = probabilities([s.weight for s in specs])
        self.sources = [PackedSource(s.path, seq_len) for s in specs]
        check_same_tokenizer(self.specs, [s.meta for s in self.sources])
        self.n = np.array([s.num_sequences("train") for s in self.sources], dtype=np.int64)
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.global_batch = batch_size * world_size
        self.position = 0
        self.counts = np.zeros(len(specs), dtype=np.int64)
        self._block: tuple[int, np.ndarray] | None = None
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        self._identity: list[dict[str, Any]] | None = None

    @property
    def vocab_size(self) -> int:
        return self.sources[0].vocab_size

    @property
    def eos_id(self) -> int:
        return self.sources[0].eos_id

    # --- the global stream ------------------------------------------------------------------
    def draws(self, lo: int, hi: int) -> np.ndarray:
        """Source of every global sequence in [lo, hi)."""
        if len(self.p) == 1:
            return np.zeros(hi - lo, dtype=np.int64)
        out = []
        for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1):
            if self._block is None or self._block[0] != b:
                rng = np.random.default_rng([self.seed, MIX_KEY, b])
                self._block = (b, rng.choice(len(self.p), size=BLOCK, p=self.p))
            start = b * BLOCK
            out.append(self._block[1][max(lo, start) - start : min(hi, start + BLOCK) - start])
        return np.concatenate(out)

    def epoch_order(self, source: int, epoch: int) -> np.ndarray:
        """Window indices of `source` in the order its epoch `epoch` visits them."""
        key = (source, epoch)
        if key not in self._orders:
            if len(self._orders) >= 2 * len(self.p):
                self._orders.clear()
            tail = [source] if source else []
            rng = np.random.default_rng([self.seed, epoch, *tail])
            self._orders[key] = rng.permutation(int(self.n[source]))
        return self._orders[key]

    def _take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, window) of the next `count` global sequences; advances the position."""
        src = self.draws(self.position, self.position + count)
        ordinal = np.empty(count, dtype=np.int64)
        for s in np.unique(src):
            where = np.flatnonzero(src == s)
            ordinal[where] = self.counts[s] + np.arange(len(where))
            self.counts[s] += len(where)
        self.position += count
        window = np.empty(count, dtype=np.int64)
        for j, (s, k) in enumerate(zip(src.tolist(), ordinal.tolist(), strict=True)):
            window[j] = self.epoch_order(s, k // int(self.n[s]))[k % int(self.n[s])]
        return src, window

    def __iter__(self) -> MixtureLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        src, window = self._take(self.global_batch)
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        src, window = src[mine], window[mine]
        x = torch.empty(self.batch_size, self.seq_len, dtype=torch.long)
        y = torch.empty_like(x)
        for s in np.unique(src):
            rows = np.flatnonzero(src == s)
            x[rows], y[rows] = self.sources[s].gather("train", window[rows])
        return x, y

    # --- accounting ---------------------------------------------------------------------------
    def tokens_seen(self) -> dict[str, int]:
        """Input tokens drawn from each source so far, over all ranks."""
        return {n: int(c) * self.seq_len for n, c in zip(self.names, self.counts, strict=True)}

    def epochs_for(self, sequences: int) -> dict[str, float]:
        """Expected epochs of each source's training split that `sequences` draws take."""
        return {
            n: float(sequences * p / k) for n, p, k in zip(self.names, self.p, self.n, strict=True)
        }

    def iter_eval(
        self, source: int, max_batches: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The validation batches of one source (unshuffled; see PackedSource.iter_eval)."""
        return self.sources[source].iter_eval(
            max_batches, self.batch_size, self.rank, self.world_size
        )

    # --- resume -------------------------------------------------------------------------------
    def identity(self) -> list[dict[str, Any]]:
        """Each source's tokenizer, shards fingerprint and sequence count (data.identity), as a
        checkpoint records them; computed once (it reads meta.json and each shard's ends)."""
        if self._identity is None:
            self._identity = [
                source_identity(spec.name, src.data_dir, src.meta, int(n))
                for spec, src, n in zip(self.specs, self.sources, self.n, strict=True)
            ]
        return self._identity

    def state_dict(self) -> dict[str, Any]:
        """Position in the global stream; identical on every rank and for any world size."""
        return {
            "kind": "mixture",
            "seed": self.seed,
            "seq_len": self.seq_len,
            "sources": list(self.names),
            "weights": [float(p) for p in self.p],
            "position": int(self.position),
            "counts": [int(c) for c in self.counts],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "mixture":
            state = self._from_single(state)
        mine = self.state_dict()
        for key in ("seed", "seq_len", "sources"):
            if state[key] != mine[key]:
                raise DataError(
                    f"loader state has {key}={state[key]!r} but this run has {mine[key]!r}; "
                    "resuming would not continue the same sample order"
                )
        if not np.allclose(state["weights"], mine["weights"], rtol=1e-9, atol=0):
            raise DataError(
                f"loader state has weights {state['weights']} but this run has "
                f"{mine['weights']}; resuming would not continue the same sample order (start a "
                "new run directory for a new mixture)"
            )
        self.position = int(state["position"])
        self.counts = np.asarray(state["counts"], dtype=np.int64)

    def _from_single(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint of the earlier single-directory loader, within its first epoch."""
        if len(self.names) != 1 or int(state.get("epoch", -1)) != 0:
            raise DataError(
                "the checkpoint's loader state is of the single-directory loader past its first "
                "epoch; resume it with the normlab version that wrote it"
            )
        position = int(state["step"]) * int(state["global_batch"])
        return {
            "seed": state["seed"],
            "seq_len": state["seq_len"],
            "sources": list(self.names),
            "weights": [1.0],
            "position": position,
            "counts": [position],
        }
