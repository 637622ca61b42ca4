"""Fleet scale: the scheduler, the fleet view and ``sweep``/``history``, through a real sshd.

Far hosts are the session sshd behind delay proxies; hung hosts are
in-process servers: one accepts TCP and never speaks (a wedged sshd), one
logs in and never answers the exec (a host stuck on a dead NFS mount). The
proxies and hung servers run on a background event loop so the CLI can run
its own ``asyncio.run`` in the test thread.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import asyncssh
import pytest
from click.testing import CliRunner
from rich.console import Console

from fleetdiag.cli import main
from fleetdiag.delayproxy import DelayProxy
from fleetdiag.inventory import Host, parse_inventory
from fleetdiag.probe import ProbeSettings
from fleetdiag.records import FAILED, HEALTHY, NO_LOG, UNREACHABLE, HostResult, Timing, host_result_from_json
from fleetdiag.render import FleetProgress, fleet_view
from fleetdiag.ssh.scheduler import CostMemory, Progress, probe_many
from fleetdiag.store import Store

from .conftest import inventory_file
from .sshd import SSHD, free_port, start_sshd

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
DP_RANK = (DEMO / "dp_rank.log").read_text()
BROKEN_PIPE = (DEMO / "broken_pipe.log").read_text()
HEALTHY_LOG = (DEMO / "healthy.log").read_text()
DP_RANK_OTHER_HOST = DP_RANK.replace("7506", "8123").replace("15:15:0", "16:42:1")  # same cause, other pids/times
EXE = str(Path(sys.executable).parent / "fleetdiag")


# --------------------------------------------------------------------------- helpers


class Background:
    """An event loop in a thread for servers the tests need while the CLI runs its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def shut(self, server) -> None:
        """Close a server on the loop that serves it: from another thread its close races the loop's own."""

        async def close() -> None:
            server.close()

        self.run(close())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def bg():
    b = Background()
    yield b
    b.close()


class CountingProxy(DelayProxy):
    """A delay proxy that also counts connections that have fully closed."""

    closed: int = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await super()._handle(reader, writer)
        finally:
            self.closed += 1


def proxy(bg: Background, sshd, rtt_ms: float, port: int | None = None) -> CountingProxy:
    p = bg.run(CountingProxy("127.0.0.1", port or sshd.port, rtt_ms).start())
    sshd.trust(p.port)
    return p


async def _wedged_server() -> asyncio.base_events.Server:
    """TCP accepted, then silence: no SSH banner ever (a wedged sshd or a black-holing middlebox)."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # until the client gives up
        finally:
            writer.close()

    return await asyncio.start_server(hold, "127.0.0.1", 0)


class _NoAuth(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return False


async def _hung_exec_server(known_hosts: Path) -> asyncssh.SSHAcceptor:
    """Logs anyone in, then never answers the exec (a host stuck in D state on a dead mount)."""
    key = asyncssh.generate_private_key("ssh-ed25519")

    async def never(process: asyncssh.SSHServerProcess) -> None:
        await asyncio.Event().wait()

    server = await asyncssh.create_server(_NoAuth, "127.0.0.1", 0, server_host_keys=[key], process_factory=never)
    port = server.sockets[0].getsockname()[1]
    with open(known_hosts, "a") as fh:
        fh.write(f"[127.0.0.1]:{port} {key.export_public_key().decode().strip()}\n")
    return server


def ssh_args(sshd, known_hosts: Path | None = None) -> list[str]:
    return [
        "--known-hosts",
        str(known_hosts or sshd.known_hosts),
        "--identity",
        str(sshd.client_key),
        "--ssh-config",
        str(sshd.ssh_config),
    ]


def log(tmp: Path, name: str, text: str) -> Path:
    p = tmp / f"{name}.log"
    p.write_text(text)
    return p


def lines_of(output: str, kind: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith(kind)]


# --------------------------------------------------------------------------- scheduler, no SSH


def fake_hosts(names: list[str], address: str = "10.0.0.1") -> list[Host]:
    return [Host(name=n, address=address, logs={"vllm": "/x.log"}) for n in names]


def fake_probe(
    seconds: dict[str, float], handshake: float = 0.0, events: list | None = None, active: dict | None = None
):
    """A probe that honours the handshake gate like probe_host, then 'runs' for a while."""

    async def probe(host, settings: ProbeSettings) -> HostResult:
        if events is not None:
            events.append(host.name)
        async with settings.connect_gate(host):
            if active is not None:
                key = host.address
                active[key] = active.get(key, 0) + 1
                active["max:" + key] = max(active.get("max:" + key, 0), active[key])
            await asyncio.sleep(handshake)
            if active is not None:
                active[host.address] -= 1
        if seconds[host.name] < 0:
            raise KeyError("a bug")
        await asyncio.sleep(seconds[host.name])
        ms = seconds[host.name] * 1000
        return HostResult(host=host.name, verdict=HEALTHY, timing=Timing(rtt_ms=ms / 4, total_ms=ms))

    return probe


def collect(hosts, probe, **kw) -> list[HostResult]:
    async def go():
        return [r async for r in probe_many(hosts, ProbeSettings(rules=object()), probe=probe, **kw)]

    return asyncio.run(go())


def test_slowest_known_host_starts_first_unknown_before_known():
    hosts = fake_hosts(["fast", "slow", "new", "mid"])
    memory = CostMemory({"fast": (5.0, 30.0), "slow": (300.0, 2000.0), "mid": (50.0, 400.0)})
    started: list[str] = []
    collect(hosts, fake_probe({h.name: 0 for h in hosts}, events=started), fanout=1, memory=memory)
    assert started == ["new", "slow", "mid", "fast"]


def test_handshakes_per_address_are_capped_and_other_addresses_are_not_held_up():
    hosts = fake_hosts([f"a{i}" for i in range(12)], "10.0.0.1") + fake_hosts([f"b{i}" for i in range(12)], "10.0.0.2")
    active: dict = {}
    res = collect(
        hosts, fake_probe({h.name: 0 for h in hosts}, handshake=0.02, active=active), fanout=64, per_address=3
    )
    assert len(res) == 24
    assert active["max:10.0.0.1"] == 3 and active["max:10.0.0.2"] == 3


def test_time_queued_for_a_handshake_slot_does_not_count_against_the_deadline():
    hosts = fake_hosts([f"h{i}" for i in range(6)])
    t0 = time.monotonic()
    res = collect(hosts, fake_probe({h.name: 0.0 for h in hosts}, handshake=0.15), per_address=1, deadline=0.25)
    assert time.monotonic() - t0 >= 0.85  # six handshakes, one at a time
    assert all(r.verdict == HEALTHY for r in res), [r.error for r in res]


def test_a_bug_on_one_host_keeps_the_others_and_progress_is_reported():
    hosts = fake_hosts(["ok1", "buggy", "ok2"])
    seen: list[Progress] = []
    res = {r.host: r for r in collect(hosts, fake_probe({"ok1": 0, "buggy": -1, "ok2": 0}), progress=seen.append)}
    assert res["ok1"].verdict == HEALTHY and res["ok2"].verdict == HEALTHY
    assert res["buggy"].verdict == NO_LOG and res["buggy"].error_kind == "internal"
    assert "KeyError" in res["buggy"].error and "please report" in res["buggy"].error
    assert [p.event for p in seen].count("start") == 3 and seen[-1].done == 3
    assert sum(seen[-1].counts.values()) == 3


def test_progress_line_draws_only_on_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    res = HostResult(host="gpu01", verdict=FAILED)
    with FleetProgress(console, 3, enabled=True) as bar:
        bar(Progress(3, "done", "gpu01", res, 1, {"gpu02": time.monotonic() - 5}, {FAILED: 1}))
        status = bar.status().plain
    assert "1 failed" in status and "waiting on gpu02 (5s)" in status
    quiet = io.StringIO()
    with FleetProgress(Console(file=quiet), 3, enabled=False) as bar:
        bar(Progress(3, "done", "gpu01", res, 1, {}, {FAILED: 1}))
    assert quiet.getvalue() == ""


# --------------------------------------------------------------------------- through sshd


def test_slowest_first_learns_real_rtts(sshd, tmp_path, bg):
    """The first run measures each host; the next one starts the far host first though it is listed last."""
    good = log(tmp_path, "h", HEALTHY_LOG)
    far = proxy(bg, sshd, 100)
    try:
        inv = parse_inventory(
            "hosts:\n"
            + "".join(
                f"  {n}:\n    address: 127.0.0.1\n    port: {p}\n    user: {sshd.user}\n    logs: {{vllm: {good}}}\n"
                for n, p in (("near", sshd.port), ("far", far.port))
            ),
            "inv.yaml",
        )
        hosts = list(inv.hosts.values())
        settings = ProbeSettings(transport=sshd.opts())
        memory = CostMemory()

        async def run(fanout: int) -> list[str]:
            started: list[str] = []

            def on(p: Progress) -> None:
                if p.event == "start":
                    started.append(p.host)

            async for _ in probe_many(hosts, settings, fanout, memory=memory, progress=on):
                pass
            return started

        assert asyncio.run(run(1)) == ["near", "far"]  # nothing known yet: inventory order
        assert memory.get("far").rtt_ms > 90 > memory.get("near").rtt_ms
        assert memory.get("far").cost_ms > memory.get("near").cost_ms
        assert asyncio.run(run(1)) == ["far", "near"]
    finally:
        bg.run(far.stop())


def test_handshake_bursts_stay_under_sshd_maxstartups(tmp_path, bg):
    """Ten hosts behind one address:port, sshd with MaxStartups 4: every host answers.

    Without the per-address cap the same burst makes sshd drop connections,
    which shows the test can fail.
    """
    server = start_sshd(tmp_path / "sshd")
    server.stop()  # restart it with a small MaxStartups (the last one in the file wins, so replace it)
    config = server.dir / "sshd_config"
    config.write_text(re.sub(r"(?m)^MaxStartups .*$", "MaxStartups 4", config.read_text()))
    server.proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(server.dir / "sshd2.log", "wb"),
    )
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end:
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    front = proxy(bg, server, 30)
    try:
        good = log(tmp_path, "h", HEALTHY_LOG)
        inv = parse_inventory(
            f"defaults:\n  address: 127.0.0.1\n  port: {front.port}\n  user: {server.user}\n"
            f"  logs: {{vllm: {good}}}\nhosts:\n  gpu[01-10]: {{}}\n",
            "inv.yaml",
        )
        hosts = list(inv.hosts.values())
        settings = ProbeSettings(transport=server.opts())

        async def run(per_address):
            return [r async for r in probe_many(hosts, settings, 64, per_address=per_address)]

        capped = asyncio.run(run(3))
        assert [r.verdict for r in capped] == [HEALTHY] * 10, [r.error for r in capped if r.verdict != HEALTHY]
        from fleetdiag.ssh import transport

        retries, transport.DROP_RETRIES = transport.DROP_RETRIES, 0  # the first attempts alone, as sshd saw them
        try:
            burst = asyncio.run(run(None))
        finally:
            transport.DROP_RETRIES = retries
        dropped = [r for r in burst if r.verdict == UNREACHABLE]
        assert dropped, "sshd accepted a 10-handshake burst: test is vacuous"
        assert all("MaxStartups" in r.error and "--per-address" in r.error for r in dropped), dropped[0].error
    finally:
        bg.run(front.stop())
        server.stop()


def test_hung_hosts_hit_their_deadline_while_the_others_report_on_time(sshd, tmp_path, bg):
    near = proxy(bg, sshd, 30)
    known = tmp_path / "known_hosts"
    known.write_text(Path(sshd.known_hosts).read_text())
    wedged = bg.run(_wedged_server())
    hung = bg.run(_hung_exec_server(known))
    try:
        failing = log(tmp_path, "f", DP_RANK)
        inv = inventory_file(
            tmp_path / "inv.yaml",
            {
                "fast": {"log": failing},
                "near": {"log": log(tmp_path, "h", HEALTHY_LOG), "port": near.port},
                "wedged": {"log": failing, "port": wedged.sockets[0].getsockname()[1]},
                "stuck": {"log": failing, "port": hung.sockets[0].getsockname()[1]},
            },
            sshd,
        )
        from fleetdiag.inventory import load_inventory

        hosts = list(load_inventory(inv).hosts.values())
        settings = ProbeSettings(transport=sshd.opts(known_hosts=str(known)))

        async def go():
            t0 = time.monotonic()
            out = []
            async for r in probe_many(hosts, settings, deadline=2.0):
                out.append((r, time.monotonic() - t0))
            return out

        arrivals = asyncio.run(go())
        order = [r.host for r, _ in arrivals]
        got = {r.host: (r, t) for r, t in arrivals}
        assert got["fast"][0].verdict == FAILED and got["near"][0].verdict == HEALTHY
        # streamed as they finished, before the deadline, not held back for the hung ones
        assert set(order[:2]) == {"fast", "near"}, order
        assert got["fast"][1] < 2.0 and got["near"][1] < 2.0
        for name, where in (("wedged", "handshake"), ("stuck", "funnel")):
            r, t = got[name]
            assert r.verdict == UNREACHABLE and r.error == "no answer within 2s (deadline)", r
            assert r.error_kind == "deadline" and where in " ".join(r.markers)
            assert 1.95 < t < 4.0  # at the deadline, not at the 10 s connect or 30 s command timeout
    finally:
        bg.run(near.stop())
        bg.shut(wedged)
        bg.shut(hung)


# --------------------------------------------------------------------------- sweep and history, end to end


def test_sweep_groups_root_causes_records_history_then_reports_only_changes(sshd, tmp_path, bg):
    proxies = [proxy(bg, sshd, rtt) for rtt in (60, 20, 40)]
    try:
        logs = {
            "gpu01": log(tmp_path, "gpu01", DP_RANK),
            "gpu02": log(tmp_path, "gpu02", DP_RANK_OTHER_HOST),
            "gpu03": log(tmp_path, "gpu03", DP_RANK),
            "gpu04": log(tmp_path, "gpu04", BROKEN_PIPE),
            "gpu05": log(tmp_path, "gpu05", HEALTHY_LOG),
        }
        inv = inventory_file(
            tmp_path / "inventory.yaml",
            {
                "gpu01": {"log": logs["gpu01"], "port": proxies[0].port},
                "gpu02": {"log": logs["gpu02"], "port": proxies[1].port},
                "gpu03": {"log": logs["gpu03"]},
                "gpu04": {"log": logs["gpu04"], "port": proxies[2].port},
                "gpu05": {"log": logs["gpu05"]},
                "gpu06": {"log": logs["gpu05"], "port": free_port()},  # nothing listens: unreachable
            },
            sshd,
        )
        db, report, notified = (
            tmp_path / "state" / "history.sqlite3",
            tmp_path / "report.json",
            tmp_path / "notify.json",
        )
        args = [
            "-i",
            str(inv),
            "sweep",
            "all",
            "--db",
            str(db),
            "--report",
            str(report),
            "--notify",
            f"cat > {notified}",
            *ssh_args(sshd),
        ]
        runner = CliRunner()

        first = runner.invoke(main, args)
        assert first.exit_code == 1, first.output + first.stderr
        new = lines_of(first.stdout, "NEW")
        assert len(new) == 3, first.stdout  # three root causes, not six hosts
        assert any(
            "gpu[01-03]" in ln and "AssertionError: DP adjusted local rank 3 is out of bounds" in ln for ln in new
        )
        assert any(ln.split()[1] == "gpu04" and "failed" in ln for ln in new)
        assert any(ln.split()[1] == "gpu06" and "unreachable" in ln and "refused" in ln for ln in new)
        assert "gpu05" not in first.stdout.split("hosts:")[0]
        assert "6 hosts: 4 failed · 1 unreachable · 1 healthy" in first.stdout
        assert "\x1b[" not in first.stdout and "sweeping" not in first.stderr  # not a TTY: no colour, no progress

        doc = json.loads(report.read_text())
        assert doc["version"] == 1 and [h["host"] for h in doc["hosts"]] == [f"gpu0{i}" for i in range(1, 7)]
        results = [host_result_from_json(h) for h in doc["hosts"]]
        assert results[5].verdict == UNREACHABLE and "refused" in results[5].error
        assert results[0].timing.rtt_ms > results[1].timing.rtt_ms  # each host's own RTT, measured
        buf = io.StringIO()
        Console(file=buf, width=200, no_color=True).print(fleet_view(results))
        assert re.search(r"gpu\[01-03\]\s.*\b3\b.*failed.*AssertionError", buf.getvalue())

        payload = json.loads(notified.read_text())
        assert sorted(c["host"] for c in payload["new"]) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu06"]
        assert payload["new"][0]["incident"]["record"]["decisive"]["fingerprint"]

        with Store(db, readonly=True) as st:
            assert set(st.open_incidents()) == {"gpu01", "gpu02", "gpu03", "gpu04", "gpu06"}
            assert st.costs()["gpu01"][0] > st.costs()["gpu03"][0]  # RTT memory for the next sweep's order

        # gpu04 recovers, gpu05 hits the seed's failure, gpu02's cause changes
        logs["gpu04"].write_text(HEALTHY_LOG)
        logs["gpu05"].write_text(DP_RANK)
        logs["gpu02"].write_text(BROKEN_PIPE)
        notified.unlink()
        second = runner.invoke(main, args)
        assert second.exit_code == 1, second.output + second.stderr
        out = second.stdout
        assert [ln.split()[1] for ln in lines_of(out, "NEW")] == ["gpu05"]
        assert [ln.split()[1] for ln in lines_of(out, "CHANGED")] == ["gpu02"]
        assert "was failed: AssertionError: DP adjusted local rank 3" in out
        assert [ln.split()[1] for ln in lines_of(out, "RESOLVED")] == ["gpu04"]
        for quiet in ("gpu01", "gpu03", "gpu06"):
            assert quiet not in out
        assert sorted(c["host"] for c in json.loads(notified.read_text())["new"]) == ["gpu05"]

        notified.unlink()
        third = runner.invoke(main, args)
        assert third.exit_code == 1 and third.stdout == "", third.stdout  # nothing changed: quiet for cron
        assert not notified.exists()

        as_json = runner.invoke(main, args + ["--json"])
        doc = json.loads(as_json.stdout)
        assert doc["changes"] == {"new": [], "changed": [], "resolved": []} and doc["exit"] == 1

        hist = runner.invoke(main, ["-i", str(inv), "history", "gpu04", "--db", str(db), "--json"])
        assert hist.exit_code == 0, hist.output
        inc = json.loads(hist.stdout)["incidents"]
        assert [i["host"] for i in inc] == ["gpu04"] and inc[0]["resolved"] and inc[0]["count"] == 1
        table = runner.invoke(main, ["-i", str(inv), "history", "--db", str(db)], env={"COLUMNS": "200"})
        assert table.exit_code == 0
        gpu01 = next(ln for ln in table.stdout.splitlines() if "gpu01" in ln)
        assert "open" in gpu01 and re.search(r"│\s+4\s+│", gpu01)  # seen in all four sweeps
    finally:
        for p in proxies:
            bg.run(p.stop())


def test_second_concurrent_sweep_is_refused_and_ctrl_c_keeps_results(sshd, tmp_path, bg):
    """A running sweep holds the lock; the second one exits 5 naming its pid.

    Ctrl-C then stops the first: hosts that answered keep their results; the
    unfinished one is reported as interrupted, and its history is untouched.
    """
    wedged = bg.run(_wedged_server())
    watch = proxy(bg, sshd, 0)  # to see when the fast host's probe is over (its connection closes)
    try:
        inv = inventory_file(
            tmp_path / "inventory.yaml",
            {
                "fast": {"log": log(tmp_path, "f", DP_RANK), "port": watch.port},
                "wedged": {"log": log(tmp_path, "w", DP_RANK), "port": wedged.sockets[0].getsockname()[1]},
            },
            sshd,
        )
        db, report = tmp_path / "history.sqlite3", tmp_path / "report.json"
        args = [
            "-i",
            str(inv),
            "sweep",
            "all",
            "--db",
            str(db),
            "--report",
            str(report),
            "--deadline",
            "60",
            "--connect-timeout",
            "60",
            *ssh_args(sshd),
        ]
        first = subprocess.Popen(
            [EXE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"}
        )
        lock = tmp_path / "history.sqlite3.lock"
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and not (lock.exists() and lock.read_text().startswith(str(first.pid))):
            time.sleep(0.05)
        while time.monotonic() < t_end and not watch.closed:  # the fast host's probe is over
            time.sleep(0.05)
        time.sleep(0.2)

        second = CliRunner().invoke(main, args)
        assert second.exit_code == 5, second.output
        assert f"another sweep is already running (pid {first.pid}" in second.stderr
        assert second.stdout == ""

        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=15)
        assert first.returncode == 1, err  # the failure found before Ctrl-C decides the exit code
        assert "interrupted; 1 host(s) unfinished: wedged" in err
        assert "NEW" in out and "fast" in out and "AssertionError" in out
        hosts = {h["host"]: h for h in json.loads(report.read_text())["hosts"]}
        assert hosts["fast"]["verdict"] == FAILED
        assert hosts["wedged"]["verdict"] == UNREACHABLE and hosts["wedged"]["error"] == "interrupted"
        assert json.loads(report.read_text())["sweep"]["interrupted"] is True
        with Store(db, readonly=True) as st:
            assert set(st.open_incidents()) == {"fast"}  # an interrupted host is not an incident
    finally:
        bg.shut(wedged)
        bg.run(watch.stop())


def test_broken_history_keeps_the_report_and_says_what_to_do(sshd, tmp_path):
    inv = inventory_file(tmp_path / "inventory.yaml", {"gpu01": {"log": log(tmp_path, "f", DP_RANK)}}, sshd)
    db, report = tmp_path / "history.sqlite3", tmp_path / "report.json"
    db.write_bytes(b"garbage, not sqlite " * 500)
    res = CliRunner().invoke(
        main, ["-i", str(inv), "sweep", "gpu01", "--db", str(db), "--report", str(report), *ssh_args(sshd)]
    )
    assert res.exit_code == 1
    assert "history not updated" in res.stderr and "damaged" in res.stderr and str(report) in res.stderr
    assert "NOW" in res.stdout and "gpu01" in res.stdout  # without history, every current problem is shown
    assert json.loads(report.read_text())["hosts"][0]["verdict"] == FAILED


def test_probe_prints_one_card_per_root_cause_and_the_fleet_view(sshd, tmp_path):
    inv = inventory_file(
        tmp_path / "inventory.yaml",
        {
            **{
                f"gpu0{i}": {"log": log(tmp_path, f"gpu0{i}", DP_RANK if i != 2 else DP_RANK_OTHER_HOST)}
                for i in (1, 2, 3)
            },
            "gpu04": {"log": log(tmp_path, "gpu04", HEALTHY_LOG)},
        },
        sshd,
    )
    res = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", *ssh_args(sshd)], env={"COLUMNS": "160"})
    assert res.exit_code == 1, res.output
    out = res.stdout
    assert out.count("FAILED") == 1 and "HEALTHY" not in out  # one card for the three, none for the healthy host
    assert "same root cause on 2 more: gpu[02-03]" in out
    assert "4 hosts: 3 failed · 1 healthy" in out and re.search(r"gpu\[01-03\]\s*│\s*3\s*│", out)


def test_history_without_a_database_says_so(tmp_path):
    res = CliRunner().invoke(main, ["history", "--db", str(tmp_path / "none.sqlite3")])
    assert res.exit_code == 2 and "no history yet" in res.stderr
