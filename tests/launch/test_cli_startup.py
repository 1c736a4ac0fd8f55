"""Commands that answer at once import nothing heavy they do not need (issue 30, item 3).

Each command runs in a fresh interpreter; at exit the test reads `sys.modules`. `--help` of every
command, `status`, `plan`, `compare` of finished runs and `submit --dry-run` (which runs
`train`'s preflight: instrument settings are checked by launch.config.instruments, without the
instruments) import no torch. The one that needs torch, and why:
- `validate` counts the model by building it on the meta device (a `torch.device` context imports
  torch._dynamo) and prints each source's epochs through normlab.data (whose modules import torch
  and sentencepiece at the top); still no DeepSpeed, transformers, matplotlib or datasets.
A recipe on a prepared data directory (not the bundled corpus) also loads torch in `submit`:
preflight's tokenizer check reads it through normlab.data.mixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides

# heavy modules a quick command must not load unless it needs them
HEAVY = (
    "torch", "torch._dynamo", "deepspeed", "transformers", "matplotlib", "datasets", "scipy",
    "tensorboard", "wandb", "sentencepiece", "tokenizers", "safetensors",
)  # fmt: skip
# validate: + the model built on `meta`; its epoch plan reads normlab.data, whose modules import
# sentencepiece at the top (data/ is another package; a small extension, not a framework)
META_BUILD = {"torch", "torch._dynamo", "sentencepiece"}
DRAWS = {"matplotlib"}  # compare draws its figures

RUN_AND_REPORT = """
import json, sys
sys.argv = ["normlab", *{argv!r}]
from normlab.launch.cli import main
try:
    rc = main()
except SystemExit as exc:
    rc = exc.code
sys.stdout.flush()
print("MODULES" + json.dumps([m for m in {heavy!r} if m in sys.modules]))
sys.exit(rc if isinstance(rc, int) else 2)
"""


def loaded_by(argv: list[str], cwd: Path | None = None) -> tuple[int, str, set[str]]:
    """(status, stdout without the report line, heavy modules loaded) of `normlab ARGV`."""
    code = RUN_AND_REPORT.format(argv=argv, heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=cwd
    )
    out, _, report = done.stdout.rpartition("MODULES")
    assert report, done.stderr
    return done.returncode, out, set(json.loads(report))


def command_names() -> list[str]:
    from normlab.launch.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return list(sub.choices)


def test_importing_every_command_module_loads_nothing_heavy() -> None:
    from normlab.launch.cli import COMMANDS

    code = (
        "import importlib, json, sys\n"
        f"for name in {COMMANDS!r}: importlib.import_module(name)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_help_lists_every_command_and_loads_nothing_heavy() -> None:
    names = command_names()
    assert len(names) >= 12 and {"train", "validate", "plan", "status", "compare"} <= set(names)
    rc, out, heavy = loaded_by(["--help"])
    assert rc == 0 and heavy == set()
    for name in names:
        assert f"    {name}" in out, name  # each command on its own line with its help


@pytest.mark.parametrize("name", ["train", "validate", "prepare", "launch", "export", "compare",
                                  "study", "submit", "status", "theory", "plan", "quickstart"])
def test_help_of_each_command_loads_nothing_heavy(name: str) -> None:
    rc, out, heavy = loaded_by([name, "--help"])
    assert rc == 0 and out.startswith(f"usage: normlab {name}"), out[:200]
    assert heavy == set()


def test_plan_needs_no_torch() -> None:
    rc, out, heavy = loaded_by(["plan", "7b", "--gpus-per-node", "8", "--gpu-memory", "80GB"])
    assert rc == 0 and "7b" in out, out
    assert heavy == set()


def test_submit_dry_run_needs_no_torch(tmp_path: Path) -> None:
    argv = ["submit", "pre", "--dry-run", "--nodes", "1", "--gpus-per-node", "0",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    rc, out, heavy = loaded_by(argv)
    assert rc == 0 and out.startswith("#!/bin/bash"), out[:200]
    assert heavy == set()
    assert not (tmp_path / "run").exists()  # a dry run touches nothing


def test_validate_loads_torch_only_for_preflight_and_the_meta_model() -> None:
    rc, out, heavy = loaded_by(["validate", "7b", "--quiet"])
    assert rc == 0 and "7b: valid;" in out, out
    assert heavy <= META_BUILD


@pytest.fixture(scope="module")
def finished_runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from normlab.launch.cli import main

    root = tmp_path_factory.mktemp("finished")
    runs = [root / "pre", root / "post"]
    for recipe, run in zip(("pre", "post_warmup"), runs, strict=True):
        over = tiny_overrides(tiny_data, run, training__steps=4, checkpoint__every=4)
        assert main(["train", recipe, *over]) == 0
    return runs


def test_status_of_a_finished_run_needs_no_torch(finished_runs: list[Path]) -> None:
    rc, out, heavy = loaded_by(["status", str(finished_runs[0])])
    assert rc == 0 and "completed" in out and "step 4/4" in out, out
    assert f"last checkpoint: {finished_runs[0]}/checkpoints/step_00000004" in out
    assert heavy == set()


def test_compare_of_finished_runs_needs_no_torch(
    finished_runs: list[Path], tmp_path: Path
) -> None:
    rc, out, heavy = loaded_by(["compare", *map(str, finished_runs), "--out", str(tmp_path)])
    assert rc == 0, out
    assert (tmp_path / "loss.png").stat().st_size > 0 and (tmp_path / "compare.md").is_file()
    assert heavy <= DRAWS


@pytest.mark.parametrize(
    "layout",
    [[], ["step_00000004"], ["step_00000004", "step_00000008"], ["step_00000004", "latest:x"],
     ["step_00000004", "step_00000008", "latest:step_00000004"], ["latest:step_00000008"]],
)  # fmt: skip
def test_status_reads_the_latest_checkpoint_as_the_manager_does(
    tmp_path: Path, layout: list[str]
) -> None:
    from normlab.launch.commands.status import latest_checkpoint
    from normlab.launch.rundir.checkpoint import CheckpointManager

    root = tmp_path / "checkpoints"
    root.mkdir()
    for item in layout:
        if item.startswith("latest:"):
            (root / "latest").write_text(item.removeprefix("latest:"))
        else:
            (root / item).mkdir()
    try:
        expected = CheckpointManager(tmp_path, 1).latest()
    except Exception:  # noqa: BLE001 (status reports a broken pointer as no checkpoint)
        expected = None
    assert latest_checkpoint(tmp_path) == expected


def test_sdp_choice_carries_the_mark_torch_compiler_would_set() -> None:
    import torch
    from normlab.model.attention_lse import DYNAMO_CONSTANT_MARK, _sdp_choice

    def probe() -> int:
        return 0

    torch.compiler.assume_constant_result(probe)
    assert vars(probe) == {DYNAMO_CONSTANT_MARK: True}
    assert getattr(_sdp_choice, DYNAMO_CONSTANT_MARK) is True


def test_count_params_kinds_match_the_wrappers() -> None:
    """presets.count_params counts residual scales by config.SCALED_KINDS (no torch), which
    must name exactly the wrappers that carry one."""
    from normlab.model.config import SCALED_KINDS
    from normlab.model.placements import SCALED_WRAPPERS

    assert set(SCALED_WRAPPERS) == SCALED_KINDS


@pytest.mark.parametrize(
    "section",
    [{"spike_score": {"window": 0}}, {"spike_score": {"k": True}},
     {"attention_logits": {"mode": "x"}}, {"update_spikes": {"threshold": 1.0}},
     {"spike_policy": {"window": 1}},
     {"spike_policy": {"max_rollbacks": -1}}, {"fp16_clamp": {"mode": "maybe"}},
     {"activations": {"every": 3}}, {"spike_scor": True}, {"qk_gains": 3}],
)  # fmt: skip
def test_preflight_refuses_what_building_the_instruments_refuses(section: dict) -> None:
    """The torch-free check (launch.config.instruments) and the instruments' constructors give
    the same one line for the same bad section."""
    from normlab.launch.callbacks import build_callbacks
    from normlab.launch.config.instruments import check_instruments
    from normlab.launch.errors import ConfigError

    with pytest.raises(ConfigError) as built:
        build_callbacks(section)
    with pytest.raises(ConfigError) as checked:
        check_instruments(section)
    assert str(checked.value) == str(built.value)


def test_sound_settings_pass_both_ways() -> None:
    import typing

    from normlab.launch.callbacks import build_callbacks
    from normlab.launch.config.instruments import AttentionLogitsSettings, check_instruments
    from normlab.launch.instruments.attention import MODES
    from normlab.launch.registry import INSTRUMENTS

    section = {name: True for name in INSTRUMENTS} | {"fp16_clamp": {"mode": False}}
    check_instruments(section)
    built = build_callbacks(section)
    assert [cb.name for cb in built] == list(INSTRUMENTS)
    assert next(cb for cb in built if cb.name == "fp16_clamp").mode == "off"  # YAML's `off`
    modes = typing.get_args(typing.get_type_hints(AttentionLogitsSettings)["mode"])
    assert set(modes) == set(MODES)
