"""The "analyse runs from another trainer" guide's worked example (docs/guides/external_runs.md).

    python docs/gen_external.py           # write the histories, run the tool, fill the page
    python docs/gen_external.py --check   # exit 1 when the page or a figure's table differs

Four committed normlab runs of the divergence sweep (docs/warnings/divergence/runs.jsonl.gz: one
stable rate, three that diverge) are written as other trainers write their logs, each in that
stack's metric names (launch/histories/sources.py): torchtitan's and Megatron-LM's TensorBoard
tags with torch's SummaryWriter, OLMo-core's keys as JSON lines, plain columns as CSV. `normlab
compare` (launch.report.compare, through the same readers as the command) reads them; the page's
blocks between `<!-- normlab:external NAME -->` and `<!-- /normlab:external -->` hold the mapping
table and what the tool printed, and docs/external/ its loss figure. tests/launch/histories/
test_external_guide.py fails when they differ from what the tool gives now.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
BUNDLE = DOCS / "warnings" / "divergence" / "runs.jsonl.gz"
PAGE = DOCS / "guides" / "external_runs.md"
FIGURES = DOCS / "external"
BLOCK = re.compile(r"(<!-- normlab:external (\S+) -->\n)(.*?)(<!-- /normlab:external -->)", re.S)
# run of the sweep -> (file or folder written, how, the source's names)
EXAMPLE = {
    "pre_fp16_noclamp_lr0.01_s0": ("titan_lr0.01", "tensorboard", "torchtitan"),
    "pre_fp16_noclamp_lr0.04_s0": ("megatron_lr0.04", "tensorboard", "megatron"),
    "pre_fp16_noclamp_lr0.05_s1": ("olmo_lr0.05.jsonl", "jsonl", "olmo-core"),
    "pre_fp16_noclamp_lr0.07_s3": ("plain_lr0.07.csv", "csv", "plain"),
}
METRICS = ("loss", "grad_norm", "lr")


def records() -> dict[str, dict[str, Any]]:
    with gzip.open(BUNDLE, "rt") as fh:
        found = (json.loads(line) for line in fh if line.strip())
        return {r["name"]: r for r in found if r["name"] in EXAMPLE}


def names(source: str) -> dict[str, str]:
    """normlab metric -> the name `source` logs it under (its first spelling; torchtitan's
    `lr/<optimizer class>` for AdamW)."""
    from normlab.launch.histories.sources import SOURCES

    return {m: SOURCES[source][m][0].replace("lr/*", "lr/AdamW") for m in METRICS}


def write_histories(root: Path) -> list[Path]:
    """Each example run written as its trainer would: the paths to give normlab."""
    from torch.utils.tensorboard import SummaryWriter

    out = []
    runs = records()
    for run, (name, how, source) in EXAMPLE.items():
        tags = names(source)
        rows = [r for r in runs[run]["metrics"] if "loss" in r]
        path = root / name
        if how == "tensorboard":
            writer = SummaryWriter(str(path))
            for r in rows:
                for key, tag in tags.items():
                    writer.add_scalar(tag, float(r[key]), int(r["step"]))
            writer.close()
        elif how == "jsonl":
            path.write_text(
                "".join(
                    json.dumps({"step": r["step"], **{t: float(r[k]) for k, t in tags.items()}})
                    + "\n"
                    for r in rows
                )
            )
        else:
            with path.open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["step", *tags.values()])
                w.writerows([[r["step"], *(r[k] for k in tags)] for r in rows])
        out.append(path)
    return out


def mapping_table() -> str:
    from normlab.launch.histories.sources import SOURCES, STEP_COLUMNS

    metrics = sorted({m for names in SOURCES.values() for m in names}, key=_order)
    lines = ["| normlab | " + " | ".join(SOURCES) + " |", "|---|" + "---|" * len(SOURCES)]
    for m in metrics:
        cells = [", ".join(f"`{n}`" for n in SOURCES[s].get(m, ())) or "-" for s in SOURCES]
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    steps = ", ".join(f"`{c}`" for c in STEP_COLUMNS)
    lines += ["", f"The step of a JSONL or CSV history is the first column of {steps} it has."]
    return "\n".join(lines) + "\n"


def _order(metric: str) -> int:
    return ("loss", "grad_norm", "lr", "eval_loss", "init_loss").index(metric)


COLUMNS = {
    "run": "run", "engine": "read as", "status": "status", "events": "events", "steps": "steps",
    "min_loss": "min loss", "spike_loss": "loss spike %", "spike_grad": "grad spike %",
    "spike_window": "window", "grad_max": "max grad norm",
}  # fmt: skip


def run_compare(root: Path, out: Path) -> None:
    """`normlab compare --fp16 ...` on the written histories, through the command's readers."""
    from normlab.launch.histories.load import compare_inputs
    from normlab.launch.histories.options import HistoryOptions
    from normlab.launch.report.compare import compare
    from rich.console import Console

    paths = write_histories(root)
    console = Console(file=open(os.devnull, "w"), width=200)  # noqa: SIM115
    compare(compare_inputs(paths, HistoryOptions(fp16=True)), out, console=console)


def blocks(out: Path) -> dict[str, str]:
    """The page's generated blocks from what compare wrote into `out`."""
    rows = list(csv.DictReader((out / "compare.csv").open()))
    table = ["| " + " | ".join(COLUMNS.values()) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(_cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    compare_md = (out / "compare.md").read_text()
    card = compare_md.split("## Spike report card\n\n", 1)[1].split("\n\n", 1)[0]
    files = " ".join(v[0] for v in EXAMPLE.values())
    return {
        "mapping": mapping_table(),
        "commands": f"```\nnormlab compare {files} --fp16 --out compare\n```\n",
        "table": "\n".join(table) + "\n",
        "card": card.strip() + "\n",
    }


def _cell(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text or "-"
    return f"{value:.4g}" if value != int(value) else f"{int(value)}"


def render(page: str, found: dict[str, str]) -> str:
    def fill(m: re.Match[str]) -> str:
        return m.group(1) + found[m.group(2)] + m.group(4)

    return BLOCK.sub(fill, page)


def generate(tmp: Path) -> tuple[dict[str, str], Path]:
    out = tmp / "compare"
    run_compare(tmp, out)
    return blocks(out), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        found, out = generate(Path(tmp))
        page = render(PAGE.read_text(), found)
        if args.check:
            if page != PAGE.read_text():
                print(f"stale: {PAGE.relative_to(DOCS)} (run python docs/gen_external.py)",
                      file=sys.stderr)  # fmt: skip
                return 1
            return 0
        FIGURES.mkdir(exist_ok=True)
        shutil.copy(out / "loss.png", FIGURES / "loss.png")
        shutil.copy(out / "grad_norm.png", FIGURES / "grad_norm.png")
        PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
