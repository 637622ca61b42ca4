"""Kernel and GPU evidence through the product: ``fleetdiag probe`` over a real OpenSSH sshd (every corpus case
end to end: test_kernel_corpus_probe.py).

The node's ``dmesg`` / ``journalctl`` / ``nvidia-smi`` are the recorded-output stand-ins of
tests/standins_kernel, put first on the node's PATH with ``--path-prepend`` (as the demo does); the
application's log is the corpus case's own, last written when its kernel fault hit.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.evidence.kernel import Clock, split_time
from fleetdiag.exitcodes import Exit, exit_for
from fleetdiag.probe import finish
from fleetdiag.records import FunnelResult, Line
from fleetdiag.render import fleet_view
from fleetdiag.store import Store, incident_key
from fleetdiag.timestamps import epoch

from .test_kernel_evidence import (
    CORPUS,
    FIXTURES,
    H200_ROW,
    STANDINS,
    _smi_spec,
)


def _standin_bin(d: Path, *, mode: str, kern: Path | None, smi: Path | None) -> Path:
    """A directory of dmesg/journalctl/nvidia-smi that serve this node's recorded output over ssh
    (sshd passes no environment: each wrapper sets what its stand-in reads)."""
    d.mkdir(parents=True, exist_ok=True)
    env = {"FD_STANDIN_MODE": mode, "FD_STANDIN_KERN": str(kern or "/dev/null"), "FD_STANDIN_SMI": str(smi or "")}
    for tool in ("dmesg", "journalctl", "nvidia-smi"):
        exe = d / tool
        exe.write_text(
            "#!/bin/sh\n"
            + "".join(f"{k}='{v}'; export {k}\n" for k, v in env.items())
            + f"exec '{STANDINS / tool}' \"$@\"\n"
        )
        exe.chmod(0o755)
    return d


def _probe(sshd, inv: Path, bindir: Path, *extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(
        main,
        [
            "--no-color",
            "-i",
            str(inv),
            "probe",
            "all",
            "--path-prepend",
            str(bindir),
            *sshd.cli_args(),
            *extra,
        ],
        env={"COLUMNS": "200", "NO_COLOR": "1"},
    )
    return r.exit_code, r.output


def _kernel_time(case: dict, mode: str) -> float:
    """When the case's decisive kernel line was logged, as the node will report it (the fixture's clock)."""
    up = float(Path("/proc/uptime").read_text().split()[0])
    clock = Clock(now=time.time(), uptime=up, tz_offset=0)
    kern = (CORPUS / case["files"]["kern"]).read_text(encoding="utf-8").splitlines()
    line = next(ln for ln in kern if case["decisive_kernel_line"] in ln)
    if mode == "journal":  # the journal stand-in gives syslog stamps the latest year not in the future
        m = re.match(r"([A-Za-z]{3})\s+(\d{1,2})\s+(\d\d:\d\d:\d\d)", line)
        assert m, line
        line = f"{m.group(1)} {m.group(2)} {m.group(3)} n kernel: x"
    t, _ = split_time(line, clock, {})
    assert t is not None, line
    return t


def test_probe_card_shows_the_kernel_cause_and_the_consequence(sshd, tmp_path: Path, write_inventory) -> None:
    """sirzzang: Xid 48 on the failing GPU; the card puts the app's ECC error under it."""
    case = json.loads((CORPUS / "sirzzang-rtxpro6000-xid48-dbe.json").read_text(encoding="utf-8"))
    kern = CORPUS / case["files"]["kern"]
    bindir = _standin_bin(tmp_path / "bin", mode="journal", kern=kern, smi=_smi_spec(case, tmp_path))
    log = tmp_path / "app.log"
    log.write_bytes((CORPUS / case["files"]["app"]).read_bytes())
    t = _kernel_time(case, "journal") + 30
    os.utime(log, (t, t))
    code, out = _probe(sshd, write_inventory({"gpu-node-a": log}), bindir)
    assert code == Exit.FAILED, out
    assert "kernel line" in out and "Xid (PCI:0000:55:00): 48" in out
    assert "kernel log (journalctl)" in out and "Xid 48 · hardware" in out
    cons = next(ln for ln in out.splitlines() if "consequence" in ln)
    assert "uncorrectable ECC error" in cons


def _benign_bin(tmp: Path, smi_rows: dict) -> Path:
    kern = tmp / "kern.log"
    kern.write_text((FIXTURES / "kernel" / "h200-boot-nvrm-benign.txt").read_text(encoding="utf-8"))
    smi = tmp / "smi.json"
    smi.write_text(json.dumps(smi_rows))
    return _standin_bin(tmp / "bin", mode="dmesg", kern=kern, smi=smi)


def test_benign_h200_lines_next_to_an_app_error_leave_it_decisive(sshd, tmp_path: Path, write_inventory) -> None:
    bindir = _benign_bin(tmp_path, {"gpus": [H200_ROW]})
    log = tmp_path / "app.log"
    log.write_text(
        "INFO 05-15 08:57:29 [engine.py:10] starting\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 139.81 GiB of which 1.00 GiB is free.\n"
    )
    code, out = _probe(sshd, write_inventory({"node": log}), bindir, "--json")
    (host,) = json.loads(out)["hosts"]
    assert host["verdict"] == "failed" and code == Exit.FAILED
    d = host["decisive"]
    assert d["source"] == "log" and d["consequence"] is None and "CUDA out of memory" in d["line"]
    assert host["facts"]["kernel_log"]["source"] == "dmesg" and host["facts"]["kernel_log"]["lines"] >= 5
    assert [e["source"] for e in host["evidence"]] == ["log"]  # benign lines are never evidence


def test_lost_gpu_with_a_healthy_log_is_degraded(sshd, tmp_path: Path, write_inventory) -> None:
    lost = (CORPUS / "pubsum-k80-xid79.smi.txt").read_text(encoding="utf-8").splitlines()[0]
    bindir = _benign_bin(
        tmp_path, {"gpus": [{**H200_ROW, "index": 1, "pci.bus_id": "00000000:2A:00.0"}], "lost": [lost]}
    )
    log = tmp_path / "app.log"
    log.write_text(
        (Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "healthy.log").read_text(
            encoding="utf-8"
        )
    )
    code, out = _probe(sshd, write_inventory({"node": log}), bindir, "--json")
    (host,) = json.loads(out)["hosts"]
    assert code == Exit.FAILED and host["verdict"] == "degraded", host
    assert host["decisive"] is None
    assert "GPU lost: nvidia-smi cannot reach it" in host["summary"]
    assert any(e["source"] == "gpu" and e["kind"] == "lost" for e in host["evidence"])
    code, out = _probe(sshd, write_inventory({"node": log}), bindir)
    assert code == Exit.FAILED
    assert "DEGRADED" in out and "GPU health" in out and "GPU lost" in out


def test_unreadable_kernel_log_is_a_fact_with_its_fix_on_the_card(sshd, tmp_path: Path, write_inventory) -> None:
    bindir = _standin_bin(tmp_path / "bin", mode="denied", kern=None, smi=None)
    log = tmp_path / "app.log"
    log.write_text("RuntimeError: shapes mismatch\n")
    code, out = _probe(sshd, write_inventory({"node": log}), bindir, "--json")
    (host,) = json.loads(out)["hosts"]
    fact = host["facts"]["kernel_log"]
    assert fact["kernel_log"] == "unreadable" and "systemd-journal" in fact["fix"]
    assert host["decisive"]["source"] == "log" and code == Exit.FAILED
    _, out = _probe(sshd, write_inventory({"node": log}), bindir)
    assert "kernel log" in out and "unreadable" in out
    fix = next(ln for ln in out.splitlines() if re.search(r"│ fix\b", ln))
    assert "usermod -aG adm,systemd-journal" in fix


# ---------------------------------------------------------------- the decision step alone (probe.finish, no SSH)

NOW = 1_780_000_000.0  # the node's clock
HEALTH_HEAD = (
    "index, pci.bus_id, uuid, ecc.errors.uncorrected.volatile.total, remapped_rows.failure, "
    "pcie.link.width.current, pcie.link.width.max"
)


def _kernel_records(lines: list[str], health: list[str] | None, unreadable: bool = False) -> list[str]:
    out = [f"@@fd_kernel_clock now={NOW:.0f} uptime=100000.5 tz=+0000"]
    if unreadable:
        out.append("@@fd_kernel_unreadable dmesg_restrict=1 user=alice groups=alice")
    else:
        out += ["@@fd_kernel_source source=dmesg", *lines, "@@fd_kernel_end"]
    if health is not None:
        out += ["@@fd_gpu_health status=ok fields=x", HEALTH_HEAD, *health, "@@fd_gpu_health_end"]
    return out


def _fr(log: list[str] | None, kernel: list[str], idle: float = 5.0) -> FunnelResult:
    fr = FunnelResult(path="/w/run.log", status="ok" if log is not None else "missing", mtime=NOW - idle, now=NOW)
    pos = 0
    for text in log or []:
        fr.tail.append(Line(pos, text, None))
        pos += len(text) + 1
    fr.kernel = kernel
    return fr


def _boot(t: float) -> str:
    """A dmesg stamp for epoch ``t`` on the node above."""
    return f"[{t - (NOW - 100000.5):12.6f}]"


GPUS = [f"{i}, 00000000:{0x18 + i:02X}:00.0, GPU-{i}, 0, No, 16, 16" for i in range(4)]


def test_rank_maps_to_its_gpu_through_cuda_visible_devices() -> None:
    """rank 1 under CUDA_VISIBLE_DEVICES=2,3 runs on host GPU 3 (bus 1b:00): the Xid there is the cause,
    not the one on GPU 2 logged at the same moment."""
    t = NOW - 8
    kern = [
        f"{_boot(t)} NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected",
        f"{_boot(t)} NVRM: Xid (PCI:0000:1a:00): 48, An uncorrectable double bit error (DBE) has been detected",
    ]
    log = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 9, in <module>',
        "[rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
    ]
    facts = {"cuda_visible_devices": "2,3", "gpus": [{"index": i, "uuid": f"GPU-{i}"} for i in range(4)]}
    res = finish("n", _fr(log, _kernel_records(kern, GPUS)), load_rules(), facts=facts)
    d = res.decisive
    assert res.verdict == "failed" and d.source == "kernel" and d.category == "hardware"
    assert "(PCI:0000:1b:00): 48" in d.line and "GPU 1b:00" in d.reason
    assert d.consequence == log[-1] and d.exception_type == "Xid 48"
    kernel_ev = [e for e in res.evidence if e["source"] == "kernel"]
    assert [e["gpu"] for e in kernel_ev] == [3, 2]  # bus ids become GPU indices through nvidia-smi


def test_faulty_gpu_of_the_failing_rank_is_the_cause_when_the_kernel_log_is_unreadable() -> None:
    health = [*GPUS[:1], "1, 00000000:19:00.0, GPU-1, 7, No, 16, 16"]
    log = ["[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered"]
    res = finish("n", _fr(log, _kernel_records([], health, unreadable=True)), load_rules(), facts={})
    d = res.decisive
    assert d.source == "gpu" and d.category == "hardware" and "GPU 1: 7 uncorrectable ECC errors" in d.line
    assert d.consequence == log[0] and res.verdict == "failed"
    assert res.facts["kernel_log"]["kernel_log"] == "unreadable"


def test_silent_log_stopped_by_the_oom_killer_fails_with_the_kernel_cause() -> None:
    """No error in the log; it fell silent 5 min ago, when the kernel killed the trainer."""
    stop = NOW - 300
    kern = [
        f"{_boot(stop - 2)} python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0",
        f"{_boot(stop - 1)} Out of memory: Killed process 4242 (python) total-vm:9kB, anon-rss:8kB",
    ]
    log = ["epoch 3 step 100 loss 1.25", "epoch 3 step 200 loss 1.21"]
    res = finish("n", _fr(log, _kernel_records(kern, GPUS), idle=300), load_rules(), facts={})
    d = res.decisive
    assert res.verdict == "failed" and d.source == "kernel" and d.category == "host-oom"
    assert "Killed process 4242" in d.line and d.consequence is None and "fell silent" in d.reason
    # the same lines an hour before the log's end are history, not the cause
    res = finish("n", _fr(log, _kernel_records(kern, GPUS), idle=300 - 3600), load_rules(), facts={})
    assert res.verdict == "healthy" and res.decisive is None
    assert any(e["kind"] == "oom-kill" for e in res.evidence)


def test_a_live_log_is_not_failed_by_an_old_kernel_event() -> None:
    kern = [f"{_boot(NOW - 30)} NVRM: Xid (PCI:0000:18:00): 13, pid=99, name=other, Graphics Exception"]
    res = finish("n", _fr(["serving 200 OK"], _kernel_records(kern, GPUS), idle=2), load_rules(), facts={})
    assert res.verdict == "healthy" and res.decisive is None


def test_idle_node_without_a_log_but_with_a_lost_gpu_is_degraded_and_an_incident(tmp_path: Path) -> None:
    health = [*GPUS[:1], "Unable to determine the device handle for GPU 0000:19:00.0: Unknown Error"]
    res = finish("n", _fr(None, _kernel_records([], health)), load_rules(), facts={})
    assert res.verdict == "degraded" and "log not found" in (res.error or "")
    assert "GPU lost" in res.summary
    key = incident_key(res)
    assert key and key.startswith("degraded:")
    again = finish("n2", _fr(None, _kernel_records([], health)), load_rules(), facts={})
    assert incident_key(again) == key  # the same fault on two nodes: one cause
    ok = finish("n3", _fr(["serving 200 OK"], _kernel_records([], GPUS)), load_rules(), facts={})
    assert ok.verdict == "healthy"
    assert exit_for([ok, res]) is Exit.FAILED
    assert str(fleet_view([res, again, ok]).title) == "3 hosts: 2 degraded · 1 healthy"
    with Store(tmp_path / "h.sqlite3") as st:  # a sweep raises it as an incident, then sees it resolved
        first = st.record_sweep([res, ok], started=NOW)
        assert [(c.host, c.verdict) for c in first.new] == [("n", "degraded")]
        fixed = finish("n", _fr(None, _kernel_records([], GPUS)), load_rules(), facts={})
        assert fixed.verdict == "no-log"
        second = st.record_sweep([fixed, ok], started=NOW + 60)
        assert [c.host for c in second.changed] == ["n"] and second.changed[0].previous.verdict == "degraded"


def test_epoch_reads_the_log_stamps_on_the_host_clock() -> None:
    assert epoch("2026-05-15T08:57:36.5Z", 0, NOW) == 1_778_835_456.5
    assert epoch("2026-05-15 10:57:36", 7200, NOW) == 1_778_835_456.0
    assert epoch("05-15 08:57:36", 0, NOW) == 1_778_835_456.0  # vLLM: no year
    assert epoch("0515 08:57:36.000001", 0, NOW) == pytest.approx(1_778_835_456.0)  # glog
    assert epoch("May 15 08:57:36", 0, NOW) == 1_778_835_456.0
    assert epoch("12-31 23:00:00", 0, NOW) == epoch("2025-12-31 23:00:00", 0, NOW)  # not in the future
    assert epoch("soon", 0, NOW) is None and epoch(None, 0, NOW) is None
