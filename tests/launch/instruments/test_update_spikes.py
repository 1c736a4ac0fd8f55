"""The update_spikes instrument: ratios against a direct median formula, update norms against the
weights' own difference, skipped and rolled-back steps left out, and a resume that continues
exactly as an uninterrupted run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from normlab.launch.errors import ConfigError
from normlab.launch.instruments.common import (
    ROLLBACKS,
    UPDATE_NORM,
    UPDATE_RATIO_MAX,
    UPDATE_SPIKE_STEPS,
    UPDATE_SPIKES,
    block_key,
)
from normlab.launch.instruments.updates import BlockUpdateSpikes, UpdateSpikes

from tests.instrument_helpers import fake_trainer, tiny_model, train_step

TOKENS = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(1))


def reference(norms: list[float], window: int, threshold: float) -> tuple[int, float]:
    """(spikes, largest ratio): r_t = u_t / median of the previous `window` valid updates."""
    valid = [u for u in norms if math.isfinite(u) and u > 0]
    ratios = [valid[t] / np.median(valid[t - window : t]) for t in range(window, len(valid))]
    return sum(r >= threshold for r in ratios), max(ratios) if ratios else math.nan


def test_ratios_follow_the_median_formula() -> None:
    rng = np.random.default_rng(0)
    norms = list(rng.lognormal(0.0, 0.3, 300))
    for t in (40, 41, 150, 290):
        norms[t] *= 8.0  # spikes, one right after another
    norms[60] = 0.0  # a skipped step
    norms[61] = math.nan  # a non-finite update
    norms[200] = math.inf
    block = BlockUpdateSpikes(window=25, threshold=4.0)
    flags = [block.update(u) for u in norms]
    spikes, ratio_max = reference(norms, 25, 4.0)
    assert block.spikes == spikes == sum(flags) >= 4
    assert block.ratio_max == pytest.approx(ratio_max, rel=1e-12)
    assert not flags[60] and not flags[61] and not flags[200]


def test_no_score_before_a_full_window() -> None:
    block = BlockUpdateSpikes(window=5, threshold=2.0)
    assert [block.update(u) for u in (1.0, 100.0, 1.0, 1.0, 1.0)] == [False] * 5
    assert math.isnan(block.ratio_max) and block.spikes == 0
    assert block.update(3.0) and block.ratio_max == pytest.approx(3.0)  # median of 1,100,1,1,1


def diff_norm(block: torch.nn.Module, old: list[torch.Tensor]) -> float:
    pairs = zip(block.parameters(), old, strict=True)
    return math.sqrt(sum(float((p.detach() - o).double().square().sum()) for p, o in pairs))


def test_update_norms_equal_the_weights_difference() -> None:
    model = tiny_model()
    tr = fake_trainer(model, log_every=1, steps=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cb = UpdateSpikes({"window": 2, "threshold": 1.5})
    cb.on_train_start(tr)
    seen = []
    for step in range(1, 6):
        before = [[p.detach().clone() for p in b.parameters()] for b in model.blocks]
        metrics = train_step(tr, [cb], step, TOKENS, opt=opt)
        want = [diff_norm(b, old) for b, old in zip(model.blocks, before, strict=True)]
        got = [float(metrics[block_key(UPDATE_NORM, i)]) for i in range(len(model.blocks))]
        assert got == pytest.approx(want, rel=1e-5)
        seen.append(want)
    window = 2  # run_window(2, 10)
    for i in range(len(model.blocks)):
        spikes, ratio = reference([s[i] for s in seen], window, 1.5)
        assert metrics[block_key(UPDATE_SPIKES, i)] == spikes
        assert metrics[block_key(UPDATE_RATIO_MAX, i)] == pytest.approx(ratio, rel=1e-5)
    most = max(metrics[block_key(UPDATE_SPIKES, i)] for i in range(3))
    assert metrics[UPDATE_SPIKE_STEPS] >= most


class Restore:
    """Stands in for a spike-policy rollback at `at`: weights jump back, `rollbacks` counts it."""

    def __init__(self, model: torch.nn.Module, at: int) -> None:
        self.model, self.at = model, at
        self.saved = [p.detach().clone() for p in model.parameters()]
        self.saved0 = [p.detach().clone() for p in model.blocks[0].parameters()]
        self.updates: list[float] = []

    def on_after_backward(self, trainer, step):  # noqa: ANN001, ANN202
        pass

    def on_step_end(self, trainer, step, metrics):  # noqa: ANN001, ANN202
        block0 = list(self.model.blocks[0].parameters())
        now = torch.cat([p.detach().flatten() for p in block0])
        if hasattr(self, "last"):
            self.updates.append(float((now - self.last).norm()))
        if step == self.at:
            start = torch.cat([p.flatten() for p in self.saved0])
            self.jump = float((now - start).norm())
            with torch.no_grad():
                for p, s in zip(self.model.parameters(), self.saved, strict=True):
                    p.copy_(s)  # back 5 steps: 5 updates' worth at once, if it were counted
        metrics[ROLLBACKS] = float(step >= self.at)
        self.last = torch.cat([p.detach().flatten() for p in block0])


def test_a_rollback_is_not_an_update() -> None:
    model = tiny_model()
    tr = fake_trainer(model, log_every=1, steps=40)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    cb = UpdateSpikes({"window": 3, "threshold": 2.0})
    cb.on_train_start(tr)
    restore = Restore(model, at=6)
    for step in range(1, 10):
        metrics = train_step(tr, [restore, cb], step, TOKENS, opt=opt)
        if step == 6:
            assert all(math.isnan(float(metrics[block_key(UPDATE_NORM, i)])) for i in range(3))
    assert metrics[UPDATE_SPIKE_STEPS] == 0
    # were the restore counted, it would be a spike: it moves block 0 > 2x its median update
    assert restore.jump / np.median(restore.updates) > 2.0


def test_resume_continues_like_one_run() -> None:
    norms = list(np.random.default_rng(3).lognormal(0.0, 0.5, 60))
    whole = BlockUpdateSpikes(10, 2.0)
    for u in norms:
        whole.update(u)
    first, second = BlockUpdateSpikes(10, 2.0), BlockUpdateSpikes(10, 2.0)
    for u in norms[:27]:
        first.update(u)
    second.load_state_dict(first.state_dict())
    for u in norms[27:]:
        second.update(u)
    assert (second.spikes, second.ratio_max) == (whole.spikes, whole.ratio_max)
    cb = UpdateSpikes()
    cb.load_state_dict({"window": 10, "blocks": [first.state_dict()] * 3, "spike_steps": 4})
    cb.on_train_start(fake_trainer(tiny_model(), steps=1000))
    assert cb.blocks[0].window == 10 and cb.spike_steps == 4  # not the run's own window


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"window": 0}, "window >= 1 and threshold > 1"),
        ({"threshold": 1.0}, "window >= 1 and threshold > 1"),
        ({"ratio": 3}, "unknown key 'instruments.update_spikes.ratio'"),
    ],
)
def test_bad_settings(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        UpdateSpikes(settings)


def test_grouped_sum_squares_counts_shards_once_per_rank_and_takes_no_parts():
    """Sums of squares per group: shards (even rows) through the engine's all-reduce, replicas
    (odd rows) counted once; a rank holding no part of any group gives zeros (no foreach call
    on an empty list, which torch refuses)."""
    from normlab.launch.instruments.gradients import grouped_sum_squares

    from tests.instrument_helpers import fake_trainer, tiny_model

    trainer = fake_trainer(tiny_model())
    a, b, c = torch.tensor([3.0, 4.0]), torch.tensor([1.0]), torch.tensor([2.0, 2.0])
    got = grouped_sum_squares(trainer, [a, b, c], [0, 1, 3], 2)
    torch.testing.assert_close(got, torch.tensor([26.0, 8.0]))
    assert torch.equal(grouped_sum_squares(trainer, [], [], 3), torch.zeros(3))
