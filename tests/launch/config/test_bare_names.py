"""Bare recipe names (`pre`, `pre.yaml`, `7b`, `quickstart/pre_nowarmup`) resolve through one
function (launch.config.loader.find_recipe) in every command that takes a recipe; a closed stdout
(`normlab validate pre | head -1`) ends quietly with status 141, not a BrokenPipe traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.config.loader import RECIPES_DIR, find_recipe
from normlab.launch.errors import ConfigError
from normlab.launch.study.plan import study_configs

from tests.conftest import REPO


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # names resolve without the repository as working directory


def test_find_recipe_forms() -> None:
    assert find_recipe("pre") == find_recipe("pre.yaml") == RECIPES_DIR / "pre.yaml"
    assert find_recipe("7b") == RECIPES_DIR / "presets" / "7b.yaml"
    assert find_recipe("quickstart/pre_nowarmup") == RECIPES_DIR / "quickstart/pre_nowarmup.yaml"
    assert find_recipe(str(RECIPES_DIR / "peri.yaml")) == RECIPES_DIR / "peri.yaml"
    assert find_recipe("mine/missing.yaml") == Path("mine/missing.yaml")  # load_yaml names it
    with pytest.raises(ConfigError, match="did you mean '7b'"):
        find_recipe("7c")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["validate", "pre", "--quiet"], "pre: valid"),
        (["validate", "quickstart/pre_nowarmup", "--quiet"], "pre_nowarmup: valid"),
        (["plan", "7b", "--gpus-per-node", "8", "--gpu-memory", "80GB"], "verdict:"),
        (
            ["launch", "peri", "--nproc-per-node", "2", "engine.name=fsdp", "--dry-run"],
            "train peri",
        ),
        (
            ["submit", "olmo2", "--gpus-per-node", "0", "--dry-run"],
            "#SBATCH --job-name=normlab-olmo2",
        ),
    ],
)
def test_commands_take_bare_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], needle: str
) -> None:
    assert main(args) == 0, capsys.readouterr().err
    assert needle in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # dry runs and checks create nothing


def test_train_resolves_a_bare_name_before_its_data_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["train", "deepnorm", "data.dataset=/no/such/dir"]) == 2
    err = capsys.readouterr().err
    assert "data directory not found: /no/such/dir" in err and "recipe" not in err
    assert not list(tmp_path.iterdir())


def test_study_takes_bare_names(tmp_path: Path) -> None:
    cfgs = study_configs(["pre", "quickstart/pre_nowarmup.yaml", "7b"], tmp_path, [], None, None)
    assert [c.run_dir for c in cfgs] == [
        str(tmp_path / "runs" / name) for name in ("pre", "pre_nowarmup", "7b")
    ]
    with pytest.raises(ConfigError, match="did you mean 'peri'"):
        study_configs(["perri"], tmp_path, [], None, None)


def test_closed_stdout_is_not_a_traceback() -> None:
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "normlab.launch.cli", "validate", "pre"]
    proc = subprocess.Popen(cmd, stdout=write, stderr=subprocess.PIPE, env=env)
    os.close(write)
    os.close(read)  # no reader left: the first write fails with EPIPE
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err.decode() == ""
