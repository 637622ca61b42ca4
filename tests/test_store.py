"""The history store: incidents, new/changed/resolved, costs, errors, the sweep lock. No SSH."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from rich.console import Console

from fleetdiag.records import FAILED, HEALTHY, NO_LOG, STALLED, UNREACHABLE, Decisive, HostResult, Timing
from fleetdiag.render import fleet_view
from fleetdiag.ssh.scheduler import CostMemory
from fleetdiag.store import (
    LockBusy,
    Store,
    StoreError,
    SweepLock,
    group_by_cause,
    incident_key,
    write_atomic,
)

T0 = 1_700_000_000.0


def failed(host: str, fp: str, message: str | None = None, rtt: float | None = None) -> HostResult:
    msg = message or f"RuntimeError: {fp}"
    d = Decisive(
        line=f"(Worker pid=1) ERROR {msg}",
        message=msg,
        exception_type=msg.split(":")[0],
        category="config",
        fingerprint=fp,
        hint="check it",
    )
    return HostResult(host=host, verdict=FAILED, decisive=d, timing=Timing(rtt_ms=rtt, total_ms=(rtt or 0) * 6))


def unreachable(host: str, kind: str = "refused", error: str | None = None) -> HostResult:
    r = HostResult(host=host, verdict=UNREACHABLE, error=error or f"connection refused by {host}:22")
    r.error_kind = kind
    return r


def healthy(host: str, rtt: float | None = None) -> HostResult:
    return HostResult(host=host, verdict=HEALTHY, summary="serving", timing=Timing(rtt_ms=rtt, total_ms=(rtt or 0) * 6))


def hosts_of(changes: list) -> list[str]:
    return sorted(c.host for c in changes)


def test_incident_key_means_same_root_cause():
    assert incident_key(healthy("a")) is None
    assert incident_key(HostResult(host="a", verdict="starting")) is None
    assert incident_key(failed("a", "fp1")) == incident_key(failed("b", "fp1")) == "fp1"
    # unreachable hosts match by kind of problem, not by a message that names their port
    assert (
        incident_key(unreachable("a", error="connection refused by 10.0.0.1:22"))
        == incident_key(unreachable("b", error="connection refused by 10.0.0.2:2222"))
        == "unreachable:refused"
    )
    assert incident_key(unreachable("a", "deadline")) != incident_key(unreachable("a", "refused"))
    assert incident_key(HostResult(host="a", verdict=NO_LOG, error="log not found: /x.log")) == "no-log:log not found"
    assert incident_key(HostResult(host="a", verdict=STALLED, summary="waiting for 25 min")) == "stalled"


def test_group_by_cause_folds_hosts_worst_first():
    results = [failed(f"gpu0{i}", "fpA") for i in (1, 2, 3, 4, 7)] + [
        healthy("gpu05"),
        healthy("gpu06"),
        unreachable("gpu08"),
    ]
    groups = group_by_cause(results)
    assert [g.verdict for g in groups] == [FAILED, UNREACHABLE, HEALTHY]
    assert groups[0].folded == "gpu[01-04,07]"
    assert groups[2].folded == "gpu[05-06]"


def test_fleet_view_one_row_per_root_cause():
    results = [
        failed(f"gpu0{i}", "fpA", "AssertionError: DP adjusted local rank 3 is out of bounds", rtt=40 + i)
        for i in (1, 2, 3, 4, 7)
    ]
    results += [
        failed("gpu05", "fpB", "BrokenPipeError: [Errno 32] Broken pipe"),
        healthy("gpu06"),
        unreachable("gpu08"),
    ]
    buf = io.StringIO()
    Console(file=buf, width=160, no_color=True).print(fleet_view(results))
    text = buf.getvalue()
    assert "8 hosts: 6 failed · 1 unreachable · 1 healthy" in text
    row = next(ln for ln in text.splitlines() if "gpu[01-04,07]" in ln)
    assert "AssertionError: DP adjusted local rank 3" in row and " 5 " in row and "41–47 ms" in row
    assert sum("AssertionError" in ln for ln in text.splitlines()) == 1  # grouped, not repeated
    assert any("gpu05" in ln and "BrokenPipeError" in ln for ln in text.splitlines())


def test_new_unchanged_changed_resolved_recurred(tmp_path):
    with Store(tmp_path / "h.db") as st:
        c = st.record_sweep([failed("a", "fpA"), unreachable("b"), healthy("c")], started=T0)
        assert hosts_of(c.new) == ["a", "b"] and not c.changed and not c.resolved
        assert c.new[0].incident.count == 1 and not c.new[0].recurred

        c = st.record_sweep([failed("a", "fpA"), unreachable("b"), healthy("c")], started=T0 + 60)
        assert not c  # nothing changed: a quiet sweep
        inc = st.open_incidents()
        assert inc["a"].count == 2 and inc["a"].first_seen == T0 and inc["a"].last_seen == T0 + 60

        c = st.record_sweep([failed("a", "fpB"), healthy("b"), failed("c", "fpA")], started=T0 + 120)
        assert hosts_of(c.changed) == ["a"] and c.changed[0].previous.fingerprint == "fpA"
        assert c.changed[0].incident.fingerprint == "fpB"
        assert hosts_of(c.resolved) == ["b"] and c.resolved[0].incident.resolved_at == T0 + 120
        assert c.resolved[0].verdict == HEALTHY
        assert hosts_of(c.new) == ["c"]

        c = st.record_sweep([unreachable("b", error="connection refused by b:2222")], started=T0 + 180)
        assert hosts_of(c.new) == ["b"] and c.new[0].recurred  # the same trouble is back
        assert c.new[0].incident.first_seen == T0 and c.new[0].incident.since == T0 + 180
        assert c.new[0].incident.count == 3

        all_ = {(i.host, i.fingerprint): i for i in st.incidents()}
        assert set(all_) == {("a", "fpA"), ("a", "fpB"), ("b", "unreachable:refused"), ("c", "fpA")}
        assert all_[("a", "fpA")].resolved_at == T0 + 120 and all_[("a", "fpB")].open
        assert all_[("a", "fpB")].record["decisive"]["fingerprint"] == "fpB"  # the evidence is kept
        assert [i.host for i in st.incidents(["a"])] == ["a", "a"]
        assert st.incidents(["a"])[0].open  # open ones first


def test_hosts_outside_the_sweep_and_interrupted_hosts_keep_their_incidents(tmp_path):
    with Store(tmp_path / "h.db") as st:
        st.record_sweep([failed("a", "fpA"), failed("b", "fpB")], started=T0)
        c = st.record_sweep([healthy("a")], started=T0 + 60)  # a sweep of a different selector
        assert hosts_of(c.resolved) == ["a"]
        assert "b" in st.open_incidents()
        interrupted = unreachable("b", "interrupted", "interrupted")
        c = st.record_sweep([interrupted], started=T0 + 120, interrupted=True, unknown=["b"])
        assert not c
        assert st.open_incidents()["b"].fingerprint == "fpB"
        assert st.sweeps()[0]["interrupted"] == 1


def test_costs_persist_and_order_slowest_first(tmp_path):
    mem = CostMemory()
    for r in (healthy("near", rtt=5), healthy("far", rtt=400), failed("mid", "x", rtt=80)):
        mem.learn(r)
    with Store(tmp_path / "h.db") as st:
        st.record_sweep([], started=T0, costs=mem.pairs())
    with Store(tmp_path / "h.db", readonly=True) as st:
        again = CostMemory(st.costs())

    class H:
        def __init__(self, name):
            self.name = name

    order = [h.name for h in again.order([H("near"), H("new"), H("mid"), H("far")])]
    assert order == ["new", "far", "mid", "near"]  # never seen: might be slowest, so first
    again.learn(healthy("far", rtt=200))
    assert again.get("far").rtt_ms == 300  # smoothed, one run does not reorder the fleet
    again.learn(unreachable("near", "interrupted"))
    assert again.get("near").rtt_ms == 5


def test_results_are_pruned_incidents_kept(tmp_path):
    with Store(tmp_path / "h.db") as st:
        st.record_sweep([failed("a", "fpA"), healthy("b")], started=T0)
        st.record_sweep([failed("a", "fpA"), healthy("b")], started=T0 + 100 * 86400, keep_days=90)
        assert [s["started"] for s in st.sweeps()] == [T0 + 100 * 86400]
        rows = st.db.execute("SELECT host, record IS NOT NULL FROM results ORDER BY host").fetchall()
        assert rows == [("a", 1), ("b", 0)]  # full records only for hosts in trouble
        assert st.open_incidents()["a"].count == 2


def test_corrupt_database_is_a_clear_error(tmp_path):
    db = tmp_path / "h.db"
    db.write_bytes(b"this is not sqlite" * 300)
    with pytest.raises(StoreError) as e:
        Store(db)
    assert e.value.kind == "corrupt"
    assert str(db) in str(e.value) and "mv " in str(e.value)


def test_locked_database_is_a_clear_error(tmp_path):
    db = tmp_path / "h.db"
    Store(db).close()
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with Store(db, timeout=0.2) as st:
            with pytest.raises(StoreError) as e:
                st.record_sweep([failed("a", "fpA")], started=T0)
        assert e.value.kind == "locked" and "locked by another process" in str(e.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    with Store(db) as st:  # nothing half-written
        assert st.sweeps() == []


def test_newer_schema_is_refused(tmp_path):
    db = tmp_path / "h.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(StoreError) as e:
        Store(db)
    assert e.value.kind == "newer"


def test_readonly_store_missing_file(tmp_path):
    with pytest.raises(StoreError) as e:
        Store(tmp_path / "nope.db", readonly=True)
    assert e.value.kind == "missing" and "run fleetdiag sweep" in str(e.value)
    assert not (tmp_path / "nope.db").exists()


def test_sweep_lock_names_the_holder_and_frees_on_death(tmp_path):
    lock_path = tmp_path / "h.db.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from fleetdiag.store import SweepLock; "
            f"l = SweepLock({str(lock_path)!r}).acquire(); print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy) as e:
            SweepLock.for_db(tmp_path / "h.db").acquire()
        assert e.value.pid == holder.pid
        assert f"pid {holder.pid}" in str(e.value) and "already running" in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    with SweepLock(lock_path):  # the kernel released it: no stale lock
        assert lock_path.read_text().split()[0] == str(os.getpid())


def test_write_atomic_replaces_whole_file(tmp_path):
    target = tmp_path / "state" / "report.json"
    write_atomic(target, json.dumps({"v": 1}))
    write_atomic(target, json.dumps({"v": 2}))
    assert json.loads(target.read_text()) == {"v": 2}
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]  # no temp file left behind


def test_readers_do_not_block_a_writer(tmp_path):
    """WAL: ``fleetdiag history`` reading during a sweep must not make the sweep fail."""
    db = tmp_path / "h.db"
    with Store(db) as st:
        st.record_sweep([failed("a", "fpA")], started=T0)
    reader = Store(db, readonly=True)
    reader.db.execute("BEGIN")
    assert reader.db.execute("SELECT count(*) FROM incidents").fetchone() == (1,)
    try:
        t = time.monotonic()
        with Store(db, timeout=1) as st:
            st.record_sweep([healthy("a")], started=T0 + 60)
        assert time.monotonic() - t < 1
    finally:
        reader.db.execute("COMMIT")
        reader.close()


def test_history_selection_uses_the_inventory_rules_over_stored_names(tmp_path):
    """Hosts no longer in any inventory: ``,`` ``!`` ``&``, globs and ranges select as in ``probe``."""
    import json as _json

    from click.testing import CliRunner

    from fleetdiag.cli import main

    db = tmp_path / "h.db"
    with Store(db) as st:
        st.record_sweep([failed("gpu01", "fpA"), failed("gpu02", "fpA"), failed("cpu01", "fpB")], started=T0)

    def names(*sel: str) -> list[str]:
        res = CliRunner().invoke(main, ["-i", str(tmp_path / "none.yaml"), "history", *sel, "--db", str(db), "--json"])
        assert res.exit_code == 0, res.output
        return sorted(i["host"] for i in _json.loads(res.stdout)["incidents"])

    assert names("gpu*,&gpu02") == ["gpu02"]
    assert names("gpu[01-02],cpu01", "&*01") == ["cpu01", "gpu01"]
    assert names("all,!gpu*") == ["cpu01"]
    res = CliRunner().invoke(main, ["-i", str(tmp_path / "none.yaml"), "history", "gpu09", "--db", str(db)])
    assert res.exit_code == 2 and "gpu09" in res.stderr


@pytest.mark.parametrize("dangling", [False, True])
def test_sweep_lock_refuses_a_symlink_and_never_writes_through_it(tmp_path, dangling):
    target = tmp_path / "target"
    if not dangling:
        target.write_text("keep me\n")
    lock = tmp_path / "h.db.lock"
    lock.symlink_to(target)
    with pytest.raises(StoreError) as e:
        SweepLock(lock).acquire()
    assert e.value.kind == "unsafe" and "symbolic link" in str(e.value)
    assert (target.read_text() == "keep me\n") if not dangling else not target.exists()


def test_report_and_history_files_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        rep = write_atomic(tmp_path / "new" / "r.json", "{}\n")
        Store(tmp_path / "db" / "h.db").close()
    finally:
        os.umask(old)
    assert oct(os.stat(rep).st_mode & 0o777) == "0o600" and oct(os.stat(rep.parent).st_mode & 0o777) == "0o700"
    assert oct(os.stat(tmp_path / "db" / "h.db").st_mode & 0o777) == "0o600"
