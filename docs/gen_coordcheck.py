"""The coordinate checks quoted in docs/transfer.md, run by the command itself (no copied value).

    python docs/gen_coordcheck.py            # run every committed check, write docs/coordcheck/
    python docs/gen_coordcheck.py --page     # only rewrite transfer.md's block from the JSON
    python docs/gen_coordcheck.py --check    # exit 1 when transfer.md's block is stale

Each entry of COMMITTED is one `normlab coordcheck` command line (its default steps, seeds, lr
and negative controls); its report goes to docs/coordcheck/NAME/ (coordcheck.json and the plot),
and transfer.md's block between `<!-- normlab:coordcheck -->` and `<!-- /normlab:coordcheck -->`
is a table built from those JSON files alone. tests/launch/transfer/test_coordcheck.py holds the
block to the JSON and (slow) reruns each command.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
OUT = DOCS / "coordcheck"
PAGE = DOCS / "transfer.md"
BLOCK = re.compile(r"(<!-- normlab:coordcheck -->\n)(.*?)(<!-- /normlab:coordcheck -->)", re.S)

CP_DEPTH = ["model.parametrization=completep", "model.base_d_model=128", "model.base_n_layers=2"]
COMMITTED: dict[str, list[str]] = {
    "pre_mup": ["pre", "model.parametrization=mup", "model.base_d_model=64"],
    "pre_completep_width": [
        "pre", "model.parametrization=completep", "model.base_d_model=64", "model.base_n_layers=2",
    ],
    "pre_completep": ["pre", *CP_DEPTH, "--depths", "2,4,8,16"],
    "pre_depth_mup": ["pre", *CP_DEPTH, "model.completep_alpha=0.5", "--depths", "2,4,8,16"],
    "peri_completep": ["peri", *CP_DEPTH, "--depths", "2,4,8,16"],
    "olmo2_completep": ["olmo2", *CP_DEPTH, "--depths", "2,4,8,16"],
}  # fmt: skip


def committed(name: str) -> dict[str, Any]:
    """The one check of a committed report (docs/coordcheck/NAME/coordcheck.json)."""
    (check,) = json.loads((OUT / name / "coordcheck.json").read_text())["checks"]
    return check


def cell(iv: dict[str, float]) -> str:
    return f"{iv['mean']:+.2f} [{iv['lo']:+.2f}, {iv['hi']:+.2f}]"


def deciding(check: dict[str, Any]) -> dict[str, Any]:
    """The slope farthest from its exponent: the one that came nearest to failing."""
    return max(check["checks"], key=lambda c: abs(c["fit"]["mean"] - c["exponent"]))


def caught_by(control: dict[str, Any]) -> str:
    """'sp (attn level t=1: +1.16 [+1.14, +1.18])': the control's farthest failing slope."""
    failed = [c for c in control["checks"] if c["outcome"] == "fail"] or control["checks"]
    worst = max(failed, key=lambda c: abs(c["fit"]["mean"] - c["exponent"]))
    return f"{worst['class']} {worst['quantity']} t={worst['t']}: {cell(worst['fit'])}"


def row(name: str, check: dict[str, Any]) -> str:
    worst = deciding(check)
    controls = "; ".join(
        f"{key} {'caught' if c['caught'] else 'NOT caught'} ({caught_by(c)})"
        for key, c in check["controls"].items()
    )
    return (
        f"| `{' '.join(COMMITTED[name])}` | {check['verdict']} | {worst['class']} "
        f"{worst['quantity']} t={worst['t']}: {cell(worst['fit'])} (e {worst['exponent']:+.2f}) "
        f"| {controls} |"
    )


def error_bound(checks: list[dict[str, Any]]) -> tuple[float, float]:
    """(largest per-seed SD of a slope, the error rate it gives): a slope whose true value is e
    fails, or one whose true value is e ± 0.5 passes, only when the t statistic of its mean
    exceeds 0.25 sqrt(n) / s + t_0.975 (docs/SCIENCE.md, the coordinate check's band)."""
    from scipy import stats

    worst_s, worst_p = 0.0, 0.0
    for c in checks:
        iv = c["fit"]
        n = iv["n"]
        crit = float(stats.t.ppf(0.975, n - 1))
        sd = (iv["hi"] - iv["mean"]) * n**0.5 / crit
        p = float(stats.t.sf(0.25 * n**0.5 / sd + crit, n - 1)) if sd > 0 else 0.0
        worst_s, worst_p = max(worst_s, sd), max(worst_p, p)
    return worst_s, worst_p


def block() -> str:
    """The table transfer.md quotes, from the committed JSON alone."""
    lines = [
        "| command (`normlab coordcheck ...`, defaults otherwise) | verdict | the slope farthest "
        "from its exponent e: mean [95 % interval] | negative controls (their farthest slope) |",
        "|---|---|---|---|",
        *(row(name, committed(name)) for name in COMMITTED),
    ]
    first = committed(next(iter(COMMITTED)))
    sd, p = error_bound([c for name in COMMITTED for c in committed(name)["checks"]])
    lines += [
        "",
        f"Each: {first['seeds']} seeds, {first['steps']} steps, batch {first['batch']} x "
        f"{first['seq_len']} tokens, AdamW at the recipe's `optim.lr` ({first['lr']:g}); band "
        "e ± 0.25 per doubling. Reports: [docs/coordcheck/](coordcheck/pre_mup/coordcheck.json).",
        f"The largest per-seed SD of any slope above is {sd:.3f}; at that spread a correct "
        f"slope fails, or a mistake of 0.5 passes, with probability at most {p:.1e} per check "
        "(the band's error rate, docs/SCIENCE.md).",
        "",
    ]
    return "\n".join(lines)


def render_page(text: str) -> str:
    if not BLOCK.search(text):
        raise SystemExit(f"{PAGE} has no <!-- normlab:coordcheck --> block")
    return BLOCK.sub(lambda m: m.group(1) + block() + m.group(3), text, count=1)


def run_all() -> None:
    for name, argv in COMMITTED.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / name
            cmd = [sys.executable, "-m", "normlab.launch.cli", "coordcheck", *argv]
            proc = subprocess.run([*cmd, "--out", str(out)], text=True, capture_output=True)
            print(proc.stdout.splitlines()[0] if proc.stdout else proc.stderr[-500:])
            if proc.returncode not in (0, 1, 3):
                raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
            shutil.rmtree(OUT / name, ignore_errors=True)
            shutil.copytree(out, OUT / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--page", action="store_true", help="only rewrite transfer.md's block")
    ap.add_argument("--check", action="store_true", help="exit 1 when the block is stale")
    args = ap.parse_args()
    text = PAGE.read_text()
    if args.check:
        stale = render_page(text) != text
        print("transfer.md: stale" if stale else "transfer.md: up to date")
        return int(stale)
    if not args.page:
        run_all()
    PAGE.write_text(render_page(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
