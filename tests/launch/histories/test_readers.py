"""Each reader on files the libraries' own writers made (torch's SummaryWriter, json.dumps lines,
csv.writer), and on damaged ones: one line on stderr, exit 2, no output written, the input left
as it was (issue 51 item 5)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.errors import ConfigError
from normlab.launch.histories.load import HistoryOptions, read_history

from tests.launch.histories.conftest import write_tensorboard

STEPS = list(range(1, 41))
LOSS = [10.0 / math.sqrt(s) for s in STEPS]
GRAD = [1.0 + 0.01 * s for s in STEPS]
LR = [min(s, 5) * 1e-3 for s in STEPS]
MEGATRON = {"loss": "lm loss", "grad_norm": "grad-norm", "lr": "learning-rate"}


def rows() -> list[dict[str, float]]:
    return [
        {"step": s, "loss": x, "grad_norm": g, "lr": r}
        for s, x, g, r in zip(STEPS, LOSS, GRAD, LR, strict=True)
    ]


def write_csv(path: Path, header: list[str], body: list[list[object]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(body)
    return path


def test_tensorboard_megatron_tags(tmp_path: Path) -> None:
    tb = write_tensorboard(rows(), MEGATRON, tmp_path / "megatron")
    h = read_history(tb)
    assert h.source == "megatron" and h.kind == "tensorboard"
    assert list(h.loss.steps) == STEPS
    assert list(h.loss.values) == pytest.approx(LOSS, rel=1e-7)  # float32 in the event file
    assert list(h.series["grad_norm"].values) == pytest.approx(GRAD, rel=1e-7)
    assert h.warmup_steps == 5  # the lr's first peak


def test_tensorboard_in_a_timestamp_folder(tmp_path: Path) -> None:
    """torchtitan writes tb/<timestamp>/: the one folder below is found."""
    names = {"loss": "loss_metrics/global_avg_loss", "grad_norm": "grad_norm"}
    write_tensorboard(rows(), names, tmp_path / "tb" / "20260101-0000")
    h = read_history(tmp_path / "tb")
    assert h.source == "torchtitan" and list(h.loss.steps) == STEPS


def test_jsonl_with_eval_rows_and_nonfinite(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    lines = [json.dumps(r) for r in rows()]
    lines.insert(10, json.dumps({"step": 10, "eval_loss": 3.5}))
    lines.append(json.dumps({"step": 41, "loss": float("nan"), "grad_norm": float("inf")}))
    path.write_text("\n".join(lines) + "\n")
    h = read_history(path)
    assert h.source == "plain" and h.series["eval_loss"].steps == (10,)
    assert h.loss.steps[-1] == 41 and math.isnan(h.loss.values[-1])
    assert h.series["grad_norm"].values[-1] == math.inf


def test_jsonl_last_line_being_written_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "running.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows()) + '{"step": 41, "lo')
    assert read_history(path).loss.steps[-1] == 40


def test_csv_through_the_csv_reader(tmp_path: Path) -> None:
    body = [[r["step"], r["loss"], r["grad_norm"], ""] for r in rows()]
    body[-1][3] = "3.25"
    path = write_csv(tmp_path / "h.csv", ["step", "loss", "grad_norm", "eval_loss"], body)
    h = read_history(path)
    assert list(h.loss.values) == LOSS and h.series["eval_loss"].steps == (40,)


def test_metric_override_and_step_column(tmp_path: Path) -> None:
    body = [[s, x] for s, x in zip(STEPS, LOSS, strict=True)]
    path = write_csv(tmp_path / "odd.csv", ["it", "my loss"], body)
    options = HistoryOptions(metrics={"loss": "my loss", "step": "it"})
    assert list(read_history(path, options).loss.values) == LOSS


def _refused(capsys: pytest.CaptureFixture[str], args: list[str], tmp_path: Path) -> str:
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["compare", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()  # nothing written
    return err


def _damaged(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_truncated_event_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tb = write_tensorboard(rows(), MEGATRON, tmp_path / "tb")
    event = next(tb.glob("*tfevents*"))
    data = event.read_bytes()
    event.write_bytes(data[:-7])
    err = _refused(capsys, [str(tb)], tmp_path)
    assert str(event) in err and "truncated" in err
    assert event.read_bytes() == data[:-7]  # the input left as it was


def test_corrupt_event_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tb = write_tensorboard(rows(), MEGATRON, tmp_path / "tb")
    event = next(tb.glob("*tfevents*"))
    data = bytearray(event.read_bytes())
    data[len(data) // 2] ^= 0xFF
    event.write_bytes(bytes(data))
    assert "damaged" in _refused(capsys, [str(tb)], tmp_path)


@pytest.mark.parametrize(
    "name,text,expected",
    [
        ("string.jsonl", '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": "2.1x"}\n',
         "line 2: 'loss' is '2.1x', not a number"),
        ("dup.jsonl", '{"step": 1, "loss": 2.0}\n{"step": 1, "loss": 2.1}\n',
         "logs 'loss' a second time"),
        ("back.jsonl", '{"step": 2, "loss": 2.0}\n{"step": 1, "loss": 2.1}\n',
         "step 1 comes after step 2"),
        ("nostep.jsonl", '{"loss": 2.0}\n', "no step column"),
        ("noloss.jsonl", '{"step": 1, "acc": 0.5}\n', "no loss"),
        ("string.csv", "step,loss\n1,2.0\n2,abc\n", "row 2 (line 3), column loss"),
        ("dup.csv", "step,loss\n1,2.0\n1,2.1\n", "logs 'loss' a second time"),
        ("noloss.csv", "step,acc\n1,0.5\n", "no loss"),
    ],
)  # fmt: skip
def test_damaged_histories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, expected: str
) -> None:
    path = _damaged(tmp_path, name, text.encode())
    assert expected in _refused(capsys, [str(path)], tmp_path)
    assert path.read_text() == text


@pytest.mark.parametrize("name", ["latin1.jsonl", "latin1.csv"])
def test_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    body = (
        b'{"step": 1, "loss": 2.0, "note\xe9": 1}\n'
        if name.endswith("jsonl")
        else b"step,loss\n1,2.0\xe9\n"
    )
    path = _damaged(tmp_path, name, body)
    assert "not UTF-8" in _refused(capsys, [str(path)], tmp_path)


def test_two_runs_in_one_tensorboard_dir(tmp_path: Path) -> None:
    """A restarted trainer that appends a second run without purging: steps go back."""
    write_tensorboard(rows(), MEGATRON, tmp_path / "tb")
    write_tensorboard(rows()[:5], MEGATRON, tmp_path / "tb")
    with pytest.raises(ConfigError, match="goes back|repeats"):
        read_history(tmp_path / "tb")


def test_unknown_metric_override(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "h.csv", ["step", "loss"], [[1, 2.0]])
    with pytest.raises(ConfigError, match="--metric grad_norm=gn: no such column"):
        read_history(path, HistoryOptions(metrics={"grad_norm": "gn"}))


def test_a_named_source_that_does_not_match(tmp_path: Path) -> None:
    tb = write_tensorboard(rows(), MEGATRON, tmp_path / "tb")
    with pytest.raises(ConfigError, match="no loss \\(torchtitan logs it as 'loss_metrics"):
        read_history(tb, HistoryOptions(source="torchtitan"))


def test_several_event_folders_name_them(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_tensorboard(rows()[:3], MEGATRON, tmp_path / "tb" / name)
    with pytest.raises(ConfigError, match="2 folders of event files below it \\(a, b\\)"):
        read_history(tmp_path / "tb")
