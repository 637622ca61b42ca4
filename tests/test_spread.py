"""A fleet spread over worker processes (fleetdiag/ssh/spread.py), through the real test sshd."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings
from fleetdiag.records import FAILED, HEALTHY, NO_LOG
from fleetdiag.ssh.scheduler import INTERNAL, CostMemory, HandshakeGate
from fleetdiag.ssh.spread import HOSTS_PER_WORKER, MAX_WORKERS, deal, probe_fleet, worker_count

from .procs import pids_with
from .sshd import start_sshd

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # three first hops: hosts can be dealt apart


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """The test sshd, listening on three loopback addresses."""
    server = start_sshd(tmp_path_factory.mktemp("sshd-spread"), "ListenAddress 127.0.0.2\nListenAddress 127.0.0.3\n")
    for addr in ADDRESSES[1:]:
        server.trust(server.port, host=addr)
    yield server
    server.stop()


def test_worker_count_grows_with_hosts_up_to_half_the_cpus():
    assert worker_count(1000, cpus=2) == 1  # a small machine: one process
    assert worker_count(10, cpus=32) == 1
    assert worker_count(2 * HOSTS_PER_WORKER, cpus=32) == 2
    assert worker_count(600, cpus=32) == 600 // HOSTS_PER_WORKER
    assert worker_count(5000, cpus=32) == MAX_WORKERS  # memory: each worker is an interpreter
    assert worker_count(5000, cpus=4) == 2
    assert worker_count(5, requested=3) == 3  # asked for: as asked, never more than hosts
    assert worker_count(2, requested=8) == 2


class _H:
    def __init__(self, name: str, target: str, port: int = 22, jump: str | None = None):
        self.name, self.target, self.port, self.jump = name, target, port, jump


def test_deal_keeps_a_first_hop_together_and_balances_the_rest():
    behind = [_H(f"b{i}", f"10.0.0.{i}", jump="bastion") for i in range(6)]
    alone = [_H(f"a{i}", f"10.1.0.{i}") for i in range(6)]
    gate = HandshakeGate(8)
    shares = deal(behind + alone, 3, gate.key)
    names = [[h.name for h in s] for s in shares]
    assert sorted(sum(names, [])) == sorted(h.name for h in behind + alone)  # each host once
    holder = [s for s in names if "b0" in s][0]
    assert all(f"b{i}" in holder for i in range(6))  # one bastion's MaxStartups: one worker
    assert sorted(len(s) for s in names) == [3, 3, 6]


def _inventory(sshd, tmp_path: Path, n: int) -> object:
    logs = {"failed": DEMO / "dp_rank.log", "healthy": DEMO / "healthy.log"}
    lines = ["hosts:"]
    for i in range(n):
        kind = ("failed", "healthy", "missing")[i % 3]
        log = str(logs[kind]) if kind in logs else str(tmp_path / "nope.log")
        lines += [
            f"  gpu{i:02d}:",
            f"    address: {ADDRESSES[i % 3]}",
            f"    port: {sshd.port}",
            f"    user: {sshd.user}",
            f"    logs: {{vllm: {json.dumps(log)}}}",
        ]
    return parse_inventory("\n".join(lines) + "\n", "inv.yaml")


def _run(hosts, settings, **kw):
    events = []

    async def go():
        got = []
        async for res in probe_fleet(hosts, settings, 4, per_address=4, progress=events.append, **kw):
            got.append(res)
        return got

    return asyncio.run(go()), events


def test_workers_give_the_same_results_as_one_process(sshd, tmp_path):
    inv = _inventory(sshd, tmp_path, 9)
    hosts = list(inv.hosts.values())
    one, _ = _run(hosts, ProbeSettings(transport=sshd.opts()), workers=1)
    memory = CostMemory()
    three, events = _run(hosts, ProbeSettings(transport=sshd.opts()), workers=3, memory=memory)
    assert sorted(r.host for r in three) == sorted(h.name for h in hosts)  # every host exactly once
    verdicts = {r.host: r.verdict for r in one}
    assert {r.host: r.verdict for r in three} == verdicts
    assert sorted(set(verdicts.values())) == sorted({FAILED, HEALTHY, NO_LOG})
    decisive = {r.host: r.decisive.line for r in three if r.decisive}
    assert all("DP adjusted local rank 3" in line for line in decisive.values()) and len(decisive) == 3
    assert [e.event for e in events].count("start") == 9 and [e.event for e in events].count("done") == 9
    assert events[-1].done == 9 and sum(events[-1].counts.values()) == 9
    assert all(memory.get(h.name) is not None for h in hosts)  # the parent's memory learns from every host


def test_a_worker_that_dies_leaves_its_hosts_a_result(sshd, tmp_path):
    """A worker killed mid-run (the OOM killer): its hosts become internal-error results; others finish."""
    lines = ["hosts:"]
    for i in range(4):
        lines += [
            f"  h{i}:",
            f"    address: {ADDRESSES[i % 2]}",
            f"    port: {sshd.port}",
            f"    user: {sshd.user}",
            f"    logs: {{vllm: {{command: {json.dumps('sleep 4; cat ' + str(DEMO / 'dp_rank.log'))}}}}}",
        ]
    inv = parse_inventory("\n".join(lines) + "\n", "inv.yaml")
    hosts = list(inv.hosts.values())
    killed = []

    def kill_one(event):
        if killed or event.event != "start":
            return
        pids = pids_with("fleetdiag.ssh.spread")
        if pids:
            time.sleep(0.5)  # its hosts have started: they are lost with it
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    async def go():
        got = []
        async for res in probe_fleet(hosts, ProbeSettings(transport=sshd.opts()), 4, workers=2, progress=kill_one):
            got.append(res)
        return got

    results = asyncio.run(go())
    assert killed
    assert sorted(r.host for r in results) == ["h0", "h1", "h2", "h3"]
    lost = [r for r in results if r.error_kind == INTERNAL]
    assert len(lost) == 2
    assert all("worker process ended" in r.error for r in lost)
    assert all(r.verdict == FAILED for r in results if r not in lost)


def test_sweep_with_workers_through_the_cli(sshd, tmp_path):
    """`sweep --workers 2`: the report holds every host, as with one process."""
    inv = tmp_path / "inv.yaml"
    doc = _inventory(sshd, tmp_path, 6)
    lines = ["hosts:"]
    for h in doc.hosts.values():
        lines += [
            f"  {h.name}:",
            f"    address: {h.address}",
            f"    port: {sshd.port}",
            f"    user: {sshd.user}",
            f"    logs: {{vllm: {json.dumps(str(h.logs['vllm']))}}}",
        ]
    inv.write_text("\n".join(lines) + "\n")
    report = tmp_path / "report.json"
    exe = str(Path(sys.executable).parent / "fleetdiag")
    proc = subprocess.run(
        [
            exe,
            "-i",
            str(inv),
            "sweep",
            "all",
            "--workers",
            "2",
            "--report",
            str(report),
            "--db",
            str(tmp_path / "h.db"),
            "--known-hosts",
            str(sshd.known_hosts),
            "--identity",
            str(sshd.client_key),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, FLEETDIAG_PERSIST="0"),
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(report.read_text())
    assert sorted(h["host"] for h in doc["hosts"]) == [f"gpu{i:02d}" for i in range(6)]
    assert sorted(h["verdict"] for h in doc["hosts"]).count("failed") == 2


def test_probe_fleet_takes_probe_manys_options_and_no_others():
    """``FanoutOptions`` is the one list: an option probe_many does not share is refused, as a signature would."""

    async def first(**kw):
        return [r async for r in probe_fleet([], ProbeSettings(), 4, **kw)]

    assert asyncio.run(first(deadline=1.0, per_address=2, memory=None, progress=None)) == []
    with pytest.raises(TypeError, match="handshakes"):
        asyncio.run(first(handshakes=3))
