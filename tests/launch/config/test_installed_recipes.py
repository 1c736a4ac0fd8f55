"""Recipes ship inside the package (issue 30, item 4): from a non-editable install, with the
repository nowhere on the path, bare names, `base: NAME` in a user's own recipe, presets and
study names resolve to the installed copies, which equal the repository's files byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SOURCES = ("pyproject.toml", "README.md", "launch", "model", "data", "recipes")

PROBE = """
import json
from pathlib import Path
import normlab.launch
from normlab.launch.config import load_config
from normlab.launch.config.loader import RECIPES_DIR, find_recipe
from normlab.launch.study.spec import load_study

user = Path("mine.yaml")
user.write_text("base: pre\\noptim:\\n  lr: 0.0042\\n")
cfg = load_config(user, [])
print(json.dumps({
    "package": normlab.launch.__file__,
    "recipes": str(RECIPES_DIR),
    "pre": str(find_recipe("pre")),
    "7b": str(find_recipe("7b")),
    "user_lr": cfg.optim.lr,
    "user_placement": cfg.model.placement,
    "user_layers": cfg.model_config().n_layers,
    "preset_layers": load_config(find_recipe("7b"), []).model_config().n_layers,
    "study": load_study("lr12").name,
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --no-deps --no-build-isolation SRC --target DIR` of a copy of the sources
    (pip builds in the source tree; the copy keeps build/ out of the repository)."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=ignore)
        else:
            shutil.copy2(item, src / name)
    target = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
           "--disable-pip-version-check", "--no-compile", str(src), "--target", str(target)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    shutil.rmtree(src)  # nothing of the sources is left to fall back on
    return target


def test_shipped_recipes_resolve_from_a_non_editable_install(
    installed: Path, tmp_path: Path
) -> None:
    # -I: no PYTHONPATH, no user site, cwd not on the path; the install goes first on sys.path
    code = f"import sys; sys.path.insert(0, {str(installed)!r})\n" + PROBE
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    recipes = installed / "normlab" / "recipes"
    assert got["package"] == str(installed / "normlab" / "launch" / "__init__.py")
    assert got["recipes"] == str(recipes)
    assert got["pre"] == str(recipes / "pre.yaml")
    assert got["7b"] == str(recipes / "presets" / "7b.yaml")
    assert got["user_lr"] == 0.0042 and got["user_placement"] == "pre"
    assert got["user_layers"] == 4  # recipes/base/tiny.yaml, reached through pre.yaml's base
    assert got["preset_layers"] == 32  # model.presets: 7b
    assert got["study"] == "lr12"
    shipped = sorted(p.relative_to(REPO / "recipes") for p in (REPO / "recipes").rglob("*.yaml"))
    assert sorted(p.relative_to(recipes) for p in recipes.rglob("*.yaml")) == shipped
    for rel in shipped:
        assert (recipes / rel).read_bytes() == (REPO / "recipes" / rel).read_bytes(), rel


def test_base_by_name_from_a_users_folder(tmp_path: Path) -> None:
    """In any install: `base: pre` and `base: 7b` name shipped recipes (as `find_recipe` reads
    them on the command line); `base: pre.yaml` beside the user's recipe is that file; a name
    that is neither is one line."""
    from normlab.launch.config import load_config
    from normlab.launch.errors import ConfigError

    (tmp_path / "mine.yaml").write_text("base: 7b\ntraining:\n  steps: 7007\n")
    cfg = load_config(tmp_path / "mine.yaml", [])
    assert (cfg.model_config().n_layers, cfg.training.steps) == (32, 7007)
    (tmp_path / "local.yaml").write_text("base: pre\n")
    assert load_config(tmp_path / "local.yaml", []).model.placement == "pre"  # shipped pre
    (tmp_path / "pre.yaml").write_text("base: post_warmup\n")
    assert load_config(tmp_path / "local.yaml", []).model.placement == "pre"  # a name: shipped
    (tmp_path / "local.yaml").write_text("base: pre.yaml\n")  # a file beside it comes first
    assert load_config(tmp_path / "local.yaml", []).model.placement == "post"
    (tmp_path / "bad.yaml").write_text("base: no_such_recipe\n")
    with pytest.raises(ConfigError, match="base 'no_such_recipe' not found"):
        load_config(tmp_path / "bad.yaml", [])
