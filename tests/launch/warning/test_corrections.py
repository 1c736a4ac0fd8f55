"""Issue 49 item 4: the early warning's claims corrected and out of sample. Holm-adjusted p
against the step-down decisions; the committed sweep recomputed (the first study's two winners
do not survive Holm over the 16 signals); the action study's seed split refused on overlap; its
healthy runs counted as distinct runs; the held-out study's split accepted and its paired
comparison in the headline (tests/launch/warning/test_paired.py checks the statistic)."""

import importlib.util
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.stats.statistics import holm, holm_adjusted
from normlab.launch.warning.actions import Outcome, distinct, paired, split_refusal

REPO = Path(__file__).resolve().parents[3]


def gen():
    spec = importlib.util.spec_from_file_location("gen_warnings", REPO / "docs" / "gen_warnings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_holm_adjusted_p_by_hand_and_the_same_decisions_as_the_step_down():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, 1*0.04, running max
    assert holm_adjusted(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    rng = np.random.default_rng(0)
    for _ in range(200):
        q = rng.uniform(0, 0.1, size=int(rng.integers(1, 20)))
        rejected, _ = holm(q)
        assert list(np.asarray(holm_adjusted(q)) <= 0.05) == list(rejected)
    assert math.isnan(holm_adjusted([0.01, math.nan])[1])
    assert holm_adjusted([0.01, math.nan])[0] == pytest.approx(0.01)  # m counts tests only


def test_the_committed_sweep_has_no_signal_that_survives_holm():
    """Recomputed from docs/warnings/divergence/runs.jsonl.gz, not read from the page."""
    g = gen()
    with tempfile.TemporaryDirectory() as tmp:
        texts = g.evaluate(g.read_bundle(), Path(tmp))
    import json

    rows = {r["signal"]: r for r in json.loads(texts["warnings.json"])["signals"]}
    compared = [r for n, r in rows.items() if n != "loss"]
    assert len(compared) == 16
    assert rows["resid_rms"]["mcnemar_p"] == pytest.approx(0.00635, abs=5e-6)
    assert rows["max_logit"]["mcnemar_p"] == pytest.approx(0.0215, abs=5e-5)
    assert rows["resid_rms"]["holm_p"] == pytest.approx(16 * rows["resid_rms"]["mcnemar_p"])
    assert rows["resid_rms"]["holm_p"] > 0.05 and rows["max_logit"]["holm_p"] > 0.05
    assert not any(r["beats_loss"] for r in compared)
    assert "No signal warns earlier than the loss" in texts["warnings.md"]
    found = g.heldout_outcomes()
    headline = g.headline(texts, g.action_block(g.read_bundle()), g.heldout_clause(found))
    assert "no signal warns earlier than the loss" in headline
    assert "Holm 0.102" in headline
    if found is None:  # the in-sample action study only: refused, not a finding
        assert "not a finding" in headline and "not packed yet" in headline
    else:  # the held-out study's paired comparison, a finding only when its p < 0.05
        result = paired(found[0])
        assert f"McNemar p {result.p:.3g}" in headline
        assert f"{result.seed_p:.3g} with the {result.seeds} seeds as the units" in headline
        assert ("beat one back-off at a fixed step" in headline) == (result.p < 0.05)
        assert ("not shown at these seeds" in headline) == (result.p >= 0.05)
        over_seeds = result.p < 0.05 and result.seed_p < 0.05
        assert ("over seeds it is not shown yet" in headline) == (
            result.p < 0.05 and not over_seeds
        )
        assert "recorded but not a finding" not in headline
    assert headline in (REPO / "README.md").read_text()
    assert headline in g.PAGE.read_text()


def test_the_action_study_refuses_seeds_its_signals_were_chosen_on():
    line = split_refusal([0, 1, 2, 3, 4, 5], [2, 3, 4, 5])
    assert line is not None and "\n" not in line and "[2, 3, 4, 5]" in line
    assert split_refusal([0, 1, 2, 3, 4, 5], [6, 7, 8, 9]) is None
    g = gen()
    block = g.action_block(g.read_bundle())
    assert "Refused:" in block and "No placebo arm" in block and "not a finding" in block
    found = g.heldout_outcomes()
    if found is not None:  # the held-out study's seeds are disjoint from the selection seeds
        assert split_refusal(found[2]["selection_seeds"], [x.seed for x in found[0]]) is None
        assert found[2]["selection_seeds"] == [0, 1, 2, 3, 4, 5]
        block = g.heldout_block(found)
        assert "Refused" not in block and "Out of sample" in block


def test_healthy_runs_count_distinct_runs():
    def o(action: str, curve: str) -> Outcome:
        return Outcome(0.02, 2, action, None, 0, 0, 1.0, None, None, 5.6, 5.6, curve)

    assert distinct([o("backoff", "a"), o("rollback", "a"), o("backoff", "b")]) == 2
    g = gen()
    block = g.action_block(g.read_bundle())
    assert "Healthy twins: 8 protected runs, 4 distinct" in block  # 4 bit-identical pairs


def test_the_heldout_arms_follow_their_twin_until_they_act():
    """Each back-off run is the twin arm of its (lr, seed) step for step until its first alarm,
    each placebo run until its fixed step: the twin's event is theirs unless the action moved
    it. Skipped before the held-out study is packed."""
    g = gen()
    if not g.HELDOUT_BUNDLE.exists():
        pytest.skip("the held-out action study is not packed yet")
    records = g.read_bundle(g.HELDOUT_BUNDLE)

    def ew(r: dict) -> dict:
        return r["config"]["instruments"]["early_warning"]

    def key(r: dict) -> tuple:
        return (r["config"]["optim"]["lr"], r["config"]["training"]["seed"])

    twins = {key(r): r for r in records if ew(r)["action"] == "checkpoint"}
    protected = [r for r in records if ew(r)["action"] != "checkpoint"]
    assert len(twins) == len(protected) // 2 > 0
    assert {r["config"]["training"]["seed"] for r in records} == {6, 7, 8, 9}
    for r in protected:
        rows = [m for m in r["metrics"] if "loss" in m]
        if ew(r).get("placebo_step"):
            until = ew(r)["placebo_step"]
        else:
            alarmed = [m["step"] for m in rows if m.get("early_warning/alarms", 0) > 0]
            until = alarmed[0] if alarmed else math.inf
        mine = [repr(m["loss"]) for m in rows if m["step"] <= until]  # repr: nan equals nan
        theirs = [
            repr(m["loss"]) for m in twins[key(r)]["metrics"] if "loss" in m and m["step"] <= until
        ]
        n = min(len(mine), len(theirs))
        assert n > 0 and mine[:n] == theirs[:n], r["name"]
