"""Hangs: silence judged by the log's own cadence, then where each process waits (py-spy, else /proc).

The stacks come from real processes: the recorded two-node NCCL hang in fixtures/hang, and a live Python
process blocked in a named function while its log is silent, read by stacks.sh with the real py-spy.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fleetdiag.analysis.lines import split_text
from fleetdiag.evidence import stacks as st
from fleetdiag.evidence.cadence import SERVING, STARTING, TRAINING, judge
from fleetdiag.evidence.stacks import (
    COLLECTIVE,
    DATA_LOADER,
    LOCK,
    SLEEP,
    SOCKET,
    Frame,
    ProcStack,
    ThreadStack,
    describe,
    evidence,
    parse_pyspy,
    parse_pyspy_json,
    parse_stacks,
    stragglers,
    where_waits,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "fleetdiag" / "remote" / "stacks.sh"
SHARED = Path(os.environ.get("FLEETDIAG_SHARED", "/work/shared"))
HANG = SHARED / "fixtures" / "hang"
VENV_BIN = Path(sys.executable).parent


def _pyspy() -> str:
    found = shutil.which("py-spy", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, "py-spy is part of the test extra (pip install -e '.[test]')"
    return found


# ---------------------------------------------------------------- the recorded NCCL hang


def _procs_threads(pid: int) -> tuple[str, str, list[str]]:
    """(state, wchan, 'tid state wchan comm' lines) of one process in fixtures/hang/procs.txt."""
    out: list[str] = []
    state = wchan = ""
    inside = False
    for raw in (HANG / "procs.txt").read_text().splitlines():
        m = re.match(r"pid (\d+) ", raw)
        if m:
            inside = int(m.group(1)) == pid
            continue
        if not inside:
            continue
        m = re.match(r"\s+state: (\S+) \(\w+\) wchan: (\S+)", raw)
        if m:
            state, wchan = m.groups()
            continue
        m = re.match(r"\s+tid (\d+) (\S+) (\S+) (\S+)", raw)
        if m:
            tid, comm, s, w = m.groups()
            out.append(f"{tid} {s} {w} {comm}")
    return state, wchan, out


def _section(pid: int, rank: int, dump: str | None) -> str:
    """What stacks.sh sends for one rank, built from the recorded py-spy dump and /proc states."""
    state, wchan, threads = _procs_threads(pid)
    parts = [
        f"@@fd_stacks_proc pid={pid} state={state} ppid=1 wchan={wchan} gpu_fds=9",
        "@@fd_stacks_cmdline /workspace/venv/bin/python -u train.py ",
        f"@@fd_stacks_environ RANK={rank} LOCAL_RANK=0 WORLD_SIZE=2 CUDA_VISIBLE_DEVICES={rank} ",
    ]
    if dump is not None:
        parts += [
            f"@@fd_stacks_pyspy pid={pid} mode=native",
            (HANG / dump).read_text().rstrip("\n"),
            f"@@fd_stacks_pyspy_end pid={pid} rc=0 status=ok",
        ]
    parts += [
        f"@@fd_stacks_threads pid={pid}",
        *threads,
        f"@@fd_stacks_threads_end count={len(threads)}",
        f"@@fd_stacks_end pid={pid}",
    ]
    return "\n".join(parts)


def _gpus() -> str:
    """The GPU section for the recorded hang: utilisation from nvidia-smi-while-hung.csv, one GPU per rank
    (the recording ran rank N on GPU N; the bus ids are this test's own)."""
    util = {}
    for raw in (HANG / "nvidia-smi-while-hung.csv").read_text().splitlines():
        m = re.match(r"(\d+), (\d+) %, ", raw)
        if m:
            util[int(m.group(1))] = m.group(2)
    assert util == {0: "100", 1: "0"}
    return "\n".join(
        [
            "@@fd_stacks_gpus",
            f"0, 00000000:19:00.0, {util[0]}",
            f"1, 00000000:2A:00.0, {util[1]}",
            "@@fd_stacks_apps",
            "662, 00000000:19:00.0",
            "663, 00000000:2A:00.0",
            "@@fd_stacks_gpus_end",
        ]
    )


def _report(dump0: str | None, dump1: str | None, pyspy: str = "/usr/bin/py-spy", gpus: bool = False) -> str:
    return "\n".join(
        [
            f"@@fd_stacks_start now=1796062299 uid=0 user=root pyspy={pyspy} ptrace_scope=1",
            _section(662, 0, dump0),
            _section(663, 1, dump1),
            *([_gpus()] if gpus else []),
            "@@fd_stacks_done",
        ]
    )


def test_recorded_hang_names_the_waiting_rank_and_the_straggler() -> None:
    rep = parse_stacks(_report("pyspy-native-rank0.txt", "pyspy-native-rank1.txt"))
    r0, r1 = rep.procs
    assert (r0.rank, r1.rank) == (0, 1)
    assert len(r0.tstates) == 40 and r0.thread_count == 40
    w0, w1 = where_waits(r0), where_waits(r1)
    assert (w0.kind, w0.at, w0.where) == (COLLECTIVE, "cuStreamSynchronize", "<module> (train.py:23)")
    assert (w1.kind, w1.at, w1.where) == (SLEEP, "clock_nanosleep", "<module> (train.py:32)")
    assert [p.pid for p in stragglers(rep.procs)] == [663]
    ev = evidence(rep)
    assert [(e["source"], e["pid"], e["kind"], e["gpu"], e["time"]) for e in ev] == [
        ("stack", 662, COLLECTIVE, 0, 1796062299.0),
        ("stack", 663, SLEEP, 1, 1796062299.0),
    ]
    assert set(ev[0]) == {"source", "time", "line", "pid", "gpu", "kind", "code"}
    assert ev[0]["line"].startswith(
        "rank 0 (pid 662) python -u train.py: in a collective / CUDA sync — "
        "cuStreamSynchronize, called from <module> (train.py:23)"
    )
    assert "straggler" not in ev[0]["line"]
    assert ev[1]["line"].startswith("rank 1 (pid 663) python -u train.py: sleeping — clock_nanosleep")
    assert ev[1]["line"].endswith("the straggler: its peers wait for it in a collective")
    assert rep.notes() == []


def test_recorded_plain_and_json_dumps_read_the_same() -> None:
    for rank, line, active in ((0, 23, True), (1, 32, False)):
        plain = parse_pyspy((HANG / f"pyspy-rank{rank}.txt").read_text())
        js = parse_pyspy_json((HANG / f"pyspy-rank{rank}.json").read_text())
        assert [(t.tid, t.name, t.active) for t in plain] == [(662 + rank, "MainThread", active)]
        assert [(t.tid, t.name, t.active) for t in js] == [(662 + rank, "MainThread", active)]
        assert [(f.name, f.file, f.line) for f in plain[0].frames] == [("<module>", "train.py", line)]
        assert [(f.name, f.file, f.line) for f in js[0].frames] == [("<module>", "train.py", line)]
        assert js[0].frames[0].path == "/workspace/train/train.py"
    native = parse_pyspy((HANG / "pyspy-native-rank0.txt").read_text())[0].frames
    assert len(native) == 26 and native[9].name == "cuStreamSynchronize" and native[9].file == "libcuda.so.580.159.04"
    # a C++ name with parentheses keeps them; the library is the last parenthesis
    assert native[12].name.startswith("at::native::_local_scalar_dense_cuda(at::Tensor const&)::{lambda()#1}")
    assert native[12].file == "libtorch_cuda.so" and native[-2].line == 23


def test_recorded_plain_dumps_fall_back_to_the_kernel_for_what_python_does_not_say() -> None:
    rep = parse_stacks(_report("pyspy-rank0.txt", "pyspy-rank1.txt"))
    w0, w1 = where_waits(rep.procs[0]), where_waits(rep.procs[1])
    # plain frames of rank 0 show only the line: its main thread runs (a CUDA sync spins on the CPU)
    assert (w0.kind, w0.where) == (st.RUNNING, "<module> (train.py:23)")
    # rank 1 is idle at line 32: the kernel says it sleeps
    assert (w1.kind, w1.at, w1.where, w1.via) == (SLEEP, "hrtimer_nanosleep", "<module> (train.py:32)", "py-spy+wchan")


def test_recorded_plain_dumps_and_gpu_utilisation_name_the_straggler() -> None:
    rep = parse_stacks(_report("pyspy-rank0.txt", "pyspy-rank1.txt", gpus=True))
    assert rep.gpu_of_pid == {662: 0, 663: 1} and [g.util for g in rep.gpus] == [100.0, 0.0]
    assert stragglers(rep.procs) == []  # the stacks alone cannot tell
    ev = evidence(rep)
    assert ev[0]["line"].endswith(
        "running on the CPU at <module> (train.py:23); GPU 0 at 100 % (busy: a CUDA "
        "sync or an NCCL kernel waiting on a peer)"
    )
    assert ev[1]["gpu"] == 1 and ev[1]["line"].endswith(
        "; GPU 1 at 0 % — the straggler: its peers wait for it in a collective"
    )


def test_recorded_hang_without_pyspy_uses_wchan_and_thread_states() -> None:
    rep = parse_stacks(_report(None, None, pyspy="absent"))
    w0, w1 = where_waits(rep.procs[0]), where_waits(rep.procs[1])
    assert (w0.kind, w0.via) == (st.RUNNING, "wchan")
    assert (w1.kind, w1.at, w1.via) == (SLEEP, "hrtimer_nanosleep", "wchan")
    line = describe(rep.procs[1])
    assert line.startswith(
        "rank 1 (pid 663) python -u train.py: sleeping — hrtimer_nanosleep (from /proc: main "
        "thread S in hrtimer_nanosleep; 40 threads: 34 futex_do_wait, 5 poll_schedule_timeout.constprop.0, "
        "1 hrtimer_nanosleep)"
    )
    assert rep.notes()[0].startswith("py-spy is not installed on this host (pip install py-spy)")


# ---------------------------------------------------------------- naming waits


def _proc(*frames: tuple[str, str | None, int | None], active: bool = False) -> ProcStack:
    return ProcStack(pid=10, threads=[ThreadStack(10, "MainThread", active, [Frame(*f) for f in frames])])


@pytest.mark.parametrize(
    "frames, kind, at, where",
    [
        (
            (
                ("wait", "threading.py", 324),
                ("get", "queue.py", 180),
                ("_try_get_data", "torch/utils/data/dataloader.py", 1133),
                ("_next_data", "torch/utils/data/dataloader.py", 1329),
                ("train", "train.py", 40),
            ),
            DATA_LOADER,
            "_try_get_data",
            "train (train.py:40)",
        ),
        (
            (
                ("all_reduce", "torch/distributed/distributed_c10d.py", 2501),
                ("wrapper", "torch/distributed/c10d_logger.py", 81),
                ("step", "trainer/loop.py", 77),
            ),
            COLLECTIVE,
            "all_reduce",
            "step (trainer/loop.py:77)",
        ),
        (
            (("synchronize", "torch/cuda/__init__.py", 985), ("main", "bench.py", 12)),
            COLLECTIVE,
            "synchronize",
            "main (bench.py:12)",
        ),
        (
            (
                ("recv", "libc.so.6", None),
                ("sock_recv", "libpython3.11.so", None),
                ("_read_response", "myproto/client.py", 55),
                ("main", "serve.py", 9),
            ),
            SOCKET,
            "recv",
            "_read_response (myproto/client.py:55)",
        ),
        (
            (("clock_nanosleep", "libc.so.6", None), ("poll_status", "jobs.py", 14)),
            SLEEP,
            "clock_nanosleep",
            "poll_status (jobs.py:14)",
        ),
        (
            (("acquire", "threading.py", 90), ("_acquire_restore", "threading.py", 300), ("flush", "ckpt_io.py", 4)),
            LOCK,
            "acquire",
            "flush (ckpt_io.py:4)",
        ),
        (
            (
                ("select", "selectors.py", 468),
                ("_run_once", "asyncio/base_events.py", 1898),
                ("run_forever", "asyncio/base_events.py", 608),
                ("serve", "uvicorn/server.py", 69),
            ),
            st.EVENT_LOOP,
            "_run_once",
            "serve (uvicorn/server.py:69)",
        ),
        (
            (
                ("acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py", 470),
                ("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 520),
                ("worker_busy_loop", "vllm/v1/executor/multiproc_executor.py", 500),
            ),
            st.QUEUE,
            "acquire_read",
            "worker_busy_loop (vllm/v1/executor/multiproc_executor.py:500)",
        ),
    ],
)
def test_where_each_kind_of_wait_is_named(frames: tuple, kind: str, at: str, where: str) -> None:
    w = where_waits(_proc(*frames))
    assert (w.kind, w.at, w.where) == (kind, at, where)


def test_no_straggler_without_a_peer_in_a_collective() -> None:
    a = _proc(("clock_nanosleep", "libc.so.6", None), ("main", "a.py", 1))
    a.env = {"RANK": "0"}
    b = _proc(("clock_nanosleep", "libc.so.6", None), ("main", "a.py", 1))
    b.pid, b.env = 11, {"RANK": "1"}
    assert stragglers([a, b]) == []


# ---------------------------------------------------------------- a real hang, read by stacks.sh

HANGER = textwrap.dedent("""
    import sys, threading, time
    def wait_for_peer():
        threading.Event().wait()
    with open(sys.argv[1], "a", buffering=1) as log:
        for i in range(15):
            log.write(time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() % 1 * 1000):03d} INFO step {i}\\n")
            time.sleep(0.2)
    wait_for_peer()
""")


@pytest.fixture()
def hung(tmp_path: Path):
    """A live Python process: a log line every 0.2 s, then blocked in wait_for_peer while the log is silent."""
    script, log = tmp_path / "hanger.py", tmp_path / "train.log"
    script.write_text(HANGER.lstrip("\n"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log)], env={**os.environ, "RANK": "3", "LOCAL_RANK": "1", "SECRET_TOKEN": "x"}
    )
    try:
        deadline = time.time() + 30
        while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 15):
            time.sleep(0.1)
        assert log.read_text().count("\n") == 15
        time.sleep(0.6)  # past the last 0.2 s sleep: now in wait_for_peer
        yield proc, log
    finally:
        proc.kill()
        proc.wait()


def _run(
    *pids: int | str, path: str | None = None, env: dict | None = None, user: str | None = None, shell: str = "sh"
) -> str:
    e = {"PATH": path or f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    cmd = [shell, "-c", f". '{SCRIPT}'; fd_stacks_main \"$@\"", "stacks", *map(str, pids)]
    if user is not None:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


def test_real_hang_is_stalled_by_its_cadence_and_pyspy_names_the_function(hung) -> None:
    proc, log = hung
    lines = split_text(log.read_text())
    mtime = log.stat().st_mtime
    # it wrote every 0.2 s; judged with k=5 and a 1 s floor so the test needs only seconds of silence
    early = judge(lines, mtime, mtime + 0.5, alive=True, k=5, floor=1.0)
    assert not early.stalled and early.phase == TRAINING and 0.15 <= (early.cadence_s or 0) <= 1.0, early
    deadline = time.time() + 20
    while (late := judge(lines, mtime, time.time(), alive=True, k=5, floor=1.0)).stalled is False:
        assert time.time() < deadline, late
        time.sleep(0.2)
    assert late.silent_s > max(5 * late.cadence_s, 1.0) and log.stat().st_mtime == mtime  # the log is silent
    assert re.search(r"^training, it wrote every ~0\.\d s.*; silent for \d+(\.\d)? s \(limit", late.reason), late.reason

    out = _run(proc.pid)
    rep = parse_stacks(out)
    (p,) = rep.procs
    assert p.pid == proc.pid and p.rank == 3 and p.local_rank == 1
    assert "SECRET_TOKEN" not in out  # only the rank/device variables leave the host
    if p.pyspy_status == "ok":
        w = where_waits(p)
        assert (w.kind, w.where) == (LOCK, "wait_for_peer (hanger.py:3)"), p.threads
        (ev,) = evidence(rep)
        assert "wait_for_peer (hanger.py:3)" in ev["line"] and ev["line"].startswith(f"rank 3 (pid {proc.pid})")
        assert ev["kind"] == LOCK and ev["source"] == "stack"
    else:  # ptrace refused here: the card says so and falls back to /proc
        assert p.pyspy_status == "denied" and any("ptrace not permitted" in n for n in rep.notes())
        assert where_waits(p).via == "wchan"


def test_real_hang_without_pyspy_falls_back_to_wchan(hung) -> None:
    proc, _ = hung
    path = "/usr/bin:/bin"
    assert shutil.which("py-spy", path=path) is None
    rep = parse_stacks(_run(proc.pid, path=path, env={"HOME": "/nonexistent"}))
    assert rep.pyspy is None and rep.procs[0].pyspy_status is None
    # py-spy on PATH but turned off by the caller: the same fallback
    off = parse_stacks(_run(proc.pid, env={"FD_STACKS_PYSPY": "none"}))
    assert off.pyspy is None and off.procs[0].threads == [] and where_waits(off.procs[0]).via == "wchan"
    w = where_waits(rep.procs[0])
    assert w.via == "wchan" and w.kind == LOCK and "futex" in (w.at or ""), w  # a threading.Event is a futex
    line = evidence(rep)[0]["line"]
    assert line.startswith(f"rank 3 (pid {proc.pid})") and "waiting on a lock / event" in line and "from /proc" in line
    assert "py-spy is not installed" in rep.notes()[0]


def test_ptrace_refused_is_stated_with_the_fix(hung) -> None:
    proc, _ = hung
    path = f"{Path(_pyspy()).parent}:/usr/bin:/bin"
    if os.geteuid() == 0:  # root may trace anything: ask as nobody
        target, out = proc.pid, _run(proc.pid, path=path, user="nobody")
    else:  # not root: pid 1 belongs to another user
        target, out = 1, _run(1, path=path)
    rep = parse_stacks(out)
    (p,) = rep.procs
    assert p.pyspy_status == "denied" and "Permission Denied" in (p.pyspy_error or ""), out
    note = next(n for n in rep.notes() if "ptrace not permitted" in n)
    assert f"pid {target}" in note and "as root (CAP_SYS_PTRACE)" in note and "fell back to /proc" in note
    w = where_waits(p)
    assert w.via == "wchan"  # another user's wait channel reads as 0: said so, not guessed
    assert "wait channel is hidden" in w.what


def test_stacks_sh_maps_pids_to_gpus_with_nvidia_smi(hung, tmp_path: Path) -> None:
    proc, _ = hung
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"  # a stand-in answering the two queries stacks.sh asks
    smi.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
          *--query-gpu=index,pci.bus_id,utilization.gpu*--format=csv,noheader,nounits*)
            printf '0, 00000000:19:00.0, 100\\n1, 00000000:2A:00.0, 0\\n' ;;
          *--query-compute-apps=pid,gpu_bus_id*--format=csv,noheader*) printf '{proc.pid}, 00000000:2A:00.0\\n' ;;
          *) echo "unexpected: $*" >&2; exit 2 ;;
        esac
    """)
    )
    smi.chmod(0o755)
    rep = parse_stacks(_run(proc.pid, path=f"{bindir}:/usr/bin:/bin"))
    assert rep.gpu_of_pid == {proc.pid: 1} and rep.gpu_error is None
    (ev,) = evidence(rep)
    assert ev["gpu"] == 1 and "; GPU 1 at 0 %" in ev["line"]
    smi.write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    rep = parse_stacks(_run(proc.pid, path=f"{bindir}:/usr/bin:/bin"))
    assert rep.gpus == [] and any(n.startswith("nvidia-smi: NVIDIA-SMI has failed") for n in rep.notes())


def test_stacks_sh_finds_the_jobs_python_processes(hung) -> None:
    proc, _ = hung
    decoy = subprocess.Popen(["sh", "-c", "sleep 60 # python torchrun vllm"])
    try:
        out = _run(env={"FD_STACKS_MAX": "200"}, path="/usr/bin:/bin")
        rep = parse_stacks(out)
        pids = [p.pid for p in rep.procs]
        assert proc.pid in pids and decoy.pid not in pids and rep.found == len(pids)
        assert len(parse_stacks(_run(env={"FD_STACKS_MAX": "1"}, path="/usr/bin:/bin")).procs) == 1
    finally:
        decoy.kill()
        decoy.wait()


def test_stacks_sh_bounds_and_bad_input(hung, tmp_path: Path) -> None:
    proc, _ = hung
    code = (
        "import threading,time\n"
        "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(5)]\n"
        "time.sleep(60)"
    )
    threads = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        out = _run(
            threads.pid,
            "12;rm -rf /",
            999999999,
            proc.pid,
            env={"FD_STACKS_THREADS": "2", "FD_STACKS_BYTES": "120", "FD_STACKS_MAX": "3"},
        )
    finally:
        threads.kill()
        threads.wait()
    rep = parse_stacks(out)
    assert "@@fd_stacks_badpid" in out and proc.pid not in [p.pid for p in rep.procs]  # third entry: max 3
    first = rep.procs[0]
    assert first.thread_count == 6 and len(first.tstates) == 2
    body = out.split(f"@@fd_stacks_pyspy pid={threads.pid} mode=native\n")[1].split("@@fd_stacks_pyspy_end")[0]
    assert len(body.encode()) <= 120 + 2
    assert [p.pid for p in rep.procs if p.gone] == [999999999]
    assert any("exited before its stack was read" in n for n in rep.notes())


@pytest.mark.parametrize("shell", ["dash", "busybox sh"])
def test_stacks_sh_under_other_shells(hung, shell: str) -> None:
    proc, _ = hung
    exe = shell.split()[0]
    if not shutil.which(exe):
        pytest.fail(f"{exe} is installed on the test machine")
    if " " in shell:  # busybox: run its sh applet
        r = subprocess.run(
            [exe, "sh", "-c", f". '{SCRIPT}'; fd_stacks_main {proc.pid}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )
        out = r.stdout
        assert r.stderr == ""
    else:
        out = _run(proc.pid, shell=exe, path="/usr/bin:/bin")
    rep = parse_stacks(out)
    assert rep.procs[0].pid == proc.pid and where_waits(rep.procs[0]).kind == LOCK


def test_stacks_sh_is_clean_posix_sh() -> None:
    r = subprocess.run(["shellcheck", "-s", "sh", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout
    text = SCRIPT.read_text()
    assert "set -e" not in text
    names = re.findall(r"^(\w+)\(\)", text, re.MULTILINE)
    assert names and all(n.startswith("fd_stacks_") for n in names)


# ---------------------------------------------------------------- cadence

T0 = dt.datetime(2026, 11, 30, 18, 0, 0)


def _log(lines: list[tuple[float, str]], fmt: str = "%Y-%m-%d %H:%M:%S,%f") -> str:
    return "".join(f"{(T0 + dt.timedelta(seconds=s)).strftime(fmt)[:23]} {msg}\n" for s, msg in lines)


def test_every_2s_then_silent_90s_is_stalled_with_its_reason() -> None:
    text = _log([(2.0 * i, f"INFO worker: heartbeat {i}") for i in range(40)])
    s = judge(split_text(text), mtime=1000.0, now=1090.0, alive=True)
    assert s.stalled and s.cadence_s == 2.0 and s.silent_s == 90.0 and s.phase == STARTING
    assert "it wrote every ~2 s; silent for 90 s (limit 60 s = the 60 s floor)" in s.reason
    assert not judge(split_text(text), mtime=1000.0, now=1050.0).stalled
    exited = judge(split_text(text), mtime=1000.0, now=1090.0, alive=False)
    assert not exited.stalled and "process has exited" in exited.reason


def test_idle_serving_node_silent_for_an_hour_is_not_stalled() -> None:
    text = (ROOT / "fleetdiag" / "data" / "demo" / "healthy.log").read_text()
    s = judge(split_text(text), mtime=1000.0, now=1000.0 + 3600, alive=True)
    assert not s.stalled and s.phase == SERVING and s.silent_s == 3600
    assert s.reason.startswith("serving and idle: start-up completed") and "silent for 60 min" in s.reason
    # the same server still loading, then silent for an hour: stalled (fixed limit: too few time stamps)
    starting = "\n".join(text.splitlines()[:5] + ["INFO 05-09 17:20:00 [loader.py:1] Loading weights took long"])
    s2 = judge(split_text(starting), mtime=1000.0, now=4600.0, alive=True)
    assert s2.stalled and s2.phase == STARTING


def test_training_silent_5min_after_steps_every_second_is_stalled() -> None:
    text = _log([(1.0 * i, f"INFO [train.py:23] [rank0] step {i} loss 1.25") for i in range(120)])
    s = judge(split_text(text), mtime=1000.0, now=1300.0, alive=None)
    assert s.stalled and s.phase == TRAINING and s.cadence_s == 1.0 and s.silent_s == 300
    assert s.reason.startswith("training, it wrote every ~1 s; silent for 5 min")


def test_cadence_of_bursts_and_of_slow_logs() -> None:
    # a 5-line report every 30 s: the cadence is 30 s (lines of a burst are one write), limit 10 x 30 s
    rows = [(30.0 * b + 0.001 * j, f"INFO eval: step {b} part {j}") for b in range(10) for j in range(5)]
    s = judge(split_text(_log(rows)), mtime=0.0, now=200.0)
    assert s.cadence_s == 30.0 and s.threshold_s == 300.0 and not s.stalled
    assert judge(split_text(_log(rows)), mtime=0.0, now=301.0).stalled
    # two time-stamped lines only: the fixed limit decides
    few = judge(split_text(_log([(0, "INFO step 1"), (5, "INFO step 2")])), mtime=0.0, now=500.0)
    assert few.cadence_s is None and few.threshold_s == 600.0 and not few.stalled
    assert "too few time-stamped lines" in few.reason
    assert judge(split_text(_log([(0, "INFO step 1")])), mtime=0.0, now=601.0).stalled


def test_recorded_hang_log_is_stalled_45s_later_with_a_lower_floor() -> None:
    text = (HANG / "node0.log").read_text().split("W1130")[0]  # the log as it stood during the hang
    lines = split_text(text)
    assert judge(lines, mtime=0.0, now=45.0).stalled is False  # 45 s < the 60 s floor
    s = judge(lines, mtime=0.0, now=45.0, floor=20.0)
    assert s.stalled and s.phase == TRAINING and s.cadence_s == 2.0


@pytest.mark.parametrize(
    "line, phase",
    [
        ("=== Step 1: Launching vLLM server ===", STARTING),
        ("INFO 05-09 17:20:00 [launcher.py:37] Application startup complete.", SERVING),
        ("{'loss': 0.5213, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.12}", TRAINING),
        (" iteration      100/    1000 | consumed samples: 3200 | elapsed time per iteration (ms): 950.2", TRAINING),
        ("Capturing CUDA graph shapes: 100%|██████████| 67/67 [00:12<00:00,  5.2it/s]", STARTING),
    ],
)
def test_phase_of_a_last_line(line: str, phase: str) -> None:
    assert judge(split_text(line + "\n"), mtime=0.0, now=10.0).phase == phase


def test_a_log_of_request_answers_is_serving_not_starting() -> None:
    """No start-up line in view, only a server answering (even 4xx): idle for an hour is healthy, not a stall."""
    from fleetdiag.analysis import load_rules
    from fleetdiag.analysis.lines import parse_all
    from fleetdiag.evidence.hang import judge_silence
    from fleetdiag.records import Line

    text = [
        'INFO:     10.0.0.5:1886 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
        'INFO:     10.0.0.5:1887 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    ]
    lines = [Line(pos=i * 100, text=t, lineno=i + 1) for i, t in enumerate(text)]
    sil = judge_silence(parse_all(lines), 1000.0, 1000.0 + 3600, load_rules(), 600.0)
    assert sil.phase == "serving" and not sil.stalled, sil
    waiting = [Line(pos=0, text="INFO 05-09 15:15:08 Loading model weights took 3.1 GB", lineno=1)]
    assert judge_silence(parse_all(waiting), 1000.0, 1000.0 + 3600, load_rules(), 600.0).stalled
