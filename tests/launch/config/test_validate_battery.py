"""`validate` refuses what `train` refuses, in one line with exit 2: NaN and infinities in every
float field of every typed section (found by walking the dataclasses, not listed by hand),
instrument names, engine and stage, a missing optional dependency, the dataset directory and
the model's vocabulary against the prepared tokenizer; bare recipe names resolve everywhere."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import normlab.launch.extras as extras
import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.config import RunConfig

from tests.conftest import REPO


def _float_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """Dotted names of every float-typed field (float, float | None) in the config classes."""
    keys = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        args = typing.get_args(hint) or (hint,)
        if dataclasses.is_dataclass(hint):
            keys += _float_keys(hint, f"{prefix}{f.name}.")
        elif typing.get_origin(hint) in (tuple, list) and float in args:
            keys.append(f"{prefix}{f.name}[0]")  # a sequence of floats: its first entry
        elif float in args:
            keys.append(f"{prefix}{f.name}")
    return keys


FLOAT_KEYS = _float_keys()


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def test_the_walk_finds_every_float_field() -> None:
    for key in (
        "optim.lr",
        "optim.eps",
        "optim.betas[0]",
        "optim.grad_clip",
        "model.init_std",
        "model.norm_eps",
    ):
        assert key in FLOAT_KEYS
    assert len(FLOAT_KEYS) >= 15


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "nan"])
def test_every_float_field_rejects_non_finite_values(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    for key in FLOAT_KEYS:
        name, seq, _ = key.partition("[")
        setting = f"{name}=[{value}, 0.5]" if seq else f"{key}={value}"
        code, _, err = _validate(capsys, "pre", "--quiet", setting)
        assert code == 2 and err.count("\n") == 0, (key, err)
        assert f"{key} must be a finite number" in err, (key, err)


def test_instrument_settings_are_walked_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _validate(capsys, "pre", "instruments.spike_score.k=.inf")
    assert code == 2 and "instruments.spike_score.k" in err and err.count("\n") == 0


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["instruments.activation=true"], "did you mean 'instruments.activations'?"),
        (["instruments.gradients=3"], "instruments.gradients must be a mapping"),
        (["engine.name=deepspeed"], "engine deepspeed needs engine.zero_stage 1, 2 or 3"),
        (["data.dataset=/no/such/dir"], "data directory not found: /no/such/dir"),
        (["data.val_fraction=0"], "data.val_fraction must lie in (0, 1), got 0.0"),
        (["schedule.decay_fraction=-1"], "schedule.decay_fraction must lie in (0, 1]"),
        (["training.threads=0"], "training.threads must be > 0"),
        (["precision.loss_scale_init=0"], "precision.loss_scale_init must be > 0"),
    ],
)
def test_validate_refuses_what_train_refuses(
    capsys: pytest.CaptureFixture[str], overrides: list[str], needle: str
) -> None:
    code, _, err = _validate(capsys, "pre", *overrides)
    assert code == 2 and needle in err and err.count("\n") == 0, err


def test_missing_deepspeed_names_the_extra(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr(extras, "installed", lambda module: module != "deepspeed")
    code, _, err = _validate(capsys, "pre", "engine.name=deepspeed", "engine.zero_stage=1")
    assert code == 2 and err.count("\n") == 0
    assert "needs DeepSpeed" in err and "pip install 'normlab[distributed]'" in err


def test_vocab_sizes_follow_the_prepared_tokenizer(
    tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _validate(capsys, "pre", f"data.dataset={tiny_data}")
    assert code == 0, err
    shown = yaml.safe_load(out[: out.rindex("\npre: valid")])
    assert shown["model"]["vocab_size"] == 512 and shown["data"]["vocab_size"] == 512
    off = {"attn_softcap", "final_softcap", "residual_scale_init"}  # null: no cap, no scale
    off |= {"base_d_model", "base_n_layers", "completep_alpha", "input_mult", "output_mult",
            "attn_mult", "d_head", "d_ff_mult"}  # null under parametrization sp (SCIENCE.md 21)
    assert all(v is not None for k, v in shown["model"].items() if k not in off)  # resolved
    code, _, err = _validate(capsys, "pre", f"data.dataset={tiny_data}", "model.vocab_size=300")
    assert code == 2 and "remove model.vocab_size" in err and "set it >= 512" in err
    code, _, err = _validate(capsys, "pre", f"data.dataset={tiny_data}", "data.vocab_size=4096")
    assert code == 2 and "remove data.vocab_size" in err


def test_bare_names_and_unreadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("pre", "peri", "7b"):
        assert _validate(capsys, name, "--quiet")[0] == 0
    code, _, err = _validate(capsys, "prr")
    assert code == 2 and "did you mean 'pre'?" in err
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("# caf\xe9\nmodel: {}\n".encode("latin-1"))
    code, _, err = _validate(capsys, str(bad))
    assert code == 2 and "not a UTF-8 text file" in err and err.count("\n") == 0
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("- a list\n")
    code, _, err = _validate(capsys, str(run))
    assert code == 2 and "must be a mapping" in err, err


def test_recipes_dir_is_the_repository_one() -> None:
    from normlab.launch.config.loader import RECIPES_DIR

    assert RECIPES_DIR == REPO / "recipes"


def test_a_split_shorter_than_one_row_is_refused(
    tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tiny_data's val split holds 5,395 tokens: a 6,000-token row cannot be cut from it."""
    longer = ["data.seq_len=6000", "model.max_seq_len=6000"]
    code, _, err = _validate(capsys, "pre", f"data.dataset={tiny_data}", *longer)
    assert code == 2 and err.count("\n") == 0
    assert "the val split of data.dataset" in err and "fewer than data.seq_len + 1 (6001)" in err
