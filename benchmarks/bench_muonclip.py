"""Step time of AdamW, Muon and Muon + QK-Clip, side by side, in one process and on 2 ranks.

Each variant trains the same recipe (recipes/pre.yaml at the tiny or a small CPU size) for
`--steps` steps through `normlab train` (1 process, engine single) or `normlab launch
--nproc-per-node 2` (engine fsdp, gloo on CPU; NCCL on GPUs when there are two); the median of
the per-step times in metrics.jsonl after `--warmup` steps is reported, with the ratio to AdamW.
Muon's cost is Newton-Schulz (5 bf16 matmul pairs per matrix; sharded: a gather to the owner
rank and a scatter back); QK-Clip's is the exact per-head max logit streamed beside attention.

    python benchmarks/bench_muonclip.py                       # tiny and small, 1 and 2 ranks
    python benchmarks/bench_muonclip.py --sizes tiny --ranks 1 --steps 20
    python benchmarks/bench_muonclip.py --ns-dtype fp32          # CPUs without bf16 matmul
    python benchmarks/bench_muonclip.py --device cuda --sizes 1b   # on a GPU machine

Variants run one after the other, so on a shared machine the ratios carry its load.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "adamw": ["optim.name=adamw"],
    "muon": ["optim.name=muon"],
    "muon+qk_clip": ["optim.name=muon", "optim.qk_clip={tau: 100.0, alpha: 0.5}"],
}
SIZES = {
    "tiny": [],  # recipes/base/tiny.yaml: 4 layers, d 128, 4 heads, seq 128, batch 8
    "small": [  # 8 layers, d 256, 8 heads, seq 256
        "model.n_layers=8",
        "model.d_model=256",
        "model.n_heads=8",
        "model.d_ff=704",
        "data.seq_len=256",
    ],
    "1b": ["model.preset=1b", "data.seq_len=2048", "data.batch_size=4", "precision.dtype=bf16"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(size: str, variant: str, ranks: int, args: argparse.Namespace, root: Path) -> float:
    """Median seconds per step of one variant (after the warm-up steps)."""
    run_dir = root / f"{size}-{variant}-{ranks}"
    overrides = [
        *SIZES[size],
        *VARIANTS[variant],
        f"training.steps={args.steps}",
        "training.log_every=1",
        "training.eval_every=0",
        "training.eval_batches=1",
        f"training.device={args.device}",
        "schedule.warmup_steps=0",
        "checkpoint.every=0",
        "logging.tensorboard=false",
        "logging.progress=false",
    ]
    if variant != "adamw":
        overrides.append(f"optim.muon_ns_dtype={args.ns_dtype}")
    if args.device == "cpu":
        overrides.append(f"training.threads={args.threads}")
    recipe = str(REPO / "recipes" / "pre.yaml")
    cli = [sys.executable, "-m", "launch.cli"]
    if ranks == 1:
        cmd = [*cli, "train", recipe, *overrides, "--run-dir", str(run_dir)]
    else:
        cmd = [
            *cli,
            "launch",
            recipe,
            *overrides,
            "engine.name=fsdp",
            "--nproc-per-node",
            str(ranks),
            "--master-port",
            str(free_port()),
            "--run-dir",
            str(run_dir),
        ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{size}/{variant}/{ranks} ranks failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in rows if "step_time" in r and r["step"] > args.warmup]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small", help=f"comma list of {list(SIZES)}")
    parser.add_argument("--ranks", default="1,2", help="comma list of process counts")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--ns-dtype",
        default="bf16",
        choices=["bf16", "fp32"],
        help="Newton-Schulz precision (bf16 as in the paper; CPUs without bf16 matmul: fp32)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            for ranks in (int(r) for r in args.ranks.split(",")):
                ms = {v: 1e3 * run(size, v, ranks, args, Path(tmp)) for v in VARIANTS}
                results.append({"size": size, "ranks": ranks, "ms": ms})
    print(
        f"median ms per step ({args.device}, Newton-Schulz in {args.ns_dtype}, {args.steps} "
        f"steps, first {args.warmup} left out)"
    )
    print(
        f"{'size':<6} {'ranks':>5} "
        + " ".join(f"{v:>13}" for v in VARIANTS)
        + f" {'muon/adamw':>11} {'clip/muon':>10}"
    )
    for r in results:
        ms = r["ms"]
        print(
            f"{r['size']:<6} {r['ranks']:>5} "
            + " ".join(f"{ms[v]:>13.1f}" for v in VARIANTS)
            + f" {ms['muon'] / ms['adamw']:>11.3f} {ms['muon+qk_clip'] / ms['muon']:>10.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
