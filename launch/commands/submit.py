"""`normlab submit RECIPE [key=value ...] --nodes N --gpus-per-node G [...]`: train on SLURM.

Renders an sbatch script into the run directory (one srun task per node running `normlab launch`,
torchrun with c10d rendezvous on the job's first host), submits it, and records the job id in
<run_dir>/slurm.json. Site defaults come from --cluster FILE (see recipes/clusters/example.yaml);
options given here override them. `--dry-run` prints the script and touches nothing.
"""

from __future__ import annotations

import argparse

from normlab.launch.commands.train import add_recipe_args, resolve

SPEC_OPTIONS = (
    "nodes", "gpus_per_node", "partition", "time", "account", "qos", "constraint", "mem",
    "cpus_per_task", "exclusive", "signal_grace_s",
)  # fmt: skip


def add_submit_options(p: argparse.ArgumentParser) -> None:
    """The job options shared by `normlab submit` and `normlab study --submit`."""
    g = p.add_argument_group("SLURM job (override the cluster file)")
    g.add_argument("--cluster", metavar="FILE", help="cluster YAML with site defaults")
    g.add_argument("--nodes", type=int, help="nodes (default 1)")
    g.add_argument("--gpus-per-node", type=int, help="GPUs (= ranks) per node; 0: a CPU job")
    g.add_argument("--partition")
    g.add_argument("--time", help="time limit, e.g. 24:00:00")
    g.add_argument("--account")
    g.add_argument("--qos")
    g.add_argument("--constraint")
    g.add_argument("--mem", help="memory per node, e.g. 200G")
    g.add_argument("--cpus-per-task", type=int)
    g.add_argument("--exclusive", action="store_true", default=None, help="whole nodes")
    g.add_argument(
        "--signal-grace", dest="signal_grace_s", type=int,
        help="seconds before the time limit at which USR1 asks for a checkpoint (default 120)",
    )  # fmt: skip


def job_spec(args: argparse.Namespace):  # noqa: ANN201 (ClusterSpec; imported lazily)
    from normlab.launch.cluster.spec import load_cluster, with_options

    return with_options(load_cluster(args.cluster), {k: getattr(args, k) for k in SPEC_OPTIONS})


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("submit", help="submit a recipe to SLURM (requeues on preemption)")
    add_recipe_args(p)
    p.add_argument("--run-dir", help="where the run lives (default: runs/<recipe name>)")
    p.add_argument("--force", action="store_true", help="continue a run dir with another config")
    add_submit_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.cluster import jobs

    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    cfg = resolve(args.recipe, overrides)
    spec = job_spec(args)
    (sub,) = jobs.prepare([cfg], spec, args.force)
    if args.dry_run:
        print(sub.script, end="")
        return 0
    jobs.check_cluster([sub], spec)
    jobs.submit(cfg, sub)
    print(
        f"submitted job {sub.job_id} for {sub.run_dir} (log: {sub.run_dir}/slurm-{sub.job_id}.out)"
    )
    return 0
