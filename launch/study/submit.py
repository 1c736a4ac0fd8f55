"""`normlab study ... --submit`: one requeueable SLURM job per run, all in one study directory.

Resumable: a run that is finished (summary 'completed' or 'diverged') or owned by a live SLURM job
(pending, running, requeued) is left alone; only the others are submitted. Every one of those is
checked (configs, run directories, sbatch, partition, live local owners) before the first job is
submitted; if sbatch refuses one part-way, the jobs already queued stay queued and recorded, and
the same command again submits the rest. DIR/plan.json lists every run (`normlab status DIR`);
DIR/study.json the jobs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.launch import slurm
from normlab.launch.cluster import jobs
from normlab.launch.errors import NormlabError
from normlab.launch.rundir import owner

if TYPE_CHECKING:
    from normlab.launch.cluster.spec import ClusterSpec
    from normlab.launch.study.plan import Planned
    from normlab.launch.study.spec import StudySpec

FINISHED = ("completed", "diverged")
# what `study --submit` offers without sbatch (each part runs as printed: the same command
# with --dry-run added, or without --submit)
NO_SBATCH = (
    "or add --dry-run to this command to print each run's batch script, or drop --submit to "
    "train the study here"
)


def where_it_stands(run_dir: Path) -> tuple[str, str | None]:
    """('finished' | 'queued' | 'to submit', the live job id when queued)."""
    from normlab.launch.rundir.directory import read_summary

    summary = read_summary(run_dir) or {}
    if summary.get("status") in FINISHED:
        return "finished", None
    job = owner.last_job_id(run_dir)
    if job is not None and slurm.job_state(job) in slurm.LIVE_STATES:
        return "queued", job
    return "to submit", None


def _write_jobs(out: Path, entries: dict[str, dict[str, Any]]) -> None:
    body = json.dumps({"submitted": list(entries.values())}, indent=2) + "\n"
    tmp = out / ".study.json.tmp"
    tmp.write_text(body)
    tmp.replace(out / "study.json")


def _previous(out: Path) -> dict[str, dict[str, Any]]:
    """The jobs an earlier submission recorded in study.json; a damaged study.json is one line
    (through the one JSON reader), not a record silently replaced by this submission's."""
    from normlab.launch.errors import ConfigError
    from normlab.launch.json_file import read_json

    if not (out / "study.json").is_file():
        return {}
    data = read_json(out / "study.json", "study record", ConfigError, "fix or move it")
    entries = data.get("submitted", []) if isinstance(data, dict) else []
    entries = entries if isinstance(entries, list) else []
    return {str(e["run_dir"]): e for e in entries if isinstance(e, dict) and "run_dir" in e}


def submit_study(
    planned: list[Planned], spec: StudySpec, out: Path, cluster: ClusterSpec, dry_run: bool = False
) -> int:
    """Submit what is missing; 0 when every run is finished, queued or submitted now.
    `dry_run`: print the batch script of each run that would be submitted, write nothing."""
    from normlab.launch.study.plan import write_plan

    standing = [where_it_stands(Path(p.cfg.run_dir or "").resolve()) for p in planned]
    todo = [p for p, (state, _) in zip(planned, standing, strict=True) if state == "to submit"]
    subs = jobs.prepare([p.cfg for p in todo], cluster, force=False)
    if dry_run:
        for p, sub in zip(todo, subs, strict=True):
            print(f"# ---- {p.cfg.name}: {sub.run_dir}/{jobs.SCRIPT_NAME}\n{sub.script}", end="")
        print(
            f"# study {spec.name}: {len(todo)} of {len(planned)} runs would be submitted "
            "(dry run: nothing submitted or written)"
        )
        return 0
    if subs:
        jobs.check_cluster(subs, cluster, NO_SBATCH)
    write_plan(spec, planned, out)
    entries = _previous(out)
    done = 0
    for p, sub in zip(todo, subs, strict=True):
        try:
            jobs.submit(p.cfg, sub)
        except NormlabError as exc:
            _write_jobs(out, entries)
            raise type(exc)(
                f"{exc} ({done} of {len(todo)} jobs submitted and kept; run the same command "
                "again to submit the rest)"
            ) from None
        done += 1
        entries[str(sub.run_dir)] = {
            "recipe": p.recipe,
            "size": p.size,
            "lr": p.lr,
            "seed": p.seed,
            "run_dir": str(sub.run_dir),
            "job_id": sub.job_id,
        }
        _write_jobs(out, entries)
        print(f"submitted job {sub.job_id}: {p.cfg.name} -> {sub.run_dir}", flush=True)
    finished = sum(s == "finished" for s, _ in standing)
    queued = [job for s, job in standing if s == "queued"]
    print(
        f"study {spec.name}: {done} submitted now, {len(queued)} already queued or running"
        + (f" (jobs {', '.join(str(j) for j in queued)})" if queued else "")
        + f", {finished} finished, of {len(planned)} runs",
        flush=True,
    )
    print(
        f"follow with: normlab status {out}\nreport when done: the same command without --submit "
        "(it reuses the finished runs)"
    )
    return 0
