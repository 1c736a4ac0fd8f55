"""A directory of TensorBoard event files, read with the tensorboard package's own reader.

Every record of every event file is first read with tensorboard's record reader (the one its
EventFileLoader uses when TensorFlow is absent), which checks each record's length and CRC: a
truncated or damaged file is one ConfigError line naming it and the record, rather than the
silent early stop the loader itself makes (it waits for a writer that is still appending). The
scalars are then read with EventAccumulator (SummaryWriter's simple values, and TF2's scalar
tensors), which also drops what a restarted writer purged. A tag whose steps go back or repeat is
refused: two runs written into one directory are not one history.
"""

from __future__ import annotations

from pathlib import Path

from normlab.launch.errors import ConfigError
from normlab.launch.histories.history import Series

EVENT_GLOB = "*tfevents*"


def event_files(path: Path) -> list[Path]:
    return sorted(p for p in path.glob(EVENT_GLOB) if p.is_file())


def check_records(path: Path) -> int:
    """The number of records in one event file; ConfigError at the first damaged one."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    reader = PyRecordReader_New(str(path))
    n = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return n
        except errors.DataLossError as exc:
            what = "truncated" if "truncated" in str(exc) else "damaged (CRC check failed)"
            raise ConfigError(
                f"{path}: event record {n + 1} is {what}; the file was cut short or corrupted "
                f"(its first {n} records are intact)"
            ) from None
        try:
            event_pb2.Event.FromString(reader.record())
        except DecodeError:
            raise ConfigError(f"{path}: event record {n + 1} is not a TensorBoard event") from None
        n += 1


def read_tensorboard(path: Path) -> dict[str, Series]:
    """Every scalar tag of the event files directly in `path` as a Series."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    files = event_files(path)
    if not files:
        raise ConfigError(f"{path}: no TensorBoard event files ({EVENT_GLOB})")
    for f in files:
        check_records(f)
    acc = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    points: dict[str, list[tuple[int, float]]] = {}
    for tag in tags.get(ea.SCALARS, []):
        points[tag] = [(int(e.step), float(e.value)) for e in acc.Scalars(tag)]
    for tag in tags.get(ea.TENSORS, []):
        values = []
        for e in acc.Tensors(tag):
            array = tensor_util.make_ndarray(e.tensor_proto)
            if array.size != 1 or array.dtype.kind not in "fiu":
                break  # not a scalar series (a histogram, text)
            values.append((int(e.step), float(array.reshape(()))))
        else:
            points.setdefault(tag, values)
    out: dict[str, Series] = {}
    for tag, pts in points.items():
        for (s0, _), (s1, _) in zip(pts, pts[1:], strict=False):
            if s1 <= s0:
                kind = "repeats" if s1 == s0 else f"goes back after step {s0}"
                raise ConfigError(
                    f"{path}: tag {tag!r}: step {s1} {kind}; a history needs each step once, in "
                    "order (two runs written into one directory?)"
                )
        out[tag] = Series(tuple(s for s, _ in pts), tuple(v for _, v in pts))
    return out
