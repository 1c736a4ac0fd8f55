"""`normlab compare --plateau X`: loss.png draws the plateau and marks the runs that did not
train (the figure's Line2D objects, caught before it is saved); a non-finite plateau is one
line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.report import plots


def fake_run(path: Path, lr: float, final: float, status: str = "completed") -> Path:
    """A run directory as the trainer leaves it: config.yaml, metrics.jsonl, summary.json."""
    path.mkdir(parents=True)
    config = {"name": path.name, "optim": {"lr": lr}, "training": {"seed": 0, "steps": 4},
              "data": {"dataset": "tiny"}, "model": {"n_layers": 2}}  # fmt: skip
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": s, "loss": 7.0 - (7.0 - final) * s / 4} for s in range(1, 5)]
    rows.append({"step": 4, "eval_loss": final})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"status": status, "steps": 4}))
    return path


def test_compare_plateau_draws_the_line_and_marks_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved: dict[str, list[tuple[str, float | None]]] = {}
    real = plots.save

    def catch(fig: plt.Figure | None, path: Path) -> Path | None:
        if fig is not None and path.name == "loss.png":
            ax = fig.axes[0]
            saved["lines"] = [
                (str(x.get_label()), float(x.get_ydata()[0]) if len(x.get_ydata()) else None)
                for x in ax.get_lines()
            ]
        return real(fig, path)

    monkeypatch.setattr(plots, "save", catch)
    good = fake_run(tmp_path / "pre", 1e-3, 5.0)
    stalled = fake_run(tmp_path / "post", 1e-3, 6.1)
    out = tmp_path / "out"
    assert main(["compare", str(good), str(stalled), "--out", str(out), "--plateau", "6.25"]) == 0
    assert (out / "loss.png").is_file()
    labels = dict(saved["lines"])
    assert labels["unigram plateau 6.250"] == 6.25
    assert labels["trained below: plateau - 0.2"] == pytest.approx(6.05)
    assert "pre" in labels and "post (did not train)" in labels  # 6.1 > 6.25 - 0.2
    assert (
        "**did not train (last eval loss not <= unigram plateau 6.250 - 0.2, or the run did not "
        "complete): post**" in (out / "compare.md").read_text()
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_bad_plateau_is_one_line(value: str, tmp_path: Path, capsys: pytest.CaptureFixture):
    run = fake_run(tmp_path / "pre", 1e-3, 5.0)
    assert main(["compare", str(run), "--out", str(tmp_path / "o"), f"--plateau={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--plateau must be a positive finite loss" in err
