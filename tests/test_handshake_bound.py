"""Handshakes in flight are bounded fleet-wide by this machine's CPUs, so a wide fanout queues
handshakes instead of starving them all (and the queued time is not held against the deadline)."""

from __future__ import annotations

from fleetdiag.records import HEALTHY
from fleetdiag.ssh import scheduler

from .test_fleet import collect, fake_hosts, fake_probe


def test_wide_fanout_is_bounded_by_cpus(monkeypatch):
    monkeypatch.setattr(scheduler.os, "cpu_count", lambda: 1)
    assert scheduler.handshake_bound() == scheduler.HANDSHAKES_PER_CPU
    hosts = fake_hosts([f"h{i}" for i in range(100)])
    active: dict = {}
    res = collect(
        hosts, fake_probe({h.name: 0 for h in hosts}, handshake=0.02, active=active), fanout=100, per_address=0
    )
    assert len(res) == 100 and all(r.verdict == HEALTHY for r in res)
    assert active["max:10.0.0.1"] == scheduler.HANDSHAKES_PER_CPU


def test_bound_scales_with_cpus_and_zero_lifts_it(monkeypatch):
    monkeypatch.setattr(scheduler.os, "cpu_count", lambda: 4)
    assert scheduler.handshake_bound() == 4 * scheduler.HANDSHAKES_PER_CPU
    hosts = fake_hosts([f"h{i}" for i in range(40)])
    active: dict = {}
    collect(
        hosts,
        fake_probe({h.name: 0 for h in hosts}, handshake=0.05, active=active),
        fanout=40,
        per_address=0,
        handshakes=0,
    )
    assert active["max:10.0.0.1"] == 40


def test_queued_for_the_fleet_bound_is_not_late():
    hosts = fake_hosts([f"h{i}" for i in range(6)], "10.0.0.9")
    active: dict = {}
    res = collect(
        hosts,
        fake_probe({h.name: 0.0 for h in hosts}, handshake=0.15, active=active),
        fanout=6,
        per_address=0,
        handshakes=2,
        deadline=0.25,
    )
    assert active["max:10.0.0.9"] == 2
    assert all(r.verdict == HEALTHY for r in res), [r.error for r in res]


def test_hosts_waiting_on_a_full_address_leave_their_fanout_slot_to_others(sshd, tmp_path):
    """130 hosts on one address that accept TCP and never send a banner, then one live host (real sshd) on
    another address:port, last in order: the live host starts at once and is the first answer, before any
    banner-less host's login timeout (20 s), instead of behind ~9 rounds of them holding every fanout slot."""
    import asyncio
    import time

    from fleetdiag.inventory import parse_inventory
    from fleetdiag.probe import ProbeSettings

    log = tmp_path / "vllm.log"
    log.write_text("INFO engine started\n")

    async def go() -> tuple[list[str], float]:
        held: list = []

        async def mute(reader, writer):  # accept, say nothing, hold the connection
            held.append(writer)
            await asyncio.sleep(3600)

        server = await asyncio.start_server(mute, "127.0.0.2", 0)
        port = server.sockets[0].getsockname()[1]
        lines = ["hosts:"]
        for i in range(130):
            lines += [f"  mute{i}:", "    address: 127.0.0.2", f"    port: {port}", f"    logs: {{vllm: {log}}}"]
        lines += [
            "  live:",
            "    address: 127.0.0.1",
            f"    port: {sshd.port}",
            f"    user: {sshd.user}",
            f"    logs: {{vllm: {log}}}",
        ]
        inv = parse_inventory("\n".join(lines) + "\n", "inv.yaml")
        settings = ProbeSettings(transport=sshd.opts(connect_timeout=20))
        t0 = time.monotonic()
        order: list[str] = []
        try:
            async for res in scheduler.probe_many(list(inv.hosts.values()), settings, fanout=64):
                order.append(res.host)
                return order, time.monotonic() - t0  # the first answer decides
        finally:
            server.close()
            for w in held:
                w.close()
        return order, time.monotonic() - t0

    order, took = asyncio.run(go())
    assert order == ["live"], order  # before every banner-less host: none of them timed out yet
    assert took < 20, took
