"""The watch controller over a real sshd: what a burst costs it, and a follower that ends (#25 item 3b).

- A follower that ends while its connection stays up (a newer follower, an admin's kill) is started again
  on that connection at once: the host is never shown ``unreachable`` for it, not even with ``grace 0``.
- A healthy host's routine lines do not cost an analysis each (fifty busy logs kept the controller busy
  and delayed detection by seconds); an error-shaped line is analysed at once.
- A traceback still being written does not make one of its frame lines the decisive error.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from fleetdiag.records import Decisive, HostResult, Verdict
from fleetdiag.watch import FAILED, HEALTHY, UNREACHABLE, Watch
from fleetdiag.watch import host as host_mod

from .slack import slack
from .test_watch import SEED_FAILURE, SEED_HEAD, Run, inventory, settings

DECISIVE = "DP adjusted local rank 3 is out of bounds"


def _healthy_line(i: int) -> str:
    return f"(APIServer pid=6412) INFO 05-09 15:14:{i % 60:02d} [loggers.py:123] Engine 000: step {i}\n"


def test_a_follower_that_ends_is_started_again_and_the_host_never_unreachable(sshd, tmp_path, monkeypatch):
    monkeypatch.setattr(host_mod, "RESTART_AFTER", 0.5)
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = inventory(sshd, {"gpu01": {"log": log}})

    downs: list[str] = []
    went_down = host_mod.HostState.went_down
    monkeypatch.setattr(
        host_mod.HostState, "went_down", lambda self, err, *a: (downs.append(err), went_down(self, err, *a))[1]
    )

    async def go() -> Run:
        w = Watch(list(inv.hosts.values()), settings(sshd, grace=0.5))
        async with Run(w) as run:
            await run.state("gpu01", HEALTHY)
            watcher = w.watchers[0]
            downs.clear()  # from here on: the host is up
            first = watcher.remote_pids[-1]
            await asyncio.sleep(1.0)
            os.killpg(first, signal.SIGTERM)  # the follower's whole tree, as a newer follower ends an old one
            await run.until(lambda: watcher.remote_pids[-1] != first, what="a new follower")
            await asyncio.sleep(0.5)
            assert w.views["gpu01"].connected
            with open(log, "a", encoding="utf-8") as fh:  # and the new one follows
                fh.write(SEED_FAILURE)
            await run.state("gpu01", FAILED)
            return run

    run = asyncio.run(go())
    assert downs == []  # never down: the follower was started again on the live connection
    assert UNREACHABLE not in [e.state for e in run.events], [(e.state, e.reason) for e in run.events]
    assert DECISIVE in run.watch.views["gpu01"].result.decisive.line


def test_routine_lines_of_a_healthy_host_wait_an_error_does_not(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = inventory(sshd, {"gpu01": {"log": log}})

    async def go() -> tuple[int, int, float]:
        w = Watch(list(inv.hosts.values()), settings(sshd))
        async with Run(w) as run:
            await run.state("gpu01", HEALTHY)
            watcher = w.watchers[0]
            await asyncio.sleep(0.5)
            before = watcher.analyses
            for i in range(15):  # 3 s of a busy serving log: a burst every 0.2 s
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(_healthy_line(i))
                await asyncio.sleep(0.2)
            routine = watcher.analyses - before
            t0 = time.monotonic()
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(SEED_FAILURE)
            await run.state("gpu01", FAILED)
            return routine, watcher.analyses, time.monotonic() - t0

    routine, _, took = asyncio.run(go())
    assert routine <= 1, routine  # not one per burst (15)
    assert took < 5.0 * slack()


def test_an_unfinished_traceback_waits_for_its_exception_line(sshd, tmp_path, monkeypatch):
    """The block arrives in two bursts (header and frames, then the exception line): the failed
    event's decisive line is the exception, never a frame."""
    monkeypatch.setattr(host_mod, "SETTLE", host_mod.SETTLE * slack())  # the next burst may come late here
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = inventory(sshd, {"gpu01": {"log": log}})
    lines = SEED_FAILURE.splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if DECISIVE in ln)

    async def go() -> Run:
        w = Watch(list(inv.hosts.values()), settings(sshd))
        async with Run(w) as run:
            await run.state("gpu01", HEALTHY)
            with open(log, "a", encoding="utf-8") as fh:
                fh.writelines(lines[:cut])
            partial = log.stat().st_size
            watcher = w.watchers[0]
            # the follower has read the unfinished block (its sync mark is past it) before the rest is written
            await run.until(lambda: watcher._pos >= partial, what="the unfinished block read")
            with open(log, "a", encoding="utf-8") as fh:
                fh.writelines(lines[cut:])
            await run.state("gpu01", FAILED)
            await asyncio.sleep(1.0)
            return run

    run = asyncio.run(go())
    failed = [e for e in run.events if e.state == FAILED]
    assert failed and all(DECISIVE in e.decisive.line for e in failed), [e.decisive.line for e in failed]


def test_unfinished_is_a_traceback_line_without_an_exception_type() -> None:
    def res(message: str, exc: str | None = None, source: str = "log") -> HostResult:
        d = Decisive(line=f"(Worker pid=7) ERROR {message}", message=message, exception_type=exc, source=source)
        return HostResult(host="h", verdict=Verdict.FAILED, decisive=d)

    assert host_mod._unfinished(res("Traceback (most recent call last):"))
    assert host_mod._unfinished(res('  File "/x/train.py", line 3, in <module>'))
    assert host_mod._unfinished(res("    ^^^^^^^^^^"))
    assert not host_mod._unfinished(res("AssertionError: DP adjusted local rank 3 is out of bounds", "AssertionError"))
    assert not host_mod._unfinished(res("CUDA error: out of memory"))
    assert not host_mod._unfinished(res('  File "/x/train.py", line 3', source="kernel"))
