"""What a sweep's parent holds per host after the probe (#27: 5,000 hosts in ≤ 500 MB).

At 5,000 hosts the parent held ~50 KB a host at its peak against ~9 KB a result: the outcome's repr
at ``asyncio.run``'s end (Python 3.11/3.12), the report as one string, a visible copy of every result
to print the news, and every new incident's record parsed back from the history. These tests fail on
any of them coming back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import tracemalloc
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.cli import main, run_async
from fleetdiag.cli.sweep import print_outcome
from fleetdiag.records import HostResult
from fleetdiag.render import Output

from .conftest import inventory_file
from .test_fleet import DP_RANK, HEALTHY_LOG, log, ssh_args


class Counted:
    reprs = 0

    def __repr__(self) -> str:
        Counted.reprs += 1
        return "Counted()"


def test_run_async_hands_back_the_result_without_its_repr():
    async def make() -> Counted:
        await asyncio.sleep(0)
        return Counted()

    Counted.reprs = 0
    got = run_async(make())
    assert isinstance(got, Counted) and Counted.reprs == 0

    # the exception of a failing coroutine still reaches the caller
    async def fail() -> None:
        raise ValueError("boom")

    try:
        run_async(fail())
    except ValueError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("run_async swallowed the exception")


def _sweep(inv: Path, tmp: Path, sshd, *extra: str):
    args = ["--db", str(tmp / "h.db"), "--report", str(tmp / "r.json"), "--workers", "1", *ssh_args(sshd)]
    return CliRunner().invoke(main, ["-i", str(inv), "sweep", "all", *args, *extra])


def test_sweep_over_sshd_never_reprs_a_result_and_a_resolved_incident_keeps_its_record(sshd, tmp_path, monkeypatch):
    """Through the CLI over real sshd: no result is ever repr'd (the end of ``asyncio.run`` did it to the
    whole outcome), the news is one line for the hosts that share a trouble, and an incident that
    resolves still has the record that showed it (open incidents are read without theirs)."""
    calls = []
    monkeypatch.setattr(HostResult, "__repr__", lambda self: calls.append(self.host) or f"HostResult({self.host})")
    bad = log(tmp_path, "bad", DP_RANK)
    hosts = {f"gpu{i:02d}": {"log": bad} for i in range(1, 7)}
    inv = inventory_file(tmp_path / "inventory.yaml", hosts, sshd)
    res = _sweep(inv, tmp_path, sshd)
    assert res.exit_code == 1, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("NEW") and "gpu[01-06]" in lines[0], res.stdout
    assert "6 hosts: 6 failed" in res.stdout
    report = {h["host"]: h for h in json.loads((tmp_path / "r.json").read_text())["hosts"]}
    # gpu01's log is healthy now: its incident resolves, with the record that showed it
    hosts["gpu01"] = {"log": log(tmp_path, "good", HEALTHY_LOG)}
    inv = inventory_file(tmp_path / "inventory.yaml", hosts, sshd)
    res = _sweep(inv, tmp_path, sshd, "--json")
    changes = json.loads(res.stdout)["changes"]
    assert not changes["new"] and not changes["changed"]
    (gone,) = changes["resolved"]
    rec = gone["incident"]["record"]
    assert gone["host"] == "gpu01" and rec["host"] == "gpu01"
    assert rec["decisive"]["line"] == report["gpu01"]["decisive"]["line"] and rec["facts"] == report["gpu01"]["facts"]
    assert calls == []


def test_the_news_of_many_hosts_costs_little_beyond_their_results(tmp_path, monkeypatch):
    """A first sweep of 200 hosts with the same real failure: recording it, printing the news and
    running it all through ``run_async`` hold little more than the results (the old path: a visible copy
    of the outcome, every record parsed back, the outcome's repr at the end)."""
    from fleetdiag.analysis import analyze_text
    from fleetdiag.store import Store
    from fleetdiag.sweep import SweepJob, execute

    diag = analyze_text(DP_RANK)
    assert diag.decisive is not None
    n = 200
    results = [
        HostResult(host=f"gpu{i:04d}", verdict=str(diag.verdict), decisive=dataclasses.replace(diag.decisive))
        for i in range(n)
    ]

    async def replay(*_a, **_k):  # the probe's results as they would arrive; what follows is the real sweep
        for r in results:
            yield r

    monkeypatch.setattr("fleetdiag.sweep.probe_fleet", replay)

    class H:
        def __init__(self, name: str) -> None:
            self.name = name

        def log_path(self, _log):
            return ("file", "/var/log/x.log")

    job = SweepJob(
        hosts=[H(r.host) for r in results],
        settings=None,  # type: ignore[arg-type]
        selector="all",
        db=tmp_path / "h.db",
        report=tmp_path / "r.json",
        deadline=None,
    )
    Store(job.db).close()  # the schema made outside the measured part
    out_text = io.StringIO()
    env = Output(stdout=out_text)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        out = run_async(execute(job))
        held, _ = tracemalloc.get_traced_memory()
        print_outcome(env, out, None, job)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(json.loads((tmp_path / "r.json").read_text())["hosts"]) == n
    assert out.changes is not None and len(out.changes.new) == n
    # each new incident's record is the host's own JSON, as the history stored it
    stored = json.loads(json.dumps(results[7].to_json()))
    assert json.loads(json.dumps(out.changes.new[7].incident.record)) == stored
    assert out_text.getvalue().startswith("NEW") and f"{n} hosts: {n} failed" in out_text.getvalue()
    per_host_held = (held - base) / n
    per_host_peak = (peak - base) / n
    # measured: 3.6 KB held a host; the old path 9.5 KB. The peak, 13 KB a host, is now the job
    # analysis's name index (job.membership, transient); the old path peaked at 24 KB without it
    assert per_host_held < 6_000, per_host_held
    assert per_host_peak < 20_000, per_host_peak
