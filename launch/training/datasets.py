"""Where a run's tokens come from: the bundled corpus (prepared once into the cache), a directory
written by `normlab prepare` (`data.dataset`), or a weighted mixture of such directories
(`data.sources`); a single dataset is the one-source mixture."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

from normlab.data.corpus import cache_dir
from normlab.data.errors import DataError
from normlab.data.mixture import SourceSpec, check_same_tokenizer
from normlab.data.prepare import prepare, read_meta
from normlab.launch.config import DataSection, RunConfig
from normlab.launch.config.schema import source_entries  # noqa: F401 (re-exported)


def bundled_dir(cfg: DataSection) -> Path:
    """Cache directory of the bundled corpus prepared with this tokenizer setting."""
    name = f"bundled-{cfg.tokenizer}{cfg.vocab_size}-val{cfg.val_fraction:g}"
    return cache_dir() / "prepared" / name


def _prepared(path: str, cfg: DataSection, key: str, quiet: bool) -> Path:
    if path == "bundled":
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
    p = Path(path).expanduser()
    if (p / "meta.json").is_file():
        return p
    raise DataError(
        f"{key} {path!r} is neither 'bundled' nor a prepared directory (no meta.json there); "
        "run `normlab prepare` first"
    )


def resolve_sources(cfg: DataSection, quiet: bool = False) -> list[SourceSpec]:
    """Every source as a prepared directory (the bundled corpus prepared on first use), checked
    to share one tokenizer."""
    keys = (
        [f"data.sources[{i}].path" for i in range(len(cfg.sources))]
        if cfg.sources
        else ["data.dataset"]
    )
    specs = [
        SourceSpec(name, _prepared(path, cfg, key, quiet), weight)
        for (name, path, weight), key in zip(source_entries(cfg), keys, strict=True)
    ]
    check_same_tokenizer(specs, [read_meta(s.path) for s in specs])
    return specs


def resolve_dataset(cfg: DataSection, quiet: bool = False) -> Path:
    """The prepared directory of the first source (every source shares its tokenizer)."""
    return resolve_sources(cfg, quiet)[0].path


def data_identity(cfg: DataSection) -> list[dict[str, Any]]:
    """Each source's identity as a checkpoint records it (data.identity), without a loader."""
    from normlab.data.identity import source_identity
    from normlab.data.loader import PackedSource

    out = []
    for spec in resolve_sources(cfg, quiet=True):
        src = PackedSource(spec.path, cfg.seq_len)
        out.append(source_identity(spec.name, src.data_dir, src.meta, src.num_sequences("train")))
    return out


def epoch_plan(cfg: RunConfig, world: int = 1) -> list[dict[str, Any]]:
    """Per source: its probability, training windows and the expected epochs of it the whole run
    draws (training.steps global batches). A bundled corpus not yet prepared has no count."""
    from normlab.data.mixture import probabilities

    entries = source_entries(cfg.data)
    p = probabilities([w for _, _, w in entries])
    drawn = cfg.training.steps * cfg.data.batch_size * world * cfg.training.grad_accum
    plan = []
    for (name, path, _), prob in zip(entries, p, strict=True):
        where = bundled_dir(cfg.data) if path == "bundled" else Path(path).expanduser()
        try:
            windows = (int(read_meta(where)["tokens"]["train"]) - 1) // cfg.data.seq_len
        except DataError:
            windows = 0
        epochs = drawn * float(prob) / windows if windows > 0 else None
        plan.append({"name": name, "p": float(prob), "windows": windows, "epochs": epochs})
    return plan
