"""A data.sources entry without `path` (or `name`) is refused on one line naming the source and
the key, from a recipe file and from an override, never with a dataclass __init__ message."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.cli import main

from tests.conftest import REPO

PRE = REPO / "recipes" / "pre.yaml"
EXAMPLE = "each source is {name, path, weight}, e.g. {name: web, path: data/web, weight: 0.7}"


def _refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["validate", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "__init__" not in err and "positional argument" not in err
    return err.strip()


@pytest.mark.parametrize(
    ("entry", "key", "what"),
    [
        ("{name: a, weight: 1}", "path", "a `normlab prepare` directory"),
        ("{name: a, path: '', weight: 1}", "path", "a `normlab prepare` directory"),
        ("{path: /d, weight: 1}", "name", "its metric name"),
    ],
)
def test_a_source_without_a_required_key_is_one_line(
    capsys: pytest.CaptureFixture[str], entry: str, key: str, what: str
) -> None:
    second = f"data.sources=[{{name: ok, path: /d, weight: 1}}, {entry}]"
    got = _refusal(capsys, str(PRE), second)
    assert got == f"normlab validate: error: data.sources[1]: no '{key}' ({what}); {EXAMPLE}"


def test_a_recipe_file_names_the_source_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(f"base: {PRE}\ndata:\n  sources:\n    - {{name: web, weight: 0.7}}\n")
    got = _refusal(capsys, str(recipe))
    assert got.endswith(f"data.sources[0]: no 'path' (a `normlab prepare` directory); {EXAMPLE}")
