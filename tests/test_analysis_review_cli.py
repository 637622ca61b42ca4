"""The review's user-visible fixes through the CLI: `fleetdiag probe` over the tests' sshd (card and --json) and
`fleetdiag analyze --kernel` on a ticket's attachments."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.cli import main

from .review_texts import WRAPPED

CUDA = "ERROR 10-22 12:01:00 [core.py:12] RuntimeError: CUDA error: an illegal memory access was encountered"
STATS = (
    "INFO 10-22 12:00:{:02d} [loggers.py:116] Engine 000: Avg prompt throughput: . tokens/s, Avg generation "
    "throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 3 reqs, GPU KV cache usage: 2.1%"
)


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--no-color", *args], env={"COLUMNS": "220", "NO_COLOR": "1"})
    return r.exit_code, r.output


def test_probe_reads_hostile_and_wrapped_logs(sshd, tmp_path: Path, write_inventory) -> None:
    """Three hosts: a log with framed lines of blanks (cubic in the frame's regex: minutes), one whose engine
    report has a stray "." for a number (the analysis raised and the log lost its diagnosis), one whose
    exception's message carries an exit code before the real error (the error's signature was dropped)."""
    logs = {
        "framed": ["│" + " " * 4000 + "x"] * 2 + [CUDA],
        "garbled": [STATS.format(k) for k in range(3)] + [CUDA],
        "wrapped": WRAPPED.splitlines(),
    }
    hosts = {}
    for name, lines in logs.items():
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(lines) + "\n")
        hosts[name] = str(path)
    inv = write_inventory(hosts)
    t = time.monotonic()
    code, out = _cli("-i", str(inv), "probe", "all", *sshd.cli_args(), "--json")
    assert time.monotonic() - t < 60, "the analysis of a framed line of blanks must not take minutes"
    assert code == 1, out
    by = {h["host"]: h for h in json.loads(out)["hosts"]}
    for name in ("framed", "garbled"):
        d = by[name]["decisive"]
        assert by[name]["verdict"] == "failed" and "an illegal memory access" in d["line"], by[name]
    w = by["wrapped"]["decisive"]
    assert (w["line"], w["rule"], w["category"]) == ("RuntimeError: shard writer failed:", "host-alloc-failed", "oom")

    code, card = _cli("-i", str(inv), "probe", "all", *sshd.cli_args())
    assert code == 1 and "analyzer error" not in card, card
    assert card.count("an illegal memory access was encountered") >= 2, card
    assert "RuntimeError: shard writer failed:" in card and "oom" in card, card


def test_analyze_kernel_attachment_in_a_localised_month(tmp_path: Path) -> None:
    """A ticket's `dmesg -T` from a Polish desktop: the Xid keeps its time, so it is tied to the error a second
    after it."""
    kern = tmp_path / "dmesg-T.txt"
    kern.write_text(
        "[pią kwi 11 10:00:00 2025] NVRM: GPU at PCI:0000:3b:00: GPU-1a2b3c4d-0000-0000-0000-000000000000\n"
        "[pią kwi 11 10:00:05 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
    app = tmp_path / "app.log"
    app.write_text("2025-04-11 10:00:06 ERROR [train.py:9] RuntimeError: CUDA error: unspecified launch failure\n")
    code, out = _cli("analyze", str(app), "--kernel", str(kern), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "failed", doc
    times = {e["source"]: e["time"] for e in doc["evidence"]}
    assert times["kernel"] is not None and times["log"] - times["kernel"] == 1.0, times
