"""Delay proxies in their own process, so subprocess clients and the bench share them.

Started by :class:`bench._common.Proxies`; not meant to be run by hand::

    python bench/_proxyd.py TARGET_PORT RTT_MS [RTT_MS ...]

prints one JSON line ``{"ports": [...]}`` (one ``DelayProxy`` per RTT, all in
front of 127.0.0.1:TARGET_PORT), then answers line commands on stdin:
``stats`` prints ``{"exchanges": [...], "connections": [...]}``, ``reset``
zeroes the counters (and prints ``{}``). It exits when stdin closes, or after
an hour at most, whichever comes first: it never outlives the bench.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetdiag.delayproxy import DelayProxy  # noqa: E402

MAX_LIFETIME = 3600.0


async def main(target_port: int, rtts: list[float]) -> None:
    proxies = [await DelayProxy("127.0.0.1", target_port, rtt).start() for rtt in rtts]
    print(json.dumps({"ports": [p.port for p in proxies]}), flush=True)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.strip())
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()

    async def serve() -> None:
        while True:
            cmd = await lines.get()
            if cmd is None:
                return
            if cmd == "stats":
                print(
                    json.dumps(
                        {"exchanges": [p.exchanges for p in proxies], "connections": [p.connections for p in proxies]}
                    ),
                    flush=True,
                )
            elif cmd == "reset":
                for p in proxies:
                    p.reset_counts()
                    p.connections = 0
                print("{}", flush=True)

    try:
        await asyncio.wait_for(serve(), MAX_LIFETIME)
    except asyncio.TimeoutError:
        pass
    finally:
        for p in proxies:
            await p.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), [float(x) for x in sys.argv[2:]]))
