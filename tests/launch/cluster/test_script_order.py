"""The batch script's order and its rendezvous port (issue 30, item 8).

* The cluster file's set-up lines run before `set -u`: a set-up line that reads an unset variable
  (as some sites' `module load` and conda activation do) runs; the same line after `set -u` is
  the failure this guards against.
* Two jobs sharing a node get different rendezvous ports, also when their ids agree modulo the
  port range: the script's own port line, run by bash while the first job's port is held on this
  host, prints another port, which is free.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from normlab.launch.cluster.port import (
    PORT_BASE,
    PORT_SPAN,
    STRIDE,
    port_is_free,
    rendezvous_port,
)
from normlab.launch.cluster.script import render_script
from normlab.launch.cluster.spec import ClusterSpec

from tests.dist_helpers import env

SETUP = ['[ -z "$NORMLAB_NEVER_SET_VAR" ] && echo "setup ran"', "export SITE_READY=1"]


def _script(tmp_path: Path) -> list[str]:
    spec = ClusterSpec(setup=list(SETUP), env={"OMP_NUM_THREADS": 4}, python=sys.executable)
    return render_script(spec, "job", tmp_path / "run", tmp_path).splitlines()


def _bash(lines: list[str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "\n".join(lines)], env={**env(), **(extra or {})},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_setup_lines_run_before_set_u(tmp_path: Path) -> None:
    lines = _script(tmp_path)
    strict = lines.index("set -uo pipefail")
    assert all(lines.index(s) < strict for s in SETUP)
    assert lines.index("export OMP_NUM_THREADS=4") < strict
    assert not any(ln.startswith("set -") for ln in lines[:strict])
    # the script from its top through `set -u`, then a line that needs it: set-up ran unharmed
    proc = _bash([*lines[: strict + 1], 'echo "ready=$SITE_READY"'])
    assert proc.returncode == 0 and proc.stdout.split() == ["setup", "ran", "ready=1"], proc.stderr
    # the order this replaces: the same set-up line under set -u fails
    proc = _bash(["set -uo pipefail", SETUP[0]])
    assert proc.returncode != 0 and "NORMLAB_NEVER_SET_VAR" in proc.stderr


def test_ports_of_jobs_agreeing_modulo_the_range_differ_when_one_is_taken() -> None:
    taken: set[int] = set()
    first = rendezvous_port(1234, lambda p: p not in taken)
    assert first == PORT_BASE + 1234
    taken.add(first)
    second = rendezvous_port(1234 + PORT_SPAN, lambda p: p not in taken)
    assert second != first and PORT_BASE <= second < PORT_BASE + PORT_SPAN
    # the range wraps at its end and stays under the ephemeral ports
    last = PORT_SPAN - 1
    moved = rendezvous_port(last, lambda p: p != PORT_BASE + last)
    assert moved == PORT_BASE + (last + STRIDE) % PORT_SPAN
    assert PORT_BASE + PORT_SPAN <= 32768
    # a busy candidate never moves onto the next job's port (a study's next job, same node)
    assert rendezvous_port(500, lambda p: p != PORT_BASE + 500) != PORT_BASE + 501
    # every port of the range is tried once
    assert len({(k * STRIDE) % PORT_SPAN for k in range(PORT_SPAN)}) == PORT_SPAN


def test_a_port_left_in_time_wait_counts_as_free() -> None:
    """An earlier job's closed rendezvous leaves TIME_WAIT connections; TCPStore binds through
    them (SO_REUSEADDR), so the probe must not count the port as busy."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the side that closes first holds TIME_WAIT
    server.close()
    client.close()
    assert port_is_free(port)


def _held_job() -> tuple[int, socket.socket]:
    """A job id whose candidate port this test holds listening (as a job's TCPStore would)."""
    for job in range(40_000, 40_400):
        port = PORT_BASE + job % PORT_SPAN
        s = socket.socket()
        try:
            s.bind(("", port))
        except OSError:
            s.close()
            continue
        s.listen()
        return job, s
    pytest.skip("no bindable port in the range on this host")


def test_script_port_line_skips_a_port_in_use_on_the_node(tmp_path: Path) -> None:
    lines = _script(tmp_path)
    port_line = next(ln for ln in lines if ln.startswith("port="))
    setup = [ln for ln in lines if ln.startswith("PYTHON=")]
    job, held = _held_job()
    with held:
        other = job + PORT_SPAN  # another job sharing the node, same id modulo the range
        for job_id in (job, other):
            proc = _bash([*setup, port_line, 'echo "$port"'], {"SLURM_JOB_ID": str(job_id)})
            assert proc.returncode == 0, proc.stderr
            port = int(proc.stdout.strip())
            assert port != held.getsockname()[1] and port_is_free(port)
            assert PORT_BASE <= port < PORT_BASE + PORT_SPAN
