"""docs/SCIENCE.md, the repository's copy of the project's science notes:

- section 19 defines the trained margin, the stable and loss margins with the values the code
  uses (the constants read from launch/stats/separation.py and sensitivity.py, not retyped);
- Part III (sections 21-24) is there; where the shared master copy is on this machine
  (../shared/SCIENCE.md, outside the repository), Part III is its text verbatim."""

from __future__ import annotations

import re

import pytest
from normlab.launch.lr_sensitivity.curves import STABLE_MARGIN
from normlab.launch.stats.separation import MIN_TEST_SEEDS, TOL, TRAINED_MARGIN
from normlab.launch.verdicts.family import LOSS_MARGIN

from tests.conftest import REPO

DOC = REPO / "docs" / "SCIENCE.md"
SHARED = REPO.parent / "shared" / "SCIENCE.md"
PART_III = "# Part III"


def section(text: str, number: int) -> str:
    start = text.index(f"\n## {number}. ")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_section_19_states_the_margins_the_code_uses() -> None:
    s19 = section(DOC.read_text(), 19)
    for name, value in (("TRAINED_MARGIN", TRAINED_MARGIN), ("STABLE_MARGIN", STABLE_MARGIN),
                        ("LOSS_MARGIN", LOSS_MARGIN), ("MIN_TEST_SEEDS", MIN_TEST_SEEDS),
                        ("TOL", TOL)):  # fmt: skip
        found = re.findall(rf"`{name} = ([0-9.e-]+)`", s19)
        assert found and all(float(v) == value for v in found), (name, found)
    for path in (
        "launch/stats/separation.py", "launch/lr_sensitivity/curves.py", "launch/verdicts/family.py"
    ):
        assert f"`{path}`" in s19 and (REPO / path).is_file()
    for term in ("*trained margin*", "*trained range*", "*stable range*", "*loss margin*"):
        assert term in s19, term
    assert f"ℓ ≤ plateau − {TRAINED_MARGIN:g}" in s19


def test_part_iii_is_there() -> None:
    text = DOC.read_text()
    part = text[text.index(PART_III) :]
    heads = re.findall(r"^## (\d+)\. ", part, flags=re.M)
    assert heads == ["21", "22", "23", "24"]


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared master copy is not on this machine")
def test_part_iii_is_the_shared_copy_verbatim() -> None:
    mine, master = DOC.read_text(), SHARED.read_text()
    assert mine[mine.index(PART_III) :] == master[master.index(PART_III) :]
