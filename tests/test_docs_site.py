"""The documentation site (mkdocs.yml, docs/): the generated pages are what docs/gen_reference.py
writes now (regenerate with `python docs/gen_reference.py`), every recipe key has a meaning, and
`mkdocs build --strict` builds the site without a warning."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", REPO / "docs" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current() -> None:
    for path, text in generator().pages().items():
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
        for name in action.choices:
            assert f"## `normlab {name}`" in page


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
