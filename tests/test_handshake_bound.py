"""Handshakes in flight are bounded fleet-wide by this machine's CPUs, so a wide fanout queues
handshakes instead of starving them all (and the queued time is not held against the deadline)."""

from __future__ import annotations

from fleetdiag import scheduler
from fleetdiag.records import HEALTHY

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
