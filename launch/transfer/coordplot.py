"""The coordinate-check figure, as the mup package draws it: one panel per step t, mean |x| per
coordinate against width (or depth) on log-log axes, one line per layer class; the last panel is
the change since t = 1 at t = k (the quantity the training checks decide)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from normlab.launch.transfer.coordcheck import CoordResult, slope  # noqa: E402

MAX_PANELS = 5


def shown_steps(steps: int) -> list[int]:
    """t = 1, 2 and k, with evenly spaced steps between, at most MAX_PANELS."""
    if steps <= MAX_PANELS:
        return list(range(1, steps + 1))
    inner = [round(2 + i * (steps - 2) / (MAX_PANELS - 2)) for i in range(1, MAX_PANELS - 2)]
    return sorted({1, 2, *inner, steps})


def plot_coords(res: CoordResult, path: Path, title: str) -> Path:
    steps = shown_steps(res.setup.steps)
    panels = [("level", t) for t in steps] + [("change", res.setup.steps)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), sharey=True)
    sizes = res.setup.sizes
    for ax, (quantity, t) in zip(axes, panels, strict=True):
        store = res.level if quantity == "level" else res.change
        for klass in res.classes:
            row = store[klass][t - 1]
            s = slope(sizes, row)
            ax.plot(sizes, row, marker="o", label=f"{klass} ({s:+.2f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"t = {t}" if quantity == "level" else f"|x_t - x_1| at t = {t}")
        ax.set_xlabel(res.setup.axis)
        ax.legend(fontsize=6, title="class (slope)", title_fontsize=6)
    axes[0].set_ylabel("mean |x| per coordinate")
    reason = res.reason()
    fig.suptitle(
        f"{title}: coordinate check over {res.setup.axis}: {res.outcome}\n{reason[:160]}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
