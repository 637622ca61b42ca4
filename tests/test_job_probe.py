"""The job-level root cause wired into the product: probe, sweep and history, through a real sshd.

Each node's log of ``corpus/multinode`` lies on its own inventory host (two
host entries to the same sshd with different log paths); the remote clock
comes from the funnel's own ``date`` (a stand-in ``date`` on the node's PATH
plays a host whose clock is off).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import analyze_text
from fleetdiag.cli import main
from fleetdiag.job import clock_sample, evidence_from_result, keep_lines, root_causes
from fleetdiag.probe import add_job_facts
from fleetdiag.records import FunnelResult, HostResult, JobFacts, Line, Timing, report_json
from fleetdiag.remote.funnel import FunnelSpec
from fleetdiag.store import Store

from .cli_env import cli_env
from .slack import slack
from .test_job import CASES, HANG, MULTI, hang_hosts, shift

assert FunnelSpec  # the funnel module loads (the clock snippet is a shipped file)


def label(case: str) -> dict:
    return json.loads((MULTI / f"{case}.json").read_text())


def job_inventory(write_inventory, tmp_path: Path, hosts: dict[str, str], sub: str = "") -> Path:
    """hosts: name -> log text; each host is the session sshd with its own log file (under ``sub``)."""
    logs = {}
    for name, text in hosts.items():
        log = tmp_path / sub / name / "train.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
        logs[name] = log
    return write_inventory(logs, name=f"{sub}/inventory.yaml" if sub else "inventory.yaml")


def cli(sshd, inv: Path, *args: str):
    return CliRunner().invoke(
        main,
        [
            "-i",
            str(inv),
            *args,
            *sshd.cli_args(),
        ],
    )


def corpus(case: str, node: str) -> str:
    return (MULTI / f"{case}.{node}.log").read_text()


def probe_json(sshd, inv: Path, *extra: str) -> dict:
    r = cli(sshd, inv, "probe", "all", "--json", *extra)
    assert r.exit_code == 1, r.output
    return json.loads(r.output)


# --------------------------------------------------------------------------- the corpus through sshd


@pytest.mark.parametrize("swap", [False, True], ids=["node0-first", "node1-first"])
@pytest.mark.parametrize("case", CASES)
def test_probe_json_names_root_host_and_rank(sshd, tmp_path, case, swap, write_inventory):
    assert CASES, "no multinode corpus"
    want = label(case)
    order = ["node1", "node0"] if swap else ["node0", "node1"]
    inv = job_inventory(write_inventory, tmp_path, {n: corpus(case, n) for n in order})
    doc = probe_json(sshd, inv)
    assert [h["host"] for h in doc["hosts"]] == order
    (rc,) = doc["root_causes"]
    assert set(rc) == {"host", "rank", "line", "time", "fingerprint", "affected", "why", "formed", "evidence"}
    assert rc["host"] == want["root_host"] and rc["rank"] == want["root_rank"]
    assert any(s in rc["line"] for s in want["root_line_any"])
    assert rc["affected"] == sorted(want["victims"])
    assert rc["time"].startswith("2026-11-30T16:4")
    hosts = {h["host"]: h for h in doc["hosts"]}
    root = hosts[want["root_host"]]
    assert root["facts"]["job"]["role"] == "root" and root["facts"]["job"]["affected"] == rc["affected"]
    assert root["decisive"]["fingerprint"] == rc["fingerprint"]
    for v in want["victims"]:
        assert hosts[v]["facts"]["job"] == {
            **hosts[v]["facts"]["job"],
            "role": "consequence",
            "root": want["root_host"],
        }
    for h in hosts.values():  # the clock sample every probe now takes, and what the job analysis kept
        clock = h["facts"]["clock"]
        assert abs(clock["measured"]) < 5 and clock["offset"] == 0.0  # this machine's clock against itself
        assert h["facts"]["zone"] and h["facts"]["log_mtime"] > 0
        assert 0 < len(h["facts"]["job"]["lines"]) <= 80


def test_fleet_view_opens_with_the_job_and_folds_the_victim(sshd, tmp_path, write_inventory):
    inv = job_inventory(
        write_inventory, tmp_path, {"node0": corpus("m1_exc", "node0"), "node1": corpus("m1_exc", "node1")}
    )
    r = cli(sshd, inv, "probe", "all")
    assert r.exit_code == 1, r.output
    out = r.output
    job = "job root cause: node1 · rank 1 · RuntimeError: mat1 and mat2 shapes"
    assert out.count(job) == 2, out  # over the root's card, and as the fleet view's opening line
    assert "1 other host failed as a consequence: node0 (peer closed the connection, " in out
    assert "failed as a consequence of node1: node0 (peer closed the connection, stamped 0.8 s earlier)" in out
    assert "consequence of node1 (job root cause)" in out  # the victim's row, folded under the root's
    assert "node1  FAILED" in out and "node0  FAILED" not in out, out  # the victim's card folds under the root
    assert out.index(job) < out.index("node1  FAILED")
    # --redact: the job line too goes through the Output (names replaced, no raw host name)
    r = CliRunner().invoke(
        main,
        [
            "--redact",
            "-i",
            str(inv),
            "probe",
            "all",
            *sshd.cli_args(),
        ],
    )
    assert "job root cause: " in r.output and "node1" not in r.output, r.output


def test_probe_jsonl_ends_with_a_root_cause_summary(sshd, tmp_path, write_inventory):
    inv = job_inventory(
        write_inventory, tmp_path, {"node0": corpus("m2_oom", "node0"), "node1": corpus("m2_oom", "node1")}
    )
    r = cli(sshd, inv, "probe", "all", "--jsonl")
    assert r.exit_code == 1, r.output
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert sorted(x["host"] for x in lines[:-1]) == ["node0", "node1"]
    assert lines[-1]["event"] == "summary"
    (rc,) = lines[-1]["root_causes"]
    assert rc["host"] == "node1" and rc["rank"] == 1 and rc["affected"] == ["node0"]


# --------------------------------------------------------------------------- clocks


def skewed_date(bindir: Path) -> Path:
    """A stand-in ``date`` whose clock is 30 s ahead on the host reading node1's log, 30 s behind on node0's."""
    bindir.mkdir(parents=True, exist_ok=True)
    real = "/bin/date" if os.path.exists("/bin/date") else "/usr/bin/date"
    exe = bindir / "date"
    exe.write_text(
        "#!/bin/sh\n"
        'case "$FD_LOG" in *node1*) d=30 ;; *node0*) d=-30 ;; *) d=0 ;; esac\n'
        f"now=$({real} +%s.%N); s=${{now%.*}}; n=${{now#*.}}\n"
        f'exec {real} -d "@$((s + d)).$n" "$@"\n'
    )
    exe.chmod(0o755)
    return bindir


@pytest.mark.parametrize("case", CASES)
def test_clock_skew_30s_each_way_same_root(sshd, tmp_path, case, write_inventory):
    plain = probe_json(
        sshd,
        job_inventory(write_inventory, tmp_path, sub="plain", hosts={n: corpus(case, n) for n in ("node0", "node1")}),
    )
    skew = {"node1": 30.0, "node0": -30.0}
    order = ["node1", "node0"]  # the host that is ahead first
    inv = job_inventory(
        write_inventory, tmp_path, sub="skew", hosts={n: shift(corpus(case, n), skew[n]) for n in order}
    )
    doc = probe_json(sshd, inv, "--path-prepend", str(skewed_date(tmp_path / "bin")))
    for h in doc["hosts"]:
        assert h["facts"]["clock"]["offset"] == pytest.approx(-skew[h["host"]], abs=2), h["facts"]["clock"]
    (rc,) = doc["root_causes"]
    want = label(case)
    assert (rc["host"], rc["rank"], rc["affected"]) == (want["root_host"], want["root_rank"], sorted(want["victims"]))
    t = datetime.fromisoformat(rc["time"].replace("Z", "+00:00")).timestamp()
    t0 = datetime.fromisoformat(plain["root_causes"][0]["time"].replace("Z", "+00:00")).timestamp()
    assert abs(t - t0) < 2  # corrected back onto the local clock


def test_probe_to_job_step_applies_the_clock_sample():
    """Unit level: a log 30 s ahead and its clock sample 30 s ahead give the same root and time as in sync."""

    def result(name: str, text: str, ahead: float) -> HostResult:
        lines = [Line(i * 100, t, i + 1) for i, t in enumerate(text.splitlines())]
        d = analyze_text(text)
        res = HostResult(host=name, verdict=d.verdict, decisive=d.decisive, timing=Timing(rtt_ms=2.0))
        now = datetime(2026, 11, 30, 18, 0, tzinfo=timezone.utc).timestamp()
        fr = FunnelResult(tail=lines, mtime=now, facts={"remote": {"clock": f"{now + ahead:.3f} +0000"}})
        add_job_facts(res, fr, received=now + 0.001)
        return res

    for case in CASES:
        same = root_causes([result(n, corpus(case, n), 0.0) for n in ("node0", "node1")])
        for node in ("node0", "node1"):
            res = [
                result(n, shift(corpus(case, n), 30.0) if n == node else corpus(case, n), 30.0 if n == node else 0)
                for n in ("node1", "node0")
            ]
            assert res[0].clock.offset in (0.0, -30.0)
            got = root_causes(res)
            assert [r.to_json() for r in got] == [r.to_json() for r in same], (case, node)


def test_clock_sample_deadband_and_busybox_date():
    assert clock_sample("1000.5 +0100", 1000.6, 0.002).to_json() == {
        "local_receive": 1000.6,
        "remote_now": 1000.5,
        "rtt": 0.002,
        "measured": 0.099,
        "offset": 0.0,
        "zone": "+0100",
    }
    s = clock_sample("1000.%N +0000", 1030.0, 0.2)  # busybox date: no %N, whole seconds
    assert s is not None and s.offset == pytest.approx(29.9)
    assert clock_sample("", 1.0, 0.1) is None and clock_sample("garbage", 1.0, 0.1) is None


def test_kept_lines_give_the_same_root_causes_as_every_line():
    """What a probe keeps in facts["job"] (a few lines) answers as the funnel's whole output does."""
    from .test_job import case_hosts

    sets = [case_hosts(c, ["node0", "node1"]) for c in CASES] + [hang_hosts(["node1", "node0"])]
    assert HANG.is_dir()
    for hosts in sets:
        full = root_causes(hosts)
        kept = []
        for h in hosts:
            lines = keep_lines(h)
            assert len(lines) < len(h.lines)
            hr = HostResult(
                host=h.host,
                verdict="failed",
                decisive=analyze_text("\n".join(h.lines)).decisive,
                facts={"job": {"lines": lines}},
            )
            ev = evidence_from_result(hr, mtime=h.mtime, zone=h.zone, offset=h.offset)
            assert ev is not None and ev.lines == lines
            kept.append(ev)
        assert full and [r.to_json() for r in root_causes(kept)] == [r.to_json() for r in full]


# --------------------------------------------------------------------------- membership


def test_two_independent_jobs_two_root_causes(sshd, tmp_path, write_inventory):
    hosts = {
        "a0": corpus("m1_exc", "node0"),
        "a1": corpus("m1_exc", "node1"),
        "b0": shift(corpus("m2_oom", "node0"), 3600),
        "b1": shift(corpus("m2_oom", "node1"), 3600),
    }
    doc = probe_json(sshd, job_inventory(write_inventory, tmp_path, hosts))
    got = sorted((rc["host"], rc["rank"], tuple(rc["affected"])) for rc in doc["root_causes"])
    assert got == [("a1", 1, ("a0",)), ("b1", 1, ("b0",))]


def test_single_failed_host_makes_no_job_claim(sshd, tmp_path, write_inventory):
    healthy = (Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "healthy.log").read_text()
    doc = probe_json(
        sshd, job_inventory(write_inventory, tmp_path, {"node1": corpus("m1_exc", "node1"), "ok": healthy})
    )
    assert doc["root_causes"] == []
    assert "role" not in doc["hosts"][0]["facts"]["job"]
    r = cli(
        sshd,
        job_inventory(write_inventory, tmp_path, sub="one", hosts={"node1": corpus("m1_exc", "node1")}),
        "probe",
        "all",
    )
    assert "job root cause" not in r.output and "node1  FAILED" in r.output


def test_report_json_shape_without_failures():
    doc = report_json([HostResult(host="a", verdict="healthy")], sweep={"selector": "all"})
    assert list(doc) == ["version", "sweep", "hosts", "root_causes"] and doc["root_causes"] == []


# --------------------------------------------------------------------------- sweep and history


def test_sweep_report_and_history_keep_one_incident_for_the_job(sshd, tmp_path, write_inventory):
    inv = job_inventory(
        write_inventory, tmp_path, {"node0": corpus("m1_exc", "node0"), "node1": corpus("m1_exc", "node1")}
    )
    db, report = tmp_path / "h.db", tmp_path / "report.json"
    r = cli(sshd, inv, "sweep", "all", "--db", str(db), "--report", str(report))
    assert r.exit_code == 1, r.output
    flat = " ".join(r.output.split())  # the news says which incident is the job's
    assert "job root cause (rank 1); 1 other host(s) failed as a consequence: node0" in flat, r.output
    assert "a consequence of node1 (job root cause)" in flat
    doc = json.loads(report.read_text())
    assert list(doc)[:2] == ["version", "sweep"]
    (rc,) = doc["root_causes"]
    assert (rc["host"], rc["rank"], rc["affected"]) == ("node1", 1, ["node0"])
    with Store(db, readonly=True) as store:
        inc = {i.host: i for i in store.incidents()}
    assert inc["node1"].job["role"] == "root" and inc["node1"].job["affected"] == ["node0"]
    assert inc["node1"].job["rank"] == 1 and inc["node1"].fingerprint == rc["fingerprint"]
    assert inc["node0"].job == {"role": "consequence", "root": "node1"}
    h = CliRunner().invoke(main, ["-i", str(inv), "history", "--db", str(db), "--json"])
    jobs = {i["host"]: i["job"] for i in json.loads(h.output)["incidents"]}
    assert jobs == {"node1": inc["node1"].job, "node0": {"role": "consequence", "root": "node1"}}
    con = sqlite3.connect(db)
    try:
        assert con.execute("select count(*) from incidents").fetchone()[0] == 2
    finally:
        con.close()


# --------------------------------------------------------------------------- watch


def test_watch_names_the_job_root_as_the_evidence_arrives(sshd, tmp_path, write_inventory, rt):
    inv = job_inventory(
        write_inventory, tmp_path, {"node0": corpus("m1_exc", "node0"), "node1": corpus("m1_exc", "node1")}
    )
    code, out = watch_until(sshd, rt, inv, '"event": "root_cause"', "--jsonl")
    assert code == 1, out
    events = [json.loads(x) for x in out.splitlines()]
    told = [e for e in events if e["event"] == "root_cause"]
    assert len(told) == 1 and told[0]["host"] == "node1" and told[0]["rank"] == 1 and told[0]["affected"] == ["node0"]
    failed = [e["host"] for e in events if e["event"] == "state" and e["state"] == "failed"]
    assert sorted(failed) == ["node0", "node1"]
    assert events.index(told[0]) > max(i for i, e in enumerate(events) if e["event"] == "state")  # once both failed
    summary = events[-1]
    assert summary["event"] == "summary"
    (rc,) = summary["root_causes"]
    assert (rc["host"], rc["rank"], rc["affected"]) == ("node1", 1, ["node0"])


def test_a_job_of_many_hosts_is_named_in_reasonable_time():
    """300 hosts of one job (one root, 299 NCCL victims): every pair is compared, by set lookups, not regex passes."""
    import time

    texts = {n: corpus("m1_exc", n) for n in ("node0", "node1")}
    results = []
    for i in range(300):  # each victim its own rank of a world of 300 (one rank twice would be two jobs)
        n = "node1" if i == 137 else "node0"
        t = texts[n]
        if i == 137:
            t = (
                t.replace("rank 1/2", "rank 137/300")
                .replace("[rank1]", "[rank137]")
                .replace("rank      : 1 (", "rank      : 137 (")
            )
        if i != 137:
            t = t.replace("[rank0]", f"[rank{i}]").replace("Rank 0]", f"Rank {i}]").replace("rank 0/2", f"rank {i}/300")
            t = t.replace("rank      : 0 (", f"rank      : {i} (")
        hr = HostResult(host=f"gpu{i:03d}", verdict="failed", decisive=analyze_text(t).decisive)
        hr.job = JobFacts(lines=keep_lines(evidence_from_result(hr, lines=t.splitlines())))
        results.append(hr)
    t0 = time.perf_counter()
    (rc,) = root_causes(results)
    took = time.perf_counter() - t0
    assert rc.host == "gpu137" and rc.rank == 137 and len(rc.affected) == 299
    assert rc.formed.endswith("ranks 0–299 of 300"), rc.formed
    assert took < 20, took  # about 0.2 s here; the cubic version took minutes


def test_watch_table_view_prints_the_job_line_once(sshd, tmp_path, write_inventory, rt):
    """The job line is printed when the second host fails, and not again by a later event or the summary."""
    inv = job_inventory(
        write_inventory, tmp_path, {"node1": corpus("m2_oom", "node1"), "node0": corpus("m2_oom", "node0")}
    )
    job = "job root cause: node1 · rank 1 · torch.OutOfMemoryError: CUDA out of memory"
    code, out = watch_until(sshd, rt, inv, job)
    assert code == 1 and "watch interrupted: 2 failed" in out, out
    assert out.count(job) == 1, out


def watch_until(sshd, rt: Path, inv: Path, text: str, *extra: str) -> tuple[int, str]:
    """``watch all`` in its own process until ``text`` is printed, then two heartbeats more (a later event
    must not undo or repeat it), then SIGTERM: it ends with its summary, as at --duration's end. A fixed
    --duration of 3-4 s ended it before the second host's snapshot at load 25-40."""
    argv = [sys.executable, "-c", "from fleetdiag.cli import main; main()", "-i", str(inv), "watch", "all", *extra]
    argv += ["--duration", "10m", "--grace", "0", "--no-facts", "--heartbeat", "0.5s", *sshd.cli_args()]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(rt))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 60 * slack()
    try:
        while not any(text in ln for ln in lines) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        reader.join(10)
    return code, "".join(lines)


# --------------------------------------------------------------------------- the rendezvous from the log's head

DEVICE = Path(__file__).resolve().parent / "fixtures" / "device"


def launched(node: str, addr: str, steps: int = 1500) -> str:
    """A real recorded node log (tests/fixtures/device/job) as a launch script writes it: its torchrun
    command first (``set -x``), then enough training chatter that the end-of-log passes do not reach it."""
    rank = node[-1]
    cmd = f"+ torchrun --nnodes 2 --node_rank {rank} --nproc_per_node 1 --master_addr {addr} --master_port 29500 fail.py\n"
    chatter = "".join(f"rank {rank}: step {i} loss 0.{i % 97:02d}31 lr 3.0e-4 tokens/s 81234\n" for i in range(steps))
    return cmd + chatter + (DEVICE / "job" / f"{node}.log").read_text()


def test_funnel_head_pass_brings_back_the_endpoint(tmp_path):
    """The head pass through GNU tools, dash and a busybox-only PATH: the command line from the start of
    the run, at most ``head_lines`` lines, nothing past ``head_bytes``; without it the passes miss it."""
    import shutil
    import subprocess

    from fleetdiag.analysis import load_rules
    from fleetdiag.job import endpoint_ere
    from fleetdiag.probe import spec_for
    from fleetdiag.remote import funnel

    text = launched("node0", "10.4.0.1")
    log = tmp_path / "train.log"
    log.write_text(text)
    spec = spec_for(str(log), load_rules(user_default=False))
    assert spec.endpoints == endpoint_ere() and spec.endpoints
    box = tmp_path / "bb"
    box.mkdir()
    bb = shutil.which("busybox")
    assert bb, "busybox is installed on the test machine"
    for a in subprocess.run([bb, "--list"], capture_output=True, text=True, check=True).stdout.split():
        (box / a).symlink_to(bb)
    shells = [
        (["sh", "-c"], dict(os.environ)),
        (["dash", "-c"], dict(os.environ)),
        ([str(box / "sh"), "-c"], {"PATH": str(box)}),
    ]
    want = text.splitlines()[0]
    for argv, env in shells:
        mark = funnel.new_mark()
        out = subprocess.run(
            [*argv, funnel.build_script(spec, mark)], capture_output=True, env=env, timeout=120, check=False
        ).stdout.decode()
        fr = funnel.parse_output(out, mark)
        texts = [ln.text for ln in fr.lines()]
        assert want in texts, (argv, fr.markers)
        assert next(ln for ln in fr.lines() if ln.text == want).pos == 0
        assert not any("rejected the endpoint" in m for m in fr.markers)
    off = funnel.parse_output(
        subprocess.run(
            ["sh", "-c", funnel.build_script(dataclasses.replace(spec, endpoints=""), mark := funnel.new_mark())],
            capture_output=True,
            timeout=120,
            check=False,
        ).stdout.decode(),
        mark,
    )
    assert want not in [ln.text for ln in off.lines()]  # the end-of-log passes alone do not reach it
    # The bounds: the first head_lines lines only, and none past head_bytes.
    many = "".join(f"MASTER_ADDR=10.9.0.{i} x\n" for i in range(10)) + text
    log.write_text(many)
    fr = funnel.run_local(spec, timeout=60)
    assert [ln.text for ln in fr.context if "MASTER_ADDR" in ln.text] == [f"MASTER_ADDR=10.9.0.{i} x" for i in range(4)]
    log.write_text("x" * 70_000 + "\n" + text)
    fr = funnel.run_local(spec, timeout=60)
    assert want not in [ln.text for ln in fr.lines()]


def test_two_jobs_in_one_time_window_told_apart_by_endpoint(sshd, tmp_path, write_inventory):
    """Two independent two-node jobs (the real recording, twice) failing in the same seconds: only their
    rendezvous, read from each log's head through the funnel, tells them apart."""
    hosts = {
        "a0": launched("node0", "10.4.0.1"),
        "a1": launched("node1", "10.4.0.1"),
        "b0": launched("node0", "10.7.0.1"),
        "b1": launched("node1", "10.7.0.1"),
    }
    doc = probe_json(sshd, job_inventory(write_inventory, tmp_path, hosts))
    got = sorted((rc["host"], rc["rank"], tuple(rc["affected"])) for rc in doc["root_causes"])
    assert got == [("a1", 1, ("a0",)), ("b1", 1, ("b0",))], doc["root_causes"]
    for rc in doc["root_causes"]:
        assert "mat1 and mat2 shapes cannot be multiplied" in rc["line"]
    for h in doc["hosts"]:  # the endpoint line survives into the kept facts (a sweep re-analyses them)
        assert any("--master_addr 10." in ln for ln in h["facts"]["job"]["lines"]), h["host"]
    # Without the endpoints (the same logs, their command line left out) time alone joins all four:
    # one root, the other job's root demoted to "affected" (the shape the endpoints fix).
    plain = {n: t.split("\n", 1)[1] for n, t in hosts.items()}
    doc = probe_json(sshd, job_inventory(write_inventory, tmp_path, sub="plain", hosts=plain))
    (rc,) = doc["root_causes"]
    assert len(rc["affected"]) == 3, rc


# --------------------------------------------------------------------------- the device recordings through sshd


@pytest.mark.parametrize("order", [["node0", "node1"], ["node1", "node0"]])
def test_device_job_recording_names_rank1_through_sshd(sshd, tmp_path, order, write_inventory):
    """The real two-node torchrun failure (H200 host): node1's RuntimeError is the root, node0's watchdog
    timeout 30 s later and its SIGABRT are the consequence."""
    texts = {n: (DEVICE / "job" / f"{n}.log").read_text() for n in order}
    doc = probe_json(sshd, job_inventory(write_inventory, tmp_path, texts))
    (rc,) = doc["root_causes"]
    assert (rc["host"], rc["rank"], rc["affected"]) == ("node1", 1, ["node0"])
    assert "mat1 and mat2 shapes cannot be multiplied" in rc["line"]
    assert rc["time"].startswith("2026-11-30T19:34:5")
    r = cli(sshd, job_inventory(write_inventory, tmp_path, sub="text", hosts=texts), "probe", "all")
    flat = " ".join(r.output.split())  # node0's first consequence-kind line: the watchdog, 30 s after the root's
    assert "failed as a consequence: node0 (collective timeout, 29." in flat or "(collective timeout, 30." in flat, flat


def test_device_hang_recording_makes_no_claim_through_sshd(sshd, tmp_path, write_inventory):
    """The real hang was ended by a SIGTERM to both agents before any watchdog fired: both hosts show
    only the agent's SIGTERM, so nothing names the straggler (by design, docs/job.md)."""
    texts = {n: (DEVICE / "hang" / f"{n}.log").read_text() for n in ("node0", "node1")}
    doc = probe_json(sshd, job_inventory(write_inventory, tmp_path, texts))
    assert doc["root_causes"] == []


@pytest.mark.parametrize("order", [["node0", "node1"], ["node1", "node0"]])
def test_straggler_named_from_real_watchdog_lines_through_sshd(sshd, tmp_path, order, write_inventory):
    """A hang whose NCCL timeout fired: node0 is the real recording's watchdog side (SeqNum=2 timed out,
    last completed work 1, the abort), node1 the real hang recording's silent rank (step 0 done, then only
    the agent's SIGTERM when the job was torn down, restamped to node0's abort). node1 never reached
    SeqNum 2: it is named, with rank 1."""
    n0 = (DEVICE / "job" / "node0.log").read_text()
    n1 = (DEVICE / "hang" / "node1.log").read_text().replace("W1130 19:36:57.13", "W1130 19:36:35.73")
    texts = {"node0": n0, "node1": n1}
    doc = probe_json(sshd, job_inventory(write_inventory, tmp_path, {n: texts[n] for n in order}))
    (rc,) = doc["root_causes"]
    assert (rc["host"], rc["rank"], rc["affected"]) == ("node1", 1, ["node0"]), rc
    assert "SeqNum=2" in rc["why"] and "never reached" in rc["why"], rc["why"]
