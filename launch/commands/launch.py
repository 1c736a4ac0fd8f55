"""`normlab launch RECIPE --nproc-per-node N [--nnodes M --node-rank R --master-addr A
--master-port P] [key=value ...]`: run `normlab train` under torchrun with c10d rendezvous.

The same command, with its own --node-rank, starts every node of a multi-node job. Before
torchrun starts, the launcher checks what it can check locally, so mistakes end in one clear line
instead of a rendezvous timeout: the recipe, the engine against the world size, the DeepSpeed
config, and (on nodes other than 0) that node 0's rendezvous endpoint is reachable. The world
size every node expects travels in NORMLAB_EXPECTED_WORLD_SIZE; ranks refuse to train in a world
of another size (nodes started with different --nnodes or --nproc-per-node).

Refusals come before torchrun wherever they can (the run directory's config, its owner, the
checkpoint `--from` or `latest` names); one only the ranks can find (a damaged checkpoint, a
world of another size) is left by every rank in $NORMLAB_LAUNCH_ERRORS and printed once here
(once per node), exit 2, without torchrun's traceback (launch.cluster.agent).

The launcher supervises torchrun (launch.cluster.supervise): the first SIGTERM, SIGINT, SIGUSR1
or SIGHUP sent to it reaches every rank (the ranks checkpoint once and stop), torchrun, then its
ranks, get SIGTERM from the kernel when their parent dies, so killing the launcher leaves nothing
training, and the ranks of a killed torchrun are waited for while they checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch.commands.train import add_recipe_args, add_unverified_arg, resolve
from normlab.launch.errors import NormlabError
from normlab.launch.rank_errors import ERRORS_ENV, first_report

if TYPE_CHECKING:
    from normlab.launch.config import RunConfig


# launch.rundir.signals.NODE_ARGS_ENV (not imported: it loads torch; tests check they agree)
NODE_ARGS_ENV = "NORMLAB_LAUNCH_NODE_ARGS"


class LaunchError(NormlabError):
    """The job cannot start as asked (rendezvous unreachable, bad node arguments)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch", help="train on N processes per node (and M nodes) with torchrun"
    )
    add_recipe_args(p)
    p.add_argument("--nproc-per-node", type=int, required=True, help="processes on this node")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node 0")
    p.add_argument(
        "--master-port",
        type=int,
        help="rendezvous port on node 0 (default: 29500 on several nodes, a free port on one node)",
    )
    p.add_argument("--run-dir", help="where the run lives (default: runs/<recipe name>)")
    p.add_argument("--force", action="store_true", help="continue a run dir with another config")
    p.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        help="resume from this checkpoint (step_00000400, or 400) instead of the latest",
    )
    p.add_argument(
        "--connect-timeout", type=float, default=60.0,
        help="seconds a node other than 0 waits for node 0's rendezvous (default 60)",
    )  # fmt: skip
    p.add_argument(
        "--rdzv-timeout", type=int, default=600,
        help="seconds the rendezvous waits for every node to join (default 600)",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command only")
    add_unverified_arg(p)
    p.set_defaults(func=run)


def check_topology(args: argparse.Namespace, cfg: RunConfig) -> int:
    """Validate node arguments against each other and the recipe; return the world size."""
    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise LaunchError(
            f"--nproc-per-node and --nnodes must be >= 1, got {args.nproc_per_node} and "
            f"{args.nnodes}"
        )
    if not 0 <= args.node_rank < args.nnodes:
        raise LaunchError(f"--node-rank must lie in 0..{args.nnodes - 1}, got {args.node_rank}")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise LaunchError(f"--master-port must lie in 1..65535, got {args.master_port}")
    world = args.nproc_per_node * args.nnodes
    check_world(cfg, world, local=True)
    return world


def check_world(cfg: RunConfig, world: int, local: bool = False) -> None:
    """What every rank would refuse, checked once before any process starts (`normlab submit`
    too, with local=False: the submitting host need not have the job's GPUs)."""
    from normlab.launch.training.preflight import preflight

    preflight(cfg, world, local=local)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_endpoint(host: str, port: int, timeout: float) -> None:
    """Retry a TCP connect to node 0's rendezvous until it answers or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(timeout, 0.1))):
                return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"cannot reach the rendezvous at {host}:{port} after {timeout:g} s ({last}); "
                "start node 0 first and check --master-addr, --master-port and the firewall"
            )
        time.sleep(0.5)


def entry_point() -> list[str]:
    """How a rank runs `normlab`: the entry point next to this Python (the working directory,
    which may hold a `model.py` or `data/`, stays off sys.path), else `-m` as torchrun does."""
    script = Path(sys.executable).parent / "normlab"
    if script.is_file() and os.access(script, os.X_OK):
        return ["--no-python", str(script)]
    return ["-m", "normlab.launch.cli"]


def torchrun_command(args: argparse.Namespace, cfg: RunConfig, port: int) -> list[str]:
    # c10d ignores --node-rank (ranks follow the join order); node 0 serves the store
    is_host = int(args.node_rank == 0)
    train = [*entry_point(), "train", args.recipe, *args.overrides, "--run-dir", cfg.run_dir]
    return [
        sys.executable, "-P", "-m", "normlab.launch.cluster.agent",  # torchrun, quiet at exit
        "--nnodes", str(args.nnodes),
        "--nproc-per-node", str(args.nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{args.master_addr}:{port}",
        "--rdzv-id", f"normlab-{cfg.name or 'run'}",
        "--rdzv-conf", f"is_host={is_host},join_timeout={args.rdzv_timeout}",
        "--max-restarts", "0",
        "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",  # passed on to the ranks
        *train, *(["--force"] if args.force else []),
        *(["--from", str(args.from_step)] if args.from_step else []),
        *(["--allow-unverified"] if args.allow_unverified else []),
        *(["--resume-on-changed-data"] if args.resume_on_changed_data else []),
    ]  # fmt: skip


def node_args(args: argparse.Namespace, port: int) -> str:
    """This node's part of the resume command its ranks print (launch.rundir.signals)."""
    return shlex.join([
        "--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank),
        "--master-addr", args.master_addr, "--master-port", str(port),
    ])  # fmt: skip


def check_run(args: argparse.Namespace, cfg: RunConfig, world: int) -> None:
    """What every rank would refuse about the run directory, once, before torchrun: another
    config without --force, a live SLURM job owning it, a --from that names no checkpoint, a
    `latest` pointer naming none, another global batch than the checkpoint's, data sources that
    changed since it (without --resume-on-changed-data). (A checkpoint's bytes are verified by
    the ranks as they load it: hashing them here too would read every checkpoint twice.)"""
    from normlab.launch.rundir.checkpoint import CheckpointManager
    from normlab.launch.rundir.directory import check_run_dir
    from normlab.launch.rundir.owner import check_owner_job
    from normlab.launch.rundir.resume import check_data_identity, check_global_batch, global_batch
    from normlab.launch.training.datasets import data_identity

    run_dir = Path(cfg.run_dir or "runs/run")
    check_run_dir(run_dir, cfg, args.force)  # read-only
    check_owner_job(run_dir)
    manager = CheckpointManager(run_dir, keep_last=1)
    # a `latest` that names no checkpoint directory raises
    ckpt = manager.find(args.from_step) if args.from_step else manager.latest()
    if ckpt is None:
        return
    # only now: the engines import torch.distributed.checkpoint (~0.8 s of a fresh launch)
    from normlab.launch.engines.fsdp import trainer_file
    from normlab.launch.engines.single import TRAINER_FILE, read_file

    files = (ckpt / trainer_file(0), ckpt / TRAINER_FILE)  # FSDP2/DeepSpeed rank 0, or single
    trainer_state = next((p for p in files if p.is_file()), None)
    if trainer_state is not None:
        saved = read_file(trainer_state, weights_only=False)
        check_global_batch(saved, global_batch(cfg, world), args.force)
        if isinstance(saved.get("data_identity"), list):  # the ranks print the notices
            now = data_identity(cfg.data)
            check_data_identity(saved, now, args.resume_on_changed_data, ckpt.name)


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    cfg = resolve(args.recipe, overrides)
    world = check_topology(args, cfg)
    check_run(args, cfg, world)
    port = args.master_port or (free_port() if args.nnodes == 1 else 29500)
    cmd = torchrun_command(args, cfg, port)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    from normlab.launch.training.datasets import (
        resolve_dataset,  # once per node, before the ranks start
    )

    resolve_dataset(cfg.data)
    if args.node_rank > 0:
        wait_for_endpoint(args.master_addr, port, args.connect_timeout)
    from normlab.launch.cluster.supervise import SHUTDOWN_TIMEOUT_S, supervise
    from normlab.launch.engines.dist import EXPECTED_WORLD_ENV
    from normlab.launch.rundir.directory import TOKEN_ENV, RunDirLock

    env = {**os.environ, EXPECTED_WORLD_ENV: str(world), "PYTHONUNBUFFERED": "1"}
    env[NODE_ARGS_ENV] = node_args(args, port)
    env.setdefault("OMP_NUM_THREADS", "1")
    # seconds torchrun gives signalled ranks to checkpoint before it SIGKILLs them
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))

    # node 0 owns the run directory for the whole job; its rank 0 inherits the lock by token
    owner = RunDirLock(Path(cfg.run_dir or "runs/run"), "normlab launch")
    with (
        owner if args.node_rank == 0 else contextlib.nullcontext(),
        tempfile.TemporaryDirectory(prefix="normlab-launch-") as errors,
    ):
        if owner.owner is not None:
            env[TOKEN_ENV] = owner.owner.token
        env[ERRORS_ENV] = errors
        code, received = supervise(cmd, env)
        refusal = first_report(Path(errors))
    if refusal is not None:  # the ranks refused (each left its line): print it once
        raise LaunchError(refusal)
    if received:  # the ranks printed their checkpoint line; torchrun ended quietly
        return 128 + received
    if code < 0:
        name = signal.Signals(-code).name
        print(
            f"normlab launch: torchrun was killed by {name}; its ranks got SIGTERM and stopped "
            f"(see {Path(cfg.run_dir or 'runs/run') / 'summary.json'})",
            file=sys.stderr,
        )
        return 128 - code
    if code != 0:
        print(
            f"normlab launch: torchrun exited with status {code} (the failing rank's error is "
            "above)",
            file=sys.stderr,
        )
    return code
