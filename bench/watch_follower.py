"""The remote follower by hand, over a real sshd behind a delay proxy: does it keep following?

Run: ``python bench/watch_follower.py [--rtt 240] [--seconds 8] [--stdin devnull,open]``
(needs /usr/sbin/sshd).

One asyncssh exec of the follower script (``remote/follow.py``'s ``build_script``, as ``watch`` sends
it) per case, through a ``DelayProxy`` of ``--rtt`` ms; an error line is appended to its log every
0.5 s. Printed per case: when the snapshot's end marker arrived, each appended line's latency (append
to its ``L`` record's arrival), and whether the follower ended before the client closed it (with the
time and exit status). The cases differ in the exec's stdin:

- ``devnull``: asyncssh's ``stdin=DEVNULL``: the client sends EOF right after the exec's reply, so it
  reaches the host one round trip after the script started;
- ``open``: stdin stays open (never written) until the client closes the channel.

A follower must keep following in both. Also printed: the machine's ``tail``, ``bash`` and ``sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import asyncssh  # noqa: E402

from fleetdiag.analysis import load_rules  # noqa: E402
from fleetdiag.delayproxy import DelayProxy  # noqa: E402
from fleetdiag.remote import follow, funnel  # noqa: E402
from tests.sshd import start_sshd  # noqa: E402

SEED = (ROOT / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text().splitlines(keepends=True)
FAILURE = "".join(SEED[next(i for i, ln in enumerate(SEED) if " ERROR " in ln) :])
DECISIVE = "DP adjusted local rank 3 is out of bounds"


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc})"
    return out.splitlines()[0] if out else ""


def tools() -> dict:
    sh = shutil.which("sh") or "sh"
    return {
        "tail": _first_line(["tail", "--version"]),
        "bash": _first_line(["bash", "--version"]),
        "sh": os.path.realpath(sh),
        "kernel": os.uname().release,
        "cores": os.cpu_count(),
        "load": round(os.getloadavg()[0], 1),
    }


async def case(
    server, port: int, log: Path, stdin: str, seconds: float, block: str = "", heartbeat: float = 2.0
) -> dict:
    rules = load_rules(user_default=False)
    log.write_text("INFO first line\n")
    fs = funnel.FunnelSpec(
        log=str(log), keywords=rules.keyword_ere(), run_start=rules.run_start_ere(), tags=rules.tag_ere()
    )
    spec = follow.FollowSpec(
        funnel=fs, waiting=rules.waiting_ere(), ready=rules.ready_ere(), session="bench", heartbeat=heartbeat
    )
    mark = funnel.new_mark()
    command = funnel.remote_command(follow.build_script(spec, mark))
    conn = await asyncssh.connect(
        "127.0.0.1",
        port,
        username=server.user,
        client_keys=[str(server.client_key)],
        known_hosts=str(server.known_hosts),
        config=None,
    )
    res: dict = {"stdin": stdin, "block": bool(block), "heartbeat": heartbeat, "latencies_ms": [], "sync_ms": []}
    res.update(before_ms=[], ended=None)  # before_ms: the append's time minus the previous record's arrival
    last = 0.0
    appended: dict[str, float] = {}
    pending: dict[str, float] = {}  # appended lines seen, their burst's sync mark not yet
    try:
        t0 = time.time()
        proc = await conn.create_process(
            command, stdin=asyncssh.DEVNULL if stdin == "devnull" else asyncssh.PIPE, stderr=asyncssh.DEVNULL
        )

        async def appender() -> None:
            i = 0
            while True:
                await asyncio.sleep(random.uniform(0.35, 0.65))
                text = f"RuntimeError: boom {i}"
                appended[text] = time.time()
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(block.replace(DECISIVE, text) if block else text + "\n")
                i += 1

        task = None
        end = time.time() + seconds
        while True:
            try:
                raw = await asyncio.wait_for(proc.stdout.readline(), max(0.01, end - time.time()))
            except asyncio.TimeoutError:
                break
            now = time.time()
            if not raw:
                await proc.wait_closed()
                res["ended"] = {"after_s": round(now - t0, 2), "exit_status": proc.exit_status}
                break
            raw = raw.rstrip("\n")
            if raw == mark + " end":
                res["snapshot_s"] = round(now - t0, 3)
                task = asyncio.ensure_future(appender())
                continue
            rec = follow.parse_record(raw)
            if isinstance(rec, follow.Line):
                hit = next((t for t in appended if rec.text.endswith(t)), None)
                if hit is not None and hit not in pending:
                    res["latencies_ms"].append(round((now - appended[hit]) * 1000))
                    res["before_ms"].append(round((appended[hit] - last) * 1000))
                    pending[hit] = appended[hit]
            elif isinstance(rec, follow.Sync) and pending:
                res["sync_ms"].append(round((now - min(pending.values())) * 1000))
                pending.clear()
            if not pending:
                last = now
        if task is not None:
            task.cancel()
        res["appended"] = len(appended)
        proc.close()
    finally:
        conn.close()
    return res


async def main_async(args) -> None:
    with tempfile.TemporaryDirectory(prefix="fleetdiag-watch-follower-") as tmp:
        server = start_sshd(Path(tmp) / "sshd")
        try:
            port = server.port  # --rtt 0: straight to sshd
            if args.rtt > 0:
                proxy = await DelayProxy("127.0.0.1", server.port, args.rtt).start()
                server.trust(proxy.port)
                port = proxy.port
            print(json.dumps({"tools": tools(), "rtt_ms": args.rtt}), flush=True)
            for _ in range(args.rounds):
                for stdin in args.stdin.split(","):
                    block = FAILURE if args.block else ""
                    log = Path(tmp) / f"{stdin}.log"
                    r = await case(server, port, log, stdin, args.seconds, block, args.heartbeat)
                    print(json.dumps(r), flush=True)
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt", type=float, default=240.0)
    ap.add_argument("--seconds", type=float, default=8.0, help="how long each case follows")
    ap.add_argument("--stdin", default="devnull,open")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--heartbeat", type=float, default=2.0)
    ap.add_argument("--block", action="store_true", help="append the seeds' failure block, not one line")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
