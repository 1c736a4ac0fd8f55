"""A setting given twice on one command line is refused in one line, exit 2, before anything
runs or is written (issue 47: settings listed twice): the same key, the same key spelled with
spaces, or a key and the section that holds it, on every command that takes KEY=VALUE settings
and on `study --set`. Different keys, and a study flag over the study file's `set:`, still
layer as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.config.loader import check_once
from normlab.launch.errors import ConfigError

TWICE = [
    ["optim.lr=1e-3", "optim.lr=2e-3"],
    ["optim.lr=1e-3", " optim.lr =2e-3"],
    ["optim={lr: 1.0e-3}", "optim.lr=2e-3"],
    ["model.norm.eps=1e-6", "model.norm={eps: 1.0e-5}"],
    ["training.steps=4", "optim.lr=1e-3", "training.steps=4"],  # even the same value
]


@pytest.mark.parametrize("settings", TWICE)
def test_the_loader_refuses_a_setting_given_twice(settings: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        check_once(settings)
    text = str(err.value)
    assert "\n" not in text and "give each setting once" in text
    keys = [s.partition("=")[0].strip() for s in settings]
    later = next(
        k
        for i, k in enumerate(keys)
        if any(k == o or k.startswith(o + ".") or o.startswith(k + ".") for o in keys[:i])
    )
    assert f"setting {later!r}" in text


def test_different_keys_and_sibling_sections_pass() -> None:
    check_once(["optim.lr=1e-3", "optim.weight_decay=0.1", "model.n_layers=2", "optimizer=x"])
    check_once(["optim.lr=1e-3", "optim.lr_mult=2"])  # a prefix of the name, not its section


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "pre", "optim.lr=1e-3", "optim.lr=2e-3"],
        ["validate", "pre", "--quiet", "optim.lr=1e-3", "optim={lr: 2.0e-3}"],
        ["train", "pre", "training.steps=2", "training.steps=3"],
        ["coordcheck", "pre", "optim.lr=1e-3", "optim.lr=1e-3"],
    ],
)
def test_every_command_taking_settings_refuses_one_given_twice(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "given" in err[0] and "give each setting once" in err[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_study_set_given_twice_is_refused_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "s"
    argv = ["study", "pre", "--lrs", "1e-3", "--seeds", "0", "--out", str(out)]
    assert main([*argv, "--set", "model.n_layers=2", "--set", "model.n_layers=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set 'model.n_layers=2'" in err[0], err
    assert not out.exists()
