"""bf16 against FP8 (precision.fp8, torchao) step time and MFU, side by side, through the Trainer.

Each size trains three times in one process, compiled, with the same recipe: bf16, then FP8
tensorwise, then FP8 rowwise, the stability instruments off (`--instruments` keeps them; every
step is a log step here). Engine fsdp on one process compiles each block (torchtitan's order:
FP8 conversion, compile, fully_shard), so the three compilations stay short and the tensorwise
run goes through torchao's float8 all-gather path. The first `--warmup` steps (compilation
included) are dropped; the table gives the median seconds per step, tokens/s, MFU (against the
device's dense bf16 peak: FP8's own peak is twice that on H100/H200) and each FP8 arm's step
rate over bf16's. On a CPU, FP8 is emulated (no speed-up: a wiring check only).

    python benchmarks/bench_fp8.py --device cuda --sizes 125m 1b      # gpu_check.sh's FP8 part
    python benchmarks/bench_fp8.py --sizes tiny --steps 3 --warmup 1 --backend eager   # CPU
    python benchmarks/bench_fp8.py --from-json a.json b.json   # the table of saved rows
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
    "tiny": ["model.d_model=128", "model.d_ff=512"],  # recipes/base/tiny.yaml
    "125m": ["model.preset=125m", "data.seq_len=2048", "data.batch_size=8", VAL],
    "1b": ["model.preset=1b", "data.seq_len=2048", "data.batch_size=4", VAL],
    # the 7b preset's GEMM shapes (d 4096, d_ff 11008) in 4 blocks, to fit one GPU: torchtitan's
    # float8 guide puts the speed-up at K, N > 4096, which neither 125m nor 1b reaches
    "7b-w4": ["model.preset=7b", "model.n_layers=4", "data.seq_len=2048", "data.batch_size=4", VAL],
}
ARMS = {"bf16": None, "fp8 tensorwise": "tensorwise", "fp8 rowwise": "rowwise"}


def run(args: argparse.Namespace, size: str, arm: str, root: Path) -> dict:
    tag = f"{size}_{arm.replace(' ', '_')}"
    steps = args.warmup + args.steps
    overrides = [
        *SIZES[size],
        f"training.steps={steps}",
        "schedule.warmup_steps=2",
        "training.log_every=1",
        "training.eval_every=0",  # the one evaluation at the end, outside the timed steps
        f"training.device={args.device}",
        "precision.dtype=bf16",
        "checkpoint.every=0",
        "logging.progress=false",
        "logging.tensorboard=false",
        f"engine.name={args.engine}",
        "engine.compile=true",
        f"engine.compile_backend={args.backend}",
        f"run_dir={root / tag}",
    ]
    overrides += [f"precision.fp8={{recipe: {ARMS[arm]}}}"] if ARMS[arm] else []
    # the recipe's instruments hook every block on a log step, and every step is one here: off
    # unless asked for, so the table times FP8, not the instruments (see benchmarks/results)
    overrides += [] if args.instruments else ["instruments={}"]
    overrides += [f"training.threads={args.threads}"] if args.device == "cpu" else []
    cfg = load_config(REPO / "recipes" / "pre.yaml", overrides)
    start = time.perf_counter()
    assert Trainer(cfg).run() == 0
    rows = [r for r in read_jsonl(root / tag / "metrics.jsonl") if "loss" in r][args.warmup :]
    return {
        "size": size,
        "arm": arm,
        "median_s": statistics.median(r["step_time"] for r in rows),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
        "mfu": statistics.median(r["mfu"] for r in rows) if "mfu" in rows[0] else None,
        "wall_s": time.perf_counter() - start,
        "final_loss": rows[-1]["loss"],
    }


def table(rows: list[dict]) -> list[str]:
    lines = [f"{'size':<6}{'arm':<16}{'median s':>10}{'tokens/s':>12}{'MFU':>8}{'vs bf16':>9}"]
    for r in rows:
        base = next(b for b in rows if b["size"] == r["size"] and b["arm"] == "bf16")
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        ratio = base["median_s"] / r["median_s"]
        lines.append(
            f"{r['size']:<6}{r['arm']:<16}{r['median_s']:>10.4f}{r['tokens_per_s']:>12,.0f}"
            f"{mfu:>8}{ratio:>8.2f}x"
        )
    return lines


def saved_rows(paths: list[Path]) -> list[dict]:
    """The rows of one or more --json files, in order (one file per size from gpu_check.sh)."""
    return [row for path in paths for row in json.loads(path.read_text())["rows"]]


def write_json(args: argparse.Namespace, rows: list[dict]) -> None:
    out = {"args": {**vars(args), "json": str(args.json)}, "rows": rows}
    args.json.write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["tiny"])
    p.add_argument("--steps", type=int, default=10, help="timed steps per arm")
    p.add_argument("--warmup", type=int, default=4, help="steps dropped (compilation)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--engine", default="fsdp", choices=["fsdp", "single"],
                   help="fsdp: torchtitan's order, float8 all-gather for tensorwise")
    p.add_argument("--instruments", action="store_true",
                   help="keep the recipe's stability instruments on (every step is a log step)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="JSON",
                   help="print the table of rows written before (by --json) and run nothing")
    args = p.parse_args()
    if args.from_json:
        print("\n".join(table(saved_rows(args.from_json))))
        return
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            for arm in ARMS:
                r = run(args, size, arm, Path(tmp))
                rows.append(r)
                mfu = f"MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else "MFU -"
                # each arm's numbers as soon as it ends: gpu_check.sh caps this part's time
                print(f"done: {size} {arm} in {r['wall_s']:.0f} s: {r['median_s']:.4f} s/step, "
                      f"{r['tokens_per_s']:,.0f} tokens/s, {mfu}", flush=True)  # fmt: skip
                if args.json:
                    write_json(args, rows)
    print(f"bench_fp8: {args.device}, engine {args.engine}, backend {args.backend}, instruments "
          f"{'on' if args.instruments else 'off'}, {args.steps} steps after {args.warmup}; vs "
          "bf16: bf16's median step time over the arm's")  # fmt: skip
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
