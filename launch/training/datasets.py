"""Where a run's tokens come from: the bundled corpus (prepared once into the cache) or a
directory written by `normlab prepare`."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from normlab.data.corpus import cache_dir
from normlab.data.errors import DataError
from normlab.data.prepare import prepare
from normlab.launch.config import DataSection


def bundled_dir(cfg: DataSection) -> Path:
    """Cache directory of the bundled corpus prepared with this tokenizer setting."""
    name = f"bundled-{cfg.tokenizer}{cfg.vocab_size}-val{cfg.val_fraction:g}"
    return cache_dir() / "prepared" / name


def resolve_dataset(cfg: DataSection, quiet: bool = False) -> Path:
    """A prepared directory for `cfg.dataset`, preparing the bundled corpus on first use."""
    if cfg.dataset == "bundled":
        out = bundled_dir(cfg)
        sink = io.StringIO() if quiet else None
        with contextlib.redirect_stdout(sink) if sink else contextlib.nullcontext():
            prepare(
                None,
                out,
                vocab_size=cfg.vocab_size,
                model_type=cfg.tokenizer,
                val_fraction=cfg.val_fraction,
                num_proc=cfg.num_proc,
            )
        return out
    path = Path(cfg.dataset).expanduser()
    if (path / "meta.json").is_file():
        return path
    raise DataError(
        f"data.dataset {cfg.dataset!r} is neither 'bundled' nor a prepared directory "
        "(no meta.json there); run `normlab prepare` first"
    )
