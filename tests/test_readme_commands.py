"""The README's commands as written: every `normlab` line of its bash blocks parses (subcommand
and options exist), and the cheap ones (validate, plan, --dry-run, and examples whose comment
quotes the error they end in) run, from the repository root, writing nothing there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from normlab.launch.cli import build_parser, main

from tests.conftest import REPO

CHEAP_COMMANDS = {"validate", "plan"}  # instant, and write nothing


def readme_commands(text: str) -> list[tuple[str, str, bool]]:
    """(command, comment, needs_earlier) of every line that runs normlab, continuation lines
    joined; needs_earlier: a `normlab prepare` came before it in its block (it reads that data)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        prepared = False
        for line in block.replace("\\\n", " ").splitlines():
            command, _, comment = line.strip().partition(" # ")
            for part in command.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and Path(argv[0]).name == "normlab":
                    found.append((shlex.join(["normlab", *argv[1:]]), comment.strip(), prepared))
                    prepared = prepared or argv[1:2] == ["prepare"]
    return found


COMMANDS = readme_commands((REPO / "README.md").read_text())


def expected_error(comment: str) -> str | None:
    """The message a comment quotes for an example that must fail ('... "did you mean X?"')."""
    quoted = re.search(r'"([^"]+)"', comment)
    failing = any(word in comment for word in ("error", "unknown", "refused"))
    return quoted.group(1) if quoted and failing else None


def is_cheap(command: str, comment: str) -> bool:
    argv = shlex.split(command)
    return argv[1] in CHEAP_COMMANDS or "--dry-run" in argv or expected_error(comment) is not None


CHEAP = [(c, m) for c, m, later in COMMANDS if not later and is_cheap(c, m)]


def test_the_readme_is_parsed() -> None:
    assert len(COMMANDS) >= 10  # the guides' commands: tests/test_docs_commands.py
    cheap = [c for c, _ in CHEAP]
    assert "normlab validate recipes/presets/7b.yaml" in cheap
    assert any("optim.lrr" in c for c in cheap)  # the unknown-key example
    assert any("--cluster recipes/clusters/example.yaml" in c for c in cheap)
    assert any(c.startswith("normlab plan") for c in cheap)


@pytest.mark.parametrize("command", [c for c, _, _ in COMMANDS])
def test_every_readme_command_parses(command: str) -> None:
    argv = [a.replace("$", "") for a in shlex.split(command)[1:]]  # $NODE_RANK -> a word
    argv = ["0" if a == "NODE_RANK" else a for a in argv]
    args, extra = build_parser().parse_known_args(argv)
    assert all("=" in e and not e.startswith("-") for e in extra), (command, extra)
    assert callable(args.func)


@pytest.mark.parametrize(("command", "comment"), CHEAP, ids=[c for c, _ in CHEAP])
def test_cheap_readme_commands_run_as_written(
    command: str, comment: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    run_as_written(command, comment, capsys, monkeypatch)


def run_as_written(
    command: str, comment: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Run a documented command in-process from the repository root: exit 0 (or 2 with the one
    line its comment quotes) and nothing written there."""
    monkeypatch.chdir(REPO)
    before = sorted(p.name for p in REPO.iterdir())
    capsys.readouterr()
    code = main(shlex.split(command)[1:])
    err = capsys.readouterr().err
    want = expected_error(comment)
    if want is None:
        assert code == 0, (command, err)
    else:
        assert code == 2 and want in err and err.count("\n") == 1, (command, err)
    assert sorted(p.name for p in REPO.iterdir()) == before  # nothing written
