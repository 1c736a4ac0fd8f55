"""docs/guides/external_runs.md (issue 51 item 4): its worked example is what `normlab compare`
gives now on the histories docs/gen_external.py writes, and the figure it shows is committed."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import REPO


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_external", REPO / "docs" / "gen_external.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_guide_is_what_the_tool_gives() -> None:
    gen = generator()
    assert gen.main(["--check"]) == 0, "stale: run python docs/gen_external.py"
    page = gen.PAGE.read_text()
    for name in ("mapping", "commands", "table", "card"):
        assert f"<!-- normlab:external {name} -->" in page, name
    assert (REPO / "docs" / "external" / "loss.png").stat().st_size > 0
    assert "guides/external_runs.md" in (REPO / "mkdocs.yml").read_text()


def test_each_source_is_read_in_its_own_names() -> None:
    """The example's rows say which mapping read each history, and the stable run has no event."""
    page = generator().PAGE.read_text()
    table = page.split("<!-- normlab:external table -->\n", 1)[1].split("<!--", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert "torchtitan (tensorboard)" in rows["titan_lr0.01"] and "| none |" in rows["titan_lr0.01"]
    assert "megatron (tensorboard)" in rows["megatron_lr0.04"]
    assert "olmo-core (jsonl)" in rows["olmo_lr0.05.jsonl"]
    assert "plain (csv)" in rows["plain_lr0.07.csv"]
