"""instruments.early_warning (SCIENCE.md 23.4, issue 32 items 6-7): bad settings refused in one
line before anything is written; Levanter's update clipping against a direct computation; the
back-off schedule; alarms on synthetic values; a resumed run takes the same decisions."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from normlab.launch.cli import main
from normlab.launch.config.instruments import check_warning_engine, checked_settings
from normlab.launch.errors import ConfigError
from normlab.launch.instruments.early_warning import EarlyWarning, levanter_threshold

from tests.conftest import REPO, tiny_overrides
from tests.instrument_helpers import fake_trainer, tiny_model, train_step

PRE = REPO / "recipes" / "pre.yaml"


@pytest.mark.parametrize(
    "settings, words",
    [
        (
            {"signals": ["loss", "entropy"]},
            "unknown signal 'entropy'; allowed: loss, grad_norm, update_norm",
        ),
        ({"signals": ["resid_rms"], "levels": {"resid_rms": 0}}, "levels.resid_rms must be a pos"),
        ({"signals": ["resid_rms"], "levels": {"resid_rms": "high"}}, "levels.resid_rms must be"),
        ({"levels": {"kurtosis": 3.0}}, "levels.kurtosis: not a watched signal; allowed: grad_n"),
        ({"backoff_from": "here"}, "backoff_from must be one of 'checkpoint', 'alarm'"),
        ({"k": 0.0}, "instruments.early_warning.k must be a positive number"),
        ({"k": -2}, "instruments.early_warning.k must be a positive number"),
        ({"k": "six"}, "instruments.early_warning.k must be a number"),
        ({"action": "pray"}, "action must be one of checkpoint, backoff, rollback, clip_update"),
        ({"backoff": 1.5}, "backoff must lie in (0, 1)"),
        ({"windw": 3}, "unknown key 'instruments.early_warning.windw'"),
    ],
)
def test_bad_settings_are_one_line(settings, words):
    with pytest.raises(ConfigError) as err:
        checked_settings("early_warning", settings)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_an_action_the_engine_cannot_do_names_the_engines():
    check_warning_engine({"early_warning": {"action": "clip_update"}}, "single")
    check_warning_engine({"early_warning": {"action": "rollback"}}, "fsdp")
    with pytest.raises(ConfigError, match="cannot run on engine 'fsdp'; allowed engines: single"):
        check_warning_engine({"early_warning": {"action": "clip_update"}}, "fsdp")


@pytest.mark.parametrize(
    "override",
    [
        "instruments.early_warning={signals: [nope]}",
        "instruments.early_warning={k: 0}",
        "instruments.early_warning={action: clip_update}",
        "instruments.early_warning={signals: [kurtosis]}",
        "instruments.early_warning={signals: [resid_rms], levels: {resid_rms: -3}}",
        "instruments.early_warning={action: rollback}",
        "instruments.early_warning={action: backoff}",
    ],
)
def test_train_exits_2_before_writing(tmp_path, override, capsys):
    run = tmp_path / "run"
    over = [f"data.dataset={tmp_path / 'absent'}", f"run_dir={run}", override]
    if "clip_update" in override:
        over.append("engine.name=fsdp")
    if "rollback" in override or "backoff" in override:
        over.append("checkpoint.every=0")  # nothing to return to
    assert main(["train", str(PRE), *over]) == 2
    assert not run.exists()
    assert "instruments.early_warning" in capsys.readouterr().err


class Grab:
    """Keeps the gradients the optimizer is about to apply."""

    name = "grab"

    def on_after_backward(self, trainer, step):
        self.grads = [p.grad.clone() for p in trainer.engine.model.parameters()]

    def on_step_end(self, trainer, step, metrics):
        pass


def test_levanter_clipping_matches_a_direct_computation():
    torch.manual_seed(0)
    model = tiny_model()
    trainer = fake_trainer(model, steps=40)
    trainer.cfg.schedule = SimpleNamespace(warmup_steps=0)
    cb = EarlyWarning({"action": "clip_update", "clip_window": 8, "clip_sigma": 1.0})
    cb.on_train_start(trainer)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tokens = torch.randint(0, 97, (2, 17))
    history: list[float] = []
    for step in range(1, 25):
        before = [p.detach().clone() for p in model.parameters()]
        lr = 0.05 * (8.0 if step in (12, 20) else 1.0)  # two large updates
        opt.param_groups[0]["lr"] = lr
        grads = Grab()
        train_step(trainer, [grads, cb], step, tokens, opt)
        delta = [-lr * g for g in grads.grads]
        norm = math.sqrt(sum(float(d.pow(2).sum()) for d in delta))
        limit = (
            statistics.fmean(history) + 1.0 * max(statistics.pstdev(history), 1e-6)
            if len(history) >= 4
            else math.inf
        )
        scale = min(1.0, limit / norm)
        for p, b, d in zip(model.parameters(), before, delta, strict=True):
            torch.testing.assert_close(p.detach(), b + scale * d, rtol=1e-5, atol=1e-6)
        history = (history + [norm])[-8:]
        if step in (12, 20):
            assert scale < 1.0  # the large updates were clipped
    assert cb.clipped >= 2
    assert levanter_threshold([1.0], 3.0, 8) == math.inf


def test_backoff_halves_and_rewarms():
    cb = EarlyWarning({"action": "backoff", "rewarm_steps": 4})
    assert cb.scale_at(10) == 1.0
    cb.lr_scale, cb.rewarm_from = 0.5, 11
    assert [cb.scale_at(s) for s in (11, 12, 13, 14, 15, 40)] == [0.125, 0.25, 0.375, 0.5, 0.5, 0.5]


def test_placebo_backs_off_at_its_step_and_not_on_the_alarm():
    """The placebo arm (issue 49 item 4): the same back-off at a fixed step; the jump at 150 is
    counted as an alarm but changes nothing."""
    with pytest.raises(ConfigError, match="placebo_step"):
        EarlyWarning({"action": "rollback", "placebo_step": 5})
    g = torch.Generator().manual_seed(0)
    values = (torch.randn(200, generator=g) * 0.05).exp().tolist()
    values[150] *= 50.0
    cb = EarlyWarning({"action": "backoff", "backoff_from": "alarm", "placebo_step": 60})
    _sim(cb, values[:100])
    assert cb.lr_scale == 0.5 and cb.rewarm_from == 61 and cb.alarms == 0
    _sim(cb, values[100:], start=101)
    assert cb.alarms == 1 and cb.lr_scale == 0.5  # the alarm: counted, not acted on


def _sim(cb: EarlyWarning, values: list[float], start: int = 1):
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(training=SimpleNamespace(log_every=1000, steps=10**6)),
        engine=SimpleNamespace(all_reduce=lambda t, op="sum": t, is_main=False),
    )
    for i, v in enumerate(values):
        cb.on_step_end(trainer, start + i, {"grad_norm": torch.tensor(v)})


def test_alarm_fires_on_the_jump_not_on_noise_nor_in_warmup():
    g = torch.Generator().manual_seed(0)
    noise = (torch.randn(300, generator=g) * 0.05).exp().tolist()
    noise[200] *= 20.0
    noise[30] *= 20.0  # during warm-up (and before half a window): no alarm
    cb = EarlyWarning({"action": "checkpoint"})
    for det in cb.detectors.values():
        det.warmup = 40
    seen = []
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(training=SimpleNamespace(log_every=1000, steps=10**6)),
        engine=SimpleNamespace(all_reduce=lambda t, op="sum": t, is_main=False),
    )
    for step, v in enumerate(noise, start=1):
        cb.on_step_end(trainer, step, {"grad_norm": torch.tensor(v)})
        if cb.wants_checkpoint():
            seen.append(step)
    assert seen == [201] and cb.alarms == 1


@pytest.mark.parametrize(
    "ew",
    [
        "{action: backoff, window: 4, k: 0.5, rewarm_steps: 3, signals: [loss, grad_norm], "
        "backoff_from: alarm}",
        "{action: rollback, window: 4, k: 0.5, signals: [loss, resid_rms], skip_batches: 3, "
        "levels: {resid_rms: 0.5}}",
    ],
    ids=["backoff", "rollback_skip_blocks"],
)
def test_resumed_run_is_exact(tiny_data: Path, tmp_path: Path, capsys, ew: str):
    """8 steps at once against the same run trained again from its step-4 checkpoint, with
    alarms that act (window 4, k 0.5: the detector fires often): a back-off, or a rollback with
    a data skip on per-block detectors; the detector state, the lr scale and the data position
    must survive the checkpoint."""
    from normlab.launch.config import load_config
    from normlab.launch.training.trainer import Trainer

    ew = "instruments.early_warning=" + ew
    # the rollback: no alarm before step 5, so the step-4 checkpoint is there to return to
    extra = [ew, f"schedule.warmup_steps={0 if 'backoff' in ew else 4}"]
    whole, half = tmp_path / "whole", tmp_path / "half"
    assert Trainer(load_config(PRE, tiny_overrides(tiny_data, whole) + extra)).run() == 0
    shutil.copytree(whole, half)  # then train it again from its step-4 checkpoint
    again = load_config(PRE, tiny_overrides(tiny_data, half) + extra)
    capsys.readouterr()
    assert Trainer(again, from_step="step_00000004").run() == 0
    assert "from step_00000004" in capsys.readouterr().out  # steps 5-8 were trained again
    assert (half / "metrics.jsonl").read_text().count("early_warning/lr_scale") == 8

    def rows(run):
        out = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["early_warning/lr_scale"]) for r in out if "loss" in r]

    a, b = rows(whole), rows(half)
    assert a == b
    if "backoff" in ew:
        assert any(scale < 1.0 for _, _, scale in a)  # the back-off did act
    else:
        done = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
        assert max(r.get("early_warning/rollbacks", 0) for r in done) >= 1  # it rolled back


def test_rollback_restores_the_newest_checkpoint_before_the_alarm_and_its_detector():
    g = torch.Generator().manual_seed(1)
    values = (torch.randn(200, generator=g) * 0.05).exp().tolist()
    values[150] *= 30.0
    cb = EarlyWarning({"action": "rollback", "max_rollbacks": 1, "skip_batches": 30})
    saved = {}
    restored = []
    skipped = []

    def restore(engine, path):
        restored.append(path.name)
        return {"callbacks": {"early_warning": saved[path.name]}}

    trainer = SimpleNamespace(
        cfg=SimpleNamespace(training=SimpleNamespace(log_every=1000, steps=10**6)),
        engine=SimpleNamespace(all_reduce=lambda t, op="sum": t, is_main=False),
        ckpt=SimpleNamespace(step_dirs=lambda: [Path(n) for n in sorted(saved)], restore=restore),
        skip_batches=skipped.append,
    )
    for step, v in enumerate(values, start=1):
        cb.on_step_end(trainer, step, {"grad_norm": torch.tensor(v)})
        if step in (100, 140, 160):  # checkpoints; 160 is after the alarm
            saved[f"step_{step:08d}"] = cb.state_dict()
        if step == 151:
            assert restored == ["step_00000140"] and cb.rollbacks == 1
            assert (
                cb.detectors["grad_norm"].state_dict()
                == saved["step_00000140"]["detectors"]["grad_norm"]
            )
    assert cb.alarms == 1 and restored == ["step_00000140"]
    # steps 141-151 were not replayed (11); 19 more steps' batches are drawn and dropped: 30
    assert skipped == [30 - (151 - 140)]


def test_checkpoint_on_alarm_in_the_trainer(tiny_data: Path, tmp_path: Path, capsys):
    """The trainer writes a checkpoint at every alarm step (and only the final one otherwise)."""
    from normlab.launch.config import load_config
    from normlab.launch.training.trainer import Trainer

    ew = "instruments.early_warning={action: checkpoint, window: 4, k: 0.5}"
    run = tmp_path / "run"
    over = tiny_overrides(tiny_data, run, **{"checkpoint.every": 0, "checkpoint.keep_last": 10})
    assert Trainer(load_config(PRE, over + [ew, "schedule.warmup_steps=0"])).run() == 0
    alarms = [int(x) for x in re.findall(r"early warning at step (\d+)", capsys.readouterr().out)]
    saved = sorted(int(p.name[5:]) for p in (run / "checkpoints").glob("step_*"))
    assert alarms and saved == sorted({*alarms, 8})


def test_the_online_signals_are_the_evaluations():
    """Every signal `normlab warnings` scores can be watched online, with the instrument that logs
    it named (so a recipe that watches a signal whose instrument is off is refused)."""
    from normlab.launch.config.instruments import WARNING_SIGNALS
    from normlab.launch.registry import INSTRUMENTS
    from normlab.launch.warning.signals import SIGNALS

    assert list(WARNING_SIGNALS) == list(SIGNALS)
    assert {s for s in WARNING_SIGNALS.values() if s is not None} <= set(INSTRUMENTS)


def _sim_blocks(cb: EarlyWarning, rows: list[dict[str, float]], start: int = 1) -> list[int]:
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(training=SimpleNamespace(log_every=1000, steps=10**6)),
        engine=SimpleNamespace(all_reduce=lambda t, op="sum": t, is_main=False),
    )
    acted = []  # the steps the action (a checkpoint) was taken
    for step, row in enumerate(rows, start=start):
        cb.on_step_end(trainer, step, {k: torch.tensor(v) for k, v in row.items()})
        if cb.wants_checkpoint():
            acted.append(step)
    return acted


def test_a_level_alarm_per_block_matches_the_offline_detector():
    """A smooth drift (what precedes the fp16 overflows of docs/early_warning.md) has no z-score
    jump; the level alarm fires at the first step one block reaches it, the step the offline
    detector of `normlab warnings` gives on the same series."""
    from normlab.launch.warning.detector import alarms
    from normlab.launch.warning.signals import SIGNALS

    steps = list(range(1, 401))
    lows = [100.0 * 1.01**s for s in steps]  # block 0: 1 % a step
    highs = [150.0 * 1.012**s for s in steps]  # block 1 grows faster and crosses first
    rows = [{"resid_rms/00": a, "resid_rms/01": b, "resid_rms/01/attn": 1e9} for a, b in
            zip(lows, highs, strict=True)]  # fmt: skip
    cb = EarlyWarning({"signals": ["resid_rms"], "levels": {"resid_rms": 5000.0}, "k": 50})
    cb.warmup = 5
    seen = _sim_blocks(cb, rows)
    rule = cb.rules["resid_rms"]
    offline = sorted(
        set(alarms(steps, lows, rule, 50, 5)) | set(alarms(steps, highs, rule, 50, 5))
    )
    assert seen[0] == offline[0] == next(s for s, b in zip(steps, highs, strict=True) if b >= 5000)
    # the level holds from there on: every later step alarms, all within 50 steps of the one
    # before, so it is one episode (SCIENCE.md 23.3's R), acted on again each 50 steps it lasts
    assert offline == list(range(seen[0], 401)) and cb.alarms == 1
    assert seen == list(range(seen[0], 401, 50))
    assert set(cb.detectors) == {"resid_rms/00", "resid_rms/01"}  # not the sub-layer key
    assert SIGNALS["resid_rms"].rule.level is None  # the level is the recipe's, not a default


def test_a_falling_signal_alarms_at_or_below_its_level():
    entropy = [2.0 - 0.01 * i for i in range(150)]
    cb = EarlyWarning({"signals": ["attn_entropy"], "levels": {"attn_entropy": 1.0}, "k": 50})
    assert _sim_blocks(cb, [{"attn_entropy/00": e} for e in entropy])[0] == 101


def _fake_ckpt(saved: dict[str, dict], restored: list[str]) -> SimpleNamespace:
    def restore(engine, path):
        restored.append(path.name)
        return {"callbacks": {"early_warning": saved[path.name]}}

    return SimpleNamespace(step_dirs=lambda: [Path(n) for n in sorted(saved)], restore=restore)


@pytest.mark.parametrize("start", ["checkpoint", "alarm"])
def test_backoff_returns_to_the_newest_checkpoint_before_the_alarm(start):
    """SCIENCE.md 23.4: back off from the last good checkpoint (or, as set, where it fired)."""
    values = [100.0 + i for i in range(200)]
    values[150] = 1e4
    cb = EarlyWarning({"signals": ["resid_rms"], "levels": {"resid_rms": 5e3}, "k": 50,
                       "action": "backoff", "backoff_from": start})  # fmt: skip
    saved: dict[str, dict] = {}
    restored: list[str] = []
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(training=SimpleNamespace(log_every=1000, steps=10**6)),
        engine=SimpleNamespace(all_reduce=lambda t, op="sum": t, is_main=False),
        ckpt=_fake_ckpt(saved, restored),
    )
    for step, v in enumerate(values, start=1):
        cb.on_step_end(trainer, step, {"resid_rms/00": torch.tensor(v)})
        if step in (100, 140):
            saved[f"step_{step:08d}"] = cb.state_dict()
    assert cb.alarms == 1 and cb.lr_scale == 0.5 and cb.rewarm_from == 152
    if start == "checkpoint":
        assert restored == ["step_00000140"] and cb.rollbacks == 1
    else:
        assert restored == [] and cb.rollbacks == 0


def test_every_signal_is_watched_in_a_run_and_sees_the_logged_values(
    tiny_data: Path, tmp_path: Path
):
    """A tiny run watching every signal, with the early warning listed before the instruments
    whose metrics it reads: each signal gets its detectors, and each detector's window holds
    exactly the values written to metrics.jsonl (the online detector sees the logged numbers)."""
    from normlab.launch.config import load_config
    from normlab.launch.config.instruments import WARNING_SIGNALS
    from normlab.launch.training.trainer import Trainer
    from normlab.launch.warning.detector import _u

    recipe = tmp_path / "watch_all.yaml"
    signals = ", ".join(WARNING_SIGNALS)
    sources = sorted({s for s in WARNING_SIGNALS.values() if s})
    recipe.write_text(
        f"base: {REPO / 'recipes' / 'pre.yaml'}\ninstruments:\n"
        f"  early_warning: {{signals: [{signals}], action: checkpoint}}\n"
        + "".join(f"  {s}: true\n" for s in sources)
    )
    run = tmp_path / "run"
    trainer = Trainer(load_config(recipe, tiny_overrides(tiny_data, run)))
    assert [cb.name for cb in trainer.callbacks][-1] == "early_warning"  # runs last
    assert trainer.run() == 0
    ew = next(cb for cb in trainer.callbacks if cb.name == "early_warning")
    assert set(ew.source.values()) == set(WARNING_SIGNALS)  # each signal was seen
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    for key, det in ew.detectors.items():
        logged = [r[key] for r in rows if key in r]
        want = [_u(v, det.rule.transform) for v in logged]
        want = [u for u in want if math.isfinite(u)]
        assert list(det.history) == pytest.approx(want, rel=1e-6), key
