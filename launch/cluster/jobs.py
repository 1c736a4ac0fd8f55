"""Submitting runs as SLURM jobs and the job record each run directory keeps (slurm.json).

Everything that can be checked is checked before the run directory is touched: the config, the
run directory's own rules (another config lives there), that sbatch exists, that the partition
exists, and that no live job owns the directory. Only then are config.yaml and the script
written; if sbatch still refuses, what was written is removed again.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch import slurm
from normlab.launch.cluster.script import SCRIPT_NAME, render_script
from normlab.launch.cluster.spec import ClusterSpec, resource_warning
from normlab.launch.errors import RunDirError
from normlab.launch.rundir.owner import (
    RECORD,
    check_not_owned,
    read_record,
)

if TYPE_CHECKING:
    from normlab.launch.config import RunConfig


@dataclass
class Submission:
    run_dir: Path
    script: str
    job_id: str | None  # None for a dry run


def prepare(cfgs: list[RunConfig], spec: ClusterSpec, force: bool) -> list[Submission]:
    """Render every run's script and check everything that can be checked (writes nothing)."""
    from normlab.launch.rundir.directory import check_run_dir
    from normlab.launch.training.preflight import preflight

    workdir = Path.cwd()
    out = []
    for cfg in cfgs:
        preflight(cfg, spec.procs_per_node * spec.nodes, local=False)  # as every rank would
        run_dir = Path(cfg.run_dir or f"runs/{cfg.name}").resolve()
        check_run_dir(run_dir, cfg, force)
        script = render_script(spec, f"normlab-{cfg.name or 'run'}", run_dir, workdir)
        out.append(Submission(run_dir, script, None))
    warning = resource_warning(spec)  # once everything that refuses has passed
    if warning:
        print(f"normlab: {warning}", file=sys.stderr)
    return out


def check_not_in_use(run_dir: Path) -> None:
    """A process training in the directory right now (its run-directory lock is live)."""
    from normlab.launch.rundir.directory import read_lock, stale_reason

    owner = read_lock(run_dir)
    if owner is not None and stale_reason(run_dir, owner) is None:
        raise RunDirError(
            f"run_dir {run_dir} is in use by {owner.describe()}: stop it first, or choose "
            "another run_dir"
        )


def check_cluster(subs: list[Submission], spec: ClusterSpec, instead: str = slurm.DRY_RUN) -> None:
    """What needs SLURM or the run directory's current owner, before anything is written;
    `instead`: what the command offers without sbatch."""
    for sub in subs:
        check_not_owned(sub.run_dir)  # a live SLURM job named in slurm.json
        check_not_in_use(sub.run_dir)  # a live local process holding the run-directory lock
    slurm.require("sbatch", instead)
    slurm.check_partition(spec.partition)


def submit(cfg: RunConfig, sub: Submission) -> Submission:
    """Write config.yaml and the script into the run directory, sbatch it, record the job id.

    The job resumes the run from the directory's own config.yaml, so a config given with --force
    replaces it here (the old one is kept as config.previous.yaml, as `normlab train` does). If
    sbatch refuses, every file is put back as it was (a new directory is removed)."""
    from normlab.launch.rundir.directory import CONFIG, PREVIOUS_CONFIG, check_run_dir, write_config

    run_dir = sub.run_dir
    existed = run_dir.exists()
    touched = [run_dir / name for name in (CONFIG, PREVIOUS_CONFIG, SCRIPT_NAME)]
    before = {p: p.read_bytes() if p.is_file() else None for p in touched}
    try:
        diff = check_run_dir(run_dir, cfg, force=True)
        if diff or before[run_dir / CONFIG] is None:
            write_config(run_dir, cfg, replaced=bool(diff))
        _write(run_dir / SCRIPT_NAME, sub.script)
        sub.job_id = slurm.sbatch(run_dir / SCRIPT_NAME)
    except BaseException:
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        for path, data in before.items():
            if data is None:
                path.unlink(missing_ok=True)
            elif existed:
                path.write_bytes(data)
        raise
    record = read_record(run_dir)
    submitted = time.strftime("%Y-%m-%dT%H:%M:%S")
    record["jobs"].append({"job_id": sub.job_id, "submitted": submitted, "script": SCRIPT_NAME})
    _write(run_dir / RECORD, json.dumps(record, indent=2) + "\n")
    return sub


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
