"""`normlab plan RECIPE --nodes N --gpus-per-node G --gpu-memory 80GB [key=value ...]`: will the
recipe fit? Per-rank memory of every engine and ZeRO stage, with and without activation
checkpointing, and a verdict on the configured one with what to change (launch.engines.memory_plan).
"""

from __future__ import annotations

import argparse

from normlab.launch.commands.train import add_recipe_args, resolve
from normlab.launch.engines.memory_plan import plan_report


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="estimate per-GPU memory of a recipe on a cluster, for every engine"
    )
    add_recipe_args(p)
    p.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (ranks) per node")
    p.add_argument("--gpu-memory", required=True, help="memory of one GPU, e.g. 80GB")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = resolve(args.recipe, list(args.overrides))
    print("\n".join(plan_report(cfg, args.nodes, args.gpus_per_node, args.gpu_memory)))
    return 0
