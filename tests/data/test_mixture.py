"""Weighted mixtures (data.mixture): proportions against the binomial bound, one global order for
any number of ranks and any split into micro-batches, exact resume, the tokenizer check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from normlab.data import DataError
from normlab.data.loader import PackedLoader
from normlab.data.mixture import MixtureLoader, SourceSpec
from normlab.data.prepare import prepare

WEIGHTS = (0.7, 0.3)


def _specs(tiny: Path, arith: Path, weights: tuple[float, float] = WEIGHTS) -> list[SourceSpec]:
    return [SourceSpec("plays", tiny, weights[0]), SourceSpec("arith", arith, weights[1])]


def _mix(tiny: Path, arith: Path, **kw: int) -> MixtureLoader:
    args = {"seq_len": 32, "batch_size": 8, "seed": 3} | kw
    return MixtureLoader(_specs(tiny, arith), **args)


def _tokens(d: Path) -> np.ndarray:
    meta = json.loads((d / "meta.json").read_text())
    return np.fromfile(d / "train.bin", dtype=meta["dtype"]).astype(np.int64)


def test_proportions_within_binomial_bound(tiny_data: Path, arith_data: Path) -> None:
    """Each sequence is a Bernoulli(w) draw of the first source: over N sequences the count
    lies within 4.5 standard deviations sqrt(N w (1 - w)) of N w (fails with prob. < 1e-5)."""
    for seed in (0, 1):
        loader = _mix(tiny_data, arith_data, seed=seed)
        for _ in range(500):
            next(loader)
        n = 500 * loader.global_batch
        assert loader.position == n and loader.counts.sum() == n
        for count, w in zip(loader.counts, WEIGHTS, strict=True):
            assert abs(count - n * w) <= 4.5 * math.sqrt(n * w * (1 - w)), (count, n * w)
        seen = loader.tokens_seen()
        assert seen == {"plays": int(loader.counts[0]) * 32, "arith": int(loader.counts[1]) * 32}
    # unnormalised weights are the same probabilities
    scaled = MixtureLoader(_specs(tiny_data, arith_data, (7.0, 3.0)), 32, 8, seed=0)
    assert np.array_equal(scaled.draws(0, 5000), _mix(tiny_data, arith_data, seed=0).draws(0, 5000))


def test_rows_are_the_windows_of_their_source(tiny_data: Path, arith_data: Path) -> None:
    loader = _mix(tiny_data, arith_data)
    toks = [_tokens(tiny_data), _tokens(arith_data)]
    x, y = next(loader)
    src = loader.draws(0, 8)
    assert torch.equal(x[:, 1:], y[:, :-1])
    seen = [0, 0]
    for row, s in zip(x, src.tolist(), strict=True):
        k = loader.epoch_order(s, 0)[seen[s]]
        seen[s] += 1
        assert row.tolist() == toks[s][k * 32 : k * 32 + 32].tolist()


def test_same_global_order_on_1_2_and_4_ranks(tiny_data: Path, arith_data: Path) -> None:
    """The arithmetic source holds few windows: 200 steps run it into its second epoch."""
    one = _mix(tiny_data, arith_data, seq_len=64, batch_size=8)
    assert one.epochs_for(200 * 8)["arith"] > 1.2
    two = [
        _mix(tiny_data, arith_data, seq_len=64, batch_size=4, rank=r, world_size=2) for r in (0, 1)
    ]
    four = [
        _mix(tiny_data, arith_data, seq_len=64, batch_size=2, rank=r, world_size=4)
        for r in range(4)
    ]
    micro = _mix(tiny_data, arith_data, seq_len=64, batch_size=4)  # grad_accum 2 on one rank
    for _ in range(200):
        x, y = next(one)
        assert torch.equal(torch.cat([next(r)[0] for r in two]), x)
        assert torch.equal(torch.cat([next(r)[1] for r in four]), y)
        assert torch.equal(torch.cat([next(micro)[0], next(micro)[0]]), x)
    states = [r.state_dict() for r in (one, *two, *four, micro)]
    assert all(s == states[0] for s in states)
    assert one.counts[1] > one.n[1]  # the small source wrapped (no sequence dropped)


def test_exact_resume_also_on_another_world_size(tiny_data: Path, arith_data: Path) -> None:
    a = _mix(tiny_data, arith_data, batch_size=4, rank=1, world_size=2)
    for _ in range(37):
        next(a)
    state = json.loads(json.dumps(a.state_dict()))  # survives a JSON round trip
    want = [next(a) for _ in range(5)]
    b = _mix(tiny_data, arith_data, batch_size=4, rank=1, world_size=2)
    b.load_state_dict(state)
    for (xw, yw), (xg, yg) in zip(want, (next(b) for _ in range(5)), strict=True):
        assert torch.equal(xw, xg) and torch.equal(yw, yg)
    single = _mix(tiny_data, arith_data, batch_size=8)  # the same position read by one rank
    single.load_state_dict(state)
    assert torch.equal(next(single)[0][4:], want[0][0])
    with pytest.raises(DataError, match="seed"):
        _mix(tiny_data, arith_data, seed=9).load_state_dict(state)
    with pytest.raises(DataError, match="weights"):
        MixtureLoader(_specs(tiny_data, arith_data, (0.5, 0.5)), 32, 8, seed=3).load_state_dict(
            state
        )


def test_one_source_reads_the_single_dataset_order(tiny_data: Path) -> None:
    mix = MixtureLoader([SourceSpec("plays", tiny_data, 1.0)], 64, 4, seed=2)
    old = PackedLoader(tiny_data, "train", 64, 4, seed=2)
    for _ in range(old.steps_per_epoch):  # the whole first epoch
        assert torch.equal(next(mix)[0], next(old)[0])
    # a checkpoint of the single-directory loader resumes at the same position
    older = PackedLoader(tiny_data, "train", 64, 4, seed=2)
    for _ in range(5):
        next(older)
    fresh = MixtureLoader([SourceSpec("plays", tiny_data, 1.0)], 64, 4, seed=2)
    fresh.load_state_dict(older.state_dict())
    assert torch.equal(next(fresh)[0], next(older)[0])


def test_tokenizer_mismatch_names_both(tiny_data: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 5)) for _ in range(400)]
    src = tmp_path / "words.txt"
    src.write_text("".join(" ".join(rng.choice(words, 12)) + "\n" for _ in range(3000)))
    other = tmp_path / "own-tokenizer"
    prepare([str(src)], other, vocab_size=300, val_fraction=0.05, num_proc=1)
    with pytest.raises(DataError, match=r"'plays' .*and 'arith' .*different tokenizers") as err:
        MixtureLoader([SourceSpec("plays", tiny_data, 1), SourceSpec("arith", other, 1)], 32, 2)
    assert str(tiny_data) in str(err.value) and str(other) in str(err.value)


def test_bad_names_and_weights(tiny_data: Path, arith_data: Path) -> None:
    with pytest.raises(DataError, match="unique"):
        MixtureLoader([SourceSpec("a", tiny_data, 1), SourceSpec("a", arith_data, 1)], 32, 2)
    with pytest.raises(DataError, match="finite and > 0"):
        MixtureLoader([SourceSpec("a", tiny_data, 1), SourceSpec("b", arith_data, 0)], 32, 2)
