"""The unigram plateau: the loss of a model that predicts token frequencies and nothing else.

A language model stalls here when its attention and MLPs have stopped learning (Post-LN without
warm-up at its stability limit); knowing the number makes a stalled run recognisable at a glance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.prepare import read_meta


def unigram_loss(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats) of `val` tokens under the token frequencies of `train`.

    Tokens absent from `train` get one count (add-one on those only), so the loss stays finite."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64)
    counts[counts == 0] = 1.0
    probs = counts / counts.sum()
    return float(-np.log(probs[val]).mean())


def dataset_unigram_loss(data_dir: str | Path) -> float:
    """unigram_loss of a prepared directory's val split under its train split."""
    path = Path(data_dir)
    meta = read_meta(path)
    dtype = np.dtype(meta["dtype"])
    train = np.memmap(path / "train.bin", dtype=dtype, mode="r")
    val = np.memmap(path / "val.bin", dtype=dtype, mode="r")
    return unigram_loss(np.asarray(train), np.asarray(val), int(meta["vocab_size"]))


def runs_plateau(configs: list[dict[str, Any]]) -> float:
    """The unigram plateau of the data the runs (their config.yaml, as dicts) trained on.

    Runs on different data have no one plateau: that is an error, not an average."""
    from normlab.launch.config import from_dict
    from normlab.launch.training.datasets import resolve_dataset

    dirs = {resolve_dataset(from_dict(c).data, quiet=True) for c in configs}
    if len(dirs) != 1:
        names = ", ".join(sorted(str(d) for d in dirs))
        raise DataError(f"runs on {len(dirs)} datasets have no single unigram plateau: {names}")
    return dataset_unigram_loss(dirs.pop())
