"""The committed theory results are what `normlab theory` prints today.

docs/theory/theory.json holds every seed's measurements; the verdicts are recomputed from them
(numpy only, well under a second) and must be the table in docs/theory/theory.md and in the
README; a few of the stored rows are measured again with the current code (one seed, a few
small models) and must agree, so a change to the model, the init or the checks that would change
the published numbers fails here until `normlab theory --out docs/theory` is run again."""

from __future__ import annotations

import json

import numpy as np
import pytest
from normlab.launch.theory.checks import check_table, checks
from normlab.launch.theory.measure import PLACEMENTS, measure, result_from_json

from tests.conftest import REPO

DOCS = REPO / "docs" / "theory"
REGENERATE = "stale: run `normlab theory --out docs/theory` and update the README's theory table"


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads((DOCS / "theory.json").read_text())


def test_docs_table_is_the_verdicts_of_the_stored_measurements(stored: dict) -> None:
    found = checks(result_from_json(stored))
    table = check_table(found)
    md = (DOCS / "theory.md").read_text().splitlines()
    start = md.index(table[0])
    assert md[start : start + len(table)] == table, REGENERATE
    assert [(c["verdict"], c["measured"]) for c in stored["checks"]] == [
        (c.verdict, c.measured) for c in found
    ], REGENERATE
    readme = (REPO / "README.md").read_text().splitlines()
    assert all(line in readme for line in table[2:]), REGENERATE
    assert f"`{stored['command']}`" in "\n".join(md)


def test_stored_rows_are_what_the_code_measures_now(stored: dict) -> None:
    res = result_from_json(stored)
    seed = res.setup.seeds - 1
    again = measure(res.setup, only=[seed])
    for p in PLACEMENTS:
        for name in ("lemma2", "theorem1", "profile"):
            got, want = getattr(again, name)[p][0], getattr(res, name)[p][seed]
            assert np.allclose(got, want, rtol=1e-4), f"{name} {p}: {REGENERATE}"
