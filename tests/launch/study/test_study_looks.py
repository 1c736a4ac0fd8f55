"""A study file's `looks:` (launch.study.spec; docs/SCIENCE.md 22.8): parsed into a plan, refused
in one line when malformed or shorter than the seeds the study runs, and the committed studies
record the looks they took."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.stats.group_sequential import OBRIEN_FLEMING, POCOCK, Plan
from normlab.launch.study.spec import load_study

BASE = {"recipes": ["pre"], "grid": {"optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1, 2, 3, 4]}


def test_looks_parse_into_a_plan(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    body = {**BASE, "looks": {"spending": "obrien_fleming", "seeds": [2, 5]}}
    path.write_text(yaml.safe_dump(body))
    assert load_study(str(path)).looks == Plan(OBRIEN_FLEMING, (2, 5), True)
    assert load_study("completep_depth").looks == Plan(POCOCK, (2, 8), False)
    assert load_study("fp8").looks == Plan(POCOCK, (3, 8), False)


@pytest.mark.parametrize(
    ("looks", "message"),
    [
        ({"spending": "pocock", "seeds": [2, 2]}, "looks.seeds must be >= 2 increasing"),
        ({"spending": "pocok", "seeds": [2, 3]}, "looks.spending must be one of"),
        ({"spending": "pocock", "seeds": [2, 3], "alpha": 0.1}, "unknown key 'looks.alpha'"),
        ({"spending": "pocock", "seeds": [2]}, "looks.seeds must be >= 2 increasing"),
        ({"spending": "pocock", "seeds": [1, 2]}, "each >= 2, got [1, 2]"),
        ({"spending": "pocock", "seeds": [2, 2.5]}, "increasing seed counts"),
        # the study runs 5 seeds: a plan ending at 4 leaves its last seed past the plan
        ({"spending": "pocock", "seeds": [2, 4]}, "looks.seeds ends at 4 seeds per arm but a"),
    ],
)
def test_bad_looks_exit_2_on_one_line(
    looks: dict, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "looks": looks}))
    out = tmp_path / "out"
    assert main(["study", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not out.exists()
