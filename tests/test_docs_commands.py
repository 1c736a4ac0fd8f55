"""The site's commands as written (docs/getting_started.md and docs/guides/*.md), as
tests/test_readme_commands.py checks the README's: every `normlab` line of a bash block parses
(subcommand and options exist); the cheap ones (validate, plan, --dry-run, --help, examples whose
comment quotes the error they end in) run from the repository root, writing nothing there; every
other one carries a tag in its comment saying what it needs: [gpu], [cluster], [cpu: TIME]
(minutes or more on a CPU: its recipe and overrides must pass `normlab validate`, its study names
must resolve), [after] (reads what the commands before it wrote) or [your files]."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from normlab.launch.cli import build_parser, main

from tests.conftest import REPO
from tests.test_readme_commands import expected_error, readme_commands, run_as_written

PAGES = [REPO / "docs" / "getting_started.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]
TAG = re.compile(r"\[(gpu|cluster|after|your files|cpu: [^\]]+)\]")
CHEAP_COMMANDS = {"validate", "plan"}  # instant, and write nothing
RECIPE_FIRST = {"train", "launch", "submit"}  # COMMAND RECIPE [options] [KEY=VALUE ...]


def page_commands() -> list[tuple[str, str, str, bool]]:
    """(page, command, comment, needs_earlier) of every normlab line of every page."""
    return [
        (page.relative_to(REPO).as_posix(), command, comment, later)
        for page in PAGES
        for command, comment, later in readme_commands(page.read_text())
    ]


COMMANDS = page_commands()


def is_cheap(command: str, comment: str) -> bool:
    argv = shlex.split(command)
    return (
        argv[1] in CHEAP_COMMANDS
        or "--dry-run" in argv
        or "--help" in argv
        or expected_error(comment) is not None
    ) and TAG.search(comment) is None


CHEAP = [(c, m) for _, c, m, later in COMMANDS if not later and is_cheap(c, m)]
TAGGED = [(c, TAG.search(m).group(1)) for _, c, m, _ in COMMANDS if TAG.search(m)]  # type: ignore[union-attr]


def test_the_pages_are_parsed() -> None:
    assert {p.name for p in PAGES} >= {"getting_started.md", "corpus.md", "distributed.md"}
    assert len(COMMANDS) >= 40
    cheap = [c for c, _ in CHEAP]
    assert "normlab validate recipes/presets/7b.yaml" in cheap
    assert any("optim.lrr" in c for c in cheap)  # the unknown-key example
    assert any("--dry-run" in c for c in cheap)
    assert {tag.split(":")[0] for _, tag in TAGGED} >= {"gpu", "cluster", "cpu", "after"}


@pytest.mark.parametrize(("page", "command"), [(p, c) for p, c, _, _ in COMMANDS])
def test_every_command_parses(page: str, command: str) -> None:
    argv = [a.replace("$", "") for a in shlex.split(command)[1:]]  # $NODE_RANK -> a word
    argv = ["0" if a == "NODE_RANK" else a for a in argv]
    args, extra = build_parser().parse_known_args(argv)
    assert all("=" in e and not e.startswith("-") for e in extra), (page, command, extra)
    assert callable(args.func)


@pytest.mark.parametrize(("page", "command", "comment", "later"), COMMANDS)
def test_every_command_is_run_or_tagged(page: str, command: str, comment: str, later: bool) -> None:
    ran = not later and is_cheap(command, comment)
    assert ran or TAG.search(comment), (
        f"{page}: `{command}` is neither run by this test nor tagged [gpu], [cluster], "
        "[cpu: TIME], [after] or [your files] in its comment"
    )


@pytest.mark.parametrize(("command", "comment"), CHEAP, ids=[c for c, _ in CHEAP])
def test_cheap_commands_run_as_written(
    command: str, comment: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    run_as_written(command, comment, capsys, monkeypatch)


CPU = [c for c, tag in TAGGED if tag.startswith("cpu:") and shlex.split(c)[1] != "prepare"]


@pytest.mark.parametrize("command", CPU)
def test_long_cpu_commands_have_valid_configs(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a [cpu: TIME] command would train passes `normlab validate` (train, launch, submit),
    or its study names resolve to study files or recipes (study)."""
    monkeypatch.chdir(REPO)
    argv = shlex.split(command)[1:]
    if argv[0] in RECIPE_FIRST:
        overrides = [a for a in argv[2:] if "=" in a and not a.startswith("-")]
        assert main(["validate", argv[1], "--quiet", *overrides]) == 0, capsys.readouterr().err
    elif argv[0] == "study":
        args, _ = build_parser().parse_known_args(argv)
        for name in args.recipes:
            assert any(
                p.exists()
                for p in (Path(name), REPO / "recipes" / "studies" / f"{name}.yaml",
                          REPO / "recipes" / f"{name}.yaml")
            ), f"`{command}`: {name} is neither a study file nor a recipe"  # fmt: skip
    else:
        assert argv[0] in ("theory", "quickstart"), f"`{command}`: no config check for {argv[0]}"
