"""The fleetdiag CLI in this process, noting when its run request leaves for a keeper: start-up before
the request leaves.

    python bench/_first_send.py OUTFILE fleetdiag-arguments...

Appends to OUTFILE one line per run request written to a Unix socket (the keeper's): the seconds since
this script started. The CLI runs through its console entry (``fleetdiag.entry``), so a request sent
ahead (``ssh.keeper.ahead``) is the first line; a probe that sends its own is noted when it does. The
interpreter's own start-up (``python -c pass``) comes before and is measured apart.
"""

import time

T0 = time.perf_counter()

import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

OUT = sys.argv[1]
_send, _sendall = socket.socket.send, socket.socket.sendall


def _note(sock: socket.socket, data) -> None:  # type: ignore[no-untyped-def]
    if sock.family == socket.AF_UNIX and b'"op": "run"' in bytes(data[:4096]):
        with open(OUT, "a") as fh:  # now: the CLI leaves with os._exit, so nothing waits for exit
            fh.write(f"{time.perf_counter() - T0:.4f}\n")


def _noting_send(self: socket.socket, data, *args):  # type: ignore[no-untyped-def]
    _note(self, data)
    return _send(self, data, *args)


def _noting_sendall(self: socket.socket, data, *args):  # type: ignore[no-untyped-def]
    _note(self, data)
    return _sendall(self, data, *args)


socket.socket.send = _noting_send  # type: ignore[method-assign]
socket.socket.sendall = _noting_sendall  # type: ignore[method-assign]
sys.argv = ["fleetdiag", *sys.argv[2:]]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fleetdiag.entry import run  # noqa: E402

run()
