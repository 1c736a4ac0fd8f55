"""`normlab validate RECIPE [key=value ...]`: print the resolved config and parameter count.

Runs the same checks as `normlab train` before it creates anything (launch.training.preflight):
a recipe that validates starts. The model is built on the `meta` device, so a 7B recipe is
counted without allocating memory. The printed config shows every value as resolved (the
model's defaults and the tokenizer's vocabulary size filled in).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from normlab.launch.commands.train import add_recipe_args, resolve
from normlab.launch.errors import ConfigError

if TYPE_CHECKING:
    from normlab.launch.config import RunConfig

META_BUILD_LAYERS = 1024  # deeper models are counted analytically (building is per layer)


def fp8_note(cfg: RunConfig) -> str | None:
    """On a GPU, whether precision.fp8's layers are large enough to gain speed (one block on the
    meta device: the linear shapes do not depend on depth)."""
    fp8 = cfg.precision.fp8
    if fp8 is None:  # nothing to import for the recipes without FP8
        return None
    import dataclasses

    import torch
    from normlab.launch.engines.fp8 import emulated, small_gemm_note
    from normlab.launch.engines.single import resolve_device
    from normlab.model import Transformer

    device: str = cfg.training.device
    if device == "auto":  # a named cuda stays cuda: validate checks GPU recipes on a CPU machine
        device = resolve_device(device).type
    if emulated(fp8, device):
        return None
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(cfg.model_config(), n_layers=1))
    return small_gemm_note(model, fp8)


def count_model(cfg: RunConfig) -> tuple[int, int]:
    """(total, embedding-excluded) parameters of the built model, on the meta device (for a
    model deeper than META_BUILD_LAYERS, from the analytic count, so validate stays instant)."""
    import torch
    from normlab.model import Transformer, count_params

    mc = cfg.model_config()
    if mc.n_layers > META_BUILD_LAYERS:
        total = count_params(mc)
        return total, total - mc.vocab_size * mc.d_model
    with torch.device("meta"):
        model = Transformer(cfg.model_config())
    total = sum(p.numel() for p in model.parameters())
    embed = sum(p.numel() for p in model.embed.parameters())
    return total, total - embed


def resolved_dict(cfg: RunConfig) -> dict[str, Any]:
    """cfg as a dict with the model section as built (no null where a default applies)."""
    import torch

    out = cfg.to_dict()
    out["model"] = {"preset": cfg.model.preset, **cfg.model_config().to_dict()}
    if out["model"]["preset"] is None:
        del out["model"]["preset"]
    if out["training"]["threads"] is None:
        out["training"]["threads"] = torch.get_num_threads()
    return out


def print_epochs(cfg: RunConfig, world: int) -> None:
    """How much of each source the run reads; a warning for every source it repeats."""
    from normlab.launch.training.datasets import epoch_plan

    for s in epoch_plan(cfg, world):
        if s["epochs"] is None:
            print(f"data {s['name']}: p {s['p']:.3f}; prepared on first use (epochs unknown)")
            continue
        print(
            f"data {s['name']}: p {s['p']:.3f}, {s['windows']:,} training sequences of "
            f"{cfg.data.seq_len + 1} tokens; the run takes {s['epochs']:.2f} epochs of it"
        )
        if s["epochs"] > 1:
            print(
                f"warning: data source {s['name']!r} repeats ({s['epochs']:.2f} epochs over "
                f"{cfg.training.steps} steps on {world} process(es)): lower its weight or add data"
            )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check a recipe; print its config and size")
    add_recipe_args(p)
    p.add_argument("--quiet", action="store_true", help="print only the parameter count")
    p.add_argument(
        "--world-size", type=int, default=1,
        help="processes the run will use (for the epochs of each data source; default 1)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.world_size < 1:
        raise ConfigError(f"--world-size must be >= 1, got {args.world_size}")
    cfg = resolve(args.recipe, list(args.overrides))
    import torch
    import yaml
    from normlab.launch.training.preflight import preflight
    from normlab.model import count_params
    from normlab.model.parametrization import config_notes

    preflight(cfg, local=False)  # GPU recipes validate on a CPU machine (the README's 7b)
    total, non_embed = count_model(cfg)
    if not args.quiet:
        print(yaml.safe_dump(resolved_dict(cfg), sort_keys=False), end="")
    if cfg.training.device == "cuda" and not torch.cuda.is_available():
        print("note: training.device is cuda; this machine has no CUDA device (train elsewhere)")
    for note in config_notes(cfg.model_config()):
        print(f"note: {note}")
    if (fp8 := fp8_note(cfg)) is not None:
        print(f"note: {fp8}")
    analytic = count_params(cfg.model_config())
    print(
        f"{cfg.name}: valid; {total:,} parameters ({total / 1e6:,.1f} M; "
        f"{non_embed:,} without the input embedding; analytic {analytic:,})"
    )
    print_epochs(cfg, args.world_size)
    return 0
