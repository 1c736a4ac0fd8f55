"""Recipe -> RunConfig: `load_config("recipes/pre.yaml", ["optim.lr=3e-4"])` reads the recipe
(with `base:` inheritance), applies dotted overrides, expands `model.preset`, fills the vocabulary
from the prepared data, type-checks every key and runs the cross-field checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab.launch.config.checks import validate
from normlab.launch.config.loader import (
    RECIPES_DIR,
    apply_overrides,
    build,
    deep_merge,
    load_yaml,
    suggest,
)
from normlab.launch.config.schema import RunConfig
from normlab.launch.errors import ConfigError
from normlab.model.presets import PRESETS


def load_config(recipe: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Recipe file + dotted overrides -> a validated RunConfig."""
    data = apply_overrides(load_yaml(recipe), overrides or [])
    if data.get("name") is None:  # absent or null: the recipe file's stem
        data["name"] = Path(recipe).stem
    try:
        return from_dict(data)
    except ConfigError as exc:  # a bad value in a user's recipe file: the line names the file
        mine = RECIPES_DIR not in Path(recipe).resolve().parents
        if not mine or str(recipe) in str(exc):
            raise
        raise type(exc)(f"{recipe}: {exc}") from None


def from_dict(data: dict[str, Any]) -> RunConfig:
    data = dict(data)
    data["model"] = expand_preset(data.get("model"))
    cfg = build(RunConfig, data)
    if cfg.run_dir is None:
        cfg.run_dir = str(Path("runs") / (cfg.name or "run"))
    # fp16 clamping switches itself on in fp16 unless a recipe sets it (SCIENCE.md section 9)
    cfg.instruments.setdefault("fp16_clamp", {"mode": "auto"})
    resolve_vocab(cfg)
    validate(cfg)
    return cfg


BUNDLED_VOCAB = 4096  # tokenizer size trained for the bundled corpus


def expand_preset(model: Any) -> Any:
    """Explicit model fields override the preset's; everything else comes from ModelConfig."""
    if not isinstance(model, dict):
        return model
    preset = model.get("preset")
    if preset is None:
        return model
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"unknown model.preset {preset!r}{suggest(str(preset), list(PRESETS))}")
    # a preset's vocabulary is only an example: the model follows the data's tokenizer
    sizes = {k: v for k, v in PRESETS[preset].items() if k != "vocab_size"}
    return deep_merge(sizes, model)


def resolve_vocab(cfg: RunConfig) -> None:
    """Fill data.vocab_size from the prepared directory (or 4096 for the bundled corpus) and
    model.vocab_size from data.vocab_size when the recipe leaves them unset."""
    d = cfg.data
    first = d.sources[0].path if d.sources else d.dataset  # every source shares one tokenizer
    prepared = prepared_vocab_size(first)
    if prepared is not None:
        if d.vocab_size not in (None, prepared):
            raise ConfigError(
                f"data.vocab_size is {d.vocab_size} but {first} was prepared "
                f"with a {prepared}-piece tokenizer: remove data.vocab_size (the prepared "
                f"directory decides), or prepare it again with --vocab-size {d.vocab_size}"
            )
        d.vocab_size = prepared
    elif d.vocab_size is None:
        d.vocab_size = BUNDLED_VOCAB
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = d.vocab_size


def prepared_vocab_size(dataset: str) -> int | None:
    """The tokenizer size in <dataset>/meta.json; None for 'bundled' or a directory without one
    (the trainer's dataset check then names what is missing)."""
    from normlab.data.meta_file import meta_of

    meta = meta_of(dataset)  # a damaged meta.json: DataError naming the file and the key
    return None if meta is None else int(meta["vocab_size"])
