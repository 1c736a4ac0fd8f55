"""`normlab export` writes a folder HF transformers loads from its root: AutoTokenizer encodes like
normlab's SentencePiece model, AutoModelForCausalLM greedily generates exactly the tokens normlab's
own model generates (Llama, Qwen3 and OLMo 2 families), and the special-token ids are the
tokenizer's own. Plus --overwrite (replace only once complete), the missing-transformers line,
--no-hf and bare run names."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import normlab.launch.extras as extras
import pytest
import torch
from normlab.data.tokenizer import load_tokenizer
from normlab.launch import export as export_cmd
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.training.trainer import Trainer
from normlab.model import ModelConfig, Transformer
from safetensors.torch import load_file

from tests.conftest import tiny_overrides

transformers = pytest.importorskip("transformers")

# family -> (recipe, HF class, extra overrides); init_std 0.2 makes greedy choices depend on the
# context (a near-uniform tiny model would repeat one token and compare little)
FAMILIES = {
    "llama": ("pre", "LlamaForCausalLM", []),
    "qwen3": ("pre_qknorm_head", "Qwen3ForCausalLM", ["model.n_kv_heads=1"]),
    "olmo2": ("olmo2", "Olmo2ForCausalLM", ["model.tie_embeddings=true"]),
}
PROMPT = "The history of the city begins in 1850, when"
NEW_TOKENS = 16


def train_tiny(data: Path, run_dir: Path, recipe: str, extra: list[str]) -> Path:
    over = tiny_overrides(data, run_dir, training__steps=2, checkpoint__every=2)
    over += ["training.eval_every=0", "model.init_std=0.2", "instruments={}", *extra]
    trainer = Trainer(load_config(find_recipe(recipe), over))
    assert trainer.run() == 0
    return run_dir


@pytest.fixture(scope="module")
def runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export_hf")
    return {
        family: train_tiny(tiny_data, root / "runs" / family, recipe, extra)
        for family, (recipe, _, extra) in FAMILIES.items()
    }


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["export", *args])
    out, err = capsys.readouterr()
    return code, out, err


@torch.no_grad()
def greedy(model: Transformer, prompt: list[int], new: int, eos: int) -> list[int]:
    """normlab's own greedy decoding: argmax of the last position, stop after EOS."""
    ids, out = torch.tensor([prompt]), []
    for _ in range(new):
        nxt = int(model(ids)[0, -1].argmax())
        out.append(nxt)
        if nxt == eos:
            break
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def native_model(out: Path) -> Transformer:
    cfg = ModelConfig.from_dict(json.loads((out / "normlab" / "model_config.json").read_text()))
    model = Transformer(cfg)
    model.load_state_dict(load_file(out / "normlab" / "model.safetensors"))
    return model.eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_loads_the_root_and_generates_normlab_tokens(
    runs: dict[str, Path], tiny_data: Path, capsys: pytest.CaptureFixture[str], family: str
) -> None:
    out = runs[family].parent.parent / f"export_{family}"
    code, stdout, err = cli(capsys, str(runs[family]), "--out", str(out))
    assert code == 0, err
    assert f"HF {family} model -> {out}" in stdout
    tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == FAMILIES[family][1]
    sp = load_tokenizer(tiny_data / "tokenizer.model")
    prompt = tok(PROMPT)["input_ids"]
    assert prompt == sp.encode(PROMPT)  # no BOS added: normlab documents carry none
    want = greedy(native_model(out), prompt, NEW_TOKENS, sp.eos_id())
    assert len(set(want)) > 3, want  # the comparison is not about one repeated token
    got = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
    )[0, len(prompt) :].tolist()
    assert got == want
    assert tok.decode(got) == sp.decode(want)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_special_token_ids_are_the_tokenizers(
    runs: dict[str, Path], tiny_data: Path, capsys: pytest.CaptureFixture[str], family: str
) -> None:
    out = runs[family].parent.parent / f"export_{family}"
    if not out.exists():
        assert cli(capsys, str(runs[family]), "--out", str(out))[0] == 0
    sp = load_tokenizer(tiny_data / "tokenizer.model")
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (config["bos_token_id"], config["eos_token_id"]) == (sp.bos_id(), sp.eos_id()) == (1, 2)
    assert config["pad_token_id"] is None  # normlab has no pad piece (see model.hf.hf_config)
    assert generation["eos_token_id"] == generation["pad_token_id"] == sp.eos_id()
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (1, 2, 0)
    assert tok.pad_token_id == sp.eos_id()
    assert max(config["bos_token_id"], config["eos_token_id"]) < config["vocab_size"] == 512
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "special_tokens_map.json").read_text())["eos_token"] == "</s>"


def test_overwrite_replaces_only_a_finished_export(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, out = runs["llama"], runs["llama"].parent.parent / "overwrite"
    assert cli(capsys, str(run), "--out", str(out), "--no-hf")[0] == 0
    (out / "mine.txt").write_text("old export")
    code, _, err = cli(capsys, str(run), "--out", str(out))
    assert code == 2 and "already exists" in err and "--overwrite" in err
    assert err.count("\n") == 1 and (out / "mine.txt").is_file()

    def disk_full(*args: object) -> list[str]:
        (args[3] / "half-written").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device", str(args[3] / "model.safetensors"))

    monkeypatch.setattr(export_cmd, "write_export", disk_full)
    code, _, err = cli(capsys, str(run), "--out", str(out), "--overwrite")
    assert code == 2 and err.count("\n") == 1 and "no space left on device while writing" in err
    assert (out / "mine.txt").read_text() == "old export"  # the failed export destroyed nothing
    assert not [n for n in os.listdir(out.parent) if n.startswith(".")]  # its temp folder too
    monkeypatch.undo()
    code, stdout, err = cli(capsys, str(run), "--out", str(out), "--overwrite")
    assert code == 0, err
    assert not (out / "mine.txt").exists() and (out / "config.json").is_file()
    assert not [n for n in os.listdir(out.parent) if n.startswith(".")]  # no temp folder left


def test_overwrite_never_replaces_what_is_not_an_export(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs["llama"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    cases = [
        (tmp_path / "notes", "is not a normlab export"),
        (tmp_path / "file", "is not a directory"),
        (run, "would replace the run directory"),
        (run.parent, "would replace the run directory"),
    ]
    for out, needle in cases:
        code, _, err = cli(capsys, str(run), "--out", str(out), "--overwrite")
        assert code == 2 and needle in err and err.count("\n") == 1, err
    assert (tmp_path / "notes" / "a.txt").read_text() == "mine"
    assert (tmp_path / "file").read_text() == "mine" and (run / "config.yaml").is_file()


def test_missing_transformers_is_one_line_unless_native_only(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setattr(extras, "installed", lambda module: module != "transformers")
    code, _, err = cli(capsys, str(runs["llama"]), "--out", str(tmp_path / "x"))
    assert code == 2 and err.count("\n") == 1
    assert "needs HF transformers" in err and "pip install 'normlab[hf]'" in err
    assert "--no-hf" in err and not (tmp_path / "x").exists()
    code, _, err = cli(capsys, str(runs["llama"]), "--out", str(tmp_path / "x"), "--no-hf")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["normlab", "tokenizer.model"]


def test_bare_run_name_and_missing_tokenizer(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(runs["llama"].parent.parent)  # holds runs/llama
    code, stdout, err = cli(capsys, "llama", "--out", str(tmp_path / "a"), "--no-hf")
    assert code == 0, err
    code, _, err = cli(capsys, "lama", "--out", str(tmp_path / "b"))
    assert code == 2 and "no run directory 'lama'" in err
    code, _, err = cli(capsys, "llama", "--out", str(tmp_path / "c"), "--tokenizer", "no.model")
    assert code == 2 and "tokenizer no.model is missing" in err and err.count("\n") == 1


def test_damaged_checkpoint_and_unwritable_out_are_one_line(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "copy"
    shutil.copytree(runs["llama"], run)
    weights = run / "checkpoints" / "step_00000002" / "model.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    code, _, err = cli(capsys, str(run), "--out", str(tmp_path / "x"))
    assert code == 2 and err.count("\n") == 1 and "step_00000002 is damaged" in err
    assert "model.pt" in err and not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("not a folder")
    code, _, err = cli(capsys, str(runs["llama"]), "--out", str(tmp_path / "file" / "x"))
    # refused by the one checked output path (launch/out_path): the file below is named
    assert code == 2 and err.count("\n") == 1 and "--out" in err
    assert f"{tmp_path / 'file'} is a file, not a directory" in err
    assert (tmp_path / "file").read_text() == "not a folder"
