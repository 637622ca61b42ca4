"""A live hang across hosts, through the product: three "nodes" (one sshd, three inventory hosts, each with its
own log), each log written by a live rank process. Ranks 0 and 2 wait in their collective (main thread blocked
on a futex while their gloo transport thread, ``gloo_tcp_loop``, polls), rank 1 sleeps in ``load_shard``; py-spy
is absent, so only /proc can tell them apart: the main thread's syscall (futex against clock_nanosleep) and
wchan. The first trip reads each rank's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) from /proc, the second
where each waits; the job line names rank 1 and says how the job was formed. Also: the recorded live hang of
``tests/corpus_multinode/hang_live`` (stacks.sh with and without py-spy, one process per node) names its
straggler the same way, and the restricted unpickler refuses a dump that would run code.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.evidence import hang, stacks
from fleetdiag.facts import node as node_mod
from fleetdiag.job import root_causes
from fleetdiag.records import HostResult

HERE = Path(__file__).resolve().parent
LIVE = HERE / "corpus_multinode" / "hang_live"
GLOO = HERE / "fixtures" / "gloo"

# One rank of a job: logs a step every 0.2 s, then waits as RANK says (the others' collective, or a stuck read).
RANK_PROC = """\
import ctypes, os, selectors, socket, threading, time
rank = int(os.environ["RANK"])
def gloo_tcp_loop():
    ctypes.CDLL(None).prctl(15, b"gloo_tcp_loop", 0, 0, 0)  # PR_SET_NAME, as gloo names its transport thread
    sel = selectors.DefaultSelector()
    a, b = socket.socketpair()
    sel.register(a, selectors.EVENT_READ)
    while True:
        sel.select()
threading.Thread(target=gloo_tcp_loop, daemon=True).start()
def load_shard(step):
    if rank == 1 and step == 5:
        time.sleep(3600)
def all_reduce():
    threading.Event().wait(3600)
for step in range(15):
    t = time.time()
    print(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d} INFO [rank{rank}] step {step}", flush=True)
    load_shard(step)
    if step == 5:
        all_reduce()
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def live_job(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("livejob")
    script = tmp / "rank.py"
    script.write_text(RANK_PROC)
    procs, logs = [], {}
    try:
        for r in range(3):
            log = tmp / f"node{r}" / "train.log"
            log.parent.mkdir()
            logs[f"node{r}"] = log
            env = {**os.environ, "RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": "3"}
            env.update(MASTER_ADDR="10.77.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="none")
            env.pop("TORCH_FR_DUMP_TEMP_FILE", None)
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen([sys.executable, str(script)], stdout=out, stdin=subprocess.DEVNULL, env=env)
                )
        deadline = time.time() + 30
        while time.time() < deadline and any(log.read_text().count("\n") < 6 for log in logs.values()):
            time.sleep(0.1)
        assert all(log.read_text().count("\n") == 6 for log in logs.values())
        while time.time() - max(log.stat().st_mtime for log in logs.values()) < 3.5:
            time.sleep(0.2)
        yield procs, logs, tmp
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_live_hang_straggler_from_proc_across_hosts(sshd, live_job) -> None:
    procs, logs, tmp = live_job
    order = ["node2", "node0", "node1"]
    lines = ["hosts:"]
    for n in order:
        lines += [f"  {n}:", "    address: 127.0.0.1", f"    port: {sshd.port}", f"    user: {sshd.user}"]
        lines += ["    logs:", f"      train: {json.dumps(str(logs[n]))}", "    funnel:", "      stall_after: 1s"]
        lines += [f"      flight_recorder: {json.dumps(str(tmp / n / 'fr_'))}"]  # none written: none read
    inv = tmp / "inventory.yaml"
    inv.write_text("\n".join(lines) + "\n")
    base = ["-i", str(inv), "probe", "all", "--known-hosts", str(sshd.known_hosts), "--identity", str(sshd.client_key)]
    base += ["--ssh-config", str(sshd.ssh_config)]
    r = CliRunner().invoke(main, [*base, "--json"])  # sshd's PATH has no py-spy: /proc only
    doc = json.loads(r.output)
    hosts = {h["host"]: h for h in doc["hosts"]}
    for n, h in hosts.items():
        assert h["verdict"] == "stalled" and h["timing"]["round_trips"] == 2, h
        (p,) = h["facts"]["node"]["procs"]  # the log's writer, its rank variables read from /proc
        assert p["pid"] == procs[int(n[-1])].pid and p["env"]["RANK"] == n[-1] and p["env"]["WORLD_SIZE"] == "3"
        assert p["env"]["MASTER_ADDR"] == "10.77.0.1" and h["facts"]["node"]["flight_recorder"] == []
        ras = h["facts"]["stacks"]["ras"]  # no NCCL in these ranks: said so, at once
        assert ras["available"] is False and ras["summary"] == "RAS not available: no job process has NCCL loaded"
        (w,) = h["facts"]["stacks"]["procs"]
        assert w["via"] == "wchan" and w["wait"] == ("sleep" if n == "node1" else "collective"), w
    (rc,) = doc["root_causes"]
    assert (rc["host"], rc["rank"], sorted(rc["affected"])) == ("node1", 1, ["node0", "node2"]), rc
    assert "by /proc (syscall and wchan)" in rc["why"] and "sleeping" in rc["line"], rc
    assert rc["formed"] == "same rendezvous 10.77.0.1:29500; ranks 0–2 of 3", rc["formed"]
    assert all(p.poll() is None for p in procs)  # read-only: every rank still waits

    r = CliRunner().invoke(main, ["--no-color", *base], env={"COLUMNS": "200", "NO_COLOR": "1"})
    flat = " ".join(r.output.split())
    assert "job root cause: node1 · rank 1 · straggler: rank 1 never reached the collective" in flat, flat
    assert "job: same rendezvous 10.77.0.1:29500; ranks 0–2 of 3" in flat
    assert "sleeping (main thread in clock_nanosleep)" in flat  # the straggler's card: where /proc says it is
    assert f"pid {procs[1].pid} rank 1/3 via 10.77.0.1:29500" in flat  # the straggler's card: its job process
    assert "NCCL RAS RAS not available: no job process has NCCL loaded" in flat


def _per_node(path: Path) -> list[HostResult]:
    """The recorded stacks.sh output (all four ranks, read on their one host) as four nodes' second trips."""
    rep = stacks.parse_stacks(path.read_text())
    out = []
    for p in rep.procs:
        if p.rank is None:
            continue
        one = stacks.StackReport(now=rep.now, pyspy=rep.pyspy, procs=[p], arch=rep.arch)
        facts = {"stacks": {"procs": hang.rank_waits(one)}}
        out.append(HostResult(host=f"node{p.rank}", verdict="stalled", summary="silent", facts=facts))
    return out


def test_recorded_io_hang_names_rank1_from_proc() -> None:
    """tests/corpus_multinode/hang_io: rank 1 blocks in recv() on a silent data server (wchan wait_woken), its
    peers wait in all_reduce (futex beside pt_gloo_runloop): /proc alone names rank 1."""
    label = json.loads((LIVE.parent / "hang_io.json").read_text())
    nodes = _per_node(LIVE.parent / "hang_io" / "stacks_sh_nopyspy.txt")
    for order in (nodes, nodes[::-1]):
        (rc,) = root_causes(order)
        assert (rc.host, rc.rank) == (label["root_host"], label["root_rank"]) and "by /proc" in rc.why, rc.why


@pytest.mark.parametrize("view", ["stacks_sh.txt", "stacks_sh_nopyspy.txt"])
def test_recorded_live_hang_names_rank2(view: str) -> None:
    label = json.loads((LIVE.parent / "hang_live.json").read_text())
    nodes = _per_node(LIVE / view)
    assert len(nodes) == 4
    for order in (nodes, nodes[::-1], nodes[1:] + nodes[:1]):
        (rc,) = root_causes(order)
        assert (rc.host, rc.rank) == (label["root_host"], label["root_rank"])
        assert sorted(rc.affected) == ["node0", "node1", "node3"]
        assert rc.formed == "ranks 0–3 of 4"
        how = "py-spy stacks" if view == "stacks_sh.txt" else "/proc (syscall and wchan)"
        assert f"by {how}" in rc.why, rc.why
        assert "load_shard" in rc.line if view == "stacks_sh.txt" else "sleeping" in rc.line, rc.line


def test_recorded_proc_of_the_gloo_hang_tells_futex_from_sleep() -> None:
    """tests/fixtures/gloo/g3_hang.proc_rank*.txt (the real /proc of three gloo ranks, 8 s into the hang)."""
    waits = {}
    for r in range(3):
        text = (GLOO / f"g3_hang.proc_rank{r}.txt").read_text()
        main_sc = int(text.split("syscall: ", 1)[1].split()[0])
        p = stacks.ProcStack(pid=r, state="S", env={"RANK": str(r)}, syscall=main_sc, arch="x86_64")
        p.wchan = text.split("wchan: ", 1)[1].split()[0]
        for ln in text.splitlines():
            if ln.startswith("task "):
                f = dict(kv.split("=", 1) for kv in ln.split()[2:] if "=" in kv)
                tid = int(ln.split()[1])
                p.tstates.append(stacks.ThreadState(tid, f["state"], f["wchan"], f["comm"]))
        p.pid = p.tstates[0].tid
        waits[r] = stacks.where_waits(p)
    assert waits[1].kind == stacks.SLEEP and "clock_nanosleep" in waits[1].what
    for r in (0, 2):
        assert waits[r].kind == stacks.COLLECTIVE and "gloo_tcp_loop" in waits[r].what, waits[r]


def test_flight_recorder_dumps_pickle_and_json_agree() -> None:
    for r, enq in ((0, 6), (1, 5), (2, 6)):
        a = node_mod.parse_flight_recorder((GLOO / f"g3_hang.fr_rank_{r}").read_bytes(), f"/x/fr_rank_{r}")
        b = node_mod.parse_flight_recorder((GLOO / f"g3_hang.fr_rank_{r}.json").read_bytes(), f"/x/fr_rank_{r}.json")
        assert (a.fmt, b.fmt) == ("pickle", "json") and a.error is None and b.error is None
        for x in (a, b):
            assert (x.rank, x.world, x.last_enqueued, x.last_completed, x.op) == (r, 3, enq, 5, "gloo:all_reduce")
            assert x.version == "2.10"


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_hostile_dump_is_refused_never_run() -> None:
    bad = pickle.dumps({"version": "2.10", "entries": [_Boom()]})
    rec = node_mod.parse_flight_recorder(bad, "/tmp/nccl_trace_rank_3")
    assert rec.rank == 3 and rec.error and "refused" not in rec.error.lower() or "not read" in rec.error
    assert "posix.system" in rec.error or "os.system" in rec.error, rec.error
    for junk in (
        b"",
        b"\x80\x04",
        b"garbage",
        b"{not json",
        pickle.dumps([1, 2, 3]),
        b"\x80\x02}q\x00(X" + b"\xff" * 9,
    ):
        r = node_mod.parse_flight_recorder(junk, "/tmp/nccl_trace_rank_0")
        assert r.error and r.last_enqueued is None
    huge = pickle.dumps({"entries": [{"collective_seq_id": i, "state": "completed"} for i in range(20000)]})
    r = node_mod.parse_flight_recorder(huge, "/tmp/nccl_trace_rank_1")
    assert r.last_enqueued == 19999 and r.entries == 20000  # only the last FR_ENTRIES are looked at


def test_node_records_are_bounded_and_data() -> None:
    """remote/node.sh's records: a hostile environment value and path stay text; garbled bytes are a note."""
    recs = [
        "proc\tpid=12 ppid=1 state=S env=RANK=3,WORLD_SIZE=8,MASTER_ADDR=10.0.0.1,evil=1,=2 cmd=python\x1b[2J t.py --api-key sk-abcdef123456",
        "proc\tpid=12 ppid=1 state=S env=RANK=3 cmd=python t.py",
        "file\t1\terrfile\t10\t1796116715\t/tmp/e\x1b]0;x\x07.json",
        "b64\t1\t!!!notbase64",
        "file\t2\tfr\t5\t\t/tmp/nccl_trace_rank_0",
        "hex\t2\tzz",
        "note\tfr /tmp/big: 99999999 bytes, over the 2097152 read",
    ]
    n = node_mod.parse_node(recs)
    assert n is not None
    (p,) = n["procs"]
    assert p["env"] == {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1"} and "\x1b" not in p["cmdline"]
    assert "sk-abcdef123456" not in p["cmdline"] and "--api-key" in p["cmdline"]  # once per pid, its secret masked
    assert all("\x1b" not in e["path"] for e in n["error_files"])
    assert any(x.startswith("fr /tmp/big") for x in n["notes"]) and any("garbled" in x for x in n["notes"])
    assert n["error_files"] == [] and n["flight_recorder"] == [] and sum("garbled" in x for x in n["notes"]) == 2


def test_real_nccl_flight_recorder_dumps_of_the_h200() -> None:
    """torch's own NCCL dumps (one rank, NCCL 2.28.9, tests/fixtures/device/h200_1gpu/fr_nccl): an all_reduce
    pending behind a GPU sleep is enqueued #18 with #17 completed, in the pickle and in the JSON alike."""
    base = HERE / "fixtures" / "device" / "h200_1gpu" / "fr_nccl"
    for name in ("dump_nccl_trace_pending.pkl", "dump_nccl_trace_json_pending.json"):
        rec = node_mod.parse_flight_recorder((base / name).read_bytes(), f"/tmp/nccl_trace_rank_0.{name}")
        assert (rec.last_enqueued, rec.last_completed, rec.op, rec.state, rec.world) == (
            18,
            17,
            "nccl:all_reduce",
            "scheduled",
            1,
        ), rec
        assert rec.error is None and rec.version == "2.10"
    done = node_mod.parse_flight_recorder((base / "dump_nccl_trace_end.pkl").read_bytes(), "x")
    assert (done.last_enqueued, done.state) == (18, "completed")
    empty = node_mod.parse_flight_recorder((base / "dump_fr_trace_idle.pkl").read_bytes(), "x")
    assert empty.error == "no collective in the dump"  # the backend-generic dump of an NCCL job: no entries


def test_node_script_bounds_what_it_sends(tmp_path: Path) -> None:
    """remote/node.sh under the real sh: dumps past the total are named, not sent; a file that is a link or
    too large is not read; a hostile error_file: path in the log is only read when it is a .json file."""
    from fleetdiag.analysis import load_rules
    from fleetdiag.probe import spec_for
    from fleetdiag.remote import funnel

    fr = tmp_path / "fr"
    fr.mkdir()
    blob = (GLOO / "g3_hang.fr_rank_0").read_bytes()
    for r in range(3):  # a real dump, padded past a million bytes (the padding follows the pickle's STOP)
        (fr / f"nccl_trace_rank_{r}").write_bytes(blob + b"\0" * 1_200_000)
    (fr / "nccl_trace_rank_9").symlink_to("/etc/passwd")
    log = tmp_path / "train.log"
    log.write_text("[rank0]: boom\n  error_file: /etc/passwd\n  error_file: /nonexistent/error.json\n")
    spec = spec_for(str(log), load_rules(user_default=False))
    spec.extra += node_mod.SCRIPT
    spec.extra_vars.update(node_mod.script_vars(str(fr / "nccl_trace_rank_")))
    res = funnel.run_local(spec, timeout=60)
    n = node_mod.parse_node(res.facts.get("node_raw"))
    assert n is not None
    assert [d["rank"] for d in n["flight_recorder"]] == [0, 1] and all(
        d["last_enqueued"] == 6 for d in n["flight_recorder"]
    )
    assert any("nccl_trace_rank_2: not sent" in x for x in n["notes"]), n["notes"]
    assert any("nccl_trace_rank_9: not a regular file" in x for x in n["notes"]), n["notes"]
    assert any("/nonexistent/error.json: not a regular file" in x for x in n["notes"])
    assert not any("passwd" in json.dumps(e) for e in n["error_files"])  # not a .json: never named, never read


def test_a_stalled_job_named_from_its_flight_recorder_alone() -> None:
    """Three stalled hosts, no stacks read (--no-stacks), each with its rank's real dump (g3_hang): rank 1 is
    behind. And a rank blocked on a lock of its own (not sleeping, not in I/O) is no straggler by stacks."""
    hosts = []
    for r in range(3):
        rec = node_mod.parse_flight_recorder((GLOO / f"g3_hang.fr_rank_{r}").read_bytes(), f"/x/nccl_trace_rank_{r}")
        facts = {"node": {"procs": [], "error_files": [], "flight_recorder": [rec.to_json()], "notes": []}}
        hosts.append(HostResult(host=f"n{r}", verdict="stalled", summary="silent", facts=facts))
    (rc,) = root_causes(hosts)
    assert (rc.host, rc.rank) == ("n1", 1) and "Flight Recorder" in rc.why
    assert "Flight Recorder dumps found for ranks 0–2" in rc.evidence
    waits = []
    for r, w in enumerate(("collective", "lock", "collective")):
        procs = [{"pid": r, "rank": r, "wait": w, "via": "wchan", "env": {"RANK": str(r), "WORLD_SIZE": "3"}}]
        waits.append(HostResult(host=f"n{r}", verdict="stalled", summary="silent", facts={"stacks": {"procs": procs}}))
    assert root_causes(waits) == []
