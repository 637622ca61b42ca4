"""fleetdiag's parsers and analysis on outputs recorded on a real 2-GPU host (tests/fixtures/device/README.md).

No SSH and no GPU here: the recordings are the input, the assertions are what an operator needs to read off them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fleetdiag.analysis import analyze_text
from fleetdiag.evidence.gpu_health import degraded, parse_health
from fleetdiag.evidence.kernel import parse_sections
from fleetdiag.evidence.stacks import (
    COLLECTIVE,
    RUNNING,
    SLEEP,
    ProcStack,
    evidence,
    parse_pyspy,
    parse_pyspy_json,
    parse_stacks,
    stragglers,
    where_waits,
)
from fleetdiag.job import (
    HostEvidence,
    classify,
    evidence_from_result,
    root_causes,
    summary_line,
)
from fleetdiag.job.rules import default_job_rules
from fleetdiag.records import HostResult

DEV = Path(__file__).resolve().parent / "fixtures" / "device"
KERNEL_SH = Path(__file__).resolve().parents[1] / "fleetdiag" / "remote" / "kernel.sh"
MTIME = datetime(2026, 11, 30, 19, 40, tzinfo=timezone.utc).timestamp()  # the logs were written that evening
RULES = default_job_rules()


def read(rel: str) -> str:
    return (DEV / rel).read_text()


def host(name: str, rel: str) -> HostEvidence:
    """A host's evidence the way the probe builds it: the analyzer's decisive line, then the job's view of it."""
    text = read(rel)
    d = analyze_text(text)
    assert d.decisive is not None, rel
    hr = HostResult(host=name, verdict=d.verdict, decisive=d.decisive, facts={}, address=None)
    ev = evidence_from_result(hr, lines=text.splitlines(), mtime=MTIME, zone="UTC")
    assert ev is not None
    return ev


# ---------------------------------------------------------------- the two-node job: rank 1 fails, rank 0 times out


def test_failing_node_decisive_line_is_the_real_error() -> None:
    d = analyze_text(read("job/node1.log"))
    assert d.verdict == "failed" and d.decisive is not None
    assert d.decisive.line == (
        "[rank1]: RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x1024 and 4096x1000)"
    )
    assert d.decisive.rank == 1
    # not the launcher's summary of it
    assert "ChildFailedError" not in d.decisive.line and "exitcode" not in d.decisive.line
    assert classify(host("node1", "job/node1.log"), RULES) == ""  # local-origin


def test_victim_node_decisive_line_is_peer_caused() -> None:
    d = analyze_text(read("job/node0.log"))
    assert d.decisive is not None
    assert "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE" in d.decisive.line
    assert d.decisive.rank == 0
    # the abort, the SIGABRT and the agent's exitcode -6 that follow are consequences, not the decisive line
    assert "SIGABRT" not in d.decisive.line and "exitcode" not in d.decisive.line
    assert classify(host("node0", "job/node0.log"), RULES) == "collective timeout"


@pytest.mark.parametrize("order", [("node0", "node1"), ("node1", "node0")])
def test_two_node_job_root_cause_is_node1_rank1(order: tuple[str, str]) -> None:
    evs = [host(n, f"job/{n}.log") for n in order]
    (rc,) = root_causes(evs)
    assert rc.host == "node1" and rc.rank == 1
    assert "mat1 and mat2 shapes cannot be multiplied" in rc.line
    assert rc.affected == ["node0"]
    # the error line has no stamp; its process's exit (the agent's E1130 19:34:59 line) bounds it
    assert rc.time is not None and rc.time.startswith("2026-11-30T19:34:5")
    (cons,) = rc.consequences
    assert cons[0] == "node0" and cons[1] == "collective timeout"
    assert cons[2] is not None and 25 <= cons[2] <= 35  # the 30 s process-group timeout, as logged
    line = summary_line(rc)
    assert line.startswith("job root cause: node1 · rank 1 · RuntimeError: mat1 and mat2")
    assert "node0 (collective timeout" in line


def test_two_node_job_needs_the_log_lines_around_an_unstamped_error() -> None:
    """A Python error line carries no time stamp: from bare HostResults (decisive line and traceback only) the
    failing host has no time, the loopback rendezvous identifies nothing, and no claim is made. The log lines
    read around it (``evidence_from_result(..., lines=...)``) supply the time, as above."""
    results = []
    for n in ("node0", "node1"):
        d = analyze_text(read(f"job/{n}.log"))
        results.append(
            HostResult(
                host=n,
                verdict=d.verdict,
                decisive=d.decisive,
                facts={"clock": {"offset": 0.0}, "zone": "UTC", "log_mtime": MTIME},
            )
        )
    assert results[1].decisive is not None and results[1].decisive.time is None
    assert root_causes(results) == []


# ---------------------------------------------------------------- the hang, ended by SIGTERM to both agents


def test_hang_ended_by_sigterm_makes_no_job_claim() -> None:
    evs = [host(n, f"hang/{n}.log") for n in ("node0", "node1")]
    for ev in evs:
        assert "SignalException: Process" in ev.line and "got signal: 15" in ev.line
        assert classify(ev, RULES) != ""  # the agent's SIGTERM is a consequence
    # both sides show only consequences and no watchdog names a SeqNum yet: no root from the logs alone
    assert root_causes(evs) == []


# ---------------------------------------------------------------- the wrong-script-path one-liner


def test_wrong_script_path_decisive_line_is_pythons() -> None:
    d = analyze_text(read("oneliner/torchrun_nonexistent.log"))
    assert d.verdict == "failed" and d.decisive is not None
    assert d.decisive.line == (
        "/opt/torch/.venv/bin/python: can't open file '/nonexistent/train.py': [Errno 2] No such file or directory"
    )


# ---------------------------------------------------------------- py-spy dumps of the hang


def _proc(rank: int, threads: list) -> ProcStack:
    """The process as stacks.sh sees it: py-spy's threads plus the /proc state and wchan recorded beside them."""
    first = read(f"hang/proc_rank{rank}.txt").splitlines()
    pid, wchan = (kv.split("=", 1)[1] for kv in first[0].split())
    state = next(ln.split()[1] for ln in first if ln.startswith("State:"))
    return ProcStack(pid=int(pid), threads=threads, state=state, wchan=wchan)


@pytest.mark.parametrize("form", ["txt", "native", "json"])
def test_pyspy_names_load_next_batch_and_the_cuda_sync(form: str) -> None:
    def load(rank: int):
        if form == "json":
            return parse_pyspy_json(read(f"hang/pyspy_rank{rank}.json"))
        name = f"pyspy_native_rank{rank}.txt" if form == "native" else f"pyspy_rank{rank}.txt"
        return parse_pyspy(read(f"hang/{name}"))

    (t0,) = load(0)
    (t1,) = load(1)
    assert (t0.tid, t0.name, t1.tid, t1.name) == (1053, "MainThread", 1054, "MainThread")
    py0 = [f.name for f in t0.frames if not f.native]
    py1 = [f.name for f in t1.frames if not f.native]
    assert py0[:4] == ["synchronize", "train_step", "main", "<module>"]
    assert py1[:3] == ["load_next_batch", "main", "<module>"]
    w0, w1 = where_waits(_proc(0, [t0])), where_waits(_proc(1, [t1]))
    assert w0.kind == COLLECTIVE and w1.kind == SLEEP
    assert w1.where == "load_next_batch (hang.py:12)"
    if form == "native":  # the driver call is the wait; the Python frame nearest it says where
        assert (w0.at, w0.where) == ("cuCtxSynchronize_v2", "synchronize (torch/cuda/__init__.py:1162)")
        assert w1.at == "clock_nanosleep"
    else:  # torch's synchronize is the wait; time.sleep is C code py-spy shows only natively: wchan says sleep
        assert (w0.at, w0.where) == ("synchronize", "train_step (hang.py:18)")
        assert (w1.at, w1.via) == ("hrtimer_nanosleep", "py-spy+wchan")
        bare = where_waits(ProcStack(pid=1054, threads=[t1]))  # py-spy alone: where, but not what
        assert (bare.kind, bare.where) == ("unknown", "load_next_batch (hang.py:12)")


def test_proc_views_of_the_hang() -> None:
    """/proc as read during the hang: the sleeper's wchan, the spinning rank running."""
    r0, r1 = read("hang/proc_rank0.txt"), read("hang/proc_rank1.txt")
    assert r0.startswith("pid=1053 wchan=0\n") and "State:\tR (running)" in r0
    assert r1.startswith("pid=1054 wchan=hrtimer_nanosleep\n") and "State:\tS (sleeping)" in r1
    assert "hrtimer_nanosleep" in r1.split("--- /proc/1054/stack", 1)[1]
    assert read("hang/gpu_util.csv").splitlines() == ["index, utilization.gpu [%]", "0, 100 %", "1, 0 %"]


# ---------------------------------------------------------------- fleetdiag's stacks.sh, run on that host


def test_stacks_sh_names_rank1_the_straggler() -> None:
    rep = parse_stacks(read("hang/stacks_sh.txt"))
    assert rep.uid == 0 and rep.pyspy and rep.notes() == []
    assert rep.gpu_of_pid == {1053: 0, 1054: 1}
    assert [(g.index, g.util) for g in rep.gpus] == [(0, 100.0), (1, 0.0)]
    by = {p.rank: p for p in rep.procs}
    assert set(by) == {0, 1}
    assert all(p.pyspy_status == "ok" and p.pyspy_mode == "native" for p in rep.procs)
    w0, w1 = where_waits(by[0]), where_waits(by[1])
    assert w0.kind == COLLECTIVE and w0.at == "cuCtxSynchronize_v2"
    assert w1.kind == SLEEP and w1.where == "load_next_batch (hang.py:12)"
    assert [p.rank for p in stragglers(rep.procs)] == [1]
    ev = {e["pid"]: e for e in evidence(rep)}
    assert "the straggler" in ev[1054]["line"] and "load_next_batch" in ev[1054]["line"]
    assert ev[1054]["gpu"] == 1 and "GPU 1 at 0 %" in ev[1054]["line"]
    assert "the straggler" not in ev[1053]["line"] and "GPU 0 at 100 %" in ev[1053]["line"]


def test_stacks_without_pyspy_falls_back_to_wchan_and_gpu_use() -> None:
    """The same capture without py-spy frames: thread states, wchan and GPU use still name the straggler."""
    rep = parse_stacks(read("hang/stacks_sh.txt"))
    for p in rep.procs:
        p.threads = []
    by = {p.rank: p for p in rep.procs}
    w0, w1 = where_waits(by[0]), where_waits(by[1])
    assert (w0.kind, w0.via) == (RUNNING, "wchan")
    assert (w1.kind, w1.via) == (SLEEP, "wchan")
    util = {pid: rep.util_of_pid(pid) for pid in rep.gpu_of_pid}
    assert [p.rank for p in stragglers(rep.procs, util)] == [1]


def test_stacks_sh_discovery_finds_ranks_and_agents() -> None:
    rep = parse_stacks(read("hang/stacks_sh_find.txt"))
    assert rep.found == 4
    ranks = {p.rank: p.pid for p in rep.procs if p.rank is not None}
    assert ranks == {0: 1053, 1: 1054}
    late = {p.pid for p in stragglers(rep.procs, {pid: rep.util_of_pid(pid) for pid in rep.gpu_of_pid})}
    assert 1054 in late and 1053 not in late


def test_stacks_sh_discovery_does_not_call_the_launchers_stragglers() -> None:
    rep = parse_stacks(read("hang/stacks_sh_find.txt"))
    late = {p.pid for p in stragglers(rep.procs, {pid: rep.util_of_pid(pid) for pid in rep.gpu_of_pid})}
    assert late == {1054}


# ---------------------------------------------------------------- GPU health, both field-name generations

HEALTHY = [(0, "00:06"), (1, "00:07")]


def _check_healthy(text: str) -> None:
    gpus = parse_health(text)
    assert [(g.index, g.bus) for g in gpus] == HEALTHY
    for g in gpus:
        assert g.ecc_uncorrected_volatile == 0
        assert g.retired_pages_pending is None  # [N/A] on an H200: row remapping replaced page retirement
        assert (g.remapped_rows_pending, g.remapped_rows_failure) == (False, False)
        assert g.pcie_gen == (5, 5) and g.pcie_width == (16, 16)
        assert g.clock_reasons == [] and g.faults == []
    assert degraded(gpus) == []


@pytest.mark.parametrize("name", ["health_event.csv", "health_throttle.csv"])
def test_health_csv_of_a_healthy_host(name: str) -> None:
    _check_healthy(read(f"smi/{name}"))


@pytest.mark.parametrize("generation", ["clocks_event_reasons", "clocks_throttle_reasons"])
def test_health_reads_clock_reasons_under_either_name(generation: str) -> None:
    """This driver answers with the new names even when asked with the old; an older one prints the old names.
    Both headers must reach the same field: the same recording with one reason switched on, under each name."""
    header, *rows = read("smi/health_event.csv").splitlines()
    assert "clocks_event_reasons.hw_slowdown" in header  # what driver 580 printed for either query
    header = header.replace("clocks_event_reasons.", f"{generation}.")
    _check_healthy("\n".join([header, *rows]))
    cells = rows[0].split(", ")
    cells[header.split(", ").index(f"{generation}.hw_slowdown")] = "Active"
    gpus = parse_health("\n".join([header, ", ".join(cells), rows[1]]))
    assert gpus[0].clock_reasons == ["hw_slowdown"] and gpus[1].clock_reasons == []
    assert gpus[0].faults == ["clocks held down: hw slowdown"]
    assert degraded(gpus) == []  # held-down clocks are a fault to show, not a degraded host


def test_kernel_sh_output_of_a_healthy_host() -> None:
    kc = parse_sections(read("smi/kernel_sh.txt"))
    assert kc.source == "dmesg" and kc.unreadable is None  # journalctl is not installed there
    assert kc.smi_status == "ok" and kc.smi_fields is not None
    assert "clocks_event_reasons.hw_slowdown" in kc.smi_fields
    events = kc.events()
    assert events and all(e.benign for e in events)
    assert any("NVRM: loading NVIDIA UNIX Open Kernel Module" in e.line for e in events)
    gpus = parse_health(kc.smi)
    assert [(g.index, g.bus) for g in gpus] == HEALTHY and degraded(gpus) == []
    assert [g.uuid for g in gpus] == [
        "GPU-25843052-6170-00a1-70e9-79c0cb7ccc7b",
        "GPU-20c84b6e-bce0-2ef1-5ce9-fbe9155fe3a2",
    ]


# ---------------------------------------------------------------- kernel.sh's choice of field names


def _stand_in_smi(tmp_path: Path, help_text: str) -> tuple[Path, Path]:
    """An nvidia-smi that prints the recorded help text and the recorded health CSV, logging each query; a
    field its help text does not list is refused with the driver's own words, as a real driver refuses it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "help.txt").write_text(help_text)
    csv = "\n".join(parse_sections(read("smi/kernel_sh.txt")).smi) + "\n"
    (tmp_path / "health.csv").write_text(csv)
    log = tmp_path / "queries.log"
    smi = bindir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  --help-query-gpu) echo help >> '{log}'; cat '{tmp_path}/help.txt' ;;
  --query-gpu=*)
    printf '%s\\n' "$1" >> '{log}'
    for f in $(printf '%s' "${{1#--query-gpu=}}" | tr ',' ' '); do
      if ! grep -q "\"$f\"" '{tmp_path}/help.txt'; then
        echo "Field \"$f\" is not a valid field to query."; exit 2
      fi
    done
    cat '{tmp_path}/health.csv' ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
""")
    smi.chmod(0o755)
    return bindir, log


SHELLS = [sh for sh in ("sh", "dash", "busybox sh") if shutil.which(sh.split()[0])]


def _gpu_health(bindir: Path, shell: str = "sh") -> str:
    cmd = f". '{KERNEL_SH}'; fd_kernel_gpu_health"
    out = subprocess.run(
        [*shell.split(), "-c", cmd],
        check=False,
        env={"PATH": f"{bindir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_kernel_sh_picks_event_reason_names_from_the_real_help(tmp_path: Path, shell: str) -> None:
    bindir, log = _stand_in_smi(tmp_path, read("smi/help_query_gpu.txt"))
    out = _gpu_health(bindir, shell)
    (query,) = log.read_text().splitlines()  # one call: no --help-query-gpu before it, no retry
    fields = query.removeprefix("--query-gpu=").split(",")
    reasons = [f for f in fields if f.startswith("clocks_")]
    assert reasons == [
        "clocks_event_reasons.hw_slowdown",
        "clocks_event_reasons.hw_thermal_slowdown",
        "clocks_event_reasons.hw_power_brake_slowdown",
        "clocks_event_reasons.sw_thermal_slowdown",
    ]
    help_text = read("smi/help_query_gpu.txt")
    assert all(f'"{f}"' in help_text for f in fields)  # every field asked for is one this driver lists
    # the query is the very one the real driver answered on that host
    assert f"fields={','.join(fields)}" in read("smi/kernel_sh.txt")
    kc = parse_sections(out)
    assert kc.smi_fields == ",".join(fields)
    assert degraded(parse_health(kc.smi)) == []


@pytest.mark.parametrize("shell", SHELLS)
def test_kernel_sh_picks_throttle_names_when_the_help_lacks_event_names(tmp_path: Path, shell: str) -> None:
    """A driver before the rename lists only clocks_throttle_reasons.*: the recorded text with the new names cut."""
    old = re.sub(r'"clocks_event_reasons\.\w+" or ', "", read("smi/help_query_gpu.txt"))
    assert '"clocks_event_reasons.' not in old and '"clocks_throttle_reasons.hw_slowdown"' in old
    bindir, log = _stand_in_smi(tmp_path, old)
    kc = parse_sections(_gpu_health(bindir, shell))
    refused, query = log.read_text().splitlines()  # today's names refused, then the older ones
    assert "clocks_event_reasons.hw_slowdown" in refused
    assert kc.smi_status == "ok" and kc.smi_fields == query.removeprefix("--query-gpu=")
    reasons = [f for f in query.removeprefix("--query-gpu=").split(",") if f.startswith("clocks_")]
    assert reasons == [
        "clocks_throttle_reasons.hw_slowdown",
        "clocks_throttle_reasons.hw_thermal_slowdown",
        "clocks_throttle_reasons.hw_power_brake_slowdown",
        "clocks_throttle_reasons.sw_thermal_slowdown",
    ]
