"""The probe's answer leaves the host in a few writes: every write becomes an SSH packet that costs the
controller a read, a decryption and a loop turn. The funnel holds each section and writes it once, and
nothing that can hang (ps, nvidia-smi, the kernel part) runs while lines are held."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from fleetdiag.analysis import load_rules
from fleetdiag.inventory import Host
from fleetdiag.inventory.model import LogSource
from fleetdiag.probe import ProbeSettings, probe_command
from fleetdiag.remote import funnel

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "dp_rank.log"


def _writes(tmp_path: Path, cmd: str) -> tuple[list[str], str]:
    """The writes of ``cmd``'s stdout (a file), as strace shows them, and the stdout."""
    out, trace = tmp_path / "out.txt", tmp_path / "trace.txt"
    with out.open("wb") as fo:
        subprocess.run(
            ["strace", "-f", "-y", "-qq", "-s", "65536", "-e", "trace=write,writev", "-o", str(trace), "sh", "-c", cmd],
            stdout=fo,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
    pat = re.compile(r"\bwritev?\(1<" + re.escape(str(out)) + r">, (.*)")
    writes = [m.group(1) for ln in trace.read_text().splitlines() if (m := pat.search(ln))]
    return writes, out.read_text()


def test_the_probe_answer_leaves_in_a_write_per_section(tmp_path, strace):
    log = tmp_path / "run.log"
    log.write_bytes(DEMO.read_bytes())
    settings = ProbeSettings(facts=True, kernel=True)
    cmd, mark = probe_command(Host(name="h"), LogSource("file", str(log)), str(log), settings, load_rules())
    writes, out = _writes(tmp_path, cmd)
    fr = funnel.parse_output(out, mark)
    assert fr.status == "ok" and funnel.CUT not in fr.markers and fr.hits and fr.tail and fr.context, out[-2000:]
    assert len(fr.tags) >= 2, fr.tags  # more than one context pass: still one write for all of them
    # begin, the log's facts with the keyword pass, the other passes, the serving facts (here the latest
    # run's settings lines), the kernel part with the GPU facts, the clock with the end marker (28 before
    # the fifth pass of #27, 19 after it)
    assert len(writes) <= 6, "\n".join(writes)
    assert writes[0].startswith(f'"{mark} begin') and "pathhex" not in writes[0]  # before the log is read
    assert writes[1].startswith('"M\\tpathhex') and "S\\thits" in writes[1]
    assert writes[2].startswith('"S\\ttail')
    assert writes[3].startswith('"F\\tlogline') and writes[4].startswith('"K\\t')
    assert writes[-1].startswith('"M\\tclock') and f"{mark} end" in writes[-1]


def test_a_hung_ps_leaves_the_funnel_sections_already_written(tmp_path):
    """The serving facts' ``ps`` (a process stuck in the kernel makes ps block reading /proc) runs after the
    funnel's last write: while it hangs, every section of the funnel has already left the host."""
    log = tmp_path / "run.log"
    log.write_bytes(DEMO.read_bytes())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "ps-ran"
    (bin_dir / "ps").write_text(f"#!/bin/sh\n: > {ran}\nexec sleep 30\n")
    (bin_dir / "ps").chmod(0o755)
    settings = ProbeSettings(facts=True, kernel=False, path_prepend=str(bin_dir))
    cmd, mark = probe_command(Host(name="h"), LogSource("file", str(log)), str(log), settings, load_rules())
    p = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ran.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ran.exists(), "ps never ran"
        time.sleep(0.3)  # what was written before ps is in the pipe: read it without waiting for more
        os.set_blocking(p.stdout.fileno(), False)
        got = p.stdout.read() or b""
        assert p.poll() is None  # still in ps
        text = got.decode()
        assert f"{mark} end" not in text and "F\t" not in text, text[-500:]  # the facts: after ps
        fr = funnel.parse_output(text, mark)
        assert fr.status == "ok" and fr.hits and fr.tail and len(fr.tags) >= 2, text[-2000:]
        assert {ln.text for ln in fr.context} and "S\tctx\t" in text
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
