"""Config loading: unknown keys with suggestions, type errors naming the key, `base:` inheritance,
dotted overrides, preset expansion, impossible combinations and the saved round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.config import RunConfig, load_config
from normlab.launch.errors import ConfigError
from normlab.model import PRESETS

from tests.conftest import REPO

PRE = REPO / "recipes" / "pre.yaml"


def _error(overrides: list[str], recipe: Path = PRE) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(recipe, overrides)
    return str(info.value)


def test_unknown_key_names_full_key_and_suggests_closest() -> None:
    msg = _error(["optim.lrr=1e-3"])
    assert "unknown key 'optim.lrr'" in msg and "did you mean 'optim.lr'?" in msg
    assert "did you mean 'optim'?" in _error(["optm.lr=1e-3"])
    assert "did you mean 'model.n_layers'?" in _error(["model.n_layer=2"])
    assert "did you mean 'training.warmup" not in _error(["training.warmup_steps=3"])


def test_wrong_type_names_the_key() -> None:
    assert "training.steps must be an integer, got 'abc'" in _error(["training.steps=abc"])
    assert "model.n_layers" in _error(["model.n_layers=2.5"])
    assert "logging.tensorboard must be of type bool" in _error(["logging.tensorboard=3"])
    assert "schedule.kind must be one of" in _error(["schedule.kind=cosin"])
    assert "optim.betas must have 2 entries" in _error(["optim.betas=[0.9]"])


def test_overrides_parse_values_as_yaml() -> None:
    cfg = load_config(PRE, ["optim.lr=3e-4", "optim.betas=[0.8, 0.9]", "logging.progress=false"])
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == (0.8, 0.9)
    assert cfg.logging.progress is False
    assert "must look like section.key=value" in _error(["optim.lr"])


def test_base_inheritance_is_recursive_and_deep(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("training: {steps: 500, seed: 7}\noptim: {lr: 0.01}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("base: ../a.yaml\ntraining: {steps: 600}\n")
    (tmp_path / "c.yaml").write_text("base: sub/b.yaml\noptim: {weight_decay: 0.0}\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert (cfg.training.steps, cfg.training.seed) == (600, 7)
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (0.01, 0.0)
    assert cfg.name == "c" and cfg.run_dir == str(Path("runs") / "c")
    (tmp_path / "a.yaml").write_text("base: c.yaml\n")
    assert "circular 'base:' inheritance" in _error([], tmp_path / "c.yaml")


def test_scheme_recipe_inherits_tiny_defaults() -> None:
    cfg = load_config(REPO / "recipes" / "post_nowarmup.yaml")
    assert cfg.model.placement == "post" and cfg.schedule.warmup_steps == 0
    assert cfg.training.steps == load_config(PRE).training.steps


def test_preset_expands_and_explicit_fields_win() -> None:
    cfg = load_config(PRE, ["model.n_layers=2"])
    mc = cfg.model_config()
    assert mc.n_layers == 2 and mc.d_model == PRESETS["tiny"]["d_model"]
    assert "did you mean '7b'?" in _error(["model.preset=7B"])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["schedule.warmup_steps=400"], "schedule.warmup_steps (400) exceeds training.steps"),
        (["data.seq_len=512"], "data.seq_len (512) exceeds model.max_seq_len"),
        (["model.placement=post", "model.ln_scaling=true"], "model.ln_scaling"),
        (["model.vocab_size=1000"], "model.vocab_size (1000) is smaller than data.vocab_size"),
        (["engine.zero_stage=2"], "engine.zero_stage 2 needs a sharding engine"),
        (["optim.name=adamm"], "did you mean 'adamw'?"),
        (["engine.name=singel"], "did you mean 'single'?"),
        (["schedule.kind=vaswani", "schedule.warmup_steps=0"], "needs schedule.warmup_steps > 0"),
        (["training.steps=0"], "training.steps must be > 0"),
        (["optim.betas=[0.9, 1.0]"], "optim.betas must lie in [0, 1)"),
        (["model.d_model=130"], "must be divisible by model.n_heads"),
    ],
)
def test_impossible_combinations_are_rejected(overrides: list[str], needle: str) -> None:
    assert needle in _error(overrides)


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(REPO / "recipes" / "olmo2.yaml", ["optim.lr=2e-3"])
    path = tmp_path / "config.yaml"
    cfg.dump(path)
    again = load_config(path)
    assert isinstance(again, RunConfig) and again.to_dict() == cfg.to_dict()


def test_cli_reports_config_errors_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(PRE), "optim.lrr=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean 'optim.lr'?" in err
    assert main(["validate", "no/such/recipe.yaml"]) == 2
    assert "recipe not found" in capsys.readouterr().err
