"""The watch controller over a real sshd: what a burst costs it, and a follower that ends (#25 item 3b).

- A follower that ends while its connection stays up (a newer follower, an admin's kill) is started again
  on that connection at once: the host is never shown ``unreachable`` for it, not even with ``grace 0``.
- A healthy host's routine lines do not cost an analysis each (fifty busy logs kept the controller busy
  and delayed detection by seconds); an error-shaped line is analysed at once.
- A traceback still being written does not make one of its frame lines the decisive error.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from fleetdiag import remote
from fleetdiag.records import Decisive, HostResult, Verdict
from fleetdiag.remote import follow
from fleetdiag.watch import FAILED, HEALTHY, RECOVERED, UNREACHABLE, Watch
from fleetdiag.watch import host as host_mod

from .slack import slack
from .sshd import start_sshd
from .test_watch import (
    SEED_FAILURE,
    SEED_HEAD,
    SLOW,
    Run,
    _lines_until,
    _local_follower,
    _records_until,
    _spawn_watch,
    append,
    inventory,
    settings,
)

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


# ------------------------------------------------------------------ the channel's stdin ending late
#
# asyncssh's stdin=DEVNULL sends EOF one round trip after the exec: on a fast host at 240 ms RTT that is
# after the follow loop chose its naps (bash: `read -t` on the channel's stdin), and that EOF ended the
# follower ("the remote follower ended", the host unreachable, detection only with the next snapshot).


@pytest.mark.parametrize("mode", ["auto", "poll"])
def test_a_follower_goes_on_when_its_stdin_ends_after_it_started(tmp_path, mode):
    log = tmp_path / "a.log"
    log.write_text("INFO up\n")
    proc, _ = _local_follower(log, mode)
    try:
        assert proc.stdin is not None
        _records_until(proc, lambda r: isinstance(r, follow.Heartbeat))  # the loop runs: its naps are chosen
        proc.stdin.close()  # the client's EOF arrives now
        for i in range(3):
            time.sleep(0.3)
            append(log, f"RuntimeError: boom {i}\n")
            _records_until(proc, lambda r, i=i: isinstance(r, follow.Line) and r.text == f"RuntimeError: boom {i}")
        _records_until(proc, lambda r: isinstance(r, follow.Heartbeat))
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_cli_watch_keeps_its_follower_when_the_channel_stdin_ends_late(tmp_path):
    """Through the CLI over a real sshd whose exec requests get their stdin's EOF only when the test says
    (a wrapper in front of the command, as a slow client's EOF): the first follower keeps following, the
    host is never unreachable, and a failure is seen by that follower, not by a new one's snapshot."""
    d = tmp_path / "ctl"
    d.mkdir()
    wrap = d / "wrap.sh"
    wrap.write_text(
        f'echo "$SSH_ORIGINAL_COMMAND" >>{d}/execs\n'
        f"n=0\nwhile [ ! -e {d}/eof ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done |\n"
        '  sh -c "$SSH_ORIGINAL_COMMAND"\n'
    )
    server = start_sshd(tmp_path / "sshd", extra_config=f"\nForceCommand sh {wrap}\n")
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  gpu01:\n    address: 127.0.0.1\n    port: {server.port}\n    user: {server.user}\n"
        f"    logs:\n      vllm: {json.dumps(str(log))}\n"
    )
    tag = remote.encoded_prefix("# fleetdiag follow")  # the start of every follower's payload
    proc = _spawn_watch(inv, "all", "--jsonl", "--heartbeat", "0.5", "--grace", "0", "--no-facts", *server.cli_args())

    def seen(lines: list[str], *states: str) -> bool:
        return any(json.loads(ln).get("state") in states for ln in lines)

    try:  # (with --grace 0 the host is unreachable until its first connection is up)
        lines = _lines_until(proc, lambda got: seen(got, HEALTHY, RECOVERED))
        time.sleep(1.0)  # heartbeats flow: the loop chose its naps
        (d / "eof").touch()
        time.sleep(1.5)  # the EOF has arrived (the wrapper looks every 0.05 s)
        append(log, SEED_FAILURE)
        lines += _lines_until(proc, lambda got: seen(got, FAILED))
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=SLOW)
    finally:
        (d / "eof").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
    events = [json.loads(ln) for ln in lines + rest.splitlines() if ln.strip()]
    states = [(e["state"], e["reason"]) for e in events if e.get("event") == "state"]
    up = next(i for i, (st, _) in enumerate(states) if st in (HEALTHY, RECOVERED))
    assert UNREACHABLE not in [st for st, _ in states[up:]], states
    failed = next(e for e in events if e.get("state") == FAILED)
    assert DECISIVE in failed["decisive"]["line"]
    followers = [ln for ln in (d / "execs").read_text().splitlines() if tag in ln]
    assert len(followers) == 1, f"{len(followers)} follower execs: the first one ended"


# ------------------------------------------------------------------ pacing the reads of a busy log


def test_a_line_right_after_a_read_is_read_at_once_and_a_spamming_log_is_still_paced(tmp_path):
    """The follower reads a busy log at most once a poll in the long run, but not by a nap after every
    read: a failure written just after a routine line's read (the p90 of #25, up to one poll late) is read
    at once. Poll 3 s here, so a nap would show whatever the load."""
    log = tmp_path / "a.log"
    log.write_text("INFO up\n")
    proc, _ = _local_follower(log, "auto", poll=3.0)  # heartbeat 0.5 s (the ticks read nothing: no pacing)
    try:
        _records_until(proc, lambda r: isinstance(r, follow.Heartbeat))
        append(log, "INFO routine\n")
        _records_until(proc, lambda r: isinstance(r, follow.Tail) and r.line.text == "INFO routine")
        t0 = time.monotonic()
        append(log, "RuntimeError: right after\n")
        _records_until(proc, lambda r: isinstance(r, follow.Line) and r.text == "RuntimeError: right after")
        assert time.monotonic() - t0 < 2.0, "held for a nap"
        time.sleep(3.0)  # the budget refills
        start, t0 = log.stat().st_size, time.monotonic()
        for i in range(60):  # 3 s of a line every 0.05 s
            append(log, f"INFO spam {i}\n")
            time.sleep(0.05)

        def last(r: object) -> bool:
            line = r.line if isinstance(r, follow.Tail) else r
            return isinstance(line, follow.Line) and line.text == "INFO spam 59"

        recs = _records_until(proc, last, timeout=10 * slack())
        bursts = sum(isinstance(r, follow.Sync) and r.pos > start for r in recs)
        took = time.monotonic() - t0
        assert 2 <= bursts <= took / 3.0 + 2 + 1, (bursts, took)  # one a poll, plus the budget's two
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
