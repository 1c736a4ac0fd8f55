"""The documentation site (mkdocs.yml, docs/): the generated pages are what docs/gen_reference.py
writes now (regenerate with `python docs/gen_reference.py`), every recipe key has a meaning, and
`mkdocs build --strict` builds the site without a warning."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def generator(name: str = "gen_reference") -> ModuleType:
    """A generator script of docs/ (gen_reference, gen_quickstart_sweep) as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "docs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current() -> None:
    gen = generator()
    for path, text in gen.pages().items():
        if path.name == "commands.md" and f"Python {gen.PYTHON} -->" not in path.read_text():
            continue  # argparse lays help out differently on another Python: see the next test
        assert path.exists() and path.read_text() == text, (
            f"{path.relative_to(REPO)} is stale: run python docs/gen_reference.py"
        )


def test_every_recipe_key_has_type_default_and_meaning() -> None:
    keys = generator().recipe_keys()
    names = [k.name for k in keys]
    assert len(names) == len(set(names))
    for must in ("model.placement", "engine.grad_sync", "optim.qk_clip.tau", "checkpoint.async",
                 "data.sources[].weight", "instruments.spike_policy.max_bad_steps"):  # fmt: skip
        assert must in names
    missing = [k.name for k in keys if not k.meaning]
    assert not missing, f"give these fields a trailing # comment (their meaning): {missing}"
    by_name = {k.name: k for k in keys}
    assert by_name["engine.grad_sync"].allowed == "`micro_batch`, `step`"
    assert by_name["engine.grad_sync"].default == "micro_batch"
    assert by_name["model.placement"].default == "pre"
    assert "`ln_scaling`" in by_name["model.placement"].allowed


def test_every_command_has_its_help_on_the_commands_page() -> None:
    from normlab.launch.cli import build_parser

    page = (REPO / "docs" / "reference" / "commands.md").read_text()
    parser = build_parser()
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            assert f"## `normlab {name}`" in page
            section = page.split(f"## `normlab {name}`", 1)[1].split("\n## ", 1)[0]
            for option in sub._actions:
                for flag in option.option_strings:
                    assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section), (
                        name,
                        flag,
                    )


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (pip install -e '.[docs]')",
)
def test_site_builds_without_warnings(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "recipe_keys" / "index.html").exists()


def readme_or_draft() -> str:
    """The README (its 'What it finds' quotes the committed studies)."""
    return (REPO / "README.md").read_text()


def test_readme_numbers_are_the_committed_data() -> None:
    """The three numbers of the README's 'What it finds', recomputed from the committed study
    outputs (docs/study/lr12, docs/study/wortsman)."""
    import csv
    from collections import defaultdict

    text = " ".join(readme_or_draft().split("## What it finds", 1)[1].split())
    study = REPO / "docs" / "study"
    runs = list(csv.DictReader((study / "lr12" / "compare.csv").open()))
    for recipe in ("post_nowarmup", "post_warmup"):
        seeds = [
            float(r["eval_loss"]) for r in runs if r["recipe"] == recipe and r["lr"] == "0.001"
        ]
        assert len(seeds) == 4 and ", ".join(f"{v:.3f}" for v in seeds) in text, recipe
    curves = {r["recipe"]: r for r in csv.DictReader((study / "lr12" / "sensitivity.csv").open())}
    assert f"against {float(curves['pre_nowarmup']['plateau']):.3f}" in text
    for recipe in ("pre_nowarmup", "post_warmup", "deepnorm_warmup", "post_nowarmup"):
        assert f"{float(curves[recipe]['lr_sensitivity']):.3f}" in text, recipe
    logits = defaultdict(list)
    for r in csv.DictReader((study / "wortsman" / "compare.csv").open()):
        logits[(r["recipe"], float(r["lr"]))].append(float(r["max_logit"]))
    mean = {k: sum(v) / len(v) for k, v in logits.items()}
    assert (
        f"from {mean[('pre', 3e-4)]:.1f} at lr 3e-4 to {mean[('pre', 0.3)]:,.0f} at lr 0.3" in text
    )
    qk = [v for (recipe, _), v in mean.items() if recipe == "pre_qknorm_head"]
    assert f"between {min(qk):.0f} and {max(qk):.0f}" in text


def test_findings_show_each_verdict_with_its_seeds(tmp_path: Path, monkeypatch) -> None:
    """A verdicts.json that `normlab verdicts` writes under docs/ shows on the findings page:
    every claim with its seeds, and the undecided ones with the seeds they would need."""
    import json

    from normlab.launch.verdicts.report import run_verdicts

    gen = generator()
    docs = tmp_path / "docs"
    run_verdicts(REPO / "docs/study/lr12/compare.csv", plateau=6.258, out=docs / "lr12")
    monkeypatch.setattr(gen, "DOCS", docs)
    page = gen.findings_page()
    rows = json.loads((docs / "lr12" / "verdicts.json").read_text())
    table = [line for line in page.splitlines() if line.startswith("| post_nowarmup | post_warmup")]
    assert len(table) == sum(v["a"] == "post_nowarmup" and v["b"] == "post_warmup" for v in rows)
    assert all("| 4/4 |" in line for line in table)
    undecided = [v for v in rows if v["verdict"] == "inconclusive"]
    assert f"Not yet decided ({len(undecided)} of {len(rows)}):" in page
    assert "seeds per arm for 80% power" in page


def test_quickstart_sweep_tables_are_what_the_runs_gave() -> None:
    """docs/quickstart_sweep.md's tables and findings are rendered from the runs' results.json
    (written by `python docs/gen_quickstart_sweep.py --runs DIR` from `normlab quickstart`)."""
    sweep = generator("gen_quickstart_sweep")
    data = json.loads(sweep.RESULTS.read_text())
    text = sweep.PAGE.read_text()
    assert text.count("<!-- normlab:quickstart-sweep ") == 3
    assert sweep.render_page(text, data) == text, "stale: run python docs/gen_quickstart_sweep.py"
    runs = data["runs"]
    assert {r["recipe"] for r in runs} == set(sweep.RECIPES) and len(runs) >= 3 * 4
    assert all(r["status"] == "completed" for r in runs), [r["status"] for r in runs]
    # the numbers in a rendered row are the file's, rounded as shown
    row = sweep.per_seed(data)[2]
    assert f"| {runs[0]['eval']['250']:.3f} |" in row


def test_early_warning_page_is_what_normlab_warnings_gives_on_the_packed_sweep() -> None:
    """docs/early_warning.md's blocks and docs/warnings/divergence/warnings.{md,json} are what
    `normlab warnings` writes for the divergence sweep's packed runs (gen_warnings --check), and
    the sweep meets issue 32 item 3: at least 20 events over at least 4 seeds, healthy runs of
    the same recipe beside them."""
    gen = generator("gen_warnings")
    assert gen.main(["--check"]) == 0, "stale: run python docs/gen_warnings.py"
    records = gen.read_bundle()
    events = [r for r in records if r["summary"].get("events")]
    assert len(events) >= 20 and len({r["config"]["training"]["seed"] for r in events}) >= 4
    assert len(records) > len(events)  # the healthy class
    assert {r["config"]["model"]["placement"] for r in records} == {"pre"}
    page = gen.PAGE.read_text()
    assert page.count("<!-- normlab:warnings ") == 6


def test_the_action_study_runs_the_tuned_levels_and_follows_its_twins() -> None:
    """Issue 32 item 6 on the committed action study: its levels are the ones `normlab warnings`
    tuned (to three digits), and each protected run is its unprotected twin in the sweep step for
    step until its first alarm, so "fired before the event" may be read against the twin."""
    import math

    import yaml

    gen = generator("gen_warnings")
    tuned = {
        r["signal"]: r["level"]
        for r in json.loads((gen.OUT / "warnings.json").read_text())["signals"]
    }
    study = yaml.safe_load((REPO / "recipes" / "studies" / "divergence_actions.yaml").read_text())
    ew = study["set"]["instruments.early_warning"]
    assert ew["k"] == 50 and set(ew["signals"]) == set(ew["levels"])
    for signal, level in ew["levels"].items():
        assert float(f"{tuned[signal]:.3g}") == level, signal
    twins = {
        (r["config"]["optim"]["lr"], r["config"]["training"]["seed"]): r for r in gen.read_bundle()
    }
    protected = gen.read_bundle(gen.ACTIONS_BUNDLE)
    assert {r["config"]["training"]["seed"] for r in protected} == {2, 3, 4, 5}  # held out
    for r in protected:
        twin = twins[(r["config"]["optim"]["lr"], r["config"]["training"]["seed"])]
        rows = [m for m in r["metrics"] if "loss" in m]
        alarmed = [m["step"] for m in rows if m.get("early_warning/alarms", 0) > 0]
        until = alarmed[0] if alarmed else math.inf
        mine = [m["loss"] for m in rows if m["step"] <= until]
        theirs = [m["loss"] for m in twin["metrics"] if "loss" in m and m["step"] <= until]
        n = min(len(mine), len(theirs))
        assert n > 0 and mine[:n] == theirs[:n], r["name"]
    # the words under the table quote its "all" rows
    page = gen.PAGE.read_text()
    for action in ("backoff", "rollback"):
        row = next(x for x in page.splitlines() if x.startswith(f"| all | {action} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        fired, saved = cells[4].split(" ")[0], cells[5].split(" ")[0]
        n_fired, n_events = fired.split("/")
        assert f"On {n_fired} of the {n_events} twin events" in page
        word = "Back-off" if action == "backoff" else "rollback"
        assert f"{word} saved {saved.replace('/', ' of the ')}" in page.replace("\n  ", " ")


def test_fp8_guide_quotes_the_saved_gpu_rows() -> None:
    """The H200 table in the FP8 guide is what bench_fp8.py --from-json prints from the saved
    rows of that run (benchmarks/results/gpu_h200_2026-12-04)."""
    saved = REPO / "benchmarks" / "results" / "gpu_h200_2026-12-04"
    printed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_fp8.py"), "--from-json",
         str(saved / "fp8_125m.json"), str(saved / "fp8_1b.json")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert printed.startswith("size  arm") and len(printed.splitlines()) == 6
    page = (REPO / "docs" / "guides" / "fp8.md").read_text()
    block = page.split("<!-- normlab:fp8-h200 -->\n```\n", 1)[1].split("\n```", 1)[0]
    assert block == printed
    assert printed in (saved / "README.md").read_text()


def test_instruments_guide_quotes_the_saved_overhead_run() -> None:
    """The overhead block of the instruments guide is what bench_instruments.py --from-json
    prints from the saved idle run, and the words under it quote that run's numbers."""
    saved = REPO / "benchmarks" / "results" / "bench_instruments_idle_2026-12-07.json"
    printed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_instruments.py"), "--from-json",
         str(saved)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    page = (REPO / "docs" / "guides" / "instruments.md").read_text()
    block = page.split("<!-- normlab:instruments-overhead -->\n```\n", 1)[1].split("\n```", 1)[0]
    assert block == printed
    (row,) = json.loads(saved.read_text())["rows"]
    lo, hi = row["cpu_overhead_ci95_pct"]
    words = " ".join(page.split())
    assert f"{row['cpu_overhead_pct']:.1f} % (95 % interval {lo:+.1f} to {hi:+.1f} %" in words
