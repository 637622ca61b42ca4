"""Kernel evidence: every real case of the kernel corpus through kernel.sh, the parsers and the decision.

kernel.sh runs for real under sh with stand-in dmesg / journalctl / nvidia-smi first on PATH; the stand-ins
print the recorded real lines and honour the flags kernel.sh calls them with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetdiag.analysis import analyze_text
from fleetdiag.evidence.correlate import AppError, correlate, decide
from fleetdiag.evidence.gpu_health import degraded, parse_health
from fleetdiag.evidence.kernel import (
    Clock,
    bus_key,
    parse_kernel_lines,
    parse_sections,
    split_time,
)
from fleetdiag.evidence.xid import XidTableError, default_xid_table, load_xid_table
from fleetdiag.timestamps import epoch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "fleetdiag" / "remote" / "kernel.sh"
STANDINS = Path(__file__).resolve().parent / "standins_kernel"
SHARED = Path(os.environ.get("FLEETDIAG_SHARED", "/work/shared"))
CORPUS = SHARED / "corpus" / "kernel"
FIXTURES = SHARED / "fixtures"
CASES = sorted(CORPUS.glob("*.json"))

# action class expected by case kind; 'other' cases say it in their meaning (hung tasks: driver hang; Xid 8: app)
BY_KIND = {
    "ecc": "hardware",
    "gpu-lost": "hardware",
    "xid-hw": "hardware",
    "xid-driver": "driver",
    "xid-nvlink": "hardware",
    "pcie": "hardware",
    "gsp-timeout": "driver",
    "xid-sw-app": "application",
    "oom-killer": "host-oom",
}
OTHER = {"gpud117-xid45-hung-task": "driver", "llamacpp27102-xid8-rc-watchdog": "application"}

H200_ROW = {
    "index": 0,
    "pci.bus_id": "00000000:18:00.0",
    "uuid": "GPU-21b026da-3a23-ca8c-52da-f8eedc850d97",
    "name": "NVIDIA H200",
    "ecc.errors.uncorrected.volatile.total": 0,
    "retired_pages.pending": "[N/A]",
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
    "pcie.link.gen.current": 5,
    "pcie.link.gen.max": 5,
    "pcie.link.width.current": 16,
    "pcie.link.width.max": 16,
    "clocks_event_reasons.active": "0x0000000000000001",
    "clocks_event_reasons.hw_slowdown": "Not Active",
    "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
    "clocks_event_reasons.hw_power_brake_slowdown": "Not Active",
    "clocks_event_reasons.sw_thermal_slowdown": "Not Active",
}


def _mode(case: dict) -> str:
    """Which real source serves this case's lines: the journal for syslog forms, dmesg for its own forms,
    /var/log/kern.log for bare 'kernel:' or grep output."""
    fmt = case.get("kern_time_format", "")
    if "journald" in fmt or "syslog" in fmt:
        return "journal"
    if fmt.startswith("dmesg"):
        return "dmesg"
    return "kernlog"


def _smi_spec(case: dict, tmp: Path) -> Path:
    smi = case["files"].get("smi")
    spec: dict = {"gpus": [H200_ROW]}
    if smi:
        text = (CORPUS / smi).read_text(encoding="utf-8")
        lost = [ln for ln in text.splitlines() if "Unable to determine the device handle" in ln]
        if lost:
            spec = {"gpus": [], "lost": lost}
        else:  # rebuild the query rows from the recorded nvidia-smi -q/table values
            spec = {"gpus": []}
            for idx, bus, ecc in re.findall(
                r"\|\s+(\d+)\s+NVIDIA.*?\|\s+([0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d)\s+\w+\s+\|\s+(\d+)\s+\|", text
            ):
                pending = (
                    "Yes"
                    if f"GPU {bus}" in text and "Pending                                        : Yes" in text
                    else "No"
                )
                spec["gpus"].append(
                    {
                        **H200_ROW,
                        "index": int(idx),
                        "pci.bus_id": bus,
                        "uuid": f"GPU-{idx}",
                        "ecc.errors.uncorrected.volatile.total": int(ecc),
                        "remapped_rows.pending": pending if int(ecc) else "No",
                    }
                )
    p = tmp / "smi.json"
    p.write_text(json.dumps(spec))
    return p


def run_script(tmp: Path, *, mode: str, kern: Path | None, smi: Path | None, extra: dict | None = None) -> str:
    env = {
        "PATH": f"{STANDINS}:{os.environ['PATH']}",
        "FD_STANDIN_MODE": mode,
        "FD_KERNEL_KERNLOG": str(kern) if mode == "kernlog" and kern else str(tmp / "absent.log"),
        "LC_ALL": "C",
        "TZ": "UTC",
        "HOME": str(tmp),
    }
    if kern:
        env["FD_STANDIN_KERN"] = str(kern)
    if smi:
        env["FD_STANDIN_SMI"] = str(smi)
    env.update(extra or {})
    r = subprocess.run(
        ["sh", "-c", f". '{SCRIPT}'; fd_kernel_main"], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _app_error(case: dict) -> AppError | None:
    app = case["files"].get("app")
    if not app:
        return None
    d = analyze_text((CORPUS / app).read_text(encoding="utf-8"))
    if d.decisive is None:
        return None
    return AppError(line=d.decisive.line, process=d.decisive.process, time=epoch(d.decisive.time))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_corpus_case_names_the_kernel_line_and_action_class(path: Path, tmp_path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    kern = CORPUS / case["files"]["kern"]
    mode = _mode(case)
    out = run_script(tmp_path, mode=mode, kern=kern, smi=_smi_spec(case, tmp_path))
    kc = parse_sections(out)
    assert kc.source == {"journal": "journalctl", "dmesg": "dmesg", "kernlog": "kern.log"}[mode]
    assert kc.clock.now and kc.clock.uptime
    events = kc.events()
    health = parse_health(kc.smi)
    app = _app_error(case)
    res = correlate(app, events, health)
    got = res.decisive
    assert got is not None, out
    assert case["decisive_kernel_line"] in got.line, (got.line, got.why)
    for decoy in case["decoys"]:
        assert decoy not in got.line
    expected = BY_KIND.get(case["kind"]) or OTHER[case["id"]]
    assert got.category == expected, (got.category, got.line)
    assert got.hint
    if case.get("xid") and got.kind == "xid":
        assert got.code == case["xid"]
    if app is not None:
        assert got.consequence == app.line
        assert res.evidence[0]["source"] == "log"
    assert any(e["source"] == "kernel" and e["line"] == got.line for e in res.evidence)
    if case["files"].get("smi"):  # each recorded nvidia-smi output shows a lost GPU or uncorrectable ECC
        assert res.degraded, kc.smi
    # the journal's stamps come back as wall time; dmesg's seconds since boot through the remote clock
    if mode == "journal":
        assert got.event is not None and got.event.time is not None
    m = re.match(r"\[\s*(\d+\.\d+)\]", got.line)
    if mode == "dmesg" and m:
        assert got.event.time == pytest.approx(kc.clock.now - kc.clock.uptime + float(m.group(1)))


def test_every_case_is_right() -> None:
    """The corpus is all there (a missing case would silently shrink the parametrized test)."""
    assert len(CASES) >= 17


def _benign_lines() -> list[str]:
    return (FIXTURES / "kernel" / "h200-boot-nvrm-benign.txt").read_text(encoding="utf-8").splitlines()


def test_benign_h200_lines_leave_the_application_error_decisive(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("\n".join(_benign_lines()) + "\n")
    out = run_script(tmp_path, mode="dmesg", kern=kern, smi=None)
    kc = parse_sections(out)
    events = kc.events()
    assert events and all(e.benign for e in events)  # collected, recognised, never a cause
    app = AppError(line="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", process="python")
    res = correlate(app, events, parse_health(kc.smi))
    assert res.decisive is None
    assert res.degraded == []
    assert [e["source"] for e in res.evidence] == ["log"]


def test_application_fault_xid_far_from_the_error_does_not_take_over() -> None:
    lines = ["[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008"]
    events = parse_kernel_lines(lines)
    app = AppError(line="RuntimeError: shapes mismatch", time=events[0].time + 3 * 86400, process="python3")
    assert decide(app, events) is None
    # the same line linked by process name and close in time is the cause
    app2 = AppError(
        line="CUDA error: an illegal memory access was encountered", time=events[0].time + 1, process="python3.10"
    )
    got = decide(app2, events)
    assert got is not None and got.category == "application" and got.code == 31


def test_hardware_xid_on_the_failing_gpu_is_linked_by_bus(tmp_path: Path) -> None:
    health = parse_health(["index, pci.bus_id, uuid", "0, 00000000:18:00.0, GPU-a", "1, 00000000:2A:00.0, GPU-b"])
    lines = [
        "[Fri Aug  9 13:32:50 2024] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:2a:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1).",
    ]
    events = parse_kernel_lines(lines)
    app = AppError(line="CUDA error: unknown error", gpu=1, time=events[1].time + 2)
    got = decide(app, events, health)
    assert got is not None and "(PCI:0000:2a:00): 94" in got.line and "GPU 2a:00" in got.why


def test_lost_gpu_without_a_job_is_degraded(tmp_path: Path) -> None:
    smi = tmp_path / "smi.json"
    lost = (CORPUS / "pubsum-k80-xid79.smi.txt").read_text().splitlines()[0]
    smi.write_text(json.dumps({"gpus": [{**H200_ROW, "index": 1, "pci.bus_id": "00000000:06:00.0"}], "lost": [lost]}))
    empty = tmp_path / "empty.log"
    empty.write_text("")
    out = run_script(tmp_path, mode="dmesg", kern=empty, smi=smi)
    kc = parse_sections(out)
    health = parse_health(kc.smi)
    res = correlate(None, kc.events(), health)
    assert res.decisive is None
    assert res.degraded == ["GPU 05:00: GPU lost: nvidia-smi cannot reach it"]
    assert any(e["source"] == "gpu" and e["kind"] == "lost" for e in res.evidence)


def test_health_fields_of_both_driver_generations(tmp_path: Path) -> None:
    bad = {
        **H200_ROW,
        "ecc.errors.uncorrected.volatile.total": 3,
        "remapped_rows.failure": "Yes",
        "pcie.link.width.current": 8,
        "pcie.link.gen.current": 1,
        "clocks_event_reasons.hw_slowdown": "Active",
    }
    for old in (False, True):
        smi = tmp_path / "smi.json"
        smi.write_text(json.dumps({"gpus": [bad], "old": old}))
        kc = parse_sections(run_script(tmp_path, mode="dmesg", kern=None, smi=smi))
        assert ("clocks_throttle_reasons" if old else "clocks_event_reasons") in (kc.smi_fields or "")
        (g,) = parse_health(kc.smi)
        assert g.bus == "18:00" and g.index == 0
        assert degraded([g]) == [
            "GPU 0: 3 uncorrectable ECC errors (volatile)",
            "GPU 0: row remapping failed",
            "GPU 0: PCIe link width x8 of x16",
        ]
        assert "clocks held down: hw slowdown" in g.faults
        assert any("PCIe gen 1 of 5" in f for f in g.faults)  # reported, but idle links drop their gen: not degrading


def test_healthy_h200_query_fixture_is_not_degraded() -> None:
    gpus = parse_health((FIXTURES / "nvidia-smi" / "h200x2-health-query.csv").read_text())
    assert [g.index for g in gpus] == [0, 1]
    assert degraded(gpus) == [] and all(g.faults == [] for g in gpus)


def test_unreadable_kernel_log_is_a_fact_with_the_fix(tmp_path: Path) -> None:
    out = run_script(tmp_path, mode="denied", kern=None, smi=None)
    kc = parse_sections(out)
    assert kc.source is None and kc.lines == []
    fact = kc.fact()
    assert fact is not None and fact["kernel_log"] == "unreadable"
    assert "adm" in fact["fix"] and "systemd-journal" in fact["fix"] and "dmesg_restrict" in fact["fix"]
    assert "adm nor the systemd-journal group" in fact["why"]


def test_output_is_bounded_in_lines_and_bytes(tmp_path: Path) -> None:
    kern = tmp_path / "flood.log"
    kern.write_text(
        "".join(
            f"[{i}.000001] NVRM: Xid (PCI:0000:61:00): 45, pid={i}, name=python3, Ch 0000000a\n" for i in range(5000)
        )
    )
    out = run_script(tmp_path, mode="dmesg", kern=kern, smi=None, extra={"FD_KERNEL_LINES": "50"})
    kc = parse_sections(out)
    assert len(kc.lines) <= 51 and "pid=4999," in kc.lines[-2 if not kc.lines[-1] else -1]
    out = run_script(tmp_path, mode="dmesg", kern=kern, smi=None, extra={"FD_KERNEL_BYTES": "1000"})
    assert sum(len(ln) + 1 for ln in parse_sections(out).lines) <= 1002


def test_time_formats() -> None:
    clock = Clock(now=1_700_000_000.0, uptime=1000.0, tz_offset=0, year=2024)
    st: dict = {}
    assert split_time("[  500.250000] NVRM: x", clock, st) == (1_699_999_500.25, "NVRM: x")
    assert split_time("[Fri Aug 30 11:43:09 2024] NVRM: x", clock, st)[0] == 1725018189.0
    assert split_time("[Mon Aug  5 03:54:13 2024] NVRM: x", clock, st)[0] == 1722830053.0
    assert split_time("2024-08-30T11:43:09.500000+0000 host kernel: NVRM: x", clock, st) == (1725018189.5, "NVRM: x")
    assert split_time("2024-08-30T13:43:09,000000+02:00 NVRM: x", clock, st)[0] == 1725018189.0
    assert split_time("Aug 30 11:43:09 red kernel: [12.5] NVRM: x", clock, st) == (1725018189.0, "NVRM: x")
    assert split_time("aug 30 11:43:09 kernel: NVRM: x", clock, st)[0] == 1725018189.0
    assert split_time("kern: warning: [2024-08-30T11:43:09.458998481Z]: NVRM: x", clock, st)[0] == pytest.approx(
        1725018189.459
    )
    # talosctl dmesg over several nodes names the node first
    assert split_time("10.0.0.7: kern: warning: [2024-08-30T11:43:09Z]: NVRM: x", clock, st) == (
        1725018189.0,
        "NVRM: x",
    )
    assert split_time("[Aug30 11:43] NVRM: x", clock, st)[0] == 1725018180.0
    assert split_time("[  +0.500000] NVRM: y", clock, st) == (1725018180.5, "NVRM: y")
    assert split_time("kernel: NVRM: x", clock, st) == (None, "NVRM: x")
    assert split_time("NVRM: x", clock, st) == (None, "NVRM: x")
    tz = Clock(tz_offset=7200, year=2024)
    assert split_time("[Fri Aug 30 13:43:09 2024] x", tz, {})[0] == 1725018189.0


def test_event_fields() -> None:
    (xid, seg, oom, hung, aer) = parse_kernel_lines(
        [
            "May 15 08:57:36 red kernel: NVRM: Xid (PCI:0000:01:00): 31, pid=80798, name=llama-server, Ch 00000008",
            "May 15 08:57:36 red kernel: llama-server[80906]: segfault at 204803fe0 ip 00007f00399189d7",
            "[3.0] Out of memory: Killed process 4242 (pt_main_thread) total-vm:1kB",
            "[4.0] INFO: task cache_mgr_event:620917 blocked for more than 120 seconds.",
            "[5.0] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer",
        ]
    )
    assert (xid.kind, xid.code, xid.bus, xid.pid, xid.process) == ("xid", 31, "01:00", 80798, "llama-server")
    assert (seg.kind, seg.pid, seg.process) == ("segfault", 80906, "llama-server")
    assert (oom.kind, oom.pid, oom.process) == ("oom-kill", 4242, "pt_main_thread")
    assert (hung.kind, hung.pid) == ("hung-task", 620917)
    assert (aer.kind, aer.bus, aer.severity) == ("pcie-aer", "00:03", "uncorrected (fatal)")
    assert bus_key("00000000:91:00.0") == bus_key("PCI:0000:91:00") == "91:00"
    assert bus_key("PCI:...") is None


def test_xid_table_covers_the_common_codes_and_merges_a_user_file(tmp_path: Path) -> None:
    t = default_xid_table()
    common = [
        8,
        13,
        31,
        32,
        38,
        43,
        45,
        48,
        56,
        57,
        58,
        61,
        62,
        63,
        64,
        68,
        69,
        74,
        79,
        92,
        94,
        95,
        109,
        119,
        120,
        121,
        122,
        123,
        136,
        137,
        140,
        143,
        *range(144, 151),
        154,
    ]
    assert all(c in t.codes for c in common)
    assert t.get(79).action == "hardware" and t.get(119).action == "driver" and t.get(13).action == "application"
    assert t.get(45).action == "informational"
    assert t.get(99999).category == "driver"  # unknown codes are never silently benign
    user = tmp_path / "xid.yaml"
    user.write_text(
        "xids:\n  13: {action: hardware}\n  999: {name: Site code, action: driver, hint: call the vendor}\n"
    )
    u = load_xid_table(user)
    assert u.get(13).action == "hardware" and u.get(13).name == "Graphics Engine Exception"
    assert u.get(999).hint == "call the vendor"
    user.write_text("xids:\n  13: {action: maybe}\n")
    with pytest.raises(XidTableError, match="xids.13.action"):
        load_xid_table(user)


def test_script_under_busybox_alone(tmp_path: Path) -> None:
    """A node with only busybox applets (no GNU grep/coreutils): same sections, same decision."""
    bb = shutil.which("busybox")
    assert bb, "busybox is installed by scripts/test"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for applet in ("sh", "grep", "tail", "head", "cut", "date", "id", "tr", "cat", "timeout", "env"):
        (bindir / applet).symlink_to(bb)
    (bindir / "python3").symlink_to(sys.executable)
    case = json.loads((CORPUS / "gpud-sxid-xid79-ltssm.json").read_text())
    kern = CORPUS / case["files"]["kern"]
    env = {
        "PATH": f"{STANDINS}:{bindir}",
        "FD_STANDIN_MODE": "dmesg",
        "FD_STANDIN_KERN": str(kern),
        "FD_KERNEL_KERNLOG": str(tmp_path / "absent"),
    }
    r = subprocess.run(
        [str(bindir / "sh"), "-c", f". '{SCRIPT}'; fd_kernel_main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    kc = parse_sections(r.stdout)
    assert kc.source == "dmesg" and kc.clock.uptime
    got = decide(None, kc.events(), parse_health(kc.smi))
    assert got is not None and case["decisive_kernel_line"] in got.line


def test_script_with_this_machines_real_tools(tmp_path: Path) -> None:
    """No stand-ins: whatever this machine allows, the script says where it read from or why it could not."""
    r = subprocess.run(
        ["sh", "-c", f". '{SCRIPT}'; fd_kernel_main"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "FD_KERNEL_KERNLOG": str(tmp_path / "absent")},
    )
    assert r.returncode == 0, r.stderr
    kc = parse_sections(r.stdout)
    assert (kc.source in ("journalctl", "dmesg", "kern.log")) != (kc.fact() is not None)
    assert kc.smi_status in ("ok", "absent")
    kc.events()  # real lines parse


def test_script_is_clean_posix_sh() -> None:
    r = subprocess.run(["shellcheck", "-s", "sh", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout
    text = SCRIPT.read_text()
    assert "set -e" not in text
    funcs = re.findall(r"^(\w+)\s*\(\)", text, re.MULTILINE)
    assert funcs and all(f.startswith("fd_kernel_") for f in funcs)


def test_remote_and_python_agree_on_lines_of_interest() -> None:
    from fleetdiag.evidence.kernel import INTEREST_ERE

    m = re.search(r"^fd_kernel_ere='([^']*)'", SCRIPT.read_text(), re.MULTILINE)
    assert m and m.group(1) == INTEREST_ERE


@pytest.mark.parametrize(
    ("lines", "want", "category"),
    [
        (
            [
                "[Tue Jan  9 10:00:00 2024] pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0",
                "[Tue Jan  9 10:00:00 2024] nvidia 0000:01:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
            ],
            "severity=Uncorrected (Fatal)",
            "hardware",
        ),
        (
            ["[812.1] Memory cgroup out of memory: Killed process 2187 (pt_main_thread) total-vm:9kB, anon-rss:8kB"],
            "Memory cgroup out of memory: Killed process 2187",
            "host-oom",
        ),
        (
            [
                "[99.1] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
                "[99.2] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x25:0x65:1474)",
            ],
            "GPU has fallen off the bus",
            "hardware",
        ),
        (
            [
                "[5.0] NVRM: RmInitAdapter failed! (0x26:0x56:1482)",
                "[5.1] NVRM: rm_init_adapter failed, device minor number 0",
            ],
            "RmInitAdapter failed",
            "driver",
        ),
        (
            ["[7.0] NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timeout, curdiff 0x14 GSP ucode"],
            "Heartbeat timeout",
            "driver",
        ),
        (
            [
                "[8.0] mce: [Hardware Error]: Machine check events logged",
                "[9.0] mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200000000070f0f",
                "[9.1] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0",
            ],
            "Machine Check Exception",
            "hardware",
        ),
    ],
)
def test_general_message_shapes(lines: list[str], want: str, category: str) -> None:
    got = decide(None, parse_kernel_lines(lines))
    assert got is not None and want in got.line and got.category == category


def test_corrected_noise_alone_is_never_a_cause() -> None:
    lines = [
        "[8.0] mce: [Hardware Error]: Machine check events logged",
        "[9.0] pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0",
        "[9.1] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Non-fatal, Link 63 LTSSM Fault Up",
        "[9.2] NVRM: krcWatchdog_IMPL: RC watchdog: GPU is probably locked!  Notify Timeout Seconds: 7",
        *_benign_lines(),
    ]
    assert decide(None, parse_kernel_lines(lines)) is None


def test_recovery_action_is_quoted_in_the_hint() -> None:
    got = decide(
        None,
        parse_kernel_lines(
            [
                "Aug 10 15:36:05 n kernel: NVRM: Xid (PCI:0000:55:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
            ]
        ),
    )
    assert got is not None and got.hint.startswith("the driver asks for: Drain and Reset")


def test_container_pid_mismatch_links_by_truncated_process_name() -> None:
    lines = [
        "2025-03-01T10:00:00.000000+0000 n kernel: NVRM: Xid (PCI:0000:c1:00): 31, pid=22884, name=VLLM::Worker_TP, Ch 00000008",
        "2025-03-01T10:00:00.100000+0000 n kernel: NVRM: Xid (PCI:0000:41:00): 43, pid=19000, name=other_job, Ch 00000008",
    ]
    events = parse_kernel_lines(lines)
    app = AppError(
        line="CUDA error: an illegal memory access was encountered",
        pid=370,
        process="VLLM::Worker_TP0",
        time=events[0].time + 7,
    )
    got = decide(app, events)
    assert got is not None and "name=VLLM::Worker_TP," in got.line and got.why.endswith("process VLLM::Worker_TP")


def test_a_corrected_aer_flood_does_not_push_the_fault_out(tmp_path: Path) -> None:
    """A GPU off the bus, then 5000 corrected AER lines (a bad riser): the Xid 79 still arrives."""
    kern = tmp_path / "flood.log"
    corrected = "pcieport 0000:00:01.1: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Receiver ID)"
    kern.write_text(
        "[100.000001] NVRM: Xid (PCI:0000:09:00): 79, pid=0, GPU has fallen off the bus.\n"
        + "".join(f"[{200 + i}.000001] {corrected}\n" for i in range(5000))
    )
    kc = parse_sections(run_script(tmp_path, mode="dmesg", kern=kern, smi=None))
    assert any("79, pid=0, GPU has fallen off the bus" in ln for ln in kc.lines)
    assert 20 < sum(corrected in ln for ln in kc.lines) < 150
    got = decide(None, kc.events())
    assert got is not None and "fallen off the bus" in got.line
