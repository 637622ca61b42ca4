"""The keeper's wire protocol: length-prefixed frames, the peer's uid, what a starting keeper answers, and
the terms both ends share.

Frames are a 4-byte big-endian length and a payload. The keeper opens with ``{"hello": 1, "pid": ...}``;
a request is one JSON frame (``op``: ``run``, ``list``, ``close``; ``open`` from CLIs before ``run``
carried it). ``run`` names the host's connection (``key``, ``params``) and the command: the keeper dials
when it holds no live connection for ``key``, so one request is the open and the command. It answers
with frames whose first byte says what follows: ``O`` stdout bytes, ``E`` stderr bytes, ``X`` a JSON end
record; and, before them, ``C`` (empty) once the connection is ready, when the request asked
(``CONNECTED_KEY``): a client that holds a handshake slot for the host gives it back there.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from ..reach import MAX_OUTPUT

PERSIST_ENV = "FLEETDIAG_PERSIST"
DEFAULT_PERSIST = 600.0
OUTPUT_CAP = MAX_OUTPUT  # the one cap on what is read from a host (reach.py)
READY, FAILED, TAKEN = b"0", b"1", b"2"  # what a starting keeper tells the command that started it
# A ``run`` with ``kept_only`` (sent ahead, ``ahead``) runs only on a connection the keeper holds; else it
# ends NOT_RUN with this kind, and the command sends its own request.
NOT_KEPT = "not-kept"
# A ``run`` with this key true gets a ``CONNECTED`` frame once its connection is ready (dialled or kept),
# before the command's output: the handshake is over, the command not yet started.
CONNECTED_KEY = "connected"
CONNECTED = b"C"


async def send(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(struct.pack(">I", len(payload)) + payload)
    await writer.drain()


async def recv(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    (n,) = struct.unpack(">I", head)
    if n > 64 * 1024 * 1024:
        raise ValueError("frame too large")
    return await reader.readexactly(n)


def peer_uid(sock: socket.socket) -> int | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid
