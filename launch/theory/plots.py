"""Figures and Markdown of `normlab theory` (the measurements live in launch.theory.measure)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from normlab.launch.theory.checks import (  # noqa: E402
    BOOT_REPS,
    MIN_SEEDS,
    Check,
    check_table,
)
from normlab.launch.theory.measure import (  # noqa: E402
    TheoryResult,
    ffn_gain,
    lemma2_prediction,
)

STYLE = {
    "post": dict(color="tab:red", marker="o", linestyle="-", label="Post-LN"),
    "pre": dict(color="tab:blue", marker="s", linestyle="--", label="Pre-LN"),
}


def caption(res: TheoryResult) -> str:
    s = res.setup
    return (
        f"at initialisation: d {s.d_model}, d_ff {s.d_ff}, ReLU MLP, LayerNorm, Xavier init, "
        f"W_Q = W_K = 0; random tokens, batch {s.batch_size} x {s.seq_len}; mean +- sd over "
        f"{s.seeds} seeds"
    )


def _errorbar(ax: plt.Axes, xs: np.ndarray, values: np.ndarray, placement: str) -> None:
    ax.errorbar(xs, values.mean(0), yerr=values.std(0), capsize=3, **STYLE[placement])


def lemma2_plot(res: TheoryResult, path: Path) -> Path:
    s = res.setup
    layers = np.arange(1, res.lemma2["pre"].shape[1] + 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in ("post", "pre"):
        _errorbar(ax, layers, res.lemma2[p], p)
    post = lemma2_prediction("post", 1, s.d_ff_mult)[0]
    ax.axhline(post, color="tab:red", linestyle=":", label=f"Post-LN prediction {post:.3g}")
    bounds = [lemma2_prediction("pre", int(layer), s.d_ff_mult) for layer in layers]
    lo, hi = zip(*bounds, strict=True)
    ax.fill_between(layers, lo, hi, color="tab:blue", alpha=0.12, label="Pre-LN bounds")
    c = ffn_gain(s.d_ff_mult)
    ax.plot(layers, lo, color="tab:blue", linestyle=":", linewidth=1)
    ax.plot(layers, hi, color="tab:blue", linestyle=":", linewidth=1)
    ax.set(
        xlabel="block l",
        ylabel=r"$E\,\|x_l\|^2 / d$ (before the closing norm)",
        title=f"Lemma 2: stream energy by depth (Pre-LN bounds 1+{c:.3g}l .. 1+{1 + c:.3g}l)",
    )
    return _save(fig, ax, res, path)


def theorem1_plot(res: TheoryResult, path: Path) -> Path:
    depths = np.asarray(res.setup.depths, float)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in ("post", "pre"):
        _errorbar(ax, depths, res.theorem1[p], p)
    anchor = res.theorem1["pre"].mean(0)[0]
    ref = anchor * np.sqrt(depths[0] / depths)
    ax.plot(
        depths, ref, color="gray", linestyle=":", label=r"$\propto 1/\sqrt{L}$ (through Pre-LN)"
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(depths, [str(int(d)) for d in depths])
    ax.set(
        xlabel="number of blocks L",
        ylabel=r"$\|\partial \mathcal{L} / \partial W_2\|_F$ of the last block's MLP",
        title="Theorem 1: last-MLP gradient against depth",
    )
    return _save(fig, ax, res, path)


def profile_plot(res: TheoryResult, path: Path) -> Path:
    layers = np.arange(1, res.profile["pre"].shape[1] + 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in ("post", "pre"):
        _errorbar(ax, layers, res.profile[p], p)
    ax.set_ylim(bottom=0)
    ax.set(
        xlabel="block l",
        ylabel=r"$\|\partial \mathcal{L} / \partial W_2\|_F$ of block l's MLP",
        title=f"Figure 3: per-layer gradient, L = {len(layers)}",
    )
    return _save(fig, ax, res, path)


def _save(fig: plt.Figure, ax: plt.Axes, res: TheoryResult, path: Path) -> Path:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.text(0.01, 0.01, textwrap.fill(caption(res), 130), fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(res: TheoryResult, out: Path) -> list[Path]:
    return [
        lemma2_plot(res, out / "lemma2_stream_energy.png"),
        theorem1_plot(res, out / "theorem1_last_mlp_grad.png"),
        profile_plot(res, out / "figure3_grad_profile.png"),
    ]


def _ms(values: np.ndarray) -> list[str]:
    return [f"{m:.3g} +- {sd:.2g}" for m, sd in zip(values.mean(0), values.std(0), strict=True)]


def markdown(
    res: TheoryResult,
    found: list[Check],
    pngs: list[Path],
    seconds: float,
    cpu: float | None = None,
    command: str = "normlab theory",
) -> str:
    s = res.setup
    took = f"{seconds:.1f} s wall" + (f", {cpu:.1f} s CPU" if cpu is not None else "")
    lines = [
        "# Xiong et al. (2020) at initialisation, measured",
        "",
        f"Setting: {caption(res)}. Command: `{command}` ({took}).",
        "",
        *check_table(found),
        "",
        f"Each verdict over the {s.seeds} seeds: the statistic of the mean over seeds and its 95 % "
        f"bootstrap interval ({BOOT_REPS} resamples of the seeds); 'held' when the interval "
        "clears the rule's boundary, 'NO' when it lies wholly on the wrong side, 'undecided' "
        f"when it straddles it (more seeds decide it) or with fewer than {MIN_SEEDS} seeds.",
        "",
        f"Lemma 2, E||x_l||^2 / d by block (L = {s.lemma_depth}):",
        "",
        "| block | Post-LN | Post-LN prediction | Pre-LN | Pre-LN bounds |",
        "|---:|---:|---:|---:|---:|",
    ]
    post, pre = _ms(res.lemma2["post"]), _ms(res.lemma2["pre"])
    for i, (a, b) in enumerate(zip(post, pre, strict=True), 1):
        lo, hi = lemma2_prediction("pre", i, s.d_ff_mult)
        pred = lemma2_prediction("post", i, s.d_ff_mult)[0]
        lines.append(f"| {i} | {a} | {pred:.3g} | {b} | {lo:.3g} .. {hi:.3g} |")
    lines += ["", "Theorem 1, gradient norm of the last block's MLP output weight:", ""]
    lines += ["| L | Post-LN | Pre-LN | Pre/Post |", "|---:|---:|---:|---:|"]
    ratio = res.theorem1["pre"].mean(0) / res.theorem1["post"].mean(0)
    rows = zip(s.depths, _ms(res.theorem1["post"]), _ms(res.theorem1["pre"]), ratio, strict=True)
    lines += [f"| {n} | {a} | {b} | {r:.3f} |" for n, a, b, r in rows]
    lines += [
        "",
        f"Figure 3, per-layer gradient norm of each MLP output weight (L = {s.profile_depth}):",
        "",
    ]
    lines += ["| block | Post-LN | Pre-LN |", "|---:|---:|---:|"]
    rows2 = zip(_ms(res.profile["post"]), _ms(res.profile["pre"]), strict=True)
    lines += [f"| {i} | {a} | {b} |" for i, (a, b) in enumerate(rows2, 1)]
    lines += ["", *(f"![{p.stem}]({p.name})" for p in pngs), ""]
    return "\n".join(lines)
