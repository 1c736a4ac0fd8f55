"""The rendezvous port of a SLURM job: `python -P -m normlab.launch.cluster.port JOB_ID` prints it.

The batch script runs on the first node of the allocation (sbatch(1)), which is the rendezvous
host, so it can look there: the candidate derived from the job id is taken when nothing on that
node listens on it, else the next free one in the range. Two jobs sharing the head node therefore
get different ports even when their ids agree modulo the range (`PORT_BASE + id % PORT_SPAN`
alone collided there), and a requeued job starts from the same candidate. The range ends below
Linux's ephemeral ports (32768-60999), which the kernel hands to outgoing connections. Left open:
two jobs that start on one node within the seconds between this probe and torchrun's bind AND
whose ids agree modulo PORT_SPAN. A leaf module: stdlib only, no torch.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable

PORT_BASE, PORT_SPAN = 20000, 12768  # [20000, 32768): under the ephemeral range


def port_is_free(port: int) -> bool:
    """Nothing on this host listens on `port` (TCP, any address), as TCPStore would bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def rendezvous_port(job_id: int, is_free: Callable[[int], bool] = port_is_free) -> int:
    """The first free port from the job's own candidate on, wrapping within the range."""
    start = job_id % PORT_SPAN
    for k in range(PORT_SPAN):
        port = PORT_BASE + (start + k) % PORT_SPAN
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
