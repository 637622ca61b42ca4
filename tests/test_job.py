"""Job-level root cause over the real multi-node logs (no SSH: the analysis and the job logic)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fleetdiag.analysis import analyze_text
from fleetdiag.job import (
    HostEvidence,
    clock_offset,
    evidence_from_result,
    normalise,
    root_causes,
    summary_line,
)
from fleetdiag.job.rules import load_job_rules
from fleetdiag.records import HostResult

SHARED = Path(__file__).resolve().parents[1].parent.parent / "shared"
if not (SHARED / "corpus").is_dir():
    SHARED = Path("/work/shared")
MULTI = SHARED / "corpus" / "multinode"
HANG = SHARED / "fixtures" / "hang"
CASES = sorted(p.stem for p in MULTI.glob("*.json"))
BENCH_JOB_SCALE = Path(__file__).resolve().parents[1] / "bench" / "job_scale.py"
MTIME = datetime(2026, 11, 30, 18, 0, tzinfo=timezone.utc).timestamp()


def host(
    name: str,
    text: str,
    *,
    offset: float = 0.0,
    facts: dict | None = None,
    address: str | None = None,
    zone: str = "UTC",
) -> HostEvidence:
    d = analyze_text(text)
    assert d.decisive is not None, name
    hr = HostResult(host=name, verdict=d.verdict, decisive=d.decisive, facts=facts or {}, address=address)
    ev = evidence_from_result(hr, lines=text.splitlines(), offset=offset, mtime=MTIME, zone=zone)
    assert ev is not None
    return ev


def shift(text: str, seconds: float) -> str:
    """The log as written by a host whose clock is ``seconds`` ahead."""

    def iso(m: re.Match[str]) -> str:
        t = datetime.strptime(m.group(0)[:19].replace("_", " "), "%Y-%m-%d %H:%M:%S") + timedelta(seconds=seconds)
        return t.strftime("%Y-%m-%d" + m.group(0)[10] + "%H:%M:%S") + m.group(0)[19:]

    def md(m: re.Match[str]) -> str:
        t = datetime(2026, int(m.group(1)), int(m.group(2)), *map(int, m.group(3, 4, 5))) + timedelta(seconds=seconds)
        return t.strftime("%m-%d %H:%M:%S")

    def glog(m: re.Match[str]) -> str:
        t = datetime(2026, int(m.group(2)), int(m.group(3)), *map(int, m.group(4, 5, 6))) + timedelta(seconds=seconds)
        return m.group(1) + t.strftime("%m%d %H:%M:%S")

    text = re.sub(r"\d{4}-\d\d-\d\d[ _]\d\d:\d\d:\d\d", iso, text)
    text = re.sub(r"(?<![\d-])(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)", md, text)
    return re.sub(r"([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)", glog, text)


def case_hosts(case: str, order: list[str], **kw: dict) -> list[HostEvidence]:
    return [host(n, (MULTI / f"{case}.{n}.log").read_text(), **kw.get(n, {})) for n in order]


def check(case: str, rcs: list) -> None:
    label = json.loads((MULTI / f"{case}.json").read_text())
    assert len(rcs) == 1, rcs
    rc = rcs[0]
    assert rc.host == label["root_host"]
    assert rc.rank == label["root_rank"]
    assert any(s in rc.line for s in label["root_line_any"])
    assert sorted(rc.affected) == sorted(label["victims"])
    assert rc.why


@pytest.mark.parametrize("order", [["node0", "node1"], ["node1", "node0"]])
@pytest.mark.parametrize("case", CASES)
def test_corpus_names_root_host_and_rank(case: str, order: list[str]) -> None:
    assert CASES, "no multinode corpus"
    check(case, root_causes(case_hosts(case, order)))


def test_m1_victim_stamped_earlier_is_demoted() -> None:
    rc = root_causes(case_hosts("m1_exc", ["node0", "node1"]))[0]
    ((victim, kind, delta),) = rc.consequences
    assert (
        victim == "node0" and kind == "peer closed the connection"
    )  # NCCL's own WARN line, before torch's relay of it
    assert delta is not None and delta < 0  # stamped before the root: only its peer-caused kind demotes it
    line = summary_line(rc)
    assert line.startswith("job root cause: node1 · rank 1 · RuntimeError: mat1 and mat2 shapes")
    assert "1 other host failed as a consequence: node0 (peer closed the connection, stamped 0.8 s earlier)" in line
    assert set(rc.to_json()) == {"host", "rank", "line", "time", "fingerprint", "affected", "why", "formed", "evidence"}
    assert rc.to_json()["time"].startswith("2026-11-30T16:46:04")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("order", [["node0", "node1"], ["node1", "node0"]])
def test_clock_skew_30s_each_way(case: str, order: list[str]) -> None:
    texts = {n: (MULTI / f"{case}.{n}.log").read_text() for n in order}
    skew = {"node1": 30.0, "node0": -30.0}
    hosts = [host(n, shift(texts[n], skew[n]), offset=-skew[n]) for n in order]
    check(case, root_causes(hosts))
    plain = root_causes(case_hosts(case, order))[0]
    assert root_causes(hosts)[0].time == plain.time  # corrected back onto one clock


LOCAL_A = (
    "INFO 11-30 10:00:00 [t.py:1] [rank0] start rank 0/2\n[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "t.py", line 3, in <module>\n[rank0]: ValueError: bad batch on rank 0\n'
    "E1130 {t} 11 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 1) local_rank: 0 (pid: 2) of binary: python\n"
)
LOCAL_B = LOCAL_A.replace("rank0", "rank1").replace("rank 0", "rank 1").replace("local_rank: 0", "local_rank: 0")


def test_clock_skew_decides_between_two_local_errors() -> None:
    facts = {"serving": {"cmdline": "torchrun --nnodes 2 --master_addr 10.0.0.7 --master_port 29500 t.py"}}
    # A really failed first (10:00:05 true time) but its clock is 30 s behind; B failed at 10:00:20, clock right.
    a = host("gpuA", LOCAL_A.format(t="09:59:35.000000"), offset=30.0, facts=facts)
    b = host("gpuB", LOCAL_B.format(t="10:00:20.000000"), offset=0.0, facts=facts)
    for hosts in ([a, b], [b, a]):
        (rc,) = root_causes(hosts)
        assert rc.host == "gpuA" and rc.rank == 0 and rc.affected == ["gpuB"]
    # uncorrected, B's clock would not matter but A's raw stamp would still be earlier: flip the skew to prove it
    a2 = host("gpuA", LOCAL_A.format(t="10:00:35.000000"), offset=-30.0, facts=facts)
    (rc,) = root_causes([b, a2])
    assert rc.host == "gpuA"


def test_two_independent_jobs_by_endpoint() -> None:
    f1 = {"serving": {"cmdline": "torchrun --nnodes 2 --master_addr 10.0.0.1 --master_port 29500 train.py"}}
    f2 = {"serving": {"cmdline": "torchrun --nnodes 2 --master_addr 10.0.0.2 --master_port 29500 train.py"}}
    hosts = case_hosts("m1_exc", ["node0", "node1"], node0={"facts": f1}, node1={"facts": f1})
    hosts += [host("b" + n, (MULTI / f"m2_oom.{n}.log").read_text(), facts=f2) for n in ("node0", "node1")]
    rcs = root_causes(hosts)
    assert [(r.host, r.rank, r.affected) for r in rcs] == [("node1", 1, ["node0"]), ("bnode1", 1, ["bnode0"])]


def test_two_independent_jobs_by_time_window() -> None:
    hosts = case_hosts("m1_exc", ["node0", "node1"])
    hosts += [host("b" + n, (MULTI / f"m2_oom.{n}.log").read_text(), offset=3600.0) for n in ("node0", "node1")]
    rcs = root_causes(hosts)
    assert sorted((r.host, tuple(r.affected)) for r in rcs) == [("bnode1", ("bnode0",)), ("node1", ("node0",))]


def test_single_failed_host_makes_no_claim() -> None:
    assert root_causes(case_hosts("m1_exc", ["node1"])) == []
    assert root_causes(case_hosts("m2_oom", ["node0"])) == []
    assert root_causes([]) == []


def test_two_unrelated_local_failures_are_not_a_job() -> None:
    a = host("gpuA", LOCAL_A.format(t="10:00:05.000000"))
    b = host("gpuB", LOCAL_B.format(t="10:00:06.000000"))
    assert root_causes([a, b]) == []


WATCHDOG = (
    "[rank0]:[E1130 18:12:38.500000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=120000) ran for 120004 milliseconds before timing out.\n"
    "[rank0]:[E1130 18:12:38.500200000 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by "
    "watchdog at work sequence id: 9 PG status: last enqueued work: 9, last completed work: 8\n"
    "[rank0]:[E1130 18:12:38.500300000 ProcessGroupNCCL.cpp:750] [Rank 0] Some NCCL operations have failed or timed out. "
    "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
)


def hang_hosts(order: list[str]) -> list[HostEvidence]:
    """The real hang, had the 120 s NCCL timeout fired before the external SIGTERM (node0's watchdog names SeqNum 9)."""
    n0 = (HANG / "node0.log").read_text()
    n0 = shift(n0, 0).replace("W1130 18:12:05.648000 583", WATCHDOG + "W1130 18:12:40.648000 583", 1)
    n1 = (HANG / "node1.log").read_text().replace("18:12:05.6", "18:12:40.6")
    texts = {"node0": n0, "node1": n1}
    return [host(n, texts[n]) for n in order]


@pytest.mark.parametrize("order", [["node0", "node1"], ["node1", "node0"]])
def test_hang_straggler_named_from_others_watchdog(order: list[str]) -> None:
    (rc,) = root_causes(hang_hosts(order))
    assert rc.host == "node1" and rc.rank == 1
    assert rc.affected == ["node0"]
    assert "SeqNum=9" in rc.why and "never reached" in rc.why


def test_fresh_hang_without_watchdog_makes_no_claim() -> None:
    hosts = [host(n, (HANG / f"{n}.log").read_text()) for n in ("node0", "node1")]
    assert root_causes(hosts) == []  # both only show the agent's SIGTERM: nothing names a root


def test_launcher_sigkill_names_the_rank() -> None:
    victim = (MULTI / "m1_exc.node0.log").read_text()
    killed = (
        "INFO 11-30 16:45:55 [train.py:18] [rank1] starting rank 1/2 local_rank 0 visible=1\n"
        "E1130 16:46:04.100000 586 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: -9) "
        "local_rank: 0 (pid: 667) of binary: /workspace/venv/bin/python\n"
    )
    (rc,) = root_causes([host("node0", victim), host("node1", killed)])
    assert rc.host == "node1" and rc.affected == ["node0"]
    assert "exitcode: -9" in rc.line


def test_victim_naming_the_root_by_address() -> None:
    v = (
        "[rank0]:[E1130 10:00:01.000000000 ProcessGroupNCCL.cpp:612] [Rank 0] NCCL error: remote process exited or "
        "there was a network error\nLast error:\nsocketProgress: Connection closed by remote peer 10.1.1.2<55296>\n"
    )
    w = v.replace("[rank0]", "[rank2]").replace("Rank 0", "Rank 2").replace("10.1.1.2", "10.1.1.3")
    hosts = [host("a", v, address="10.1.1.1"), host("b", w, address="10.1.1.2"), host("c", v, address="10.1.1.3")]
    # all three peer-caused, each naming a peer: b is named by a and c, c by b only, a by nobody
    (rc,) = root_causes(hosts)
    assert rc.host == "b" and rc.affected == ["a", "c"] and "names b" in rc.why


def test_consequence_delay_reads_in_words() -> None:
    """No bare sign for the operator: later, earlier (only stamped so), or the same time."""
    from fleetdiag.job import consequence_text

    assert consequence_text("node0", "collective timeout", 30.04) == "node0 (collective timeout, 30.0 s later)"
    assert consequence_text("node0", "NCCL remote error", -0.4) == "node0 (NCCL remote error, stamped 0.4 s earlier)"
    assert consequence_text("node0", "k", 0.01) == "node0 (k, at the same time)"
    assert consequence_text("node0", "k", None) == "node0 (k)"


def test_user_rules_extend_peer_kinds(tmp_path: Path) -> None:
    text = (
        "INFO 11-30 10:00:00 [t.py:1] [rank0] start rank 0/2\n[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "t.py", line 3, in <module>\n[rank0]: MyBusError: partner vanished\n'
    )
    a = host("gpuA", text)
    b = host("gpuB", LOCAL_B.format(t="10:00:02.000000"))
    assert root_causes([a, b]) == []  # two local-origin errors, no facts: not linked
    extra = tmp_path / "peer.yaml"
    extra.write_text("peer_caused:\n  - {kind: my bus lost, pattern: 'MyBusError'}\n")
    rules = load_job_rules([extra], user_default=False)
    (rc,) = root_causes([a, b], rules=rules)
    assert rc.host == "gpuB" and rc.consequences[0][1] == "my bus lost"
    bad = tmp_path / "bad.yaml"
    bad.write_text("peer_cause: []\n")
    with pytest.raises(ValueError, match="unknown section"):
        load_job_rules([bad], user_default=False)


def test_default_rules_follow_an_edit_of_the_users_peer_file(tmp_path: Path, monkeypatch) -> None:
    """A long ``watch`` reads the user's peer.yaml again once it changes, and a broken edit falls back."""
    from fleetdiag.job.rules import default_job_rules

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    kinds = lambda: [r.key for r in default_job_rules().peer_caused]  # noqa: E731
    assert "my bus lost" not in kinds()
    peer = tmp_path / "fleetdiag" / "peer.yaml"
    peer.parent.mkdir()
    peer.write_text("peer_caused:\n  - {kind: my bus lost, pattern: 'MyBusError'}\n")
    assert "my bus lost" in kinds()
    peer.write_text("peer_caused:\n  - {kind: my link lost, pattern: 'MyLinkError'}\n")
    os.utime(peer, ns=(peer.stat().st_atime_ns, peer.stat().st_mtime_ns + 1_000_000_000))
    assert "my link lost" in kinds() and "my bus lost" not in kinds()
    peer.write_text("peer_cause: []\n")  # an unknown section: the shipped rules alone
    os.utime(peer, ns=(peer.stat().st_atime_ns, peer.stat().st_mtime_ns + 2_000_000_000))
    assert kinds() and "my link lost" not in kinds()


@pytest.mark.parametrize(
    "raw,zone,expect",
    [
        ("2024-11-20 14:37:16", "UTC", "2024-11-20T14:37:16"),
        ("2024-11-20T14:37:16.5+02:00", "UTC", "2024-11-20T12:37:16.5"),
        ("2026-11-30_16:46:05", "UTC", "2026-11-30T16:46:05"),
        ("1120 14:37:16.123", "UTC", "2026-11-20T14:37:16.123"),
        ("[rank0]:[W1120 14:37:16.829017590 ProcessGroupNCCL.cpp:1]", "UTC", "2026-11-20T14:37:16.829017"),
        ("626 06:24:44.9", "UTC", "2026-06-26T06:24:44.9"),
        ("INFO 11-20 14:37:16 [x.py:1] hi", "UTC", "2026-11-20T14:37:16"),
        ("11-20 14:37:16", "+01:00", "2026-11-20T13:37:16"),
        ("11-20 14:37:16", "Europe/Berlin", "2026-11-20T13:37:16"),
        ("11-20 14:37:16", 3600, "2026-11-20T13:37:16"),
    ],
)
def test_normalise_formats(raw: str, zone: object, expect: str) -> None:
    want = datetime.fromisoformat(expect).replace(tzinfo=timezone.utc).timestamp()
    assert normalise(raw, zone, MTIME, 0.0) == pytest.approx(want, abs=1e-3)


def test_normalise_year_nearest_mtime_and_offset() -> None:
    jan = datetime(2027, 1, 2, tzinfo=timezone.utc).timestamp()
    got = normalise("12-31 23:59:00", "UTC", jan, 0.0)
    assert got == datetime(2026, 12, 31, 23, 59, tzinfo=timezone.utc).timestamp()
    assert normalise("12-31 23:59:00", "UTC", jan, 5.0) == got + 5.0
    assert normalise("no time here", "UTC", jan, 0.0) is None
    assert normalise(None) is None
    assert clock_offset(100.0, 0.2, 69.9) == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("line", "ranks", "world"),
    [
        ("[rank3]: Watchdog caught collective operation timeout", {3}, None),
        ("INFO rank 5/16 ready", {5}, 16),
        ("initialized rank 2 in world size 8", {2}, 8),
        ("[Rank 7] NCCL error", {7}, None),
        ("env WORLD_SIZE=32 MASTER_PORT=29500", set(), 32),
        ("torchrun --nnodes=4 --nproc-per-node=8 serve.py", set(), None),  # nodes, not ranks
        ("INFO 10-22 12:00:01 throughput 12.3 tokens/s", set(), None),
    ],
)
def test_ranks_of_each_form(line, ranks, world):
    """ranks_of skips lines without its words before the regexes: every form it reads still counts."""
    from fleetdiag.job import HostEvidence, ranks_of

    assert ranks_of(HostEvidence(host="h", line="", lines=[line])) == (ranks, world)


def _job_scale():
    spec = importlib.util.spec_from_file_location("fleetdiag_bench_job_scale", BENCH_JOB_SCALE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_root_causes_time_is_linear_in_the_fleet():
    """4x the failed hosts costs < 5x the time, in every fleet shape of bench/job_scale.py (the pairwise
    membership tests made it quadratic: 16x); measured in one run, in CPU seconds, the best of two each."""
    bench = _job_scale()
    for shape in bench.SHAPES:
        small, big, rcs = float("inf"), float("inf"), []
        for _ in range(2):  # interleaved, the best of each: CPU time, and a load that changes between runs
            small = min(small, bench.timed(250, shape)[0])
            t, rcs = bench.timed(1000, shape)
            big = min(big, t)
        assert big < 5 * small + 0.05, (shape, small, big)
        roots = 1 if shape in ("one-job", "no-endpoint") else 1000 // bench.JOB
        assert len(rcs) == roots, shape
        assert all("CUDA error" in rc.line and len(rc.affected) == 1000 // roots - 1 for rc in rcs), shape


def test_a_peer_named_by_its_ipv6_address_is_found_in_an_indexed_fleet():
    """A name that is not one word (an IPv6 address) is still found in another host's error text, among many."""
    from fleetdiag.job.membership import _Host, _index_names

    def ev(name: str, address: str, line: str) -> HostEvidence:
        return HostEvidence(host=name, line=line, message=line, address=address)

    peer = "[rank1]: RuntimeError: Connection closed by peer [fd00::7]:29500"
    hosts = [_Host(ev("gpu-a1", "fd00::7", "RuntimeError: CUDA error"), "", None, "", set())]
    hosts += [_Host(ev(f"gpu-b{k}", f"fd00::{k + 100:x}", peer), "peer", None, "", set()) for k in range(300)]
    for h in hosts:
        h.keys = {h.ev.host, h.ev.address}
    _index_names(hosts)
    assert all(h.names(hosts[0]) for h in hosts[1:])
    assert not any(h.names(o) for h in hosts for o in hosts[1:] if o is not h)
