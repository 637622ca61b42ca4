"""The watch state machine on an injected clock: every rule with plain numbers for "now", no sleeps, no SSH.

``HostState`` is driven directly (the rules), then a ``HostWatcher`` is fed follower records by
hand (the merging of what arrives), both with a clock that the test advances.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetdiag.analysis import load_rules
from fleetdiag.inventory import parse_inventory
from fleetdiag.records import Decisive, FunnelResult, HostResult, Line, Verdict
from fleetdiag.remote import follow
from fleetdiag.watch import (
    CONNECTING,
    FAILED,
    HEALTHY,
    RECOVERED,
    STALLED,
    STARTING,
    UNREACHABLE,
    HostState,
    HostView,
    HostWatcher,
    LineBuffer,
    WatchSettings,
)

RULES = load_rules(user_default=False)


def _no_clock() -> float:
    raise AssertionError("the state machine read a clock; time must be passed in")


def machine(**kw: Any) -> HostState:
    s = WatchSettings(
        rules=RULES,
        stall_after=kw.pop("stall_after", 60.0),
        wait_limit=kw.pop("wait_limit", 900.0),
        grace=kw.pop("grace", 10.0),
        clock=_no_clock,
        **kw,
    )
    buf = LineBuffer()
    buf.reset([Line(0, "INFO serving", 1)])
    return HostState(s, HostView("h", log="/var/log/x.log"), buf, s.stall_after, wall=lambda: 1_700_000_000.0)


def healthy(summary: str = "serving requests") -> HostResult:
    return HostResult(host="h", verdict=Verdict.HEALTHY, summary=summary)


def starting(summary: str = "waiting for the engine to be ready") -> HostResult:
    return HostResult(host="h", verdict=Verdict.STARTING, summary=summary)


def failed(message: str = "AssertionError: rank 3 out of bounds", fp: str = "fp1") -> HostResult:
    return HostResult(
        host="h", verdict=Verdict.FAILED, decisive=Decisive(line=f"ERROR {message}", message=message, fingerprint=fp)
    )


def up(st: HostState, res: HostResult, now: float) -> Any:
    """A snapshot arrived at ``now``: connected, the log grew just now, analysed."""
    st.came_up()
    st.set_activity(now, now)
    st.analysed(res, now)
    return st.evaluate(now)


def test_a_log_that_stops_growing_is_stalled_at_stall_after_and_recovers_when_it_grows():
    st = machine(stall_after=60.0)
    assert up(st, healthy(), 1000.0) == CONNECTING  # the event: connecting -> healthy
    assert st.view.state == HEALTHY
    assert st.evaluate(1059.9) is None and st.view.state == HEALTHY
    assert st.evaluate(1060.0) == HEALTHY
    assert st.view.state == STALLED
    assert "has not grown for 60s" in st.view.reason and "last: serving requests" in st.view.reason
    assert st.evaluate(1500.0) is None  # still stalled: no new event
    st.set_activity(1501.0, 1501.0)  # it grows again
    assert st.evaluate(1501.0) == STALLED
    assert st.view.state == RECOVERED and st.view.reason.startswith("healthy again: ")
    assert st.evaluate(1530.0) is None and st.view.state == RECOVERED  # stays recovered while healthy


def test_per_host_stall_after_is_the_one_used():
    st = machine(stall_after=60.0)
    st.stall_after = 5.0  # the inventory's per-host value
    up(st, healthy(), 0.0)
    st.evaluate(5.0)
    assert st.view.state == STALLED


def test_activity_never_moves_back():
    st = machine()
    up(st, healthy(), 100.0)
    st.set_activity(40.0, 100.0)  # an older mtime from a late heartbeat
    assert st.idle(100.0) == 0.0 and st.activity == 100.0


def test_a_blip_within_grace_holds_the_last_state_and_past_grace_is_unreachable():
    st = machine(grace=10.0)
    up(st, healthy(), 0.0)
    st.went_down("connection lost", permanent=False, now=100.0)
    assert st.evaluate(100.0) is None and st.view.state == HEALTHY  # held while reconnecting
    assert st.evaluate(109.9) is None
    assert st.view.error == "connection lost"
    assert st.evaluate(110.0) == HEALTHY
    assert st.view.state == UNREACHABLE and st.view.reason == "connection lost"
    st.went_down("refused", permanent=False, now=115.0)  # a later failure does not restart the grace period
    assert st.down_since == 100.0


def test_a_host_never_reached_is_connecting_then_unreachable_and_a_permanent_error_at_once():
    st = machine(grace=10.0)
    st.went_down("connection refused by h:22", permanent=False, now=0.0)
    assert st.evaluate(0.0) is None  # still connecting: the initial state
    assert st.view.reason == "retrying: connection refused by h:22"
    assert st.evaluate(10.0) == CONNECTING and st.view.state == UNREACHABLE
    key = machine(grace=10.0)
    key.went_down("authentication refused", permanent=True, now=0.0)
    assert key.evaluate(0.0) == CONNECTING and key.view.state == UNREACHABLE


def test_unreachable_then_back_and_healthy_is_recovered():
    st = machine(grace=10.0)
    up(st, healthy(), 0.0)
    st.went_down("connection lost", permanent=False, now=50.0)
    st.evaluate(70.0)
    assert st.view.state == UNREACHABLE
    assert up(st, healthy(), 80.0) == UNREACHABLE
    assert st.view.state == RECOVERED and st.view.connected and st.view.reconnects == 1
    assert st.down_since is None and st.view.error is None


def test_waiting_longer_than_the_wait_limit_is_stalled_even_while_the_log_grows():
    st = machine(stall_after=60.0, wait_limit=900.0)
    up(st, starting(), 0.0)
    assert st.view.state == STARTING
    for t in range(30, 900, 30):  # a health-check loop: the log grows, the analysis still says starting
        st.set_activity(float(t), float(t))
        st.analysed(starting(), float(t))
        assert st.evaluate(float(t)) is None, t
    st.set_activity(900.0, 900.0)
    assert st.evaluate(900.0) == STARTING
    assert st.view.state == STALLED and st.view.reason.startswith("still not ready after 15 min")
    st.analysed(healthy("ready"), 905.0)  # it came up after all
    assert st.waiting_since is None
    assert st.evaluate(905.0) == STALLED and st.view.state == RECOVERED


def test_the_wait_limit_clock_restarts_after_a_non_starting_analysis():
    st = machine(wait_limit=100.0, stall_after=1e9)
    up(st, starting(), 0.0)
    st.analysed(healthy(), 50.0)
    st.analysed(starting(), 60.0)  # a new run starting
    st.evaluate(150.0)
    assert st.view.state == STARTING
    st.evaluate(160.0)
    assert st.view.state == STALLED


def test_failed_stays_failed_through_silence_a_gone_process_and_a_blip():
    st = machine(stall_after=60.0, grace=10.0, process="vllm serve")
    assert up(st, failed(), 0.0) == CONNECTING
    assert st.view.state == FAILED and st.view.reason == "AssertionError: rank 3 out of bounds"
    assert st.evaluate(10_000.0) is None  # a dead job's log stops growing: still the decisive error
    st.view.process_alive = False
    assert st.evaluate(10_001.0) is None and st.view.state == FAILED
    st.went_down("connection lost", permanent=False, now=10_002.0)
    assert st.evaluate(10_005.0) is None and st.view.state == FAILED
    assert up(st, failed(), 10_006.0) is None and st.view.state == FAILED  # back, same error: no event


def test_a_new_decisive_error_while_failed_is_an_event():
    st = machine()
    up(st, failed(), 0.0)
    st.analysed(failed("RuntimeError: CUDA error: an illegal memory access", fp="fp2"), 5.0)
    assert st.evaluate(5.0) == FAILED  # previous state failed, but a different error: reported
    assert st.view.reason.startswith("RuntimeError: CUDA error")
    assert st.troubled


def test_process_gone_with_no_error_is_stalled():
    st = machine(process="vllm serve")
    up(st, healthy(), 0.0)
    st.view.process_alive = False
    assert st.evaluate(1.0) == HEALTHY
    assert st.view.state == STALLED and "no process matches 'vllm serve'" in st.view.reason


def test_an_empty_or_missing_log_is_starting_then_stalled_when_it_never_appears():
    st = machine(stall_after=60.0)
    st.buffer.reset()
    st.log_status = "missing"
    up(st, starting("log not found"), 0.0)
    assert st.view.state == STARTING and "waiting for the log to appear" in st.view.reason
    st.evaluate(60.0)
    assert st.view.state == STALLED and "has not appeared for 60s" in st.view.reason
    st.seen_log = True
    st.set_activity(61.0, 61.0)
    st.evaluate(61.0)
    assert "the log is gone" in st.view.reason


def test_events_carry_the_watch_state_and_the_probe_verdict():
    st = machine()
    up(st, healthy(), 0.0)
    st.went_down("x", permanent=True, now=1.0)
    st.evaluate(1.0)
    res = st.view.to_result()
    assert res.verdict == "unreachable" and isinstance(res.verdict, Verdict)
    st2 = machine()
    st2.evaluate(0.0)
    assert st2.view.to_result().verdict is Verdict.STARTING  # connecting is "starting" to probe's vocabulary


# ------------------------------------------------------------------ the watcher's merging, on the same clock


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watcher(tmp_path: Any, clock: Clock, **kw: Any) -> tuple[HostWatcher, list[tuple[str, str | None]]]:
    inv = parse_inventory(
        f"hosts:\n  h:\n    address: 10.0.0.9\n    logs:\n      run: {tmp_path}/run.log\n", "inv.yaml"
    )
    s = WatchSettings(rules=RULES, facts=False, clock=clock, **kw)
    events: list[tuple[str, str | None]] = []
    w = HostWatcher(inv.hosts["h"], s, lambda hw, prev: events.append((hw.view.state, prev)), "sess")
    return w, events


def test_watcher_records_drive_the_machine_on_the_injected_clock(tmp_path):
    clock = Clock()
    w, events = watcher(tmp_path, clock, stall_after=30.0)
    log = f"{tmp_path}/run.log"
    w._snapshot(
        FunnelResult(
            path=log, status="ok", size=40, mtime=100.0, now=100.0, tail=[Line(0, "INFO step 10/1000 loss=2.31", 1)]
        )
    )  # training: silence is a stall
    assert events == [(HEALTHY, CONNECTING)] and w.view.connected
    clock.t += 20
    w._record(follow.Heartbeat(now=120.0, size=40, mtime=100.0, inode=1, alive=None, pos=40))  # remote: idle 20 s
    assert w.view.state == HEALTHY
    clock.t += 11
    w._record(follow.Heartbeat(now=131.0, size=40, mtime=100.0, inode=1, alive=None, pos=40))
    assert events[-1] == (STALLED, HEALTHY)
    clock.t += 1
    w._record(Line(40, "ERROR Traceback follows", 2))
    w._record(Line(64, "ValueError: boom", 3))
    w._record(follow.Sync(90))
    assert w.view.state == FAILED and events[-1] == (FAILED, STALLED)
    assert w.idle() == 0.0 and w.analyses == 2


@pytest.mark.parametrize("kind,state", [("auth", UNREACHABLE), ("refused", CONNECTING)])
def test_watcher_down_is_unreachable_at_once_only_for_permanent_errors(tmp_path, kind, state):
    from fleetdiag.watch.host import PERMANENT

    clock = Clock()
    w, _events = watcher(tmp_path, clock, grace=10.0)
    w.state.went_down("no", kind in PERMANENT, clock())
    w.evaluate()
    assert w.view.state == state
