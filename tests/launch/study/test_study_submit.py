"""`normlab study NAME --submit` against stand-in sbatch/squeue/sinfo scripts (the real-cluster
test is tests/launch/cluster/test_slurm.py): one job per run; an sbatch that refuses
part-way keeps what was queued and says how many; the same command again submits only what
is missing; a finished run is never resubmitted; `normlab status DIR` counts the queued runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from normlab.launch.cli import main

FAKE_SBATCH = """#!/bin/sh
# job ids from a counter; refuses once when $STATE/refuse_at equals the next id
n=$(cat "$STATE/next" 2>/dev/null || echo 100)
if [ -f "$STATE/refuse_at" ] && [ "$(cat "$STATE/refuse_at")" = "$n" ]; then
  rm "$STATE/refuse_at"; echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1
fi
echo $((n + 1)) > "$STATE/next"
echo "$n" >> "$STATE/queued"
echo "$n"
"""
FAKE_SQUEUE = """#!/bin/sh
# squeue -h -j ID -t all -o %T: PENDING for every id sbatch handed out
grep -qx "$3" "$STATE/queued" 2>/dev/null && echo PENDING
exit 0
"""
FAKE_SINFO = "#!/bin/sh\necho debug\n"


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm_state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE), ("sinfo", FAKE_SINFO)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return state


def study_file(tmp_path: Path) -> Path:
    path = tmp_path / "sub.yaml"
    body = {"recipes": ["pre", "pre_qknorm_head"], "grid": {"optim.lr": [1e-3, 1e-2]},
            "seeds": [0], "steps": 40, "protocol": {"claims": False}}  # fmt: skip
    path.write_text(yaml.safe_dump(body))
    return path


def test_partial_submission_is_completed_by_the_same_command(
    slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    cmd = [
        "study",
        str(study_file(tmp_path)),
        "--out",
        str(out),
        "--submit",
        "--gpus-per-node",
        "0",
    ]
    (slurm / "refuse_at").write_text("102\n")  # the third sbatch refuses
    assert main(cmd) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and "sbatch refused the job" in err, err
    assert "(2 of 4 jobs submitted and kept; run the same command again" in err
    jobs = json.loads((out / "study.json").read_text())["submitted"]
    assert [j["job_id"] for j in jobs] == ["100", "101"]
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["pre_lr0.001_s0", "pre_lr0.01_s0"]  # the refused run left nothing behind

    assert main(cmd) == 0  # again: only the two missing runs
    text = capsys.readouterr().out
    assert "2 submitted now, 2 already queued or running (jobs 100, 101), 0 finished" in text
    jobs = json.loads((out / "study.json").read_text())["submitted"]
    assert sorted(j["job_id"] for j in jobs) == ["100", "101", "102", "103"]

    done = out / "runs" / "pre_lr0.001_s0"  # one run finishes; its job is gone from the queue
    (done / "summary.json").write_text(json.dumps({"status": "completed"}))
    (slurm / "queued").write_text("101\n102\n103\n")
    assert main(cmd) == 0
    text = capsys.readouterr().out
    assert "0 submitted now, 3 already queued or running" in text and "1 finished" in text
    assert (slurm / "next").read_text().strip() == "104"  # nothing was resubmitted

    assert main(["status", str(out)]) == 0
    status = capsys.readouterr().out
    assert "4 runs: 1 done, 3 queued" in status
