"""The sbatch script of one run: one srun task per node, each running `normlab launch`.

The job runs the `normlab` entry point installed next to the cluster's Python (`$NORMLAB`), never
`python -m ...` from the submit directory, where a user's `model.py` or `data/` could shadow a
module. srun is given the job's --cpus-per-task and --mem again: since Slurm 22.05 a job step
no longer inherits --cpus-per-task from sbatch, so torchrun and all its ranks would share one
core on a site that constrains cores.

`normlab launch` runs torchrun with c10d rendezvous on the first host of the allocation
(`scontrol show hostnames "$SLURM_JOB_NODELIST"`), where this script runs, on a port that
launch.cluster.port picks there: derived from the job id and checked free on that node, so two
jobs sharing a node do not collide.

The cluster file's set-up lines (`module load`, conda activation) run before `set -u`: some
sites' set-up scripts read unset variables and break under it.

Signals: `--signal=B:USR1@grace` sends USR1 to this batch shell `grace` seconds before the time
limit; the trap passes it to every job step (`scancel --signal` reaches steps, not this shell),
whose ranks finish their step and write one checkpoint. Afterwards the run is requeued
(`scontrol requeue`) when it stopped for USR1 and is not finished. SIGTERM (scancel, or
preemption by the scheduler, which requeues by itself) is absorbed here so the shell outlives
the steps' checkpoint, and never requeues: a cancelled job stays cancelled.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from normlab.launch.cluster.spec import ClusterSpec

SCRIPT_NAME = "submit.sbatch"


def sbatch_lines(spec: ClusterSpec, job_name: str, run_dir: Path, workdir: Path) -> list[str]:
    options = [
        f"--job-name={job_name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
    ]
    if spec.gpus_per_node:
        options.append(f"--gpus-per-node={spec.gpus_per_node}")
    pairs = [
        ("cpus-per-task", spec.cpus_per_task),
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("constraint", spec.constraint),
        ("time", spec.time),
        ("mem", spec.mem),
    ]
    options += [f"--{key}={value}" for key, value in pairs if value is not None]
    if spec.exclusive:
        options.append("--exclusive")
    options.append(f"--signal=B:USR1@{spec.signal_grace_s}")
    options.append("--requeue" if spec.requeue else "--no-requeue")
    options += [
        "--open-mode=append",
        f"--output={run_dir}/slurm-%j.out",
        f"--chdir={workdir}",
    ]
    return [f"#SBATCH {shlex.quote(o)}" for o in options]


def environment_lines(spec: ClusterSpec) -> list[str]:
    lines = list(spec.setup)
    lines += [f"export {name}={shlex.quote(str(value))}" for name, value in spec.env.items()]
    return lines or [":  # (no set-up lines in the cluster file)"]


def srun_prefix(spec: ClusterSpec) -> str:
    words = ["srun", "--nodes", str(spec.nodes), "--ntasks-per-node=1"]
    if spec.cpus_per_task is not None:  # not inherited from sbatch since Slurm 22.05
        words.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.mem is not None:
        words.append(f"--mem={spec.mem}")  # 0: all of the job's memory on each node
    if spec.container is not None:
        words.append(f"--container-image={spec.container.image}")
        if spec.container.mounts:
            words.append(f"--container-mounts={','.join(spec.container.mounts)}")
    return shlex.join(words)


def render_script(spec: ClusterSpec, job_name: str, run_dir: Path, workdir: Path) -> str:
    """The batch script; `run_dir` holds the run's config.yaml, so every (re)start resumes it."""
    python = spec.python or sys.executable
    launch = (
        f'"$NORMLAB" launch "$RUN_DIR" --nnodes {spec.nodes} '
        f'--nproc-per-node {spec.procs_per_node} --master-addr "$head_addr" --master-port "$port"'
    )
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Written by `normlab submit` for {run_dir}; `sbatch` it again to resubmit.",
            *sbatch_lines(spec, job_name, run_dir, workdir),
            "",
            "# environment (cluster file), before set -u: module load / conda activate may read",
            "# unset variables",
            *environment_lines(spec),
            "set -uo pipefail",
            "",
            f"RUN_DIR={shlex.quote(str(run_dir))}",
            f"PYTHON={shlex.quote(python)}",
            "# the entry point next to that Python (a name such as python3 is looked up on PATH)",
            'NORMLAB=$(dirname "$(command -v "$PYTHON" || echo "$PYTHON")")/normlab',
            '[ -x "$NORMLAB" ] || { echo "normlab: no normlab entry point at $NORMLAB (next to '
            '$PYTHON): install normlab there or set python in the cluster file" >&2; exit 2; }',
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "head_addr=$(scontrol show node \"$head\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
            "head_addr=${head_addr:-$head}",
            "# from the job id, free on this node (the first of the allocation)",
            'port=$("$PYTHON" -P -m normlab.launch.cluster.port "$SLURM_JOB_ID") || exit 2',
            'echo "normlab: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on '
            '$SLURM_JOB_NODELIST, rendezvous $head_addr:$port"',
            "",
            "# USR1 (time limit near): every step's ranks checkpoint, then the job requeues.",
            "# TERM (scancel, preemption): the ranks checkpoint; this shell waits for them.",
            'stopped_by=""',
            "trap 'stopped_by=USR1; scancel --signal=USR1 \"$SLURM_JOB_ID\"' USR1",
            "trap 'stopped_by=${stopped_by:-TERM}' TERM",
            "",
            f"{srun_prefix(spec)} \\",
            '  bash -c \'exec "$@" --node-rank "$SLURM_NODEID"\' normlab-node \\',
            f"  {launch} &",
            "step=$!",
            'wait "$step"; code=$?',
            'while kill -0 "$step" 2>/dev/null; do wait "$step"; code=$?; done',
            "",
            "# -P: the submit directory is not put on sys.path (nothing there shadows normlab)",
            '"$PYTHON" -P -m normlab.launch.cluster.requeue "$RUN_DIR" '
            '--stopped-by "${stopped_by:-none}" --exit-code "$code"',
            "",
        ]
    )
