"""`normlab train RECIPE [key=value ...]`: train, or resume the run in its run directory.

RECIPE is a YAML file, a bare recipe name (`pre`, `7b`: recipes/ and recipes/presets/), or a run
directory (resumed with its own config.yaml).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch.errors import ConfigError

if TYPE_CHECKING:
    from normlab.launch.config import RunConfig


def add_recipe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recipe", help="recipe YAML, a recipe name (pre, peri, 7b...), or a run directory to resume"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides, e.g. optim.lr=3e-4; your own corpus: data.dataset=DIR (a "
        "`normlab prepare` output; model.vocab_size then defaults to its tokenizer's size)",
    )


def resolve(recipe: str, overrides: list[str]) -> RunConfig:
    """A run directory (holding config.yaml) resumes with its own config and location."""
    from normlab.launch.config import load_config
    from normlab.launch.config.loader import find_recipe

    path = Path(recipe).expanduser()
    if path.is_dir():
        if not (path / "config.yaml").is_file():
            raise ConfigError(
                f"{path} is a directory but not a run directory (no config.yaml); give a recipe "
                "file or name"
            )
        return load_config(path / "config.yaml", [*overrides, f"run_dir={path}"])
    return load_config(find_recipe(recipe), overrides)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a recipe (resumes an existing run directory)")
    add_recipe_args(p)
    p.add_argument("--run-dir", help="where the run lives (default: runs/<recipe name>)")
    p.add_argument(
        "--force",
        action="store_true",
        help="continue a run directory holding another config (the new optimizer and schedule "
        "values apply from the resumed step on; moments are kept)",
    )
    p.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        help="resume from this checkpoint (step_00000400, or 400) instead of the latest, e.g. "
        "the previous verified one when the latest is damaged",
    )
    add_unverified_arg(p)
    p.set_defaults(func=run)


def add_unverified_arg(p: argparse.ArgumentParser) -> None:
    """--allow-unverified and --resume-on-changed-data: the resume checks a user may waive."""
    p.add_argument(
        "--allow-unverified",
        action="store_true",
        help="load a checkpoint that has no manifest.json (its files cannot be verified)",
    )
    p.add_argument(
        "--resume-on-changed-data",
        action="store_true",
        help="resume although a data source changed since the checkpoint (another tokenizer, "
        "re-prepared shards or another sequence count); refused otherwise, --force included",
    )


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    cfg = resolve(args.recipe, overrides)
    from normlab.launch.training.trainer import (
        Trainer,  # heavy imports only once the config is valid
    )

    trainer = Trainer(
        cfg,
        force=args.force,
        from_step=args.from_step,
        allow_unverified=args.allow_unverified,
        resume_on_changed_data=args.resume_on_changed_data,
    )
    status = trainer.run()
    s = trainer.summary
    if trainer.engine.is_main and s.get("status") == "completed":
        print(
            f"{cfg.name}: {s['steps']} steps, final loss {s['final_loss']:.4f}, eval loss "
            f"{s['eval_loss']:.4f}, {s['tokens_per_s'] or 0:,.0f} tokens/s -> {cfg.run_dir}"
        )
    return status
