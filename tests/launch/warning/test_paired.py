"""The alarm-driven back-off against its placebo (issue 49 item 4; launch/warning/actions.py
paired, paired_sentence; docs/gen_warnings.py's held-out block and headline clause): exact
one-sided McNemar p against binomial tails written out by hand, pairing by (lr, seed), healthy
twins counted as distinct runs, and words no stronger than the p. Synthetic outcomes only."""

import gzip
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
from normlab.launch.warning.actions import (
    DOSE,
    Outcome,
    mcnemar_greater,
    paired,
    paired_sentence,
    seed_sign_flip,
)

REPO = Path(__file__).resolve().parents[3]
EVENT = ("nonfinite", 150)


def gen():
    spec = importlib.util.spec_from_file_location("gen_warnings", REPO / "docs" / "gen_warnings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def o(
    action: str,
    lr: float,
    seed: int,
    saved: bool,
    *,
    healthy: bool = False,
    alarms: int = 1,
    curve: str = "",
) -> Outcome:
    """A protected run; its twin had an event unless `healthy`."""
    twin = None if healthy else EVENT
    event = None if (saved or healthy) else ("nonfinite", 170)
    return Outcome(lr, seed, action, 100, alarms, 1, 0.5, event, twin, 5.9, 6.1, curve)


def arms(saves: list[tuple[bool, bool]]) -> list[Outcome]:
    """One (back-off saved, placebo saved) per seed at lr 0.05."""
    out = []
    for seed, (a, q) in enumerate(saves):
        out += [o("backoff", 0.05, seed, a), o("placebo_backoff", 0.05, seed, q)]
    return out


def test_exact_one_sided_mcnemar_by_hand():
    assert mcnemar_greater(5, 0) == pytest.approx(1 / 32)  # P(X >= 5), X ~ Bin(5, 1/2)
    assert mcnemar_greater(3, 1) == pytest.approx(5 / 16)  # (4 + 1) / 16
    assert mcnemar_greater(4, 0) == pytest.approx(1 / 16)
    assert mcnemar_greater(6, 1) == pytest.approx(8 / 128)  # (7 + 1) / 128
    assert mcnemar_greater(0, 3) == 1.0  # one-sided: the placebo's wins give no evidence for
    assert mcnemar_greater(0, 0) == 1.0


def test_the_pairs_counts_and_discordant_pairs():
    # seeds 0-4: back-off only; seeds 5-6: both; seed 7: placebo only; seed 8: neither
    saves = [(True, False)] * 5 + [(True, True)] * 2 + [(False, True), (False, False)]
    r = paired(arms(saves))
    assert (r.pairs, r.saved, r.placebo_saved, r.b, r.c) == (9, 7, 3, 5, 1)
    assert r.p == pytest.approx(7 / 64)  # P(X >= 5), X ~ Bin(6, 1/2) = (6 + 1) / 64
    assert r.healthy_pairs == 0 and r.false_alarms == 0


def test_pairing_is_by_lr_and_seed():
    out = arms([(True, False)] * 5)
    out.append(o("placebo_backoff", 0.05, 99, True))  # no back-off at seed 99: not paired
    out.append(o("backoff", 0.06, 0, True))  # no placebo at lr 0.06: not paired
    out.append(o("placebo_backoff", 0.07, 0, True))  # nor at lr 0.07 (another lr, same seed)
    out.append(o("rollback", 0.05, 0, False))  # another action: ignored
    r = paired(out)
    assert (r.pairs, r.saved, r.placebo_saved, r.b, r.c) == (5, 5, 0, 5, 0)
    assert r.p == pytest.approx(1 / 32)
    # the order of the outcomes does not matter
    assert paired(list(reversed(out))) == r
    # one arm twice at one (lr, seed) is refused, as are pairs whose twins disagree
    with pytest.raises(ValueError, match="two backoff runs"):
        paired(out + [o("backoff", 0.05, 0, False)])
    other_twin = Outcome(0.05, 0, "placebo_backoff", 90, 1, 1, 0.5, None, ("nonfinite", 9), 6, 6)
    with pytest.raises(ValueError, match="twins disagree"):
        paired([o("backoff", 0.05, 0, True), other_twin])


def test_placebo_steps_after_the_twins_event_are_counted():
    """A placebo whose fixed step comes at or after its twin's event (150) had not acted."""
    out = []
    for seed, step in enumerate((100, 149, 150, 200)):
        out += [o("backoff", 0.05, seed, True), replace(o("placebo_backoff", 0.05, seed, False),
                                                        placebo_step=step)]  # fmt: skip
    r = paired(out)
    assert (r.pairs, r.placebo_late) == (4, 2)
    assert "On 2 of the 4 pairs the twin's event came at or before the placebo's fixed step" in (
        paired_sentence(r)
    )
    assert "placebo's fixed step" not in paired_sentence(paired(arms([(True, False)] * 4)))


def test_healthy_twins_count_false_alarms_and_distinct_runs():
    out = arms([(True, False)] * 3)
    out += [
        # seed 10: no alarm, so the back-off run is its twin; the placebo backed off at its step
        o("backoff", 0.02, 10, False, healthy=True, alarms=0, curve="twin10"),
        o("placebo_backoff", 0.02, 10, False, healthy=True, alarms=0, curve="placebo10"),
        # seed 11: two false alarm episodes acted on; the placebo counted the first only
        o("backoff", 0.02, 11, False, healthy=True, alarms=2, curve="backoff11"),
        o("placebo_backoff", 0.02, 11, False, healthy=True, alarms=1, curve="placebo11"),
        # seed 12: both runs bit-identical (the same curve): one run, not two
        o("backoff", 0.02, 12, False, healthy=True, alarms=0, curve="same12"),
        o("placebo_backoff", 0.02, 12, False, healthy=True, alarms=0, curve="same12"),
    ]
    r = paired(out)
    assert r.pairs == 3 and r.healthy_pairs == 3
    assert (r.false_alarms, r.placebo_false_alarms, r.healthy_distinct) == (2, 1, 5)
    text = paired_sentence(r)
    assert "On the 3 healthy twins (no event) the alarm-driven arm raised 2 false alarm" in text
    assert "their 6 protected runs are 5 distinct" in text


def test_the_words_are_no_stronger_than_the_p():
    strong = paired(arms([(True, False)] * 5))  # p = 1/32
    weak = paired(arms([(True, False)] * 3 + [(False, True)]))  # p = 5/16
    none = paired(arms([(True, True)] * 4))  # no discordant pair: p = 1
    assert strong.p < 0.05 <= weak.p and none.p == 1.0
    s, w, n = paired_sentence(strong), paired_sentence(weak), paired_sentence(none)
    assert "at a fixed step (p < 0.05 over pairs and over seeds)" in s and "not shown" not in s
    for text in (w, n):
        assert "not shown at these seeds" in text and "(p < 0.05)" not in text
    assert "McNemar p 0.0312" in s and "McNemar p 0.312" in w and "McNemar p 1)" in n
    for text in (s, w, n):  # the dose difference is said whatever the p
        assert DOSE in text and "backs off again each 50 steps" in text
    assert "nothing to compare" in paired_sentence(paired([]))


def test_the_headline_states_a_finding_only_below_005():
    g = gen()
    meta = {"selection_seeds": [0, 1, 2, 3, 4, 5]}

    def found(saves: list[tuple[bool, bool]], first_seed: int = 6) -> tuple:
        out = [replace(x, seed=x.seed + first_seed) for x in arms(saves)]
        return out, [], meta

    strong = g.heldout_clause(found([(True, False)] * 5))
    assert strong.startswith("On held-out seeds 6-10 the alarm-driven back-off saved 5 of 5")
    assert "placebo (the same back-off once at a fixed step) 0 of 5" in strong
    assert "McNemar p 0.0312" in strong and "beat one back-off at a fixed step" in strong
    weak = g.heldout_clause(found([(True, False)] * 3 + [(False, True)]))
    assert "McNemar p 0.312" in weak and "not shown at these seeds" in weak
    assert "beat" not in weak
    overlap = g.heldout_clause(found([(True, False)] * 5, first_seed=2))
    assert "not a finding" in overlap and "beat" not in overlap
    assert g.heldout_clause(None) is None
    texts = {"warnings.json": json.dumps({"signals": []})}
    assert g.headline(texts, "", strong).endswith(strong + "\n")
    before = g.headline(texts, "Refused: ...\nNo placebo arm ...", None)
    assert "not a finding" in before and "not packed yet" in before


def _record(name: str, lr: float, seed: int, ew: dict, event_step: int | None) -> dict:
    events = [{"kind": "nonfinite", "step": event_step}] if event_step else []
    alarm_from = ew.pop("_alarm", None)
    rows = []
    for step in range(1, 201):
        if event_step and step > event_step:
            break
        fired = alarm_from is not None and step >= alarm_from
        rows.append({"step": step, "loss": 6.0, "early_warning/alarms": float(fired)})
    return {
        "name": name,
        "config": {
            "optim": {"lr": lr},
            "training": {"seed": seed},
            "instruments": {"early_warning": ew},
        },
        "summary": {"status": "completed", "events": events},
        "metrics": rows,
    }


def test_the_heldout_block_sets_each_arm_against_its_own_twin(tmp_path, monkeypatch):
    g = gen()
    bundle, meta = tmp_path / "runs.jsonl.gz", tmp_path / "sweep.json"
    monkeypatch.setattr(g, "HELDOUT_BUNDLE", bundle)
    monkeypatch.setattr(g, "HELDOUT_META", meta)
    assert g.heldout_outcomes() is None
    assert g.heldout_block(None).startswith("Not run and packed yet")
    records = []
    for seed in (6, 7):
        records += [
            _record(f"twin_lr05_s{seed}", 0.05, seed, {"action": "checkpoint", "_alarm": 90}, 150),
            _record(f"backoff_lr05_s{seed}", 0.05, seed, {"action": "backoff", "_alarm": 90}, None),
            _record(
                f"placebo_lr05_s{seed}",
                0.05,
                seed,
                {"action": "backoff", "placebo_step": 125, "_alarm": 90},
                160 if seed == 6 else None,  # the placebo saves seed 7 only
            ),
        ]
    g.write_bundle(records, bundle)
    meta.write_text(json.dumps({
        "command": "normlab study divergence_actions_heldout --jobs 2", "time_s": 600,
        "machine": "2 CPU cores", "selection_seeds": [0, 1, 2, 3, 4, 5],
        "evaluation_seeds": [6, 7],
    }))  # fmt: skip
    with gzip.open(bundle, "rt") as fh:
        assert len(fh.readlines()) == 6
    outcomes, twins, _ = g.heldout_outcomes()
    assert len(twins) == 2 and {x.action for x in outcomes} == {"backoff", "placebo_backoff"}
    assert all(x.twin_event == ("nonfinite", 150) for x in outcomes)
    block = g.heldout_block((outcomes, twins, _))
    assert block.startswith("6 runs (2 twins, 4 with an action), seeds 6-7;")
    assert "Out of sample: the signals were tuned and chosen on seeds 0-5" in block
    assert "Refused" not in block
    assert "| all | backoff | 2 (6, 7) |" in block and "| all | placebo_backoff |" in block
    assert "back-off saved 2, its placebo 1; 1 saved by the back-off only, 0 by" in block
    # a protected run without its twin is refused
    g.write_bundle(records[1:], bundle)
    with pytest.raises(SystemExit, match="no twin run"):
        g.heldout_outcomes()


def test_the_seed_is_the_unit_when_pairs_share_it():
    """Exact sign flip over seeds by hand; pairs at several rates of one seed are one unit."""
    assert seed_sign_flip([1, 1, 1, 1]) == pytest.approx(1 / 16)  # only the observed signs
    assert seed_sign_flip([1, 1, 1, 1, 1]) == pytest.approx(1 / 32)
    assert seed_sign_flip([2, -1]) == pytest.approx(2 / 4)  # sums 1, 3 >= 1; -1, -3 not
    assert seed_sign_flip([3, 0, 0]) == pytest.approx(1 / 2)  # zero seeds change no sum
    assert seed_sign_flip([]) == 1.0 and seed_sign_flip([0, 0]) == 1.0
    # five rates of one seed, the back-off saving each: 5 discordant pairs but one seed
    one_seed = []
    for lr in (0.03, 0.04, 0.05, 0.06, 0.07):
        one_seed += [o("backoff", lr, 6, True), o("placebo_backoff", lr, 6, False)]
    r = paired(one_seed)
    assert r.p == pytest.approx(1 / 32) and (r.seeds, r.seed_p) == (1, 0.5)
    text = paired_sentence(r)
    assert "on these (lr, seed) pairs (p < 0.05), not yet shown over seeds" in text
    assert "sign-flip p 0.5 over 1 seeds" in text and "over pairs and over seeds" not in text
    g = gen()
    clause = g.heldout_clause(([replace(x) for x in one_seed], [], {"selection_seeds": [0, 1]}))
    assert "0.5 with the 1 seeds as the units" in clause
    assert "over seeds it is not shown yet (5 held-out seeds" in clause
