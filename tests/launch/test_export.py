"""`normlab export`: checkpoints of the single, FSDP2 and DeepSpeed ZeRO-3 engines (the sharded
runs with activation checkpointing) consolidate to one safetensors file holding the trained
weights, plus the resolved config (in normlab/) and, at the root, a HF model whose logits match."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from normlab.launch.export import check_hf_family
from normlab.model import ModelConfig, Transformer
from safetensors.torch import load_file

from tests.conftest import REPO
from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    launch,
    losses,
    normlab,
    prepare_tiny,
    write_recipe,
)

pytestmark = pytest.mark.distributed
# weights of 2-rank and 1-rank runs after 8 AdamW steps differ by ~1e-5 (reduction order)
WEIGHT_TOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    recipe = write_recipe(root, prepare_tiny(root), 8, 4)
    out = {"root": root, "single": root / "single", "fsdp": root / "fsdp", "zero3": root / "zero3"}
    check_ok(normlab("train", str(recipe), "--run-dir", str(out["single"])))
    # activation checkpointing wraps every block: parameter names must come out clean anyway
    ac = ("engine.activation_checkpointing=true", "data.batch_size=2")
    check_ok(launch(recipe, out["fsdp"], 2, "engine.name=fsdp", *ac))
    check_ok(launch(recipe, out["zero3"], 2, "engine.name=deepspeed", "engine.zero_stage=3", *ac))
    for name in ("fsdp", "zero3"):  # recomputation changes nothing
        assert_same_curve(out[name], losses(out["single"]))
    return out


def exported(runs: dict[str, Path], name: str, *args: str) -> Path:
    out = runs["root"] / f"export_{name}{'_'.join(a.strip('-') for a in args)}"
    proc = normlab("export", str(runs[name]), "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"-> {out / 'normlab' / 'model.safetensors'}" in proc.stdout
    return out


def test_single_export_holds_the_checkpoint_weights(runs: dict[str, Path]) -> None:
    out = exported(runs, "single")
    ckpt = torch.load(runs["single"] / "checkpoints" / "step_00000008" / "model.pt")
    weights = load_file(out / "normlab" / "model.safetensors")
    assert set(weights) == set(ckpt) and all(torch.equal(weights[k], ckpt[k]) for k in ckpt)
    saved = yaml.safe_load((out / "normlab" / "config.yaml").read_text())
    assert saved == yaml.safe_load((runs["single"] / "config.yaml").read_text()) | {
        "run_dir": str(runs["single"])
    }


@pytest.fixture(scope="module")
def reference(runs: dict[str, Path]) -> dict[str, torch.Tensor]:
    return load_file(exported(runs, "single", "--no-hf") / "normlab" / "model.safetensors")


@pytest.mark.parametrize("engine", ["fsdp", "zero3"])
def test_sharded_exports_match_the_single_run(
    runs: dict[str, Path], reference: dict[str, torch.Tensor], engine: str
) -> None:
    ref = reference
    out = exported(runs, engine)
    weights = load_file(out / "normlab" / "model.safetensors")
    assert set(weights) == set(ref)
    worst = max((weights[k] - ref[k]).abs().max().item() for k in ref)
    assert worst < WEIGHT_TOL, f"{engine}: max weight difference {worst:.3g}"
    # the file alone rebuilds the model
    cfg = ModelConfig.from_dict(json.loads((out / "normlab" / "model_config.json").read_text()))
    model = Transformer(cfg)
    model.load_state_dict(weights)
    hf = pytest.importorskip("transformers").AutoModelForCausalLM.from_pretrained(out)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (model.eval()(tokens) - hf.eval()(tokens).logits).abs().max().item()
    assert diff < 1e-4


def test_an_architecture_without_hf_counterpart_is_refused_pointing_at_no_hf() -> None:
    from normlab.launch.config import load_config
    from normlab.launch.errors import RunDirError

    cfg = load_config(REPO / "recipes" / "post_warmup.yaml")
    with pytest.raises(RunDirError, match=r"placement='post'.*export with --no-hf"):
        check_hf_family(cfg)


def test_export_errors_leave_existing_directories_alone(runs: dict[str, Path]) -> None:
    taken = runs["root"] / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [
        ([str(runs["single"]), "--out", str(taken)], "already exists"),
        ([str(runs["root"]), "--out", str(runs["root"] / "x")], "not a normlab run directory"),
        ([str(runs["fsdp"]), "--out", str(runs["root"] / "y"), "--step", "5"], "no checkpoint at"),
    ]
    for args, message in cases:
        proc = normlab("export", *args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert (taken / "keep.txt").read_text() == "mine" and len(list(taken.iterdir())) == 1
    assert not (runs["root"] / "x").exists() and not (runs["root"] / "y").exists()
