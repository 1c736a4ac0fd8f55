"""Which documents are validation documents, and where EOS goes between documents."""

from __future__ import annotations

import numpy as np


def assign_split(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean `is_val` per document: the first round(val_fraction * n_docs) documents (at least
    one, at most n_docs - 1, when val_fraction > 0) of `default_rng(seed).permutation(n_docs)`."""
    is_val = np.zeros(n_docs, dtype=bool)
    if val_fraction <= 0 or n_docs < 2:
        return is_val
    n_val = min(max(1, round(val_fraction * n_docs)), n_docs - 1)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return is_val


def eos_after(contig: np.ndarray, is_val: np.ndarray) -> np.ndarray:
    """EOS follows a row unless its text continues in the next row and that row is in the same
    split, so each split's stream is continuous text with EOS at every real discontinuity."""
    same_next = np.zeros_like(contig)
    same_next[:-1] = is_val[:-1] == is_val[1:]
    return ~(contig & same_next)
