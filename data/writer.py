"""Token arrays written as they are produced: `train.bin`/`val.bin` are flat arrays of one dtype
(nanoGPT's layout), appended to batch by batch, so memory does not grow with the corpus."""

from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import BinaryIO

import numpy as np

SPLITS = ("train", "val")


def route(
    ids: list[list[int]], is_val: np.ndarray, eos: np.ndarray, eos_id: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """(train tokens, val tokens) of one batch of documents: each document's ids in order,
    followed by `eos_id` where `eos` is set."""
    out = []
    for split_is_val in (False, True):
        rows = [
            doc + [eos_id] if e else doc
            for doc, v, e in zip(ids, is_val, eos, strict=True)
            if v == split_is_val
        ]
        n = sum(len(r) for r in rows)
        out.append(np.fromiter(chain.from_iterable(rows), dtype=dtype, count=n))
    return out[0], out[1]


class SplitWriter:
    """Appends token arrays to `folder`/{train,val}.bin and counts the tokens of each split."""

    def __init__(self, folder: Path, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.counts = dict.fromkeys(SPLITS, 0)
        # closed by close(), which build calls in a finally
        self._files: dict[str, BinaryIO] = {
            s: open(folder / f"{s}.bin", "wb")  # noqa: SIM115
            for s in SPLITS
        }

    def append(self, train: np.ndarray, val: np.ndarray) -> int:
        """Write one batch; returns the number of tokens written."""
        for split, arr in zip(SPLITS, (train, val), strict=True):
            assert arr.dtype == self.dtype, (arr.dtype, self.dtype)
            self._files[split].write(arr.tobytes())
            self.counts[split] += len(arr)
        return len(train) + len(val)

    def close(self) -> dict[str, int]:
        for f in self._files.values():
            f.close()
        return dict(self.counts)
