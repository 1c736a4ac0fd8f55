"""The rendezvous port of a SLURM job: `python -P -m normlab.launch.cluster.port JOB_ID` prints it.

The batch script runs on the first node of the allocation (sbatch(1)), which is the rendezvous
host, so it can look there: the candidate derived from the job id is taken when nothing on that
node listens on it, else the next free one at a stride through the range. Two jobs sharing the
head node therefore get different ports even when their ids agree modulo the range
(`PORT_BASE + id % PORT_SPAN` alone collided there), and a requeued job starts from the same
candidate. The range ends below Linux's ephemeral ports (32768-60999), which the kernel hands to
outgoing connections. Left open:
two jobs that start on one node within the seconds between this probe and torchrun's bind AND
whose ids agree modulo PORT_SPAN. A leaf module: stdlib only, no torch.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable

PORT_BASE, PORT_SPAN = 20000, 12768  # [20000, 32768): under the ephemeral range
# a busy candidate moves by this stride, not by one: job id + 1 (the next job of a study, often on
# the same node) owns the next port, and a step of one would take it (prime to PORT_SPAN)
STRIDE = 4099


def port_is_free(port: int) -> bool:
    """Nothing on this host listens on `port` (TCP, any address), as TCPStore would bind it:
    with SO_REUSEADDR, so the TIME_WAIT connections an earlier job left behind do not count as
    busy (TCPStore binds through them; counting them moved a job onto its neighbour's port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def rendezvous_port(job_id: int, is_free: Callable[[int], bool] = port_is_free) -> int:
    """The job's own candidate, else the first free one at STRIDE steps from it, wrapping within
    the range (STRIDE is prime to PORT_SPAN, so every port is tried once)."""
    start = job_id % PORT_SPAN
    for k in range(PORT_SPAN):
        port = PORT_BASE + (start + k * STRIDE) % PORT_SPAN
        if is_free(port):
            return port
    raise SystemExit(f"normlab: no free rendezvous port in [{PORT_BASE}, {PORT_BASE + PORT_SPAN})")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m normlab.launch.cluster.port SLURM_JOB_ID", file=sys.stderr)
        return 2
    print(rendezvous_port(int(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
