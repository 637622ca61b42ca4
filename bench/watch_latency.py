"""How fast does ``fleetdiag watch`` notice a failure, and what does it cost the host?

Run: ``python bench/watch_latency.py`` (needs /usr/sbin/sshd, like the tests).

1. Detection latency at a simulated RTT of 240 ms (a DelayProxy in front of a
   real loopback sshd): the time from the seeds' failure being appended to a
   log that was growing healthily, to the ``failed`` state-change event.
   Target: ≤ RTT/2 + 250 ms = 370 ms. Side by side: the follower woken by
   inotify (the default where GNU tail exists), the follower polling every
   0.2 s (the fallback), and a controller that polls the log itself every 1 s
   over the same persistent connection (what "watch" would be without a
   remote follower; the seeds' user polled every 30 s).
2. The remote follower's CPU while the log is idle: the whole process tree of
   the exec (found by the pid the snapshot reports) read from /proc over
   ~10 s. Target: below 1 % of one core.

Prints numbers, not pass/fail (DESIGN §9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetdiag.analysis import load_rules  # noqa: E402
from fleetdiag.delayproxy import DelayProxy  # noqa: E402
from fleetdiag.inventory import parse_inventory  # noqa: E402
from fleetdiag.ssh.transport import connect  # noqa: E402
from fleetdiag.watch import FAILED, HEALTHY, RECOVERED, STARTING, Watch, WatchSettings  # noqa: E402
from tests.sshd import start_sshd  # noqa: E402

SEED = (ROOT / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text().splitlines(keepends=True)
CUT = next(i for i, ln in enumerate(SEED) if " ERROR " in ln)
HEAD, FAILURE = "".join(SEED[:CUT]), "".join(SEED[CUT:])
RULES = load_rules(user_default=False)
TICK = os.sysconf("SC_CLK_TCK")


def healthy_line(i: int) -> str:
    return f"(APIServer pid=6412) INFO 05-09 15:14:{i % 60:02d} [loggers.py:123] Engine 000: step {i}\n"


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def grow_for(path: Path, seconds: float, start: int, every: float = 0.1) -> int:
    i = start
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        append(path, healthy_line(i))
        i += 1
        await asyncio.sleep(every)
    return i


async def watch_latency(server, rtt: float, trials: int, mode: str, workdir: Path) -> list[float]:
    """Milliseconds from append to the failed event, one per trial."""
    log = workdir / f"vllm-{mode}.log"
    log.write_text(HEAD)
    proxy = await DelayProxy("127.0.0.1", server.port, rtt).start()
    server.trust(proxy.port)
    inv = parse_inventory(
        f"hosts:\n  far:\n    address: 127.0.0.1\n    port: {proxy.port}\n    user: {server.user}\n"
        f"    logs:\n      vllm: {log}\n",
        "bench.yaml",
    )
    w = Watch(list(inv.hosts.values()), WatchSettings(transport=server.opts(), rules=RULES, mode=mode, facts=False))
    got: dict[str, float] = {}
    changed = asyncio.Event()

    history: list[str] = []

    async def consume() -> None:
        async for ev in w.events():
            got[ev.state] = time.monotonic()
            history.append(f"{ev.previous}→{ev.state} ({ev.reason})")
            changed.set()

    async def until(*states: str, timeout: float = 30) -> float:
        end = time.monotonic() + timeout
        while w.views["far"].state not in states:
            changed.clear()
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"still {w.views['far'].state}, wanted {states}; events: {history[-6:]}")
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        return got.get(w.views["far"].state, time.monotonic())

    task = asyncio.ensure_future(consume())
    out: list[float] = []
    i = 0
    try:
        await until(HEALTHY, STARTING)
        for _ in range(trials):
            i = await grow_for(log, random.uniform(0.6, 1.4), i)  # healthy growth, then the failure at a random phase
            await asyncio.sleep(random.uniform(0, 0.2))
            t0 = time.monotonic()
            append(log, FAILURE)
            t1 = await until(FAILED)
            out.append((t1 - t0) * 1000)
            with open(log, "w", encoding="utf-8") as fh:  # a relaunch: truncate, start again
                fh.write(HEAD)
            await until(HEALTHY, RECOVERED, STARTING)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await proxy.stop()
    return out


async def controller_poll_latency(server, rtt: float, trials: int, every: float, workdir: Path) -> list[float]:
    """The baseline: the controller runs `tail -c +OFFSET` over its open connection every `every` seconds."""
    log = workdir / "vllm-poll-controller.log"
    log.write_text(HEAD)
    proxy = await DelayProxy("127.0.0.1", server.port, rtt).start()
    server.trust(proxy.port)
    conn = await connect("127.0.0.1", proxy.port, server.user, server.opts())
    out: list[float] = []
    offset = len(HEAD.encode())
    i = 0
    try:
        for _ in range(trials):
            appended: list[float] = []

            async def writer() -> None:
                nonlocal i
                i = await grow_for(log, random.uniform(0.6, 1.4), i)
                await asyncio.sleep(random.uniform(0, 0.2))
                appended.append(time.monotonic())
                append(log, FAILURE)

            wt = asyncio.ensure_future(writer())
            while True:
                data, _status, _o, _t = await conn.run(f"tail -c +{offset + 1} {log}", 30)
                offset += len(data)
                if b"DP adjusted local rank" in data:
                    out.append((time.monotonic() - appended[0]) * 1000)
                    break
                await asyncio.sleep(every)
            await wt
            log.write_text(HEAD)
            offset = len(HEAD.encode())
    finally:
        conn.close()
        await proxy.stop()
    return out


# ------------------------------------------------------------------ CPU


def _tree_ticks(root: int) -> int:
    """utime+stime of a process tree, children it already reaped included."""
    stats: dict[int, tuple[int, list[str]]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2 :].split()
        stats[int(d)] = (int(f[1]), f)
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _f) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid in stats:
            total += sum(int(x) for x in stats[pid][1][11:15])
        stack.extend(kids.get(pid, []))
    return total


async def idle_cpu(server, workdir: Path, seconds: float, grow_every: float | None = None, **kw) -> float:
    """Percent of one core used by the remote follower's process tree while its log is idle (or growing)."""
    log = workdir / f"idle-{random.randrange(10**6)}.log"
    log.write_text(HEAD)
    inv = parse_inventory(
        f"hosts:\n  h:\n    address: 127.0.0.1\n    port: {server.port}\n    user: {server.user}\n"
        f"    logs:\n      vllm: {log}\n",
        "bench.yaml",
    )
    w = Watch(list(inv.hosts.values()), WatchSettings(transport=server.opts(), rules=RULES, facts=False, **kw))

    async def consume() -> None:
        async for _ev in w.events():
            pass

    task = asyncio.ensure_future(consume())
    try:
        watcher = w.watchers[0]
        for _ in range(100):
            if watcher.remote_pids:
                break
            await asyncio.sleep(0.1)
        root = watcher.remote_pids[-1]
        await asyncio.sleep(2)  # past start-up (the snapshot, the line count)
        t0, c0 = time.monotonic(), _tree_ticks(root)
        if grow_every:
            await grow_for(log, seconds, 0, grow_every)
        else:
            await asyncio.sleep(seconds)
        t1, c1 = time.monotonic(), _tree_ticks(root)
        return (c1 - c0) / TICK / (t1 - t0) * 100
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="fleetdiag-bench-"))
    server = start_sshd(work / "sshd")
    rtt = args.rtt
    target = rtt / 2 + 250
    try:
        print(
            f"fleetdiag watch: detection latency at simulated RTT {rtt:.0f} ms "
            f"(target ≤ RTT/2 + 250 ms = {target:.0f} ms), {args.trials} trials each"
        )
        print(f"  {'':40} {'median':>8} {'p90':>8} {'max':>8}")
        rows = [
            ("watch, follower woken by inotify", await watch_latency(server, rtt, args.trials, "auto", work)),
            ("watch, follower polling every 0.2 s", await watch_latency(server, rtt, args.trials, "poll", work)),
            ("controller polls over SSH every 1 s", await controller_poll_latency(server, rtt, args.trials, 1.0, work)),
        ]
        base = statistics.median(rows[0][1])
        for name, ms in rows:
            med = statistics.median(ms)
            ok = "ok" if pct(ms, 0.9) <= target else "over target"
            ratio = f"{med / base:5.1f}×"
            print(f"  {name:40} {med:6.0f}ms {pct(ms, 0.9):6.0f}ms {max(ms):6.0f}ms  {ratio}  p90 {ok}")
        print(
            f"  (the seeds' user: a 30 s poll loop, ≈{15000 + 1.5 * rtt:.0f} ms on average, "
            f"{(15000 + 1.5 * rtt) / base:.0f}× the follower)"
        )
        print(
            f"\nremote follower CPU while the log is idle ({args.cpu_seconds:.0f} s, process tree via /proc; target < 1 % of a core)"
        )
        for name, kw in [
            ("wake mode (default: inotify doorbell, bash)", {}),
            ("wake mode + --process (pgrep check)", {"process": "sshd"}),
            ("poll mode, bash (no GNU tail)", {"mode": "poll"}),
            ("poll mode, POSIX sh + sleep (no bash)", {"mode": "poll", "shell": "sh"}),
        ]:
            cpu = await idle_cpu(server, work, args.cpu_seconds, **kw)
            print(f"  {name:48} {cpu:5.2f} % of a core  {'ok' if cpu < 1 else 'over target'}")
        cpu = await idle_cpu(server, work, args.cpu_seconds, grow_every=0.1)
        print(f"  {'for scale: wake mode, log growing 10 lines/s':48} {cpu:5.2f} % of a core  (no target)")
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt", type=float, default=240.0, help="simulated round trip, ms")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--cpu-seconds", type=float, default=10.0)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
