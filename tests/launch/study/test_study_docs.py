"""The committed study results agree with the tool and with the docs that quote them.

For every study report committed under docs/study/NAME/:
- sensitivity.csv follows SCIENCE.md 19 from the per-point means of sensitivity_grid.csv (the
  LR sensitivity is the mean over the grid of the seed-mean minus its minimum; the best loss and
  its learning rate are that minimum and where it is);
- every table in docs/*.md that follows a link to that sensitivity.csv quotes, per recipe row,
  the LR sensitivity and the best loss the csv holds (to the printed 3 decimals).
A rerun that changes the numbers without regenerating the docs fails here."""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = REPO / "docs"
REPORTS = sorted(p.parent for p in (DOCS / "study").glob("*/sensitivity.csv"))
LINK = re.compile(r"\(study/([\w-]+)/sensitivity\.csv\)")
NUMBER = re.compile(r"-?\d+\.\d+")


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def curves(report: Path) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["recipe"], r["size"]): r for r in rows_of(report / "sensitivity.csv")}


def test_there_are_committed_reports() -> None:
    assert {"wortsman", "qknorm"} <= {p.name for p in REPORTS}


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.name)
def test_sensitivity_csv_follows_the_formula_from_the_grid(report: Path) -> None:
    grid: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in rows_of(report / "sensitivity_grid.csv"):
        grid[(r["recipe"], r["size"])].append((float(r["lr"]), float(r["mean"])))
    found = curves(report)
    assert set(grid) == set(found)
    for key, points in grid.items():
        means = [m for _, m in points]
        best = min(means)
        row = found[key]
        # the grid csv rounds each mean to 4 decimals: the recomputed value is within 1e-4
        assert abs(float(row["lr_sensitivity"]) - (sum(means) / len(means) - best)) < 2e-4, key
        assert abs(float(row["best_loss"]) - best) < 2e-4, key
        best_lrs = [lr for lr, m in points if abs(m - best) < 2e-4]
        assert any(abs(float(row["best_lr"]) - lr) < 1e-12 for lr in best_lrs), key


def quoted_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(study name, header cells, body rows) of each markdown table that follows a link to
    study/NAME/sensitivity.csv (the first table after the link, within its section)."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        for name in LINK.findall(line):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("|"):
                if lines[j].startswith("#"):
                    break
                j += 1
            if j >= len(lines) or not lines[j].startswith("|"):
                continue
            table = []
            while j < len(lines) and lines[j].startswith("|"):
                table.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            found.append((name, table[0], table[2:]))
    return found


def column(header: list[str], prefix: str) -> int | None:
    return next((k for k, h in enumerate(header) if h.lower().startswith(prefix)), None)


def test_the_docs_quote_the_committed_numbers() -> None:
    checked = 0
    for doc in sorted(DOCS.glob("*.md")):
        for name, header, body in quoted_tables(doc.read_text()):
            report = DOCS / "study" / name
            assert report.is_dir(), f"{doc.name} links study/{name}/, which is not committed"
            found = curves(report)
            sens, best = column(header, "lr sensitivity"), column(header, "best loss")
            size = column(header, "size")  # a ladder's table names the size of each row
            assert sens is not None, f"{doc.name}: no LR sensitivity in the study/{name} table"
            sizes = {s for _, s in found}
            assert size is not None or len(sizes) == 1, f"{doc.name}: study/{name} needs a size"
            for cells in body:
                recipe = cells[0].strip("`* ")
                key = (recipe, cells[size].strip("` ") if size is not None else sizes.pop())
                sizes.add(key[1])
                if key not in found:
                    continue
                row = found[key]
                for k, key in ((sens, "lr_sensitivity"), (best, "best_loss")):
                    if k is None:
                        continue
                    quoted = float(NUMBER.findall(cells[k])[0])
                    assert abs(quoted - float(row[key])) <= 6e-4, (
                        f"{doc.name}, study/{name}, {recipe}: {key} quoted {quoted}, "
                        f"the committed csv has {row[key]}"
                    )
                checked += 1
    assert checked >= 7 + 4 + 9  # wortsman's 5 and qknorm's 2 recipes, lr12's 4, depth's 9


PROBE_ROW = re.compile(r"^\| (\w+), lr ([\d.e-]+), seed (\d) \| ([^|]+) \| ([^|]+) \|")


def test_the_logit_drift_table_matches_its_committed_grid() -> None:
    """study_wortsman.md section 6 quotes each run of docs/probes/logit_drift (eval loss at 200 /
    400 / 600, ||mean output embedding|| at 100 / 300 / 600); the seed means of the step-600 values
    are the committed sensitivity_grid.csv's (eval capped at l_0 there, so only where below it)."""
    grid = {
        (r["recipe"], float(r["lr"])): r
        for r in rows_of(DOCS / "probes" / "logit_drift" / "sensitivity_grid.csv")
    }
    l0 = float(rows_of(DOCS / "probes" / "logit_drift" / "sensitivity.csv")[0]["init_loss"])
    runs: dict[tuple[str, float], list[tuple[float, float]]] = defaultdict(list)
    for line in (DOCS / "study_wortsman.md").read_text().splitlines():
        found = PROBE_ROW.match(line)
        if found:
            recipe, lr, _, evals, norms = found.groups()
            final = (float(evals.split("/")[-1]), float(norms.split("/")[-1]))
            runs[(recipe, float(lr))].append(final)
    assert set(runs) == set(grid) and all(len(v) == 2 for v in runs.values())
    for key, seeds in runs.items():
        row = grid[key]
        norm = sum(n for _, n in seeds) / 2
        assert abs(norm - float(row["head_mean_norm_final_mean"])) <= 0.06, key  # 1 decimal
        if all(e < l0 for e, _ in seeds):
            assert abs(sum(e for e, _ in seeds) / 2 - float(row["mean"])) <= 6e-4, key
        else:
            assert float(row["mean"]) == pytest.approx(l0, abs=1e-3), key  # capped at l_0


def quoted_runs(pattern: str, lr: str, section: str = "") -> dict[str, tuple[str, ...]]:
    """Rows of study_wortsman.md (after `section`, if given) matching `pattern`, whose first two
    groups are recipe and seed: {run name: the other groups}."""
    text = (DOCS / "study_wortsman.md").read_text()
    text = text.split(section)[-1] if section else text
    found = (re.match(pattern, line) for line in text.splitlines())
    return {f"{m[1]}_lr{lr}_s{m[2]}": m.groups()[2:] for m in found if m}


def test_the_zloss_dose_table_matches_its_committed_runs() -> None:
    """study_wortsman.md section 7 quotes each run of docs/probes/zloss_dose: its final eval loss
    and max attention logit are the committed compare.csv's, every run once."""
    compare = {r["run"]: r for r in rows_of(DOCS / "probes" / "zloss_dose" / "compare.csv")}
    row = r"^\| (qk|z4|z3|z2), seed (\d) \| ([^|]+) \|[^|]+\|[^|]+\| ([\d,]+) \|$"
    quoted = quoted_runs(row, "0.3")
    assert set(quoted) == set(compare) and len(quoted) == 16
    for run, (evals, max_logit) in quoted.items():
        assert abs(float(evals.split("/")[-1]) - float(compare[run]["eval_loss"])) <= 6e-4, run
        assert int(max_logit.replace(",", "")) == round(float(compare[run]["max_logit"])), run


def test_the_long_logit_table_matches_its_committed_runs() -> None:
    """study_wortsman.md section 8 quotes each run of docs/probes/logit_long; its eval loss at
    step 10,000 is the committed compare.csv's, every run once."""
    compare = {r["run"]: r for r in rows_of(DOCS / "probes" / "logit_long" / "compare.csv")}
    quoted = quoted_runs(r"^\| (qk|qk_zloss), seed (\d) \| ([\d. /]+) \|", "0.1", "## 8.")
    assert set(quoted) == set(compare) and len(quoted) == 4
    for run, (evals,) in quoted.items():
        assert abs(float(evals.split("/")[-1]) - float(compare[run]["eval_loss"])) <= 6e-4, run
