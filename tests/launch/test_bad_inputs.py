"""Issue 47, items 2 and 6: every file a user supplies or a run wrote is read through one reader per
kind, which refuses damage with one line naming the file and what was expected (exit 2), and a
refused command leaves every file as it was.

Built for the class, not for examples: each file kind is a valid file plus the command that reads
it; each damage kind is a generic edit of that file (bytes that are not UTF-8, an entry given
twice, a negative loss, a non-integer step or count, a string where a number goes, a file cut
short mid-token). The test runs every (kind, damage) pair that the kind can carry, through the CLI
in-process, and hashes every file under the test's folder before and after.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.config.paths import saved_form

from tests.conftest import REPO
from tests.launch.verdicts.tables import rows_of, write_table

WORTSMAN = REPO / "docs" / "study" / "wortsman"
STUDY_FILE = REPO / "recipes" / "studies" / "wortsman.yaml"

# what each damage kind's message must say was expected (one of these, case-insensitive)
EXPECTED = {
    "not_utf8": r"UTF-8",
    "duplicate": r"twice|repeats|duplicate",
    "negative_loss": r">= 0|> 0|non-negative|below 0|positive",  # a loss, an l0 or a rate
    "non_integer_step": r"integer|int >= 0|whole number|step number|step count",
    "string_for_number": r"number|integer|int|float",
    "truncated": r"JSON|YAML|expected|not CSV|fields|could not find|is needed",
}


def hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def replace_once(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data, (path, old)
    path.write_bytes(data.replace(old, new, 1))


def cut_mid_token(path: Path, token: bytes) -> None:
    """Cut the file inside the last occurrence of `token` (a key or a number)."""
    data = path.read_bytes()
    at = data.rindex(token) + len(token) // 2
    path.write_bytes(data[:at])


@dataclass
class Kind:
    """A file kind: `make(root)` writes a valid one and returns (the file, the CLI args that read
    it); `damage` maps a damage kind to the edit that applies it."""

    make: Callable[[Path], tuple[Path, list[str]]]
    damage: dict[str, Callable[[Path], None]] = field(default_factory=dict)


# --- run directories: config.yaml, summary.json, metrics.jsonl, read by `normlab status` --------


def make_run(root: Path) -> Path:
    """A run directory as a finished run leaves it (no training: the files are what matters)."""
    run = root / "run"
    run.mkdir(parents=True)
    cfg = load_config(
        find_recipe("pre"), ["training.steps=40", f"run_dir={run}", "data.dataset=bundled"]
    )
    (run / "config.yaml").write_text(yaml.safe_dump(saved_form(cfg), sort_keys=False))
    rows = [{"step": s, "loss": 6.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3} for s in (1, 2, 3, 4)]
    rows.insert(2, {"step": 2, "eval_loss": 5.9})
    rows.append({"step": 4, "eval_loss": 5.6})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "name": "pre", "status": "completed", "steps": 4, "final_loss": 5.6, "min_loss": 5.6,
        "eval_loss": 5.6, "tokens_per_s": 1000.0, "train_s": 1.5, "tokens_per_step": 256,
        "events": [],
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return run


def run_file(name: str) -> Callable[[Path], tuple[Path, list[str]]]:
    def make(root: Path) -> tuple[Path, list[str]]:
        run = make_run(root)
        return run / name, ["status", str(run)]

    return make


def append_then_valid(extra: bytes) -> Callable[[Path], None]:
    """A bad line followed by a good one (a bad last line could be a write cut short)."""

    def damage(path: Path) -> None:
        with path.open("ab") as fh:
            fh.write(extra + b"\n" + b'{"step": 9, "loss": 1.0}\n')

    return damage


KINDS: dict[str, Kind] = {
    "summary.json": Kind(
        run_file("summary.json"),
        {
            "not_utf8": lambda p: replace_once(p, b'"pre"', b'"pr\xe9"'),
            "duplicate": lambda p: replace_once(p, b'"steps": 4,', b'"steps": 4, "steps": 5,'),
            "negative_loss": lambda p: replace_once(p, b'"final_loss": 5.6', b'"final_loss": -1'),
            "non_integer_step": lambda p: replace_once(p, b'"steps": 4', b'"steps": 3.5'),
            "string_for_number": lambda p: replace_once(p, b'"train_s": 1.5', b'"train_s": "x"'),
            "truncated": lambda p: cut_mid_token(p, b'"tokens_per_step"'),
        },
    ),
    "metrics.jsonl": Kind(
        run_file("metrics.jsonl"),
        {
            "not_utf8": append_then_valid(b'{"step": 5, "loss": 1.0, "n\xe9": 1}'),
            "duplicate": append_then_valid(b'{"step": 5, "loss": 1.0, "loss": 2.0}'),
            "negative_loss": append_then_valid(b'{"step": 5, "loss": -0.5}'),
            "non_integer_step": append_then_valid(b'{"step": 5.5, "loss": 1.0}'),
            "string_for_number": append_then_valid(b'{"step": 5, "loss": "low"}'),
            "truncated": append_then_valid(b'{"step": 5, "lo'),
        },
    ),
    "config.yaml": Kind(
        run_file("config.yaml"),
        {
            "not_utf8": lambda p: replace_once(p, b"name: pre", b"name: pr\xe9"),
            "duplicate": lambda p: p.write_bytes(p.read_bytes() + b"training:\n  steps: 9\n"),
            "non_integer_step": lambda p: replace_once(p, b"  steps: 40", b"  steps: 3.5"),
            "string_for_number": lambda p: replace_once(p, b"  lr: 0.001", b"  lr: fast"),
            "truncated": lambda p: cut_mid_token(p, b"placement"),
        },
    ),
}


def make_job_record(root: Path) -> tuple[Path, list[str]]:
    run = make_run(root)
    (run / "slurm.json").write_text(json.dumps({"jobs": [{"job_id": "12345"}]}) + "\n")
    return run / "slurm.json", ["status", str(run)]


def make_plan(root: Path) -> tuple[Path, list[str]]:
    run = make_run(root)
    plan = {"study": "mine", "file": None, "runs": [{"run_dir": str(run), "recipe": "pre"}]}
    (root / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    return root / "plan.json", ["status", str(root)]


def give_first_key_twice(path: Path) -> None:
    data = path.read_bytes()
    key = re.search(rb'\{\s*("[^"]+")\s*:', data)
    assert key, data
    path.write_bytes(data.replace(b"{", b"{" + key.group(1) + b": 0, ", 1))


JSON_DAMAGE: dict[str, Callable[[Path], None]] = {
    "not_utf8": lambda p: p.write_bytes(p.read_bytes().replace(b"{", b'{"\xe9": 0, ', 1)),
    "duplicate": lambda p: give_first_key_twice(p),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
}


def make_ds_config(root: Path) -> tuple[Path, list[str]]:
    """A user's DeepSpeed JSON, read by the preflight of `submit --dry-run` (writes nothing)."""
    path = root / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}))
    over = ["engine.name=deepspeed", "engine.zero_stage=2", f"engine.deepspeed_config={path}"]
    return path, ["submit", "pre", *over, "--dry-run", "--gpus-per-node", "0",
                  "--run-dir", str(root / "run")]  # fmt: skip


def make_prepared(root: Path) -> tuple[Path, list[str]]:
    """A prepared data directory's meta.json, read when a recipe names the directory."""
    from normlab.data.prepare import prepare

    src = root / "corpus.txt"
    src.write_text(
        "".join(f"line {i} of a small corpus with words to learn.\n" for i in range(400))
    )
    out = root / "prepared"
    prepare([str(src)], out, vocab_size=320, val_fraction=0.1, num_proc=1, chunk_lines=8)
    return out / "meta.json", ["validate", "pre", f"data.dataset={out}", "--quiet"]


KINDS |= {
    "slurm.json": Kind(make_job_record, JSON_DAMAGE),
    "plan.json": Kind(make_plan, JSON_DAMAGE),
    "deepspeed config": Kind(make_ds_config, JSON_DAMAGE),
    "meta.json": Kind(
        make_prepared,
        JSON_DAMAGE
        | {
            "negative_loss": lambda p: replace_once(p, b'"train": ', b'"train": -'),
            "non_integer_step": lambda p: replace_once(
                p, b'"vocab_size": 320', b'"vocab_size": 320.5'
            ),
            "string_for_number": lambda p: replace_once(
                p, b'"vocab_size": 320', b'"vocab_size": "320"'
            ),
        },
    ),
}

# --- files a user supplies: a recipe, a results table, a claims file, a study file -------------

RECIPE = b"""base: pre
model:
  preset: tiny
training:
  steps: 40
optim:
  lr: 0.001
instruments:
  early_warning:
    signals: [grad_norm, max_logit]
"""


def make_recipe(root: Path) -> tuple[Path, list[str]]:
    path = root / "mine.yaml"
    path.write_bytes(
        RECIPE.replace(b"base: pre", f"base: {REPO / 'recipes' / 'pre.yaml'}".encode())
    )
    return path, ["validate", str(path), "--quiet"]


def make_results(root: Path) -> tuple[Path, list[str]]:
    mu = np.array([6.0, 5.2, 4.6])
    rows = rows_of("pre", mu + np.zeros((2, 3)), lrs=(1e-3, 3e-3, 1e-2), l0=8.0)
    rows += rows_of("post", mu + 0.3 + np.zeros((2, 3)), lrs=(1e-3, 3e-3, 1e-2), l0=8.0)
    path = write_table(root / "results.csv", rows)
    return path, ["verdicts", str(path), "--out", str(root / "verdicts")]


def make_claims(root: Path) -> tuple[Path, list[str]]:
    table, args = make_results(root)
    path = root / "claims.yaml"
    path.write_bytes(
        b"- {a: pre, b: post, statistic: loss_at_best_lr, expect: a_lower, name: first}\n"
        b"- {a: pre, b: post, statistic: lr_sensitivity}\n"
    )
    return path, [*args, "--claims", str(path)]


def make_study(root: Path) -> tuple[Path, list[str]]:
    path = root / "mystudy.yaml"
    path.write_bytes(
        b"name: mystudy\nrecipes: [pre, post_warmup]\nseeds: [0, 1]\nsteps: 20\n"
        b"grid:\n  optim.lr: [0.001, 0.003]\nset:\n  training:\n    eval_every: 10\n"
    )
    return path, ["study", str(path), "--out", str(root / "out")]


def make_merge_source(name: str) -> Callable[[Path], tuple[Path, list[str]]]:
    """`study wortsman --report-only --out DIR --merge MORE`: MORE's table `name` is read."""

    def make(root: Path) -> tuple[Path, list[str]]:
        out, more = root / "out", root / "more"
        out.mkdir(), more.mkdir()
        for table in ("compare.csv", "sensitivity.csv"):
            shutil.copy(WORTSMAN / table, out / table)
        shutil.copy(WORTSMAN / name, more / name)
        if name != "results.csv":
            shutil.copy(WORTSMAN / "results.csv", more / "results.csv")
        args = ["study", str(STUDY_FILE), "--report-only", "--out", str(out), "--merge", str(more)]
        return more / name, args

    return make


def first_row_cell(column: str, value: bytes) -> Callable[[Path], None]:
    """Set `column` of the first data row of a CSV to `value`."""

    def damage(path: Path) -> None:
        lines = path.read_bytes().split(b"\n")
        header = lines[0].rstrip(b"\r").split(b",")
        cells = lines[1].split(b",")
        cells[header.index(column.encode())] = value
        lines[1] = b",".join(cells)
        path.write_bytes(b"\n".join(lines))

    return damage


def repeat_first_row(path: Path) -> None:
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], lines[1], *lines[1:]]))


def cut_first_row(path: Path) -> None:
    """A data row cut short after its first cell, rows after it intact (a cut-and-pasted file)."""
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].split(b",")[0] + b",0.00"
    path.write_bytes(b"\n".join(lines))


def csv_damage(loss: str, count: str) -> dict[str, Callable[[Path], None]]:
    return {
        "not_utf8": first_row_cell("status", b"compl\xe9ted"),
        "duplicate": repeat_first_row,
        "negative_loss": first_row_cell(loss, b"-0.5"),
        "non_integer_step": first_row_cell(count, b"1.5"),
        "string_for_number": first_row_cell(loss, b"low"),
        "truncated": cut_first_row,
    }


KINDS |= {
    "recipe": Kind(
        make_recipe,
        {
            "not_utf8": lambda p: p.write_bytes(p.read_bytes() + b"# caf\xe9\n"),
            "duplicate": lambda p: p.write_bytes(p.read_bytes() + b"training:\n  steps: 9\n"),
            "negative_loss": lambda p: replace_once(p, b"lr: 0.001", b"lr: -0.001"),  # a rate > 0
            "non_integer_step": lambda p: replace_once(p, b"steps: 40", b"steps: 2.5"),
            "string_for_number": lambda p: replace_once(p, b"lr: 0.001", b"lr: fast"),
            "truncated": lambda p: cut_mid_token(p, b"signals"),
        },
    ),
    "recipe signals": Kind(
        make_recipe,
        {"duplicate": lambda p: replace_once(p, b"max_logit]", b"max_logit, grad_norm]")},
    ),
    "results table": Kind(make_results, csv_damage("eval_loss", "seed")),
    "results table l0": Kind(
        make_results,
        {
            "negative_loss": first_row_cell("l0", b"-2"),
            "string_for_number": first_row_cell("l0", b"x"),
        },
    ),
    "claims file": Kind(
        make_claims,
        {
            "not_utf8": lambda p: replace_once(p, b"name: first", b"name: f\xe9rst"),
            "duplicate": lambda p: p.write_bytes(
                p.read_bytes().replace(b"lr_sensitivity", b"loss_at_best_lr")
            ),
            "truncated": lambda p: cut_mid_token(p, b"lr_sensitivity"),
        },
    ),
    "claims file keys": Kind(
        make_claims,
        {
            "duplicate": lambda p: replace_once(
                p, b"expect: a_lower", b"expect: a_lower, expect: any"
            )
        },
    ),
    "study file": Kind(
        make_study,
        {
            "not_utf8": lambda p: replace_once(p, b"name: mystudy", b"name: myst\xe9dy"),
            "duplicate": lambda p: p.write_bytes(p.read_bytes() + b"  training.eval_every: 5\n"),
            "non_integer_step": lambda p: replace_once(p, b"steps: 20", b"steps: 2.5"),
            "string_for_number": lambda p: replace_once(p, b"[0.001, 0.003]", b"[0.001, fast]"),
            "negative_loss": lambda p: replace_once(p, b"[0.001, 0.003]", b"[0.001, -0.003]"),
            "truncated": lambda p: cut_mid_token(p, b"optim.lr"),
        },
    ),
    "study file keys": Kind(
        make_study, {"duplicate": lambda p: p.write_bytes(p.read_bytes() + b"seeds: [3]\n")}
    ),
    # the merge reads its sources through the same CSV reader as `verdicts` (every damage above):
    # compare.csv is read only here, so it carries every damage; results.csv two of them
    "merge results.csv": Kind(
        make_merge_source("results.csv"),
        {
            d: f
            for d, f in csv_damage("eval_loss", "seed").items()
            if d in ("not_utf8", "duplicate")
        },
    ),
    "merge compare.csv": Kind(make_merge_source("compare.csv"), csv_damage("eval_loss", "seed")),
}

CASES = [(kind, damage) for kind, spec in KINDS.items() for damage in spec.damage]


@pytest.mark.parametrize(("kind", "damage"), CASES, ids=[f"{k}-{d}" for k, d in CASES])
def test_damage_is_one_line_naming_the_file_and_nothing_changes(
    kind: str, damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = KINDS[kind]
    path, args = spec.make(tmp_path)
    spec.damage[damage](path)
    before = hashes(tmp_path)
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert path.name in err, err  # names the file
    assert re.search(EXPECTED[damage], err, re.I), err  # and what was expected
    assert hashes(tmp_path) == before  # nothing written, nothing overwritten


@pytest.mark.parametrize(
    "kind",
    [
        "summary.json",
        "metrics.jsonl",
        "config.yaml",
        "slurm.json",
        "plan.json",
        "recipe",
        "deepspeed config",
        "meta.json",
    ],  # fmt: skip
)
def test_the_undamaged_file_is_read(kind: str, tmp_path: Path) -> None:
    """The valid files the damage starts from pass, so each refusal above is the damage's."""
    _, args = KINDS[kind].make(tmp_path)
    assert main(args) == 0


def test_a_cut_last_line_of_a_jsonl_is_a_live_write_not_damage(tmp_path: Path) -> None:
    """A run still writing (or killed mid-line) leaves a cut last line: read without it."""
    from normlab.launch.rundir.runfiles import read_metrics

    run = make_run(tmp_path)
    with (run / "metrics.jsonl").open("ab") as fh:
        fh.write(b'{"step": 5, "lo')
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 2, 3, 4, 4]
    assert main(["status", str(run)]) == 0
