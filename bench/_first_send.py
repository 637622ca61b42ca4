"""The fleetdiag CLI in this process, noting when it first reaches a keeper: start-up before the request leaves.

    python bench/_first_send.py OUTFILE fleetdiag-arguments...

Appends to OUTFILE one line per connection to a Unix socket (the keeper's): the seconds since this
script started. A warm probe connects twice (open, then the command), so the last line is when the
command left. The interpreter's own start-up (``python -c pass``) comes before and is measured apart.
"""

import time

T0 = time.perf_counter()

import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

OUT = sys.argv[1]
_connect = socket.socket.connect


def _noting(self: socket.socket, address) -> None:  # type: ignore[no-untyped-def]
    if self.family == socket.AF_UNIX:
        with open(OUT, "a") as fh:  # now: the CLI leaves with os._exit, so nothing waits for exit
            fh.write(f"{time.perf_counter() - T0:.4f}\n")
    return _connect(self, address)


socket.socket.connect = _noting  # type: ignore[method-assign]
sys.argv = ["fleetdiag", *sys.argv[2:]]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fleetdiag.cli import main  # noqa: E402

main()
