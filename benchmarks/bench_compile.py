"""Step time with engine.compile off and on, side by side, through the Trainer (CPU or GPU).

The same recipe trains twice in one process, eager then compiled (QK-Clip and the default
instruments on: what issue 21 asked compile to carry), one log row per step. The first
`--warmup` steps of each (the compiled run's include compilation) are dropped; the table gives
the median and min seconds per step, tokens/s, TFLOP/s per device (launch/training/mfu.py) and
the compiled/eager ratio. Timings on a shared machine are under load: compare within one run.

    python benchmarks/bench_compile.py                      # tiny, CPU, inductor
    python benchmarks/bench_compile.py --size small --steps 30 --json out.json
    python benchmarks/bench_compile.py --device cuda --dtype bf16 --size 125m   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from normlab.launch.config import load_config  # noqa: E402
from normlab.launch.rundir.metrics import read_jsonl  # noqa: E402
from normlab.launch.training.trainer import Trainer  # noqa: E402

# the bundled corpus's default validation share (0.005: 4 sequences of 2049 tokens) is smaller
# than one global batch at the presets' lengths; the run refuses that, so hold out more
VAL = "data.val_fraction=0.03"
SIZES = {
    "tiny": [],  # recipes/base/tiny.yaml: 4 layers, d 128, seq 128, batch 8
    "small": ["model.n_layers=8", "model.d_model=256", "model.n_heads=8", "model.d_ff=704"],
    "125m": ["model.preset=125m", "data.seq_len=1024", "data.batch_size=8", VAL],
}


def run(args: argparse.Namespace, compiled: bool, root: Path) -> dict:
    tag = "compiled" if compiled else "eager"
    overrides = [
        *SIZES[args.size],
        f"training.steps={args.warmup + args.steps}",
        "schedule.warmup_steps=2",
        "training.log_every=1",
        "training.eval_every=0",  # the one evaluation at the end, outside the timed steps
        f"training.device={args.device}",
        f"precision.dtype={args.dtype}",
        "checkpoint.every=0",
        "logging.progress=false",
        "logging.tensorboard=false",
        f"engine.compile={str(compiled).lower()}",
        f"engine.compile_backend={args.backend}",
        f"run_dir={root / tag}",
    ]
    overrides += ["optim.qk_clip={tau: 100.0}"] if args.qk_clip else []
    overrides += [f"training.threads={args.threads}"] if args.device == "cpu" else []
    cfg = load_config(REPO / "recipes" / "pre.yaml", overrides)
    start = time.perf_counter()
    assert Trainer(cfg).run() == 0
    wall = time.perf_counter() - start
    rows = [r for r in read_jsonl(root / tag / "metrics.jsonl") if "loss" in r][args.warmup :]
    times = [r["step_time"] for r in rows]
    return {
        "mode": tag,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
        "tflops_per_gpu": statistics.median(r["tflops_per_gpu"] for r in rows),
        "mfu": statistics.median(r["mfu"] for r in rows) if "mfu" in rows[0] else None,
        "wall_s": wall,
        "final_loss": rows[-1]["loss"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=5, help="steps dropped (compilation)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-qk-clip", dest="qk_clip", action="store_false")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(args, compiled, Path(tmp)) for compiled in (False, True)]
    eager, comp = rows
    print(
        f"bench_compile: {args.size}, {args.device} {args.dtype}, backend {args.backend}, "
        f"QK-Clip {'on' if args.qk_clip else 'off'}, {args.steps} steps after {args.warmup}"
    )
    print(f"{'mode':<10}{'median s':>10}{'min s':>10}{'tokens/s':>12}{'TFLOP/s':>10}"
          f"{'MFU':>8}{'wall s':>9}{'loss':>9}")  # fmt: skip
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(
            f"{r['mode']:<10}{r['median_s']:>10.4f}{r['min_s']:>10.4f}{r['tokens_per_s']:>12,.0f}"
            f"{r['tflops_per_gpu']:>10.4f}{mfu:>8}{r['wall_s']:>9.1f}{r['final_loss']:>9.4f}"
        )
    ratio = eager["median_s"] / comp["median_s"]
    print(f"compiled vs eager: {ratio:.2f}x the eager step rate (median step time)")
    if args.json:
        out = {"args": {**vars(args), "json": str(args.json)}, "rows": rows, "speedup": ratio}
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
