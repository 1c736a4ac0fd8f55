"""The coordinate check (docs/SCIENCE.md 21.5) decides with a stated error rate: five deliberate
µP mistakes fail, correct µP and CompleteP pass with their negative controls caught, over several
seeds of the check itself; the interval rule's error rates are what the docs say; finite width is
told apart from a wrong exponent; the command's exit codes are 0 / 1 / 3; the docs quote the
committed runs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from normlab.launch.transfer import coordcheck as cc
from normlab.model import ModelConfig

BASE = dict(n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=256, max_seq_len=32)
MUP = dict(parametrization="mup", base_d_model=64)
COMPLETEP = dict(parametrization="completep", base_d_model=64, base_n_layers=2)
SETUP = dict(steps=4, seeds=6, lr=1e-3, batch=4, seq_len=32)  # the command's defaults
WIDTHS, DEPTHS = (64, 128, 256, 512), (2, 4, 8, 16)
CHECK_SEEDS = (0, 6)  # disjoint seed sets of the check itself


@pytest.fixture(autouse=True, scope="module")  # before the module-scoped runs below
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _setup(axis: str, sizes: tuple[int, ...], first_seed: int = 0) -> cc.CoordSetup:
    return cc.CoordSetup(axis, sizes, first_seed=first_seed, **SETUP)  # type: ignore[arg-type]


# the five deliberate mistakes, each built by patching the parametrization, and the check that
# must catch it


def _patch(mp: pytest.MonkeyPatch, mistake: str) -> None:
    import normlab.model.init as init
    import normlab.model.parametrization as par
    import normlab.model.transformer as transformer

    right = par.group_factors

    def factors(cfg, klass, *args, **kw):  # type: ignore[no-untyped-def]
        f = right(cfg, klass, *args, **kw)
        m_n = par.width_mult(cfg)
        if mistake == "hidden_lr_unscaled" and klass == "hidden":
            return par.Factors(lr=f.lr * m_n, weight_decay=f.weight_decay, eps=f.eps)
        if mistake == "head_lr_scaled" and klass == "head":
            return par.Factors(lr=f.lr / m_n, weight_decay=f.weight_decay, eps=f.eps)
        return f

    if mistake in ("hidden_lr_unscaled", "head_lr_scaled"):
        mp.setattr(par, "group_factors", factors)  # launch/optim imports it at each build
    elif mistake == "hidden_init_unscaled":
        mp.setattr(init, "hidden_init_factor", lambda cfg: 1.0)
    elif mistake == "no_head_mult":
        mp.setattr(transformer, "output_mult", lambda cfg: 1.0)
    elif mistake == "head_mult_half_power":
        mp.setattr(transformer, "output_mult", lambda cfg: par.width_mult(cfg) ** -0.5)
    else:
        raise AssertionError(mistake)


MISTAKES = {  # mistake -> a check that must fail
    "hidden_lr_unscaled": "attn change at t=4",
    "hidden_init_unscaled": "attn level at t=1",
    "no_head_mult": "logits level at t=1",
    "head_mult_half_power": "logits level at t=1",
    "head_lr_scaled": "head_update level at t=4",
}


@pytest.fixture(scope="module")
def mistaken() -> dict[tuple[str, int], cc.CoordResult]:
    """Each mistake at each check seed (about 3 s each on one core)."""
    out = {}
    for mistake in MISTAKES:
        for first in CHECK_SEEDS:
            with pytest.MonkeyPatch.context() as mp:
                _patch(mp, mistake)
                out[mistake, first] = cc.coord_check(
                    ModelConfig(**BASE, **MUP), _setup("width", WIDTHS, first)
                )
    return out


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
@pytest.mark.parametrize("first", CHECK_SEEDS)
def test_each_deliberate_mistake_fails(mistaken, mistake: str, first: int) -> None:
    res = mistaken[mistake, first]
    assert res.outcome == cc.FAIL, res.reason()
    by_name = {r.check.name: r for r in res.checks}
    assert by_name[MISTAKES[mistake]].outcome == cc.FAIL, by_name[MISTAKES[mistake]].reason


@pytest.fixture(scope="module")
def correct() -> dict[tuple[str, int], cc.Verdict]:
    """Correct µP and CompleteP over width with their controls, at each check seed."""
    return {
        (name, first): cc.run_check(ModelConfig(**BASE, **kw), _setup("width", WIDTHS, first))
        for name, kw in (("mup", MUP), ("completep", COMPLETEP))
        for first in CHECK_SEEDS
    }


@pytest.mark.parametrize("name", ["mup", "completep"])
@pytest.mark.parametrize("first", CHECK_SEEDS)
def test_correct_parametrization_passes_and_its_controls_are_caught(
    correct, name: str, first: int
) -> None:
    v = correct[name, first]
    assert v.outcome == cc.PASS and v.exit_code == 0, v.reason()
    assert set(v.controls) == {"sp", "hidden_lr_unscaled"} and not v.uncaught
    logits = next(r for r in v.result.checks if r.check.name == "logits level at t=1")
    assert logits.fit.mean == pytest.approx(-0.5, abs=0.05)  # sqrt(d) / m_N


def test_an_uncaught_control_makes_a_pass_inconclusive(correct) -> None:
    v = correct["mup", 0]
    weak = cc.Verdict(v.result, {"sp": v.result})  # a "control" that is the recipe itself
    assert weak.outcome == cc.INCONCLUSIVE and weak.exit_code == 3
    assert weak.reason().startswith("lacks power: control sp not caught")


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_depth_check_tells_the_two_alphas_and_sp_apart(alpha: float) -> None:
    """Blocks' sum at init grows as 1/2 - α per doubling: CompleteP -1/2, Depth-µP 0, sp +1/2;
    each is the other's control."""
    cfg = ModelConfig(**BASE, **COMPLETEP, completep_alpha=alpha)
    v = cc.run_check(cfg, _setup("depth", DEPTHS))
    assert v.outcome == cc.PASS, v.reason()
    assert set(v.controls) == {"sp", "other_alpha"} and not v.uncaught
    assert v.result.checks[0].check.exponent == 0.5 - alpha


def test_depth_check_refuses_a_model_without_a_depth_rule() -> None:
    with pytest.raises(ValueError, match="depth check checks CompleteP"):
        cc.run_check(ModelConfig(**BASE, **MUP), _setup("depth", (2, 4)), controls=False)


# the decision rule on synthetic slopes


def _per_seed(slopes: list[float], sizes=WIDTHS, noise: float = 0.0, rng=None) -> list[list[float]]:
    """Per seed, values whose pairwise log2 slopes are `slopes` (plus noise per seed)."""
    rng = rng or random.Random(0)
    out = []
    for _ in range(6):
        y, row = 1.0, [1.0]
        for s in slopes:
            y *= 2 ** (s + rng.gauss(0, noise))
            row.append(y)
        out.append(row)
    return out


def test_finite_width_is_told_apart_from_a_wrong_exponent() -> None:
    check = cc.Check("mlp", "change", 4, 0.0)
    settling = cc.decide(check, WIDTHS, _per_seed([-0.6, -0.2, -0.05], noise=0.02))
    assert settling.outcome == cc.PASS and settling.from_size == 128, settling.reason
    assert "finite width" in settling.reason
    wrong = cc.decide(check, WIDTHS, _per_seed([0.5, 0.5, 0.5], noise=0.02))
    assert wrong.outcome == cc.FAIL and wrong.from_size is None
    growing = cc.decide(check, WIDTHS, _per_seed([0.05, 0.2, 0.6], noise=0.02))
    assert growing.outcome != cc.PASS  # moving away from the band is not finite width
    noisy = cc.decide(check, WIDTHS, _per_seed([0.2, 0.2, 0.2], noise=0.3))
    assert noisy.outcome == cc.INCONCLUSIVE and "add seeds" in noisy.reason


@pytest.mark.parametrize(("true", "wrong_outcome"), [(0.0, cc.FAIL), (0.5, cc.PASS)])
def test_stated_error_rates(true: float, wrong_outcome: str) -> None:
    """At the exponent the check fails at most 2.5 % of the time, half a doubling off it passes at
    most 2.5 % (each side of the band is a one-sided 2.5 % test), at a per-seed SD of 0.1."""
    rng = random.Random(1)
    check = cc.Check("attn", "change", 4, 0.0)
    n = 400
    wrong = sum(
        cc.decide(check, WIDTHS, _per_seed([true] * 3, noise=0.1, rng=rng)).outcome == wrong_outcome
        for _ in range(n)
    )
    assert wrong / n <= 0.025


def test_slope_is_the_log_log_least_squares_fit() -> None:
    assert cc.slope([64, 128, 256, 512], [3 * w**0.5 for w in (64, 128, 256, 512)]) == (
        pytest.approx(0.5)
    )


# the command


def _command(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "cc"
    cmd = [sys.executable, "-m", "normlab.launch.cli", "coordcheck", *argv, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (check,) = json.loads((out / "coordcheck.json").read_text())["checks"]
    assert (out / check["png"]).stat().st_size > 0
    return proc, check


def test_command_exits_1_on_a_failure_with_the_reason_in_one_line(tmp_path: Path) -> None:
    proc, check = _command(
        tmp_path, "pre", "model.n_layers=1", "model.init=normal", "training.threads=1",
        "--widths", "64,256", "--steps", "2", "--seeds", "3", "--no-controls",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("width [64, 256]: fail: ") and "outside band" in first
    assert check["verdict"] == "fail" and check["controls"] == {}
    assert "width 256 done" in proc.stderr  # one progress line per stage


def test_command_exits_3_when_two_seeds_cannot_decide(tmp_path: Path) -> None:
    proc, check = _command(
        tmp_path, "pre", "model.n_layers=1", "model.parametrization=mup", "model.base_d_model=64",
        "training.threads=1", "--widths", "64,128", "--steps", "2", "--seeds", "2",
        "--no-controls",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    assert check["verdict"] == "inconclusive" and "add seeds" in check["verdict_reason"]


# the runs committed in docs/coordcheck/ and quoted in docs/transfer.md (docs/gen_coordcheck.py)


def _generator():  # type: ignore[no-untyped-def]
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "docs" / "gen_coordcheck.py"
    spec = importlib.util.spec_from_file_location("gen_coordcheck", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
COMMITTED = GEN.COMMITTED


def test_transfer_page_quotes_the_committed_checks() -> None:
    """docs/transfer.md's block is what gen_coordcheck builds from the committed reports; every
    committed check passes with each of its negative controls caught."""
    text = GEN.PAGE.read_text()
    assert GEN.render_page(text) == text, "stale: run python docs/gen_coordcheck.py --page"
    for name in COMMITTED:
        check = GEN.committed(name)
        assert check["verdict"] == "pass", name
        assert check["controls"] and all(c["caught"] for c in check["controls"].values()), name
        assert GEN.row(name, check) in text


def test_the_quoted_error_bound_is_the_t_tail_at_the_worst_spread() -> None:
    """The block's error rate: P(T_{n-1} > 0.25 sqrt(n)/sd + t_0.975) at the largest per-seed
    SD, recomputed here from a per-seed SD by hand: a one-sided miss never exceeds 2.5 %."""
    from scipy import stats

    iv = {"mean": 0.0, "hi": 0.1, "lo": -0.1, "n": 6}
    sd, p = GEN.error_bound([{"fit": iv}])
    crit = stats.t.ppf(0.975, 5)
    assert sd == pytest.approx(0.1 * 6**0.5 / crit)
    assert p == pytest.approx(stats.t.sf(0.25 * 6**0.5 / sd + crit, 5))
    wide = {"mean": 0.0, "hi": 100.0, "lo": -100.0, "n": 6}
    assert GEN.error_bound([{"fit": wide}])[1] <= 0.025


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_check_is_what_the_command_gives(name: str, tmp_path: Path) -> None:
    """The command run again (20-50 s each on 2 cores): the same verdict and slopes."""
    proc, check = _command(tmp_path, *COMMITTED[name])
    committed = GEN.committed(name)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert check["verdict"] == committed["verdict"]
    for got, want in zip(check["checks"], committed["checks"], strict=True):
        assert got["fit"]["mean"] == pytest.approx(want["fit"]["mean"], abs=1e-3)
