"""Nothing an observing instrument does runs off its log steps (issue 50 item 1).

The real Trainer runs 6 steps at log_every 3 (log steps 3 and 6) with every observer of
launch/registry.py on, over two small models that give each one something to hook (FP8 emulated,
QK-Norm; DyT, a gate, sinks, soft-caps, LayerScale). Counted, per instrument and step:
- calls of the forward hooks it registers (every registration made inside one of its callback
  methods is wrapped with a counter): none off log steps, some on each log step;
- torch functions and tensor methods its callback methods call (a TorchFunctionMode active only
  while that callback runs: every kernel launch, copy, `.item()` or `.tolist()` passes it): none
  off log steps, but for the arming of a log step's hooks at the end of the step before it
  (zeroed accumulators, registrations: the forward of the log step is the first thing after).
The actions (spike_policy, fp16_clamp, early_warning, qk_clip) act every step by definition and
init_loss runs once before training; update_spikes measures every step's update by definition
(launch/instruments/updates.py: a spike lasts one step), its per-step work is stated there.

A second test runs under engine.compile (backend eager: Dynamo's tracing without code
generation) and checks the hooked metrics equal an uncompiled run's: Dynamo skips guards on
nn.Module hooks by default, so hooks armed after the first trace never ran there.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from normlab.launch.config import load_config
from normlab.launch.instruments import attention_probe
from normlab.launch.registry import INSTRUMENTS
from normlab.launch.training.trainer import Trainer
from torch import nn
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[3]
ACTIONS = {"spike_policy", "fp16_clamp", "early_warning", "init_loss"}
EVERY_STEP = {"update_spikes"}  # per-step by definition (its module doc)
OBSERVERS = sorted(set(INSTRUMENTS) - ACTIONS - EVERY_STEP)
SMALL = [
    "model.n_layers=2", "model.d_model=64", "model.n_heads=2", "model.d_ff=128",
    "data.seq_len=32", "data.batch_size=2", "training.eval_every=0", "checkpoint.every=0",
    "training.device=cpu", "logging.progress=false", "logging.tensorboard=false",
    "schedule.warmup_steps=0", "training.threads=1",
]  # fmt: skip
MODELS = {
    "fp8_qknorm": ["model.qk_norm=head", "precision.fp8={}"],
    "stabilizers": [
        "model.norm=dyt",
        "model.attn_gate=headwise",
        "model.attn_sinks=true",
        "model.attn_softcap=50.0",
        "model.final_softcap=30.0",
        "model.residual_scale=layerscale",
    ],  # fmt: skip
}
# nothing to log there: RMSNorm without residual scales; no QK-Norm gains
IDLE = {("fp8_qknorm", "norm_stabilizers"), ("stabilizers", "qk_gains")}
LOG_EVERY, STEPS = 3, 6
LOG_STEPS = {3, 6}


class _CountOps(TorchFunctionMode):
    def __init__(self, tally: Counter, key: tuple[str, int]) -> None:
        super().__init__()
        self.tally, self.key = tally, key

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.tally[self.key] += 1
        return func(*args, **(kwargs or {}))


class Probe:
    """Wraps the trainer's callbacks and the hooks they register; tallies by (name, step)."""

    def __init__(self) -> None:
        self.step = 0  # the step whose forward runs now
        self.owner: str | None = None  # the callback whose method runs now
        self.hook_calls: Counter = Counter()
        self.ops: Counter = Counter()

    def wrap_callback(self, cb: Any) -> None:
        for method in ("on_train_start", "on_after_backward", "on_step_end"):
            setattr(cb, method, self._timed(cb.name, method, getattr(cb, method)))

    def _timed(self, name: str, method: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def run(trainer: Any, *args: Any) -> Any:
            step = args[0] if args else 0
            self.owner = name
            try:
                with _CountOps(self.ops, (name, step, method)):
                    return fn(trainer, *args)
            finally:
                self.owner = None

        return run

    def wrap_hook(self, hook: Any) -> Any:
        if self.owner is None:  # the engine's own hooks (FP8's autocast cast on CPU)
            return hook
        owner = self.owner

        @functools.wraps(hook)
        def counted(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if module.training:  # evaluation passes return at once in every instrument
                self.hook_calls[(owner, self.step)] += 1
            return hook(module, *args, **kwargs)

        return counted

    def wrap_reader(self, read: Any) -> Any:
        """A reader of an attention's shared probe (attention_probe.py), called by the one hook
        of whichever instrument subscribed first: counted as its subscriber's."""
        owner = self.owner

        @functools.wraps(read)
        def counted(*args: Any) -> Any:  # the probe calls readers on training forwards only
            self.hook_calls[(owner, self.step)] += 1
            return read(*args)

        return counted


def _config(tmp: Path, model: str, extra: list[str]) -> Any:
    observers = [f"instruments.{name}=true" for name in OBSERVERS]
    if model == "stabilizers":
        observers.append("instruments.attention_logits={mode: lse_bound}")
    overrides = [*SMALL, *MODELS[model], *observers, *extra, f"run_dir={tmp / model}"]
    overrides += [f"training.steps={STEPS}", f"training.log_every={LOG_EVERY}"]
    return load_config(REPO / "recipes" / "pre.yaml", overrides)


def _run(cfg: Any, probe: Probe | None, monkeypatch: pytest.MonkeyPatch) -> Trainer:
    trainer = Trainer(cfg)
    if probe is not None:
        for cb in trainer.callbacks:
            probe.wrap_callback(cb)
        for method in ("register_forward_hook", "register_forward_pre_hook"):
            original = getattr(nn.Module, method)

            def register(module, hook, *a, _original=original, **kw):  # noqa: ANN001, ANN202
                return _original(module, probe.wrap_hook(hook), *a, **kw)

            monkeypatch.setattr(nn.Module, method, register)
        add = attention_probe._Probe.add

        def subscribed(self, read, weights):  # noqa: ANN001, ANN202
            return add(self, probe.wrap_reader(read), weights)

        monkeypatch.setattr(attention_probe._Probe, "add", subscribed)
        train_step = trainer._train_step

        def step(n: int) -> dict[str, Any]:
            probe.step = n
            return train_step(n)

        trainer._train_step = step  # type: ignore[method-assign]
    assert trainer.run() == 0
    return trainer


@pytest.fixture(scope="module", params=sorted(MODELS))
def probed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torchao")
    model = request.param
    probe = Probe()
    with pytest.MonkeyPatch.context() as mp:
        _run(_config(tmp_path_factory.mktemp(model), model, []), probe, mp)
    return model, probe


def test_no_hook_runs_off_a_log_step(probed: tuple[str, Probe]) -> None:
    model, probe = probed
    off = {key: n for key, n in probe.hook_calls.items() if key[1] not in LOG_STEPS}
    assert off == {}, f"{model}: hooks called off log steps: {off}"
    hooked = {name for name, _ in probe.hook_calls}
    expected = {
        "fp8_qknorm": {"activations", "attention_logits", "attn_entropy", "attention_stabilizers",
                       "fp8", "kurtosis", "output_logits"},
        "stabilizers": {"activations", "attention_logits", "attn_entropy", "attention_stabilizers",
                        "fp8", "kurtosis", "norm_stabilizers", "output_logits"},  # fp8: kurtosis
    }[model]  # fmt: skip
    assert hooked == expected
    for name in hooked:
        assert all(probe.hook_calls[(name, s)] > 0 for s in LOG_STEPS), name


def test_no_callback_work_off_a_log_step(probed: tuple[str, Probe]) -> None:
    """No tensor op at all (no copy, no reduction, no host sync) in any observer's callbacks
    on steps 1, 2, 4, 5; and each does its work on the log steps."""
    model, probe = probed
    arming = {(s - d, "on_step_end") for s in LOG_STEPS for d in (0, 1)}
    served = LOG_STEPS | {0}  # 0: on_train_start
    off = {k: n for k, n in probe.ops.items() if k[1] not in served and k[1:] not in arming}
    assert off == {}, f"{model}: torch calls off log steps: {off}"
    for name in OBSERVERS:
        if (model, name) in IDLE:
            continue
        assert sum(n for k, n in probe.ops.items() if k[0] == name and k[1] == 6) > 0, name


def _hooked_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    prefixes = ("resid_rms/", "attn_out_rms/", "max_logit", "kurtosis/", "attn_entropy/", "logz",
                "massive_act/", "first_token_share/")  # fmt: skip
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith(prefixes)}
        for r in rows
        if "loss" in r
    }


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_hooks_armed_after_the_first_trace_run_under_compile(
    scope: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1 (no log) is traced without hooks, step 2 (a log step) needs them: compiled values
    equal the uncompiled run's (Dynamo's eager backend runs the same kernels), whether the
    single engine compiles the whole model or each block (engine.compile_scope)."""
    names = ["activations", "attention_logits", "kurtosis", "attn_entropy", "output_logits",
             "attention_stabilizers"]  # fmt: skip
    base = [
        *SMALL, "training.steps=2", "training.log_every=2", "instruments={}",
        *[f"instruments.{n}=true" for n in names],
    ]  # fmt: skip
    results = {}
    for compiled in (False, True):
        run_dir = tmp_path / f"compile_{compiled}"
        extra = [f"engine.compile={str(compiled).lower()}", "engine.compile_backend=eager"]
        extra.append(f"engine.compile_scope={scope}")
        cfg = load_config(REPO / "recipes" / "pre.yaml", [*base, *extra, f"run_dir={run_dir}"])
        _run(cfg, None, monkeypatch)
        results[compiled] = _hooked_metrics(run_dir)
    eager, compiled = results[False][2], results[True][2]
    assert len(eager) > 10 and all(v != 0 for k, v in eager.items() if "rms" in k)
    assert any(k.startswith("massive_act/") for k in eager)
    assert compiled == pytest.approx(eager, rel=1e-6)
    # the hooks trace whole: no graph break from numpy (the CPU median's introselect is eager-only)
    assert not [b for b in counters["graph_break"] if "numpy" in b]
    torch._dynamo.reset()
