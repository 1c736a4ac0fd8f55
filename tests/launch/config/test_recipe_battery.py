"""Recipe edge cases end in one line and exit 2: empty files, keys or sections given twice, a
`base:` that is no path, out-of-range seeds, and every typed field walked (found from the
dataclasses, not listed by hand) with a wrong type and an out-of-range value."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from normlab.launch.cli import main
from normlab.launch.config import RunConfig, load_config
from normlab.launch.errors import ConfigError

from tests.conftest import REPO

PRE = REPO / "recipes" / "pre.yaml"


def _fields(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted recipe key, type) of every leaf field, the optional sections included."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint = prefix + f.metadata.get("key", f.name), hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = [a for a in args if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(hint) or inner:
            out += _fields(inner[0] if inner else hint, key + ".")
        else:
            out.append((key, hint))
    return out


FIELDS = _fields()


def _kinds(hint: Any) -> set[Any]:
    """The scalar kinds a field accepts: int, float, bool, str, Literal, tuple, dict."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(hint) if a is not type(None)))
    origin = typing.get_origin(hint)
    return {origin if origin in (Literal, tuple, dict) else hint}


def _refused(key: str, value: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(PRE, [f"{key}={value}"])
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_walk_finds_every_section() -> None:
    keys = {k for k, _ in FIELDS}
    for key in ("training.seed", "checkpoint.async", "optim.qk_clip.tau", "model.n_kv_heads"):
        assert key in keys
    assert {k.split(".")[0] for k in keys if "." in k} >= {
        "model",
        "data",
        "optim",
        "schedule",
        "training",
        "precision",
        "logging",
        "checkpoint",
        "engine",
    }


@pytest.mark.parametrize(("key", "hint"), FIELDS, ids=[k for k, _ in FIELDS])
def test_every_field_refuses_a_wrong_type_and_an_out_of_range_value(key: str, hint: Any) -> None:
    kinds = _kinds(hint)
    wrong = ["{a: 1}"]  # a mapping is no scalar setting anywhere
    if kinds & {int, float}:
        wrong += ["abc", "[1]", "true"]
        for bad in ("-1", "-0.5", "1e39" if float in kinds else str(2**63)):
            assert key in _refused(key, bad), (key, bad)  # counts and rates are never negative
    if int in kinds and float not in kinds:
        wrong += ["1.5"]
    if kinds == {bool}:
        wrong += ["1", "abc", "[true]"]
    if kinds == {str}:
        wrong += ["5", "[a]", "''"]
    if Literal in kinds:
        wrong += ["not-a-choice"]
    for bad in wrong:
        if dict in kinds:
            break
        assert key in _refused(key, bad), (key, bad)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("-1", "training.seed must lie in [0, 4294967295]"),
        (str(2**32), "training.seed must lie in [0, 4294967295]"),
        (str(2**70), "training.seed must fit in 64 bits"),
    ],
)
def test_seeds_outside_32_bits_are_refused(value: str, needle: str) -> None:
    assert needle in _refused("training.seed", value)


def test_the_edges_of_the_seed_range_are_accepted() -> None:
    assert load_config(PRE, ["training.seed=0"]).training.seed == 0
    assert load_config(PRE, [f"training.seed={2**32 - 1}"]).training.seed == 2**32 - 1


@pytest.mark.parametrize(
    ("key", "value"),
    [("name", "''"), ("name", "' '"), ("name", "a/b"), ("name", ".."), ("run_dir", "''")],
)
def test_blank_names_and_paths_are_refused(key: str, value: str) -> None:
    assert key in _refused(key, value)


def test_a_null_name_means_the_recipe_stem() -> None:
    assert load_config(PRE, ["name=null"]).name == "pre"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "the recipe is empty"),
        ("# only a comment\n", "the recipe is empty"),
        ("~\n", "the recipe is empty"),
        ("- a\n- b\n", "a recipe must be a mapping at the top level, got list"),
        (
            "optim:\n  lr: 1.0e-3\noptim:\n  lr: 2.0e-3\n",
            "duplicate key 'optim' (first given on line 1) at line 3",
        ),
        (
            "optim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n",
            "duplicate key 'lr' (first given on line 2) at line 3",
        ),
        ("base: 5\n", "'base' must be a path or a list of paths, got 5"),
        ("base: [5]\n", "'base' must be a path or a list of paths, got 5"),
        ("base: {a: 1}\n", "'base' must be a path or a list of paths, got {'a': 1}"),
        ("base: ''\n", "'base' must be a path or a list of paths, got ''"),
        ("base: []\n", "'base' must be a path or a list of paths, got []"),
        ("base:\n", "'base' must be a path or a list of paths, got None"),
        ("base: missing.yaml\n", "base 'missing.yaml' not found"),
        ("model: {preset: [a]}\n", "unknown model.preset ['a']"),
        ("optim: [1\n", "invalid YAML: expected ',' or ']'"),
    ],
)
def test_recipe_files_with_edge_cases_give_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    recipe = tmp_path / "edge.yaml"
    recipe.write_text(text)
    capsys.readouterr()
    code = main(["validate", str(recipe), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (text, out)
    assert err.count("\n") == 1 and needle in err, (text, err)
    assert str(recipe) in err or "preset" in needle, err


def test_a_duplicate_in_a_base_recipe_is_refused_naming_that_file(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text("training:\n  steps: 5\ntraining:\n  steps: 6\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\n")
    with pytest.raises(ConfigError, match=r"parent\.yaml: invalid YAML: duplicate key 'training'"):
        load_config(tmp_path / "child.yaml")


def test_a_duplicate_key_inside_an_override_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="value is not valid YAML"):
        load_config(PRE, ["optim={lr: 1.0e-3, lr: 2.0e-3}"])


def test_the_same_key_in_two_mappings_is_no_duplicate(tmp_path: Path) -> None:
    recipe = tmp_path / "ok.yaml"
    recipe.write_text("base: " + str(PRE) + "\noptim:\n  lr: 1.0e-3\nschedule:\n  kind: wsd\n")
    cfg = load_config(recipe)
    assert cfg.optim.lr == 1.0e-3 and cfg.schedule.kind == "wsd"
