"""Claims as data (issue 29 item 2): a study file's `claims:`, validated on one line; the seed
articles' claims ship as recipes/studies/articles.yaml; per-entry seeds (an A/A study); a claim
whose recipes were not run is "not tested"; the study's rows decided by SCIENCE.md 22."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.errors import ConfigError
from normlab.launch.study.plan import DEFAULT_RECIPES, plan, spec_from_flags
from normlab.launch.study.sections import FOOTER, VERDICTS, Section, parse, render, with_section
from normlab.launch.study.spec import article_claims, load_study
from normlab.launch.study.study_verdicts import (
    decide_study,
    losses_at_fractions,
    status_of,
    verdict_section,
)
from normlab.launch.verdicts.decide import Claim

BASE = {"recipes": ["pre", "pre_nowarmup"], "grid": {"optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1]}
CLAIM = {"a": "pre", "b": "pre_nowarmup", "statistic": "lr_sensitivity", "expect": "a_lower"}


def write(tmp_path: Path, **change: object) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}, sort_keys=False))
    return path


def test_claims_of_a_study_file_are_data(tmp_path: Path) -> None:
    spec = load_study(str(write(tmp_path, claims=[{**CLAIM, "name": "mine"}])))
    assert spec.claims == [Claim("pre", "pre_nowarmup", "lr_sensitivity", "a_lower", None, "mine")]
    assert spec.claims_to_decide() == spec.claims


def test_without_claims_the_seed_articles_claims_are_decided(tmp_path: Path) -> None:
    spec = load_study(str(write(tmp_path)))
    articles = article_claims()
    assert spec.claims is None and spec.claims_to_decide() == articles
    assert {(c.a, c.b) for c in articles} == {
        ("post_nowarmup", "post_warmup"),
        ("pre_nowarmup", "pre"),
        ("post_warmup", "deepnorm"),
    }
    assert {c.a for c in articles} | {c.b for c in articles} <= set(DEFAULT_RECIPES)
    flags = spec_from_flags(["pre"], [1e-3, 3e-3], [0, 1])
    assert flags.claims_to_decide() == articles  # `normlab study` without a file
    off = load_study(str(write(tmp_path, protocol={"claims": False})))
    assert off.claims_to_decide() == []


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ([{**CLAIM, "stat": 1}], "claims: claim 1: unknown key 'stat'; allowed: a, b, statistic"),
        ([{"a": "pre", "b": "x"}], "claims: claim 1: missing statistic"),
        ([{**CLAIM, "statistic": "loss"}], "statistic 'loss' is not one of"),
        ([{**CLAIM, "expect": "lower"}], "claim 1: expect 'lower' is not one of"),
        ([{**CLAIM, "b": "pre"}], "a claim compares two recipes, got 'pre' twice"),
        ([CLAIM, "pre"], "claims: claim 2 is not a mapping"),
        ([], "'claims' must be a non-empty list"),
    ],
)
def test_bad_claims_are_one_line(tmp_path: Path, claims: list, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_study(str(write(tmp_path, claims=claims)))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_claims_with_protocol_claims_false_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write(tmp_path, claims=[CLAIM], protocol={"claims": False})
    assert main(["study", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "claims are given but protocol.claims is false" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_entry_seeds_make_an_aa_study(tmp_path: Path) -> None:
    entries = [
        {"recipe": "pre", "name": "pre_a", "seeds": [0, 1]},
        {"recipe": "pre", "name": "pre_b", "seeds": [2, 3]},
    ]
    spec = load_study(str(write(tmp_path, recipes=entries)))
    planned = plan(spec, tmp_path / "o")
    seeds = {r: sorted({p.seed for p in planned if p.recipe == r}) for r in ("pre_a", "pre_b")}
    assert seeds == {"pre_a": [0, 1], "pre_b": [2, 3]}
    shipped = load_study("aa")
    arms = [set(r.seeds or []) for r in shipped.recipes]
    assert len(arms) == 2 and all(len(s) >= 4 for s in arms) and not arms[0] & arms[1]
    assert {r.path for r in shipped.recipes} == {shipped.recipes[0].path}  # one recipe twice
    with pytest.raises(ConfigError, match="recipes.pre_a.seeds has a value twice"):
        load_study(str(write(tmp_path, recipes=[{**entries[0], "seeds": [1, 1]}, "pre"])))


def rows(recipe: str, losses: np.ndarray, lrs: list[float], seeds: list[int]) -> list[dict]:
    return [
        {"recipe": recipe, "size": None, "lr": lr, "seed": s, "eval_loss": float(losses[i, j]),
         "status": "completed", "init_loss": 8.3}
        for i, s in enumerate(seeds)
        for j, lr in enumerate(lrs)
    ]  # fmt: skip


def test_a_study_decides_its_claims_and_says_what_was_not_run() -> None:
    lrs = [1e-3, 3e-3, 1e-2]
    base = np.array([5.6, 5.4, 5.9])
    rng = np.random.default_rng(0)
    a = base + 0.01 * rng.standard_normal((4, 3))
    b = base + 0.5 + 0.01 * rng.standard_normal((4, 3))
    table = rows("pre", a, lrs, [0, 1, 2, 3]) + rows("post", b, lrs, [0, 1, 2, 3])
    claims = [
        Claim("pre", "post", "loss_at_best_lr", "a_lower", None, "Pre-LN lower"),
        Claim("pre", "peri", "loss_at_best_lr", "a_lower", None, "not run"),
    ]
    decided = decide_study(table, claims, 6.258, 0.1, aa=200)
    first, second = decided.verdicts
    assert first.verdict == "a_lower" and first.claim == "Pre-LN lower"
    assert first.delta == pytest.approx(a[:, 1].mean() - b[:, 1].mean(), abs=1e-9)
    assert second.verdict == "not_tested" and second.note == "not run: peri"
    assert all(r.passed for r in decided.aa)
    section = "\n".join(verdict_section(decided))
    assert (
        "| Pre-LN lower | pre vs post | - | loss_at_best_lr "
        "| A lower (pre lower than post by more than 0.1 nats) |"
    ) in section
    assert "| not run | pre vs peri | - | loss_at_best_lr | not tested (not run: peri) |" in section
    assert "A/A self-test (22.6, B 200" in section and ": pass;" in section


def test_one_seed_is_never_a_verdict() -> None:
    lrs = [1e-3, 3e-3]
    table = rows("pre", np.array([[5.0, 4.0]]), lrs, [0]) + rows(
        "post", np.array([[6.0, 6.0]]), lrs, [0]
    )
    (v,) = decide_study(
        table, [Claim("pre", "post", "loss_at_best_lr")], 6.258, 0.1, aa=None
    ).verdicts
    assert v.verdict == "inconclusive" and "needs >= 2 seeds" in v.note


def test_statuses_and_fractions_and_the_section_replacement() -> None:
    assert [status_of(s) for s in ("completed", "diverged", "interrupted", None, "x")] == [
        "completed", "diverged", "stopped", "failed", "failed"
    ]  # fmt: skip
    evals = [{"step": 25, "eval_loss": 7.0}, {"step": 50, "eval_loss": 6.0},
             {"step": 100, "eval_loss": 5.0}]  # fmt: skip
    assert losses_at_fractions(evals, 100) == {0.25: 7.0, 0.5: 6.0}  # no eval near 75 %
    old = "# t\n\n## Verdicts\n\n| old |\n\n![fig](a.png)\n"
    new = Section(VERDICTS, ["## Verdicts (SCIENCE.md 22)", "", "new", ""])
    assert render(with_section(parse(old), new, before=(FOOTER,))) == (
        "# t\n\n## Verdicts (SCIENCE.md 22)\n\nnew\n\n![fig](a.png)\n"
    )
    none = parse("# t\n\nEvery run: x\n")
    assert render(with_section(none, Section(VERDICTS, ["S", ""]), before=(FOOTER,))) == (
        "# t\n\nS\n\nEvery run: x\n"
    )


def test_report_only_refuses_submit_and_a_study_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = str(tmp_path / "o")
    assert main(["study", "zloss", "--report-only", "--submit", "--out", out]) == 2
    assert "--report-only trains nothing" in capsys.readouterr().err
    assert main(["study", "zloss", "--report-only", "--out", out]) == 2
    assert "has neither the study's runs" in capsys.readouterr().err


def test_plan_a_study_from_a_stated_or_pilot_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from normlab.launch.stats import statistics as st

    # SCIENCE.md 22.5's example: SD 0.03, true difference 0.2, margin 0.1, 3 claims
    assert main(["verdicts", "--plan", "0.2", "--sd", "0.03"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("this claim needs 4 seeds per arm at a 0.1-nat margin")
    assert st.seeds_needed(0.2, 0.03, 0.1, 0.05 / 3) == 4
    pilot = tmp_path / "pilot.csv"
    lines = ["recipe,lr,seed,eval_loss,status,l0"]
    for seed, shift in enumerate((0.0, 0.04, -0.03)):
        for lr, loss in ((1e-3, 5.6), (3e-3, 5.4)):
            lines.append(f"pre,{lr},{seed},{loss + shift},completed,8.3")
    pilot.write_text("\n".join(lines) + "\n")
    assert main(["verdicts", str(pilot), "--plan", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "pre [-] loss_at_best_lr: this claim needs" in out
    assert "pre [-] lr_sensitivity: this claim needs" in out
    assert main(["verdicts", "--plan", "0.2"]) == 2
    assert "either --sd SD or a pilot RESULTS table" in capsys.readouterr().err
    assert main(["verdicts"]) == 2
    assert "a results table is needed" in capsys.readouterr().err
