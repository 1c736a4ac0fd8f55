"""study.md's FP8 section (issue 33 item 3; launch.study.fp8_section): every cell is the committed
compare.csv's value for that run and seed, bf16 arms show no casts, and `--report-only` replaces
the section in place."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from normlab.launch.report.fp8_columns import FP8_COLUMNS
from normlab.launch.study.fp8_section import HEAD, fp8_section
from normlab.launch.study.plan import plan
from normlab.launch.study.sections import FOOTER, FP8, VERDICTS, Section, parse, render
from normlab.launch.study.sections import with_section as with_
from normlab.launch.study.spec import load_study

ROOT = Path(__file__).resolve().parents[3]
REDUCED = ROOT / "docs" / "study" / "fp8_reduced"  # 16 runs of the fp8 study, 2 seeds


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 (list[Planned])
    return plan(load_study("fp8"), tmp_path_factory.mktemp("fp8"))


def test_cells_are_compare_csv_per_seed(planned) -> None:  # noqa: ANN001
    with (REDUCED / "compare.csv").open() as fh:
        runs = {r["run"]: r for r in csv.DictReader(fh)}
    lines = fp8_section(planned, REDUCED / "compare.csv")
    assert lines[0] == HEAD
    table = [x for x in lines if x.startswith("| ") and not x.startswith("| recipe")]
    assert len(table) == 8  # 4 recipes x 2 learning rates (SwiGLU only) were run
    labels = [label for label, _ in FP8_COLUMNS.values()]
    assert lines[lines.index(table[0]) - 2].split(" | ")[3:] == [*labels[:-1], labels[-1] + " |"]
    for row in table:
        recipe, point, seeds, *cells = row.strip("| ").split(" | ")
        lr = point.split("lr ")[1]
        assert seeds == "0,1"
        for cell, (key, (_, fmt)) in zip(cells, FP8_COLUMNS.items(), strict=True):
            want = []
            for seed in (0, 1):
                value = runs[_name(planned, recipe, float(lr), seed)][key]
                want.append(format(float(value), fmt) if value else "-")
            assert cell == ", ".join(want), (recipe, point, key)
        if not recipe.endswith("_fp8"):  # bf16: no casts, but the kurtosis is measured
            assert cells[0] == "-, -" and "-" not in cells[3]
    # the reduced run's write-up: pre_fp8 at 3e-2 had 0.118 of an input cast to zero (seed max)
    pre = next(r for r in table if r.startswith("| pre_fp8 |") and "lr 0.03 " in r)
    assert max(float(x) for x in pre.split(" | ")[3].split(", ")) == pytest.approx(0.118, abs=5e-4)


def _name(planned, recipe: str, lr: float, seed: int) -> str:  # noqa: ANN001
    (p,) = [
        p
        for p in planned
        if p.recipe == recipe
        and float(p.lr) == lr
        and p.seed == seed
        and p.size == "smooth_swiglu=False"
    ]
    return Path(str(p.cfg.run_dir)).name


def test_no_fp8_statistics_no_section(planned, tmp_path: Path) -> None:  # noqa: ANN001
    src = ROOT / "docs" / "study" / "completep_depth" / "compare.csv"
    assert fp8_section(planned, src) == []  # none of its run names, and no FP8 columns
    assert fp8_section(planned, tmp_path / "missing.csv") == []


def test_report_only_replaces_the_section_in_place(planned) -> None:  # noqa: ANN001
    section = fp8_section(planned, REDUCED / "compare.csv")
    text = (
        "# t\n\n## Every grid point\n\n| a |\n\n## Verdicts (SCIENCE.md 22)\n\nx\n\nEvery run: y\n"
    )

    def replace(text: str, lines: list[str]) -> str:
        return render(with_(parse(text), Section(FP8, lines), before=(VERDICTS, FOOTER)))

    once = replace(text, section)
    assert once.index(HEAD) < once.index("## Verdicts") and once.count(HEAD) == 1
    assert replace(once, section) == once
    stale = replace(text, [HEAD, "", "old", ""])
    assert replace(stale, section) == once
    assert replace(once, []) == text


def test_a_study_with_fp8_writes_the_section(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: a one-run study under emulated FP8 with the instrument on shows its compare.csv
    numbers in study.md."""
    from normlab.launch.study.run import run_study
    from rich.console import Console

    from tests.conftest import tiny_overrides

    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    sets = [
        o
        for o in tiny_overrides(tiny_data, Path("unused"))
        if not o.startswith(("run_dir=", "schedule.warmup_steps=", "training.log_every="))
    ]
    sets += ["schedule.warmup_steps=0", "training.log_every=2"]
    sets += ["precision.fp8={}", "instruments.fp8=true"]
    out = tmp_path / "study"
    run_study(["pre"], out, sets, steps=4, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    with (out / "compare.csv").open() as fh:
        (row,) = list(csv.DictReader(fh))
    text = (out / "study.md").read_text()
    assert text.count(HEAD) == 1
    section = text.split(HEAD)[1].split("\n## ")[0]
    (line,) = [x for x in section.split("\n") if x.startswith("| pre |")]
    cells = line.strip("| ").split(" | ")[3:]
    want = [format(float(row[k]), fmt) for k, (_, fmt) in FP8_COLUMNS.items()]
    assert cells == want
