"""Impossible model configurations are rejected with a message naming the field and the choices."""

import pytest
import torch
from normlab.model import PRESETS, ModelConfig, Transformer, count_params
from normlab.model.config import FINAL_NORM


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(placement="sandwich"), "model.placement must be one of 'post', 'pre', 'peri'"),
        (dict(n_heads=8, n_kv_heads=3), "allowed n_kv_heads: [1, 2, 4, 8]"),
        (dict(ln_scaling=True, placement="post"), "ln_scaling is defined only for placement 'pre'"),
        (dict(embed_norm=True, placement="pre"), "embed_norm belongs to placement 'peri'"),
        (dict(qk_norm=True), "model.qk_norm must be one of 'none', 'head', 'flat'"),
        (dict(norm="batchnorm"), "model.norm must be one of 'layernorm', 'rmsnorm'"),
        (dict(init="deepnorm", placement="pre"), "init 'deepnorm' and model.placement 'deepnorm'"),
        (dict(mix_ratio=1.5, placement="mix"), "mix_ratio must lie in [0, 1]"),
        (dict(d_model=100, n_heads=3), "must be divisible by model.n_heads"),
        (dict(n_layers="4"), "model.n_layers must be of type int"),
        (dict(norm_backend="cuda"), "one of 'torch', 'triton', 'auto'"),
    ],
)
def test_bad_config_raises_naming_field(kwargs, needle):
    with pytest.raises(ValueError) as err:
        ModelConfig(**kwargs)
    assert needle in str(err.value)


def test_unknown_key_suggests_closest():
    with pytest.raises(ValueError, match="did you mean 'n_kv_heads'"):
        ModelConfig.from_dict({"n_kv_head": 2})


def test_round_trip_and_defaults():
    cfg = ModelConfig(placement="deepnorm")
    assert cfg.init == "deepnorm" and cfg.n_kv_heads == cfg.n_heads
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert set(FINAL_NORM) == {
        "post", "pre", "peri", "olmo2", "deepnorm", "mix", "hybrid", "hybrid_star", "keel",
        "ln_scaling",
    }


def test_ln_scaling_is_a_placement_and_the_older_spelling_means_the_same() -> None:
    """placement: ln_scaling and the older placement: pre + ln_scaling: true build one config
    (LayerNorm Scaling's own init, `normal`); the saved form of an older run compares equal."""
    from normlab.launch.rundir.directory import config_diff

    new, old = ModelConfig(placement="ln_scaling"), ModelConfig(placement="pre", ln_scaling=True)
    assert new == old
    assert (new.placement, new.ln_scaling, new.init) == ("ln_scaling", True, "normal")
    before = {"model": {"placement": "pre", "ln_scaling": True}}
    assert config_diff(before, {"model": {"placement": "ln_scaling", "ln_scaling": None}}) == []
    assert config_diff(before, {"model": {"placement": "pre", "ln_scaling": None}}) != []


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_param_count_on_meta(name):
    cfg = ModelConfig(**PRESETS[name])
    with torch.device("meta"):
        model = Transformer(cfg)
    assert model.num_params() == count_params(cfg)
    if name == "7b":  # Llama-2-7B shapes with a 32000 vocabulary: 6.74e9 parameters
        assert count_params(cfg) == 6_738_415_616


def test_meta_build_then_materialise_matches_eager_init():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=40, max_seq_len=16)
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device="cpu")
    torch.manual_seed(3)
    model.init_weights()
    torch.manual_seed(3)
    eager = Transformer(cfg)
    torch.manual_seed(3)
    eager.init_weights()
    tokens = torch.randint(0, 40, (2, 9))
    torch.testing.assert_close(model(tokens), eager(tokens))


@pytest.mark.parametrize("backend", ["triton"])
def test_triton_backend_without_gpu_is_a_clear_error(backend, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: triton can run")
    with pytest.raises(ValueError, match="norm_backend='triton' cannot run here"):
        Transformer(ModelConfig(norm_backend=backend, n_layers=1))
