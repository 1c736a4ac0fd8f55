"""Checkpoint-on-signal: SIGUSR1, SIGTERM and SIGINT stop training at a step boundary.

The handler only records the signal. After every optimizer step the trainer asks `agreed()`,
which takes the maximum recorded signal over all ranks (a CPU all-reduce on a gloo group, so a
CUDA run does not synchronise its stream for it): every rank sees the same answer after the same
step, so all of them reach the one synchronised checkpoint together and no collective is left
waiting.

Whatever arrives after the first signal is absorbed: a rank checkpoints once and exits, however
many signals come and in whatever order. Repeats are common and mean nothing new: under SLURM one
preemption reaches every process of a job step directly (slurmstepd) and again through torchrun;
a parent-death signal can arrive more than once (torchrun has several threads); a user presses
Ctrl-C twice. An exit without the checkpoint would lose the steps since the last one, so the
only way to stop without it is SIGKILL.

Ranks started by torchrun also ask the kernel for SIGTERM when torchrun dies (PR_SET_PDEATHSIG),
so a killed launcher never leaves ranks training unsupervised.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType, TracebackType

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def stop_status(signum: int) -> str:
    """summary.json status of a run stopped by `signum`: Ctrl-C interrupts, the rest preempt."""
    return "interrupted" if signum == signal.SIGINT else "preempted"


def under_slurm() -> bool:
    return "SLURM_JOB_ID" in os.environ


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `signum` to this process when its parent dies; False where unsupported.
    libc is loaded at import, so this is safe between fork and exec (a preexec_fn)."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def set_child_subreaper() -> bool:
    """Become the parent of orphaned descendants (a killed torchrun's ranks), so this process
    can wait for them; False where unsupported."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _says(text: str) -> None:
    """One line on stderr from rank 0 (every rank gets the signal; one saying so is enough)."""
    if os.environ.get("RANK", "0") == "0":
        print(text, file=sys.stderr, flush=True)


class GracefulStop:
    """Context manager: installs the handlers on enter and restores the previous ones on exit.
    `received` is the first stop signal; later ones are counted in `repeats` and change nothing."""

    def __init__(self) -> None:
        self.received: int = 0
        self.repeats = 0
        self._previous: dict[int, object] = {}
        self._group: object = None

    def __enter__(self) -> GracefulStop:
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank of torchrun: die with it
            set_parent_death_signal(signal.SIGTERM)
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave the process's handlers alone
                break
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # after a stop the process is on its way out (checkpoint written): a late repeat must
        # not kill it now (SIGUSR1's default) or raise KeyboardInterrupt, so it stays absorbed
        absorb = signal.SIG_IGN if self.received else None
        for sig, handler in self._previous.items():
            signal.signal(sig, absorb or handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.received:
            self.received = signum
            _says(f"normlab: {name} received: finishing this step, then checkpointing")
            return
        self.repeats += 1
        if self.repeats == 1:
            _says(
                f"normlab: {name} received as well: still stopping after this step with one "
                "checkpoint (only SIGKILL stops without it)"
            )

    def agreed(self) -> int:
        """The signal every rank stops for after this step (0: keep training). Collective."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.received
        if self._group is None:  # every rank reaches its first call after the same step
            gloo = dist.get_backend() == "gloo"
            self._group = dist.group.WORLD if gloo else dist.new_group(backend="gloo")
        flag = torch.tensor([self.received], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag.item())


BATCH_SCRIPT = "submit.sbatch"  # launch.cluster.script.SCRIPT_NAME (tests check they agree)
# what `normlab launch` started this node with (--nnodes, --node-rank, --master-addr,
# --master-port), for a resume command that runs as printed on a node of a multi-node job
NODE_ARGS_ENV = "NORMLAB_LAUNCH_NODE_ARGS"


def resume_command(run_dir: Path) -> str:
    """The command that resumes this run as it was started: `sbatch RUN/submit.sbatch` for a
    SLURM job of `normlab submit` (its script resumes the run on every node), `normlab train RUN`
    for one process, `normlab launch RUN --nproc-per-node N` for ranks started by torchrun on
    one node, and on several this node's `--nnodes M --node-rank R --master-addr A
    --master-port P` (as `normlab launch` started it: NODE_ARGS_ENV), so the command runs as
    printed on the node that printed it. The run directory's config.yaml holds every override
    it was started with."""
    script = Path(run_dir) / BATCH_SCRIPT
    if os.environ.get("SLURM_JOB_ID") and script.is_file():
        return f"sbatch {shlex.quote(str(script))}"
    run = shlex.quote(str(run_dir))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if "TORCHELASTIC_RUN_ID" not in os.environ and world == 1:
        return f"normlab train {run}"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // max(local, 1))
    if nodes == 1:
        return f"normlab launch {run} --nproc-per-node {local}"
    node = os.environ.get(NODE_ARGS_ENV) or shlex.join([  # torchrun started by hand
        "--nnodes", str(nodes), "--node-rank", os.environ.get("GROUP_RANK", "0"),
        "--master-addr", os.environ.get("MASTER_ADDR", "127.0.0.1"),
    ])  # fmt: skip
    return f"normlab launch {run} --nproc-per-node {local} {node}"


def stop_message(signum: int, step: int, total: int, checkpoint: Path | None, resume: str) -> str:
    """The exit line (and summary message) of a run stopped by `signum`; `resume` is the
    command that continues it (resume_command)."""
    name = signal.Signals(signum).name
    requeued = signum == signal.SIGUSR1 and resume.startswith("sbatch ")
    how = f"resume with `{resume}`" + (" if the job is not requeued" if requeued else "")
    if " --node-rank " in resume:
        how += " on this node (every other node: the same with its own --node-rank)"
    return (
        f"{stop_status(signum)} by {name} after step {step}/{total}; checkpoint {checkpoint}; {how}"
    )
