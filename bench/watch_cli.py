"""Detection latency of ``fleetdiag watch`` through the CLI, for 1, 3 and 50 hosts at 240 ms RTT.

Run: ``python bench/watch_cli.py [--hosts 1,3,50] [--rounds 3] [--rtt 240]`` (needs /usr/sbin/sshd).

Every host is a real loopback sshd behind its own delay proxy (``bench/_proxyd.py``), its log growing
healthily; the installed console script runs ``watch all --jsonl`` as a user would. Once every host is
healthy, the seeds' failure is appended to each host's log in turn; the latency is the ``failed``
event's own time minus the append's time (same clock). Then each log is truncated back to its healthy
head (the host recovers) and the next round starts. Also counted: ``unreachable`` events (a follower
must never end by design), and failed events whose decisive line is not the seed's (a traceback frame
while the block was being written). Target: p90 ≤ RTT/2 + 50 ms.

``--floor`` measures the same appends through the same proxies with no fleetdiag at all: one OpenSSH
``ssh HOST tail -F -n0 LOG`` per host, the latency being the decisive line's arrival. On a machine that
also plays the hosts, that is the floor the machine itself sets. ``--profile FILE`` runs the watch under
cProfile (the controller's time, per function). Each result carries the 1-minute load average at its
start and end and the machine's core count: on a shared machine the numbers move with it.

Prints numbers, not pass/fail (DESIGN §9).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import PROFILED_CLI  # noqa: E402

from tests.sshd import ssh_argv, start_sshd  # noqa: E402

SEED = (ROOT / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text().splitlines(keepends=True)
CUT = next(i for i, ln in enumerate(SEED) if " ERROR " in ln)
HEAD, FAILURE = "".join(SEED[:CUT]), "".join(SEED[CUT:])
DECISIVE = "DP adjusted local rank 3 is out of bounds"


# the CLI with its garbage collections, the follower records that end a burst (sync marks, heartbeats)
# and its analyses logged to a file, line by line (the CLI ends with os._exit: nothing may wait for the
# end): "gc START END GEN", "rec TIME HOST KIND", "an START END HOST"
TRACED = """
import gc, sys, time
from fleetdiag.cli import run
from fleetdiag.remote import follow
from fleetdiag.watch import host
out = open(sys.argv.pop(1), "w", buffering=1)
t = [0.0]
def cb(phase, info):
    if phase == "start":
        t[0] = time.time()
    else:
        out.write(f"gc {t[0]:.6f} {time.time():.6f} {info['generation']}\\n")
gc.callbacks.append(cb)
record, analyze = host.HostWatcher._record, host.HostWatcher._analyze
def _record(self, rec):
    if isinstance(rec, (follow.Sync, follow.Heartbeat)):
        out.write(f"rec {time.time():.6f} {self.host.name} {type(rec).__name__}\\n")
    return record(self, rec)
def _analyze(self):
    t0 = time.time()
    try:
        return analyze(self)
    finally:
        out.write(f"an {t0:.6f} {time.time():.6f} {self.host.name}\\n")
host.HostWatcher._record, host.HostWatcher._analyze = _record, _analyze
sys.argv[0] = "fleetdiag"
run()
"""


def traced(path: str, trials: list[tuple[str, float, float]]) -> dict:
    """Where each detection's time went: until the burst's sync mark reached the controller (the host, the
    network), and after it (the controller: its analyses and collections meanwhile)."""
    gcs, recs, ans = [], [], []
    for ln in Path(path).read_text().splitlines():
        f = ln.split()
        if f[0] == "gc":
            gcs.append((float(f[1]), float(f[2]), int(f[3])))
        elif f[0] == "rec":
            recs.append((float(f[1]), f[2], f[3]))
        elif f[0] == "an":
            ans.append((float(f[1]), float(f[2]), f[3]))
    sync_ms, after_ms, gc_ms, an_ms = [], [], [], []
    for name, t0, t1 in trials:
        syncs = [t for t, h, k in recs if h == name and k == "Sync" and t0 <= t <= t1]
        ts = syncs[-1] if syncs else t1  # the sync the failure was decided on: the last one before the event
        sync_ms.append(round((ts - t0) * 1000))
        after_ms.append(round((t1 - ts) * 1000, 1))
        gc_ms.append(round(sum(max(0.0, min(e, t1) - max(s, t0)) for s, e, _ in gcs) * 1000, 1))
        an_ms.append(round(sum(max(0.0, min(e, t1) - max(s, t0)) for s, e, _ in ans) * 1000, 1))
    return {
        "to_sync_ms": sync_ms,
        "after_sync_ms": after_ms,
        "gc_in_detection_ms": gc_ms,
        "analyses_in_detection_ms": an_ms,
        "gen2_ms": sorted(round((e - s) * 1000, 1) for s, e, g in gcs if g == 2)[-10:],
    }


def healthy_line(i: int) -> str:
    return f"(APIServer pid=6412) INFO 05-09 15:14:{i % 60:02d} [loggers.py:123] Engine 000: step {i}\n"


def _grow(logs: list, names: list[str], failing: set[str], stop: threading.Event) -> None:
    """Every log but the failing ones grows healthily, a line every 0.2 s, as a serving vLLM's does."""
    i = 0
    while not stop.is_set():
        for p, name in zip(logs, names):
            if name not in failing:
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write(healthy_line(i))
        i += 1
        time.sleep(0.2)


def tree() -> str:
    """Where the watched CLI's fleetdiag comes from (a before/after run on one machine names both)."""
    code = "import fleetdiag, os; print(os.path.dirname(os.path.dirname(fleetdiag.__file__)))"
    exe = Path(sys.executable).parent / "python"
    return subprocess.run([str(exe), "-c", code], capture_output=True, text=True, cwd="/").stdout.strip()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


class Events:
    """The watch's JSON lines, read in a thread; wait for a condition on them."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[dict] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            seen = time.time()
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            doc["_seen"] = seen  # when the line reached its reader: what an operator sees
            with self.cond:
                self.lines.append(doc)
                self.cond.notify_all()

    def state(self) -> dict[str, str]:
        now: dict[str, str] = {}
        for d in self.lines:
            if d.get("event") == "state":
                now[d["host"]] = d["state"]
        return now

    def wait(self, pred, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True


class TailFloor:
    """The floor: bare OpenSSH ``tail -F`` sessions over the same proxies, no fleetdiag."""

    def __init__(self, server, ports: list[int], logs: list[Path], names: list[str]):
        self.seen: dict[str, list[float]] = {h: [] for h in names}  # arrival times of the decisive line
        self.up: set[str] = set()
        self.cond = threading.Condition()
        self.procs = []
        for port, log, name in zip(ports, logs, names):
            argv = ssh_argv(server, port) + [f"exec tail -F -n 0 -s 0.2 -- {shlex.quote(str(log))}"]
            argv[argv.index(f"HostKeyAlias=[127.0.0.1]:{server.port}")] = f"HostKeyAlias=[127.0.0.1]:{port}"
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(proc, name), daemon=True).start()

    def _read(self, proc: subprocess.Popen, name: str) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            t = time.time()
            with self.cond:
                self.up.add(name)
                if DECISIVE.encode() in raw:
                    self.seen[name].append(t)
                self.cond.notify_all()

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)


def run(
    n: int,
    rounds: int,
    rtt: float,
    workdir: Path,
    server,
    floor: bool = False,
    profile: str | None = None,
    settle: float = 25.0,
    trace: str | None = None,
) -> dict:
    logs = [workdir / f"n{n}-h{i:02d}.log" for i in range(n)]
    for p in logs:
        p.write_text(HEAD)
    proxyd = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "_proxyd.py"), str(server.port), *[str(rtt)] * n],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proxyd.stdout is not None
    ports = json.loads(proxyd.stdout.readline())["ports"]
    for port in ports:
        server.trust(port)
    inv = workdir / f"inv{n}.yaml"
    inv.write_text(
        "hosts:\n"
        + "".join(
            f"  h{i:02d}:\n    address: 127.0.0.1\n    port: {port}\n    user: {server.user}\n"
            f"    logs:\n      vllm: {json.dumps(str(logs[i]))}\n"
            for i, port in enumerate(ports)
        )
    )
    names = [f"h{i:02d}" for i in range(n)]
    load0 = os.getloadavg()[0]
    if floor:
        return run_floor(n, rounds, rtt, server, ports, logs, names, proxyd, load0)
    exe = [str(Path(sys.executable).parent / "fleetdiag")]
    if profile:
        exe = [sys.executable, "-c", PROFILED_CLI, f"{profile}.{n}"]
    elif trace:
        exe = [sys.executable, "-c", TRACED, f"{trace}.{n}"]
    argv = [*exe, "-i", str(inv), "watch", "all", "--jsonl", "--known-hosts", str(server.known_hosts)]
    argv += ["--identity", str(server.client_key), "--ssh-config", str(server.ssh_config)]
    watch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ev = Events(watch)
    stop = threading.Event()

    def grow() -> None:
        _grow(logs, names, failing, stop)

    failing: set[str] = set()
    grower = threading.Thread(target=grow, daemon=True)
    grower.start()
    latencies: list[float] = []
    spans: list[tuple[str, float, float]] = []  # (host, append, failed event) of each trial
    seen_ms: list[float] = []
    wrong: list[str] = []
    misses = 0
    t_up = time.monotonic()
    ok = ev.wait(lambda: all(ev.state().get(h) in ("healthy", "recovered") for h in names), 120)
    up_s = time.monotonic() - t_up
    try:
        for _ in range(rounds if ok else 0):
            for name, p in zip(names, logs):
                seen = len(ev.lines)
                failing.add(name)
                time.sleep(0.25)  # the grower's last healthy line is out of the way
                t0 = time.time()
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write(FAILURE)

                def failed(name: str = name, seen: int = seen) -> dict | None:
                    for d in ev.lines[seen:]:
                        if d.get("event") == "state" and d["host"] == name and d["state"] == "failed":
                            return d
                    return None

                if not ev.wait(lambda: failed() is not None, 30):
                    misses += 1
                    continue
                d = failed()
                latencies.append((d["time"] - t0) * 1000)
                spans.append((name, t0, d["time"]))
                seen_ms.append((d["_seen"] - t0) * 1000)
                if DECISIVE not in (d.get("decisive") or {}).get("line", ""):
                    wrong.append((d.get("decisive") or {}).get("line", ""))
            for name, p in zip(names, logs):  # back to a healthy run: each host recovers
                p.write_text(HEAD)
                failing.discard(name)
            ev.wait(lambda: all(ev.state().get(h) in ("healthy", "recovered") for h in names), 60)
        time.sleep(settle if n <= 3 else 5)  # a follower that ends by design would show up here as unreachable
    finally:
        stop.set()
        watch.terminate()
        watch.wait(20)
        proxyd.stdin.close()  # type: ignore[union-attr]
        proxyd.wait(10)
    down = [d["reason"][:60] for d in ev.lines if d.get("event") == "state" and d["state"] == "unreachable"]
    unreachable = len(down)
    final = ev.state()
    extra = traced(f"{trace}.{n}", spans) if trace else {}
    return {
        "hosts": n,
        "what": "fleetdiag watch --jsonl",
        "tree": tree(),
        "cores": os.cpu_count(),
        "load": [round(load0, 1), round(os.getloadavg()[0], 1)],
        "up_s": round(up_s, 1),
        "trials": len(latencies),
        "misses": misses,
        "p50_ms": round(pct(latencies, 0.5), 1),
        "p90_ms": round(pct(latencies, 0.9), 1),
        "max_ms": round(max(latencies), 1) if latencies else None,
        "seen_p50_ms": round(pct(seen_ms, 0.5), 1),
        "seen_p90_ms": round(pct(seen_ms, 0.9), 1),
        "target_ms": rtt / 2 + 50,
        "wrong_decisive": len(wrong),
        "unreachable_events": unreachable,
        "unreachable_why": sorted(set(down))[:5],
        "final_states": {st: list(final.values()).count(st) for st in sorted(set(final.values()))},
        "latencies_ms": [round(x) for x in latencies],
        **extra,
    }


def run_floor(n: int, rounds: int, rtt: float, server, ports, logs, names, proxyd, load0: float) -> dict:
    """The same appends, seen by bare ``tail -F`` over ssh through the same proxies."""
    floor = TailFloor(server, ports, logs, names)
    stop = threading.Event()
    failing: set[str] = set()

    def grow() -> None:
        _grow(logs, names, failing, stop)

    threading.Thread(target=grow, daemon=True).start()
    latencies: list[float] = []
    misses = 0
    t_up = time.monotonic()
    with floor.cond:
        floor.cond.wait_for(lambda: len(floor.up) == n, 120)
    up_s = time.monotonic() - t_up
    try:
        for _ in range(rounds):
            for name, p in zip(names, logs):
                seen = len(floor.seen[name])
                failing.add(name)
                time.sleep(0.25)
                t0 = time.time()
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write(FAILURE)
                with floor.cond:
                    if not floor.cond.wait_for(lambda name=name, seen=seen: len(floor.seen[name]) > seen, 30):
                        misses += 1
                        continue
                    latencies.append((floor.seen[name][seen] - t0) * 1000)
            for name, p in zip(names, logs):
                p.write_text(HEAD)
                failing.discard(name)
            time.sleep(1.0)
    finally:
        stop.set()
        floor.stop()
        proxyd.stdin.close()
        proxyd.wait(10)
    return {
        "hosts": n,
        "what": "floor: ssh tail -F",
        "cores": os.cpu_count(),
        "load": [round(load0, 1), round(os.getloadavg()[0], 1)],
        "up_s": round(up_s, 1),
        "trials": len(latencies),
        "misses": misses,
        "p50_ms": round(pct(latencies, 0.5), 1),
        "p90_ms": round(pct(latencies, 0.9), 1),
        "max_ms": round(max(latencies), 1) if latencies else None,
        "target_ms": rtt / 2 + 50,
        "latencies_ms": [round(x) for x in latencies],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="1,3,50")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtt", type=float, default=240.0)
    ap.add_argument("--floor", action="store_true", help="bare ssh tail -F over the same proxies (no fleetdiag)")
    ap.add_argument("--profile", metavar="FILE", help="run the watch under cProfile, stats to FILE.<hosts>")
    ap.add_argument("--trace", metavar="FILE", help="trace the CLI's bursts, analyses and collections to FILE.<hosts>")
    ap.add_argument("--settle", type=float, default=25.0, help="seconds watched after the last round (1-3 hosts)")
    args = ap.parse_args()
    os.environ.setdefault("FLEETDIAG_PERSIST", "0")
    with tempfile.TemporaryDirectory(prefix="fleetdiag-watch-cli-") as tmp:
        server = start_sshd(Path(tmp) / "sshd")
        try:
            for n in (int(x) for x in args.hosts.split(",")):
                res = run(
                    n, args.rounds, args.rtt, Path(tmp), server, args.floor, args.profile, args.settle, args.trace
                )
                print(json.dumps(res), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
