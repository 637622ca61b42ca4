"""fleetdiag watch: the remote follower, the state machine, reconnects, the event stream.

Integration tests go through the real OpenSSH sshd fixture (and a zero-delay
DelayProxy where a connection must be cut). Timings are shortened (heartbeat
0.5 s, stall after ~1.5 s) so each test takes a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.delayproxy import DelayProxy
from fleetdiag.inventory import parse_inventory
from fleetdiag.records import Line
from fleetdiag.remote import follow, funnel
from fleetdiag.watch import (
    CONNECTING,
    FAILED,
    HEALTHY,
    RECOVERED,
    STALLED,
    STARTING,
    UNREACHABLE,
    LineBuffer,
    Watch,
    WatchEvent,
    WatchSettings,
)

from .slack import slack
from .sshd import free_port

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
SEED = (DEMO / "dp_rank.log").read_text().splitlines(keepends=True)
CUT = next(i for i, ln in enumerate(SEED) if " ERROR " in ln)  # its start-up | the failure
# a serving server's log (ready, answering requests), then dp_rank.log's failure appended to it; dp_rank.log's
# own head is a start-up that never said it was ready, which reads `starting`, not healthy
SEED_HEAD, SEED_FAILURE = (DEMO / "healthy.log").read_text(), "".join(SEED[CUT:])
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"
RULES = load_rules(user_default=False)
# Waits end as soon as the state is reached; the bound is for a loaded CI machine, where one
# sshd exec (a login shell with its rc files) can take seconds. Latency is measured in bench/.
SLOW = 30.0 * slack()


def inventory(sshd: Any, hosts: dict[str, dict]) -> Any:
    lines = ["hosts:"]
    for name, h in hosts.items():
        lines += [
            f"  {name}:",
            "    address: 127.0.0.1",
            f"    port: {h.get('port', sshd.port)}",
            f"    user: {sshd.user}",
            "    logs:",
            f"      vllm: {json.dumps(str(h['log']))}",
        ]
    return parse_inventory("\n".join(lines) + "\n", "watch-test.yaml")


def settings(sshd: Any, **kw: Any) -> WatchSettings:
    base: dict[str, Any] = dict(
        transport=sshd.opts(),
        rules=RULES,
        heartbeat=0.5,
        grace=5.0,
        stall_after=60.0,
        backoff_min=0.2,
        backoff_max=1.0,
        facts=False,
        kernel=False,  # the kernel part reads this machine's kernel log: its own tests (test_watch_kernel.py)
    )
    base.update(kw)
    return WatchSettings(**base)


class Run:
    """A watch running in the background of a test, with waits on its state."""

    def __init__(self, watch: Watch):
        self.watch = watch
        self.events: list[WatchEvent] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Run:
        async def consume() -> None:
            async for ev in self.watch.events():
                self.events.append(ev)
                self._changed.set()

        self._task = asyncio.ensure_future(consume())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def until(self, cond: Callable[[], bool], timeout: float = 0, what: str = "") -> None:
        timeout = timeout or SLOW
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"timed out waiting for {what or cond}; events: "
                    + "; ".join(f"{e.host}:{e.state} ({e.reason})" for e in self.events)
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.1))
            except asyncio.TimeoutError:
                pass

    async def state(self, host: str, *states: str, timeout: float = 0) -> None:
        await self.until(lambda: self.watch.views[host].state in states, timeout, f"{host} in {states}")


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


async def grow(path: Path, n: int, every: float = 0.1, tag: str = "APIServer pid=6412") -> None:
    for i in range(n):
        append(path, f"({tag}) INFO 05-09 15:14:{i % 60:02d} [loggers.py:123] step {i}\n")
        await asyncio.sleep(every)


# ------------------------------------------------------------------ through sshd


def test_growing_log_then_seed_failure_is_failed_with_decisive_line(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = inventory(sshd, {"uk-node": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd, facts=True))) as run:
            await run.state("uk-node", HEALTHY, STARTING)
            await grow(log, 8)  # healthy growth, seen as such
            assert run.watch.views["uk-node"].state in (HEALTHY, STARTING)
            append(log, SEED_FAILURE)
            await run.state("uk-node", FAILED)
            return run

    run = asyncio.run(go())
    v = run.watch.views["uk-node"]
    d = v.result.decisive
    assert DECISIVE in d.line and d.line.startswith("(Worker pid=7506)"), d.line
    assert d.process == "Worker pid=7506"
    assert any("in init_device" in ln for ln in d.traceback)  # the follower brought the whole traceback
    assert d.traceback[-1].endswith(DECISIVE)
    assert sum(v.result.secondary.values()) >= 2  # the cascade is counted, not chosen
    failed = [e for e in run.events if e.state == FAILED]
    assert len(failed) == 1 and failed[0].previous in (HEALTHY, STARTING) and DECISIVE in failed[0].reason
    assert failed[0].decisive is not None and failed[0].decisive.line == d.line


def test_log_that_stops_growing_is_stalled_then_recovers(sshd, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    inv = inventory(sshd, {"trainer": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd, stall_after=1.5))) as run:
            # the log grows until the watch has seen it healthy (a loaded machine's first snapshot can take
            # longer than the stall limit), then goes quiet
            writer = asyncio.ensure_future(grow(log, 100_000, tag="rank0"))
            try:
                await run.state("trainer", HEALTHY)
            finally:
                writer.cancel()
            t0 = time.monotonic()
            await run.state("trainer", STALLED)
            assert time.monotonic() - t0 >= 1.0  # not before the log has been quiet that long
            reason = run.watch.views["trainer"].reason  # probe's judgement: training, then silent past the limit
            assert reason.startswith("training, ") and "silent for" in reason and "1.5 s limit" in reason, reason
            await grow(log, 2, tag="rank0")
            await run.state("trainer", RECOVERED)
            return run

    run = asyncio.run(go())
    states = [e.state for e in run.events]
    assert states.index(HEALTHY) < states.index(STALLED) < states.index(RECOVERED)


def test_waiting_loop_longer_than_limit_is_stalled(sshd, tmp_path):
    """The seeds' run.log: "Waiting for vLLM server to be ready..." keeps coming, nothing else."""
    log = tmp_path / "run.log"
    log.write_text("=== Step 1: Launching vLLM server ===\n")
    inv = inventory(sshd, {"de-node": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd, wait_limit=1.5))) as run:

            async def loop() -> None:
                while True:
                    append(log, "Waiting for vLLM server to be ready...\n")
                    await asyncio.sleep(0.2)

            writer = asyncio.ensure_future(loop())
            try:
                await run.state("de-node", STARTING)
                await run.state("de-node", STALLED)
            finally:
                writer.cancel()
            return run

    run = asyncio.run(go())
    v = run.watch.views["de-node"]
    assert "still not ready" in v.reason and "Waiting for vLLM server" in v.reason
    assert v.idle() < 1.0 * slack()  # stalled although the log is growing (read late on a loaded machine)


def test_serving_process_gone_with_a_quiet_log_is_stalled(sshd, tmp_path):
    marker = f"sleep 60.{uuid.uuid4().int % 10**8:08d}"  # a command line no other process has
    log = tmp_path / f"{marker}.log"  # the follower's own processes name the log: they must not count
    log.write_text(SEED_HEAD)
    proc = subprocess.Popen(marker.split())
    inv = inventory(sshd, {"us-node": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd, process=marker))) as run:
            await run.state("us-node", HEALTHY)
            await run.until(lambda: run.watch.views["us-node"].process_alive is True, SLOW, "process seen alive")
            proc.kill()
            proc.wait()
            await run.state("us-node", STALLED)
            return run

    try:
        run = asyncio.run(go())
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"no process matches '{marker}'" in run.watch.views["us-node"].reason


def test_killed_connection_reconnects_and_keeps_following(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)

    async def go() -> Run:
        proxy = await DelayProxy("127.0.0.1", sshd.port, 0).start()
        sshd.trust(proxy.port)
        try:
            inv = inventory(sshd, {"cn-node": {"log": log, "port": proxy.port}})
            async with Run(Watch(list(inv.hosts.values()), settings(sshd, grace=10))) as run:
                await run.state("cn-node", HEALTHY)
                first = proxy.connections
                proxy.drop_all()
                await run.until(lambda: run.watch.views["cn-node"].reconnects >= 1, SLOW, "a reconnect")
                assert proxy.connections > first
                assert run.watch.views["cn-node"].connected
                append(log, SEED_FAILURE)  # the new follower sees what comes next
                await run.state("cn-node", FAILED)
                return run
        finally:
            await proxy.stop()

    run = asyncio.run(go())
    states = [e.state for e in run.events]
    assert UNREACHABLE not in states  # a blip within the grace period is not news
    assert DECISIVE in run.watch.views["cn-node"].reason


class FreezeProxy:
    """TCP to sshd; ``freeze()`` makes the open connections go silent without closing them.

    That is a peer that vanished without a RST (a NAT dropping state, a host
    powered off): TCP reports nothing, only the missing heartbeats tell.
    """

    def __init__(self, target: int):
        self.target = target
        self.port = 0
        self.frozen: set[int] = set()
        self.live: set[int] = set()
        self.connections = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> FreezeProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def freeze(self) -> None:
        self.frozen |= self.live

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cid = self.connections
        self.live.add(cid)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while True:
                    data = await src.read(65536)
                    if not data or cid in self.frozen:
                        if cid in self.frozen:
                            await asyncio.Event().wait()  # swallow everything, forever
                        break
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer), return_exceptions=True)


def test_silent_connection_is_noticed_by_missing_heartbeats_and_replaced(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)

    async def go() -> Run:
        proxy = await FreezeProxy(sshd.port).start()
        sshd.trust(proxy.port)
        inv = inventory(sshd, {"far": {"log": log, "port": proxy.port}})
        try:
            async with Run(Watch(list(inv.hosts.values()), settings(sshd, grace=10, silence=1.5))) as run:
                await run.state("far", HEALTHY)
                old = run.watch.watchers[0].remote_pids[-1]
                assert Path(f"/proc/{old}").exists()
                proxy.freeze()
                t0 = time.monotonic()
                await run.until(lambda: run.watch.views["far"].reconnects >= 1, SLOW, "a reconnect")
                assert time.monotonic() - t0 >= 1.0  # heartbeats were missed first
                # the stranded follower (its sshd session never noticed) was ended by its successor
                await run.until(lambda: not Path(f"/proc/{old}").exists(), SLOW, "the old follower gone")
                append(log, SEED_FAILURE)
                await run.state("far", FAILED)
                return run
        finally:
            await proxy.stop()

    run = asyncio.run(go())
    assert UNREACHABLE not in [e.state for e in run.events]


def test_host_that_stays_down_is_unreachable_others_go_on_and_it_recovers(sshd, tmp_path):
    good, flaky = tmp_path / "good.log", tmp_path / "flaky.log"
    good.write_text(SEED_HEAD)
    flaky.write_text(SEED_HEAD)
    dead_port = free_port()

    async def go() -> Run:
        proxy = await DelayProxy("127.0.0.1", sshd.port, 0).start()
        sshd.trust(proxy.port)
        port = proxy.port
        inv = inventory(
            sshd,
            {"good": {"log": good}, "flaky": {"log": flaky, "port": port}, "dead": {"log": good, "port": dead_port}},
        )
        async with Run(Watch(list(inv.hosts.values()), settings(sshd, grace=1.0))) as run:
            await run.state("flaky", HEALTHY)
            await run.state("good", HEALTHY)  # up too before flaky goes (a loaded machine's logins take seconds)
            await run.state("dead", UNREACHABLE)
            assert "refused" in run.watch.views["dead"].reason
            await proxy.stop()  # flaky goes away and stays away
            proxy.drop_all()
            await run.state("flaky", UNREACHABLE)
            assert run.watch.views["good"].state == HEALTHY  # the others go on
            again = await DelayProxy("127.0.0.1", sshd.port, 0, port=port).start()
            try:
                await run.state("flaky", RECOVERED)
            finally:
                await again.stop()
            return run

    run = asyncio.run(go())
    flaky_states = [e.state for e in run.events if e.host == "flaky"]
    assert flaky_states[-2:] == [UNREACHABLE, RECOVERED], flaky_states


def test_truncation_and_rotation_restart_from_the_top(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD + SEED_FAILURE)
    inv = inventory(sshd, {"h": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd))) as run:
            await run.state("h", FAILED)
            with open(log, "w") as fh:  # truncated in place (a relaunch with `> vllm.log`)
                fh.write(SEED_HEAD)
            await run.state("h", RECOVERED)
            os.rename(log, tmp_path / "vllm.log.1")  # rotated: a new file under the old name
            log.write_text(SEED_HEAD + SEED_FAILURE.replace("pid=7506", "pid=9999"))
            await run.state("h", FAILED)
            return run

    run = asyncio.run(go())
    d = run.watch.views["h"].result.decisive
    assert d.process == "Worker pid=9999" and DECISIVE in d.line
    assert any("rotated" in m for m in run.watch.views["h"].markers)
    # the new file is read from its top: on a loaded box one poll may see only its start-up lines (starting)
    # before its failure line arrives
    assert [e.state for e in run.events if e.state != STARTING][-3:] == [FAILED, RECOVERED, FAILED]
    assert run.events[-1].state == FAILED


def test_hostile_log_path_is_followed_literally(sshd, tmp_path):
    canary = f"fleetdiag-pwned-{uuid.uuid4().hex}"
    name = f"-x$(touch {canary});`touch {canary}` 'q\"\nnl.log"
    log = tmp_path / name
    log.write_text(SEED_HEAD)
    inv = inventory(sshd, {"h": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd))) as run:
            await run.state("h", HEALTHY)
            append(log, SEED_FAILURE)
            await run.state("h", FAILED)
            return run

    asyncio.run(go())
    for where in (Path.home(), tmp_path, Path("/tmp"), Path("/")):
        assert not (where / canary).exists()


def test_missing_log_waits_for_it_then_follows(sshd, tmp_path):
    log = tmp_path / "later.log"
    inv = inventory(sshd, {"h": {"log": log}})

    async def go() -> Run:
        async with Run(Watch(list(inv.hosts.values()), settings(sshd))) as run:
            await run.state("h", STARTING)
            assert "waiting for the log to appear" in run.watch.views["h"].reason
            log.write_text(SEED_HEAD + SEED_FAILURE)
            await run.state("h", FAILED)
            return run

    asyncio.run(go())


def _cli_inventory(sshd: Any, tmp_path: Path, log: Path, extra: str = "") -> Path:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  uk-node:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n{extra}"
    )
    return inv


def _spawn_watch(inv: Path, *args: str) -> subprocess.Popen:
    """The installed console script, as a user runs it (so Ctrl-C is a real SIGINT)."""
    exe = str(Path(sys.executable).parent / "fleetdiag")
    return subprocess.Popen(
        [exe, "-i", str(inv), "watch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "160"},
    )


def _lines_until(proc: subprocess.Popen, done: Callable[[list[str]], bool]) -> list[str]:
    """Lines of the child's stdout until ``done(lines)``; never blocks past SLOW seconds."""
    assert proc.stdout is not None
    got: list[str] = []
    box: list[str] = []

    def read_one() -> None:
        box.append(proc.stdout.readline())

    deadline = time.monotonic() + SLOW
    while not done(got):
        box.clear()
        reader = threading.Thread(target=read_one, daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        assert box, f"no output within {SLOW:g}s; so far: {got}"
        assert box[0], f"the watch exited: {got}"
        got.append(box[0].rstrip("\n"))
    return got


def test_cli_jsonl_events_are_parseable_and_ordered_and_ctrl_c_summarises(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = _cli_inventory(
        sshd,
        tmp_path,
        log,
        f"  nowhere:\n    address: 127.0.0.1\n    port: {free_port()}\n"
        f"    user: {sshd.user}\n    logs:\n      vllm: {log}\n",
    )
    proc = _spawn_watch(inv, "all", "--jsonl", "--heartbeat", "0.5", "--grace", "1", *sshd.cli_args())

    def seen(lines: list[str], host: str, state: str) -> bool:
        return any(json.loads(ln).get("host") == host and json.loads(ln).get("state") == state for ln in lines)

    try:
        lines = _lines_until(proc, lambda got: seen(got, "uk-node", HEALTHY))
        append(log, SEED_FAILURE)  # while it is being watched
        lines += _lines_until(
            proc, lambda got: seen(lines + got, "uk-node", FAILED) and seen(lines + got, "nowhere", UNREACHABLE)
        )
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rest, err = proc.communicate(timeout=SLOW)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err  # a host failed (failed wins over unreachable)
    records = [json.loads(ln) for ln in lines + rest.splitlines() if ln.strip()]
    events, summary = records[:-1], records[-1]
    assert events and all(e["event"] == "state" and e["version"] == 1 for e in events)
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    times = [e["time"] for e in events]
    assert times == sorted(times)
    uk = [e for e in events if e["host"] == "uk-node"]
    assert [(e["previous"], e["state"]) for e in uk] == [(CONNECTING, HEALTHY), (HEALTHY, FAILED)]
    assert uk[1]["decisive"]["process"] == "Worker pid=7506" and DECISIVE in uk[1]["decisive"]["line"]
    assert [e["state"] for e in events if e["host"] == "nowhere"] == [UNREACHABLE]
    assert summary["event"] == "summary" and summary["interrupted"] is True
    states = {h["host"]: (h["state"], h["verdict"]) for h in summary["hosts"]}
    assert states == {"uk-node": (FAILED, FAILED), "nowhere": (UNREACHABLE, UNREACHABLE)}


def test_cli_table_prints_changes_and_the_card_and_a_summary(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD + SEED_FAILURE)
    proc = _spawn_watch(_cli_inventory(sshd, tmp_path, log), "uk-node", "--no-facts", *sshd.cli_args())
    try:
        _lines_until(proc, lambda got: any("✗ failed" in ln for ln in got))
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=SLOW)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert DECISIVE in rest and "Worker pid=7506" in rest  # the card, printed once, in the scrollback
    assert "watch interrupted: 1 failed" in rest


def test_cli_duration_and_exit_code_for_an_unreachable_host(sshd, tmp_path):
    """In-process (CliRunner): --duration ends the watch; refused + --grace 0 is unreachable at once."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED_HEAD)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  gone:\n    address: 127.0.0.1\n    port: {free_port()}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n"
    )
    result = CliRunner().invoke(
        main, ["-i", str(inv), "watch", "gone", "--jsonl", "--grace", "0", "--duration", "1", *sshd.cli_args()]
    )
    assert result.exit_code == 3, result.output  # nothing failed, a host unreachable
    first, summary = (json.loads(ln) for ln in result.output.splitlines())
    assert (first["host"], first["previous"], first["state"]) == ("gone", CONNECTING, UNREACHABLE)
    assert "refused" in first["reason"]
    assert summary["event"] == "summary" and summary["interrupted"] is False
    assert summary["hosts"][0]["state"] == UNREACHABLE and "refused" in summary["hosts"][0]["error"]


# ------------------------------------------------------------------ the follower script, locally


def _local_follower(log: Path, mode: str, **kw: Any) -> tuple[subprocess.Popen, str]:
    fs = funnel.FunnelSpec(
        log=str(log), keywords=RULES.keyword_ere(), run_start=RULES.run_start_ere(), tags=RULES.tag_ere()
    )
    spec = follow.FollowSpec(
        funnel=fs, waiting=RULES.waiting_ere(), ready=RULES.ready_ere(), mode=mode, heartbeat=0.5, **kw
    )
    mark = funnel.new_mark()
    proc = subprocess.Popen(
        ["sh", "-c", follow.build_script(spec, mark)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    return proc, mark


def _records_until(proc: subprocess.Popen, stop: Callable[[Any], bool], timeout: float = 5.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        raw = proc.stdout.readline().decode("utf-8", "replace").rstrip("\n")
        rec = follow.parse_record(raw)
        if rec is not None:
            out.append(rec)
            if stop(rec):
                return out
    raise AssertionError(f"no stop record in {out}")


@pytest.mark.parametrize("mode", ["auto", "poll"])
def test_follower_positions_partial_lines_and_truncation(tmp_path, mode):
    """Byte offsets stay exact across held-back partial lines; truncation restarts at 0."""
    log = tmp_path / "a.log"
    log.write_text("first\n")
    proc, mark = _local_follower(log, mode)
    try:
        _records_until(proc, lambda r: isinstance(r, follow.Heartbeat))
        append(log, "ERROR half")
        time.sleep(0.4)
        append(log, ' done\nTraceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n')
        recs = _records_until(proc, lambda r: isinstance(r, follow.Line) and r.text == "ValueError: bad")
        lines = {}
        for r in recs:
            r = r.line if isinstance(r, follow.Tail) else r
            if isinstance(r, Line):
                lines[r.pos] = r
        data = log.read_bytes()
        for pos, ln in lines.items():
            assert data[pos:].split(b"\n", 1)[0].decode().startswith(ln.text), (pos, ln.text)
        assert lines[6].text in ("ERROR half", "ERROR half done")
        assert lines[6].lineno == 2
        assert any(r.text == '  File "x.py", line 1' for r in lines.values())  # context, not just keywords
        log.write_text("ERROR again\n")  # truncated and rewritten
        recs = _records_until(proc, lambda r: isinstance(r, follow.Line) and r.text == "ERROR again")
        assert any(isinstance(r, follow.Reset) and r.reason == "truncated" for r in recs)
        assert recs[-1].pos == 0 and recs[-1].lineno == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_follower_exits_when_the_controller_hangs_up(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("x\n")
    proc, _ = _local_follower(log, "auto")
    try:
        _records_until(proc, lambda r: isinstance(r, follow.Heartbeat))
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()  # what sshd does when the channel closes
        proc.stdout.close()
        proc.wait(timeout=5 * slack())
        deadline = time.monotonic() + 3 * slack()
        while True:  # the doorbell tail, the loop and awk are gone too (zombies awaiting init do not count)
            ps = subprocess.run(["ps", "-o", "stat=,args=", "-g", str(proc.pid)], capture_output=True, text=True)
            left = [ln for ln in ps.stdout.splitlines() if ln.strip() and not ln.strip().startswith("Z")]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert left == [], left
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------ units


def test_line_buffer_merges_by_pos_cuts_at_run_start_and_bounds():
    buf = LineBuffer(cap=10)
    buf.reset([Line(0, "a", 1), Line(2, "b", 2)])
    buf.add(Line(2, "b longer"))  # a held-back partial line that got its end
    assert [(ln.pos, ln.text, ln.lineno) for ln in buf.lines()] == [(0, "a", 1), (2, "b longer", 2)]
    buf.add(Line(10, "new run"), run_start=True)
    assert [ln.pos for ln in buf.lines()] == [10]
    for p in range(11, 40):
        buf.add(Line(p, f"l{p}"))
    kept = [ln.pos for ln in buf.lines()]
    assert len(kept) == 10 and kept[:5] == [10, 11, 12, 13, 14] and kept[-1] == 39
    assert buf.dropped == 20


def test_line_buffer_keeps_only_the_latest_routine_lines():
    """A busy healthy log must not fill the buffer: routine (tail) lines are a small rolling window."""
    buf = LineBuffer(cap=1000, tail_cap=5)
    buf.add(Line(0, "ERROR boom"))
    for p in range(1, 200):
        buf.add_tail(Line(p * 10, f"step {p}"))
    assert [ln.pos for ln in buf.lines()] == [0, 1950, 1960, 1970, 1980, 1990]
    buf.add_tail(Line(0, "ERROR boom, now complete"))  # a tail record never demotes an error line
    assert buf.lines()[0].text == "ERROR boom, now complete"


def test_parse_record_shapes():
    assert follow.parse_record("L\t12\t3\tERROR x\ty") == Line(12, "ERROR x\ty", 3)
    assert follow.parse_record("L\t12\t-\tx") == Line(12, "x", None)
    assert follow.parse_record("l\t12\t4\tx") == follow.Tail(Line(12, "x", 4))
    hb = follow.parse_record("H\t100\t5\t99\t7\t0\t5")
    assert isinstance(hb, follow.Heartbeat) and hb.alive is False and hb.size == 5 and hb.mtime == 99
    assert follow.parse_record("H\t100\t-\t-\t-\t-\t0").alive is None
    assert follow.parse_record("R\trotated\t42\t/var/log/x.log") == follow.Reset("rotated", 42, "/var/log/x.log")
    assert follow.parse_record("S\t77") == follow.Sync(77)
    assert follow.parse_record("garbage") is None


def test_follower_script_quotes_every_value():
    fs = funnel.FunnelSpec(log="/tmp/$(reboot)'x", keywords="a", run_start="b", tags="c")
    script = follow.build_script(follow.FollowSpec(funnel=fs, process="vllm'; reboot; '"), "@@FD:abc")
    assert "FW_LOG='/tmp/$(reboot)'\"'\"'x'" in script
    assert "FW_PROC='vllm'\"'\"'; reboot; '\"'\"''" in script


def test_follower_script_writes_nowhere_but_dev_null():
    """The same lint as the funnel's: every redirection of the fixed follower text is /dev/null or an fd."""
    import re

    for body in (follow._FUNCS, follow._LOOP, follow._PRE, follow._FOLLOW):
        body = re.sub(r"'[^']*'", "''", body)
        body = re.sub(r'"[^"]*"', '""', body)
        for m in re.finditer(r"(?<![<>&|0-9])(\d?>>?)\s*([^\s;|&)]+)", body):
            assert m.group(2) == "/dev/null" or m.group(2).startswith("&"), m.group(0)
        assert "mktemp" not in body and "tee " not in body
