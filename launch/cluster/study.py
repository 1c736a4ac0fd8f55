"""`normlab study ... --submit`: one SLURM job per recipe, all runs in one study directory.

Every run is checked (configs, run directories, sbatch, partition, live owners) before the first
job is submitted. `normlab compare DIR/runs/*` reads the runs while they train.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.launch.cluster import jobs

if TYPE_CHECKING:
    from normlab.launch.cluster.spec import ClusterSpec
    from normlab.launch.config import RunConfig


def submit_study(cfgs: list[RunConfig], out: Path, spec: ClusterSpec) -> list[dict[str, Any]]:
    """Submit every run; write DIR/study.json listing the jobs; return its entries."""
    subs = jobs.prepare(cfgs, spec, force=False)
    jobs.check_cluster(subs, spec)
    entries = []
    for cfg, sub in zip(cfgs, subs, strict=True):
        jobs.submit(cfg, sub)
        entries.append({"recipe": cfg.name, "run_dir": str(sub.run_dir), "job_id": sub.job_id})
        print(f"submitted job {sub.job_id}: {cfg.name} -> {sub.run_dir}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.json").write_text(json.dumps({"submitted": entries}, indent=2) + "\n")
    runs = " ".join(e["run_dir"] for e in entries)
    print(f"follow with: normlab status {runs}\ncompare with: normlab compare {runs} --out {out}")
    return entries
