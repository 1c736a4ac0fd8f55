"""bf16 against FP8 (precision.fp8, torchao) step time and MFU, side by side, through the Trainer.

Each size trains once per arm, compiled, with the same recipe: bf16, then FP8 tensorwise, then
FP8 rowwise (`--arms` picks), the stability instruments off (`--instruments` keeps them, every
window's last step a log step). The default engine is `single` with each block compiled
(engine.compile_scope blocks: one block's graph, its float8 linears inside, serves every
block): on one GPU FSDP2 adds its all-gathers, copies and per-block hooks for nothing.
The trainer's own step runs in windows of `--window` steps, the last step's losses crossing to
the host as on a log step, without the run's final evaluation and checkpoint (a 1b checkpoint
writes 16 GB). The first `--warmup` steps (compilation included) are dropped; the table gives
the median seconds per step over the timed windows, tokens/s, MFU (against the device's dense
bf16 peak: FP8's own peak is twice that on H100/H200) and each FP8 arm's step rate over
bf16's. On a CPU, FP8 is emulated (no speed-up: a wiring check only).

    python benchmarks/bench_fp8.py --device cuda --sizes 1b 7b-w4       # gpu_check.sh's part
    python benchmarks/bench_fp8.py --sizes tiny --steps 3 --warmup 1 --backend eager   # CPU
    python benchmarks/bench_fp8.py --from-json a.json b.json   # the table of saved rows
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from normlab.launch.config import load_config  # noqa: E402
from normlab.launch.training.host_rows import to_host  # noqa: E402
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


def config(args: argparse.Namespace, size: str, arm: str, root: Path):  # noqa: ANN201
    """The recipe of one arm (a RunConfig)."""
    tag = f"{size}_{arm.replace(' ', '_')}"
    overrides = [
        *SIZES[size],
        "training.steps=100000",
        "schedule.warmup_steps=2",
        f"training.log_every={args.window}",
        f"training.device={args.device}",
        "precision.dtype=bf16",
        "logging.progress=false",
        "logging.tensorboard=false",
        f"engine.name={args.engine}",
        "engine.compile=true",
        f"engine.compile_scope={args.compile_scope}",
        f"engine.compile_backend={args.backend}",
        f"run_dir={root / tag}",
    ]
    if ARMS[arm]:
        overrides.append(f"precision.fp8={{recipe: {ARMS[arm]}, small_gemms: {args.small_gemms}}}")
    overrides += [] if args.instruments else ["instruments={}"]
    overrides += [f"training.threads={args.threads}"] if args.device == "cpu" else []
    return load_config(REPO / "recipes" / "pre.yaml", overrides)


def window(trainer: Trainer, steps: int) -> tuple[float, float]:
    """(seconds per step, last loss) over `steps` trainer steps, the losses read at the end."""
    start = time.perf_counter()
    pending = []
    for _ in range(steps):
        trainer.step += 1
        pending.append(trainer._train_step(trainer.step))
    rows = to_host(pending)
    return (time.perf_counter() - start) / steps, rows[-1]["loss"]


def run(args: argparse.Namespace, size: str, arm: str, root: Path) -> dict:
    cfg = config(args, size, arm, root)
    start = time.perf_counter()
    trainer = Trainer(cfg)
    trainer._build()  # engine, model, data: what Trainer.run does before its loop
    for cb in trainer.callbacks:
        cb.on_train_start(trainer)
    warm, timed = math.ceil(args.warmup / args.window), math.ceil(args.steps / args.window)
    times = []
    for i in range(warm + timed):
        seconds, loss = window(trainer, args.window)
        if i >= warm:
            times.append(seconds)
    trainer.engine.shutdown()
    median = statistics.median(times)
    tokens_per_s = trainer.tokens_per_step / median
    mfu = trainer.throughput.row(tokens_per_s).get("mfu")
    del trainer
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "size": size,
        "arm": arm,
        "median_s": median,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "wall_s": time.perf_counter() - start,
        "final_loss": loss,
        "steps": (warm + timed) * args.window,
    }


def table(rows: list[dict]) -> list[str]:
    lines = [f"{'size':<6}{'arm':<16}{'median s':>10}{'tokens/s':>12}{'MFU':>8}{'vs bf16':>9}"]
    for r in rows:
        base = next((b for b in rows if b["size"] == r["size"] and b["arm"] == "bf16"), None)
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        ratio = f"{base['median_s'] / r['median_s']:.2f}x" if base else "-"  # bf16 not measured
        lines.append(
            f"{r['size']:<6}{r['arm']:<16}{r['median_s']:>10.4f}{r['tokens_per_s']:>12,.0f}"
            f"{mfu:>8}{ratio:>9}"
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
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    p.add_argument("--steps", type=int, default=6, help="timed steps per arm")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped (compilation)")
    p.add_argument("--window", type=int, default=3, help="steps per timed window")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--engine",
        default="single",
        choices=["single", "fsdp"],
        help="fsdp: torchtitan's order and FP8 all-gather (one GPU pays for them)",
    )
    p.add_argument(
        "--compile-scope",
        default="blocks",
        choices=["blocks", "model"],
        help="engine single: compile each block (default) or the whole model",
    )
    p.add_argument(
        "--small-gemms",
        default="convert",
        choices=["convert", "skip"],
        help="precision.fp8.small_gemms: skip leaves torchao's small layers in bf16",
    )
    p.add_argument(
        "--instruments", action="store_true", help="keep the recipe's stability instruments on"
    )
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the table of rows written before (by --json) and run nothing",
    )
    args = p.parse_args()  # fmt: skip
    if args.from_json:
        print("\n".join(table(saved_rows(args.from_json))))
        return
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            for arm in args.arms:
                r = run(args, size, arm, Path(tmp))
                rows.append(r)
                mfu = f"MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else "MFU -"
                # each arm's numbers as soon as it ends: gpu_check.sh caps this part's time
                print(f"done: {size} {arm} in {r['wall_s']:.0f} s: {r['median_s']:.4f} s/step, "
                      f"{r['tokens_per_s']:,.0f} tokens/s, {mfu}, loss {r['final_loss']:.3f}",
                      flush=True)  # fmt: skip
                if args.json:
                    write_json(args, rows)
    print(f"bench_fp8: {args.device}, engine {args.engine} ({args.compile_scope}), backend "
          f"{args.backend}, instruments {'on' if args.instruments else 'off'}, small_gemms "
          f"{args.small_gemms}, {args.steps} steps after {args.warmup}; vs bf16: bf16's median "
          "step time over the arm's")  # fmt: skip
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
