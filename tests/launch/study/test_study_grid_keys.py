"""A typo in a study file's dotted recipe keys (grid, set, schedule, a recipe entry's set) gets
the recipe loader's 'did you mean' line and exit 2 through the CLI, before the protocol's own
checks (a misspelt optim.lr used to read as 'the protocol needs grid.optim.lr')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from normlab.launch.errors import ConfigError
from normlab.launch.study.spec import config_key_problem, load_study

STUDY = """recipes: [pre]
seeds: [0, 1]
steps: 4
{body}
"""


def study_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text(STUDY.format(body=body))
    return path


def test_the_cli_names_a_misspelt_grid_key_in_one_line(tmp_path: Path) -> None:
    path = study_file(tmp_path, "grid: {optim.lrr: [1.0e-3, 3.0e-3]}")
    cmd = [sys.executable, "-m", "normlab.launch.cli", "study", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert lines == [
        "normlab study: error: typo.yaml: grid: unknown key 'optim.lrr' (did you mean 'optim.lr'?)"
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("grid: {optm.lr: [1.0e-3, 3.0e-3]}", "grid: unknown key 'optm' (did you mean 'optim'?)"),
        (
            "grid: {optim.lr: [1.0e-3, 3.0e-3], model.n_layer: [2, 4]}",
            "grid: unknown key 'model.n_layer' (did you mean 'model.n_layers'?)",
        ),
        (
            "grid: {optim.lr: [1.0e-3, 3.0e-3]}\nset: {optim.z_los: 1.0e-4}",
            "set: unknown key 'optim.z_los' (did you mean 'optim.z_loss'?)",
        ),
        (
            "grid: {optim.lr: [1.0e-3, 3.0e-3]}\nschedule: {warmup_step: 0}",
            "schedule: unknown key 'schedule.warmup_step' (did you mean 'schedule.warmup_steps'?)",
        ),
    ],
)
def test_every_dotted_key_of_a_study_file_is_checked(tmp_path: Path, body: str, message: str):
    with pytest.raises(ConfigError) as caught:
        load_study(str(study_file(tmp_path, body)))
    assert str(caught.value) == f"typo.yaml: {message}"


def test_known_keys_pass_and_mappings_are_left_to_the_run() -> None:
    for key in ("optim.lr", "model.n_layers", "schedule.warmup_steps", "checkpoint.async",
                "instruments.attention_logits.every", "data.dataset"):  # fmt: skip
        assert config_key_problem(key) is None, key
    assert config_key_problem("optim.lrr") == "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"
