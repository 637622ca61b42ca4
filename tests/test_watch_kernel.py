"""``fleetdiag watch`` reads a host as ``probe`` does: the same exec as its snapshot (facts, the kernel
part, ``--path-prepend``) and the same step from output to result, so a GPU fault that probe names is
watch's decisive line too, on the card and in ``--jsonl`` (with the ``evidence``).

Through the console script over a real OpenSSH sshd; the node's dmesg/journalctl/nvidia-smi are the
recorded stand-ins of tests/standins_kernel (as in tests/test_kernel_probe.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from .conftest import inventory_file
from .test_kernel_evidence import CORPUS, _smi_spec
from .test_kernel_probe import _kernel_time, _probe, _standin_bin
from .test_watch import _lines_until, _spawn_watch

CASE = json.loads((CORPUS / "sirzzang-rtxpro6000-xid48-dbe.json").read_text(encoding="utf-8"))
XID = "Xid (PCI:0000:55:00): 48"


def _node(sshd, tmp: Path) -> tuple[Path, Path, Path]:
    """(inventory, stand-in bin dir, log) of a node whose kernel log holds the case's Xid 48."""
    kern = CORPUS / CASE["files"]["kern"]
    bindir = _standin_bin(tmp / "bin", mode="journal", kern=kern, smi=_smi_spec(CASE, tmp))
    log = tmp / "app.log"
    return inventory_file(tmp / "inventory.yaml", {"gpu-node-a": log}, sshd), bindir, log


def _events(proc) -> tuple[list[dict], dict]:
    """The state events up to the first ``failed``, then (after Ctrl-C) the summary."""
    got = _lines_until(proc, lambda ls: any('"state": "failed"' in ln for ln in ls))
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=30)
    lines = [json.loads(ln) for ln in got + rest.splitlines() if ln.startswith("{")]
    summary = next(d for d in lines if d.get("event") == "summary")
    return [d for d in lines if d.get("event") == "state"], summary


def test_watch_names_the_kernel_cause_probe_names(sshd, tmp_path: Path) -> None:
    """The log already holds the app's ECC error: the first failed event is the kernel's Xid 48, the
    app's line its consequence, with probe's evidence; probe of the same node says the same."""
    inv, bindir, log = _node(sshd, tmp_path)
    log.write_bytes((CORPUS / CASE["files"]["app"]).read_bytes())
    t = _kernel_time(CASE, "journal") + 30
    os.utime(log, (t, t))
    proc = _spawn_watch(inv, "all", "--jsonl", "--path-prepend", str(bindir), *sshd.cli_args())
    states, summary = _events(proc)
    failed = next(e for e in states if e["state"] == "failed")
    d = failed["decisive"]
    assert d["source"] == "kernel" and XID in d["line"], failed
    assert "uncorrectable ECC error" in d["consequence"], d
    assert any(e["source"] == "kernel" and e["line"] == d["line"] for e in failed["evidence"]), failed
    (host,) = summary["hosts"]
    assert host["decisive"]["line"] == d["line"] and host["facts"]["kernel_log"]["source"] == "journalctl"
    assert any(e["source"] == "kernel" for e in host["evidence"])
    code, out = _probe(sshd, inv, bindir, "--json")
    (probed,) = json.loads(out)["hosts"]
    assert probed["decisive"]["line"] == d["line"] and probed["decisive"]["category"] == d["category"]


def _now_stamped(lines: list[str], fmt: str, pattern: str) -> list[str]:
    """Recorded lines with their stamps moved to now (UTC, as the stand-ins read them)."""
    stamp = time.strftime(fmt, time.gmtime())
    return [re.sub(pattern, stamp, ln, count=1) for ln in lines]


def test_a_failure_written_during_the_watch_gets_the_kernel_cause(sshd, tmp_path: Path) -> None:
    """The log is healthy and the kernel log clean at the snapshot; then the GPU faults (Xid 48) and
    the app's error lines are appended while watching. Watch reads the kernel part again on its
    connection: the failed event's decisive line becomes the Xid, and its card shows the kernel line."""
    inv, bindir, log = _node(sshd, tmp_path)
    kern = tmp_path / "kern.log"
    recorded = (CORPUS / CASE["files"]["kern"]).read_text(encoding="utf-8").splitlines(keepends=True)
    kern.write_text("".join(ln for ln in recorded if "Xid" not in ln), encoding="utf-8")
    bindir = _standin_bin(tmp_path / "bin2", mode="journal", kern=kern, smi=_smi_spec(CASE, tmp_path))
    app = (CORPUS / CASE["files"]["app"]).read_text(encoding="utf-8").splitlines(keepends=True)
    log.write_text("INFO starting training\nINFO step 1 loss 2.5\n")
    proc = _spawn_watch(inv, "all", "--jsonl", "--path-prepend", str(bindir), *sshd.cli_args())
    _lines_until(proc, lambda ls: any('"state": "healthy"' in ln for ln in ls))
    with open(kern, "a", encoding="utf-8") as fh:  # the fault, then the app's error: both now
        fh.writelines(_now_stamped([ln for ln in recorded if "Xid" in ln], "%b %e %H:%M:%S", r"^\w{3}\s+\d+ [\d:]{8}"))
    with open(log, "a", encoding="utf-8") as fh:
        fh.writelines(_now_stamped(app, "E%m%d %H:%M:%S", r"E\d{4} [\d:]{8}"))
    got = _lines_until(proc, lambda ls: any('"state": "failed"' in ln and XID in ln for ln in ls))
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    events = [json.loads(ln) for ln in got + rest.splitlines() if ln.startswith("{")]
    failed = [e for e in events if e.get("state") == "failed"]
    assert failed[-1]["decisive"]["source"] == "kernel" and XID in failed[-1]["decisive"]["line"], failed
    assert "uncorrectable ECC error" in failed[-1]["decisive"]["consequence"]
    assert any(e["source"] == "kernel" for e in failed[-1]["evidence"])
    summary = next(e for e in events if e.get("event") == "summary")
    assert summary["hosts"][0]["decisive"]["source"] == "kernel"
