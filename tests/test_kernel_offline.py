"""``fleetdiag analyze [LOG] --kernel FILE [--smi FILE]``: a ticket's attachments decided as probe decides a
live host, through the CLI (verdict and decisive line on the card and in ``--json``).

Every kernel case runs once: its application log when it has one (else the kernel log alone), its kernel
log as recorded, its nvidia-smi output when the report had one. The kernel file forms a user saves (dmesg,
-T, -H, journalctl -k in each short format, kern.log) are produced by the stand-ins from one recording and
must all read the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.evidence.gpu_health import degraded, parse_smi_text
from fleetdiag.evidence.offline import detect_form, read_kernel_file

from .test_kernel_corpus_probe import CASES, _category, names_the_line, stands_alone
from .test_kernel_evidence import FIXTURES, STANDINS

IDS = [c["id"] for c in CASES]


def _analyze(*args: str, stdin: str | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--no-color", "analyze", *args], input=stdin, env={"COLUMNS": "3000"})
    return r.exit_code, r.output


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_tickets_attachments_decide_like_a_probe(case: dict) -> None:
    d = case["_dir"]
    args = ["--kernel", str(d / case["files"]["kern"])]
    if case["files"].get("smi"):
        args += ["--smi", str(d / case["files"]["smi"])]
    app = case["files"].get("app")
    code, out = _analyze(*([str(d / app)] if app else []), *args, "--json")
    host = json.loads(out)
    dec = host["decisive"]
    if app:  # the job's error is the consequence of the kernel line
        assert host["verdict"] == "failed" and code == 1, host
        assert dec["source"] == "kernel" and names_the_line(case, dec["line"]), dec
        assert dec["category"] == _category(case)
    elif stands_alone(case):
        assert host["verdict"] == "degraded" and code == 1, host
        assert dec["source"] == "kernel" and case["decisive_kernel_line"] in dec["line"], dec
        assert dec["category"] == _category(case) and dec["hint"]
        why = "nvidia-smi" if case["files"].get("smi") else "no nvidia-smi output given"
        assert why in dec["reason"], dec
    else:  # an application's own fault, an OOM kill, corrected errors: not the node's; a lost GPU is
        assert dec is None, dec
        want = "degraded" if case["files"].get("smi") else "healthy"
        assert host["verdict"] == want and code == (1 if want == "degraded" else 0), host
    if dec is not None:
        for decoy in case["decoys"]:
            assert decoy not in dec["line"]
        assert host["facts"]["kernel_log"]["kernel_log"] == "read"
        _, card = _analyze(*([str(d / app)] if app else []), *args)
        row = next(ln for ln in card.splitlines() if "kernel line" in ln)
        assert names_the_line(case, row)


def _forms(tmp: Path, recording: Path) -> dict[str, str]:
    """One recording saved in each form a user attaches, by the stand-ins' own conversions."""
    env = {**os.environ, "FD_STANDIN_KERN": str(recording), "TZ": "UTC"}
    out = {}
    for fmt in ("short", "short-precise", "short-iso", "short-iso-precise", "short-full"):
        r = subprocess.run(
            [str(STANDINS / "journalctl"), "-k", "-o", fmt],
            env={**env, "FD_STANDIN_MODE": "journal"},
            capture_output=True,
            text=True,
            check=True,
        )
        out[fmt] = r.stdout
    return out


def test_every_saved_form_of_one_kernel_log_reads_the_same(tmp_path: Path) -> None:
    case = next(c for c in CASES if c["id"] == "sirzzang-rtxpro6000-xid48-dbe")
    rec = case["_dir"] / case["files"]["kern"]
    want = {
        "short": "journalctl -k / kern.log (syslog)",
        "short-precise": "journalctl -k -o short-precise",
        "short-iso": "journalctl -k -o short-iso",
        "short-iso-precise": "journalctl -k -o short-iso-precise",
        "short-full": "journalctl -k -o short-full",
    }
    for fmt, text in _forms(tmp_path, rec).items():
        f = tmp_path / f"k-{fmt}.txt"
        f.write_text(text)
        kc = read_kernel_file(f)
        assert kc.source == want[fmt], (fmt, text[:200])
        code, out = _analyze("--kernel", str(f), "--json")
        host = json.loads(out)
        assert host["verdict"] == "degraded" and code == 1
        assert case["decisive_kernel_line"] in host["decisive"]["line"], (fmt, host["decisive"])
        assert host["decisive"]["time"].endswith("15:36:05+0000"), (fmt, host["decisive"]["time"])
    # dmesg as it prints by default, with -T and -H: the forms of the shared corpus
    for cid, form in (
        ("gpud-sxid-xid79-ltssm", "dmesg"),
        ("nvdocker849-xid48-dbe", "dmesg -T"),
        ("returnn1486-pcie-aer-corrected-gpu-unknown", "dmesg -H"),
        ("openrm1150-xid45-after-nvlink149", "no timestamps"),
        ("gpud500-xid119-python", "no timestamps"),
    ):
        c = next(c for c in CASES if c["id"] == cid)
        assert read_kernel_file(c["_dir"] / c["files"]["kern"]).source == form, cid
    assert detect_form(["[    5.123456] node kernel: NVRM: Xid (PCI:0000:01:00): 79, x"]) == (
        "journalctl -k -o short-monotonic"
    )
    assert detect_form(["2024-08-30T11:43:09,123456+00:00 NVRM: Xid (PCI:0000:01:00): 79, x"]) == (
        "dmesg --time-format iso"
    )


def test_kernel_log_alone_from_stdin_log_and_a_crlf_file(tmp_path: Path) -> None:
    """'analyze --kernel FILE -' reads the application log from stdin; a Windows-saved kernel file reads too."""
    kern = tmp_path / "dmesg.txt"
    kern.write_bytes(
        b"[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\r\n"
        b"               NVRM: (PCI ID: 10de:26b5) installed in this system has\r\n"
        b"               NVRM: fallen off the bus and is not responding to commands.\r\n"
    )
    code, out = _analyze("--kernel", str(kern), "-", "--json", stdin="serving 200 OK\n")
    host = json.loads(out)
    assert code == 1 and host["verdict"] == "degraded" and host["log"] == "<stdin>"
    assert "fallen off the bus and is not responding" in host["decisive"]["line"]
    assert "\r" not in host["decisive"]["line"]
    code, out = _analyze("--kernel", "-", "--json", stdin=kern.read_bytes().decode())
    assert code == 1 and json.loads(out)["verdict"] == "degraded"  # 'journalctl -k | fleetdiag analyze --kernel -'
    code, out = _analyze("--kernel", "-", "-", stdin="x\n")
    assert code == 2 and "not both" in out
    code, out = _analyze("--kernel", str(tmp_path / "absent.txt"))
    assert code == 2 and "absent.txt: no such file" in out
    code, out = _analyze()
    assert code == 2 and "--kernel FILE" in out


def test_history_before_a_reboot_or_a_driver_reload_does_not_count(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    old = "Aug 10 15:36:05 n kernel: NVRM: Xid (PCI:0000:55:00): 79, pid=1, GPU has fallen off the bus."
    for marker in (
        "Aug 10 16:00:00 n kernel: Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) #45-Ubuntu SMP",
        "Aug 10 16:00:00 n kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
    ):
        kern.write_text(f"{old}\n{marker}\n")
        code, out = _analyze("--kernel", str(kern), "--json")
        assert json.loads(out)["verdict"] == "healthy" and code == 0, marker
    kern.write_text(f"{old.replace('15:36:05', '16:00:10')}\n")  # after the reload: it counts
    code, out = _analyze("--kernel", str(kern), "--json")
    assert json.loads(out)["verdict"] == "degraded" and code == 1


@pytest.mark.parametrize(
    ("name", "faults"),
    [
        ("h200-q.txt", []),  # nvidia-smi -q of two healthy H200s
        ("h200x2-health-query.csv", []),
        ("nvidia-smi.txt", []),  # the plain table
    ],
)
def test_healthy_nvidia_smi_outputs_of_every_shape(name: str, faults: list[str]) -> None:
    gpus = parse_smi_text((FIXTURES / "nvidia-smi" / name).read_text(encoding="utf-8"))
    assert len(gpus) == 2 and degraded(gpus) == faults
    assert [g.index for g in gpus] == [0, 1]


def test_nvidia_smi_q_faults_are_read(tmp_path: Path) -> None:
    text = (FIXTURES / "nvidia-smi" / "h200-q.txt").read_text(encoding="utf-8")
    first, second = text.split("\nGPU 00000000:00:07.0", 1)
    bad = first
    for key, value in (
        ("DRAM Uncorrectable", "3"),
        ("Remapping Failure Occurred", "Yes"),
        ("GPU Recovery Action", "Drain and Reset"),
        ("HW Slowdown", "Active"),
    ):
        bad = re.sub(rf"(\n +{key} +: )[^\n]*", lambda m, v=value: m.group(1) + v, bad, count=1)
    gpus = parse_smi_text(bad + "\nGPU 00000000:00:07.0" + second)
    g0, g1 = gpus
    assert g0.ecc_uncorrected_volatile == 3 and g0.remapped_rows_failure and g0.recovery_action == "Drain and Reset"
    assert "hw_slowdown" in g0.clock_reasons and g1.degrading == []
    assert degraded(gpus) == [
        "GPU 0: 3 uncorrectable ECC errors (volatile)",
        "GPU 0: row remapping failed",
        "GPU 0: the driver asks for: Drain and Reset",
    ]
    smi = tmp_path / "q.txt"
    smi.write_text(bad)
    code, out = _analyze("--smi", str(smi), "--json")
    host = json.loads(out)
    assert host["verdict"] == "degraded" and code == 1 and "Drain and Reset" in host["summary"]
