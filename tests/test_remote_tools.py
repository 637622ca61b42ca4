"""Remote tools cannot hold the host or the probe: nvidia-smi runs under ``timeout -k`` (a
TERM-ignoring one is killed) and its output is capped with ``head -c`` (never buffered whole).
The stand-in nvidia-smi sits in a directory given as --path-prepend, as the demo does it."""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from pathlib import Path

from fleetdiag import facts
from fleetdiag.analysis import load_rules
from fleetdiag.probe import spec_for
from fleetdiag.remote import funnel
from fleetdiag.ssh.transport import connect

from .test_reliability import SEED, write_log

RULES = load_rules(user_default=False)


def stand_in(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return bindir


def run_facts(sshd, log: Path, bindir: Path) -> tuple[funnel.FunnelResult, float, int]:
    spec = spec_for(str(log), RULES)
    spec.extra += facts.GPU_SNIPPET
    spec.extra_vars.update(facts.snippet_vars(str(bindir), timeout=1))

    async def go():
        conn = await connect("127.0.0.1", sshd.port, sshd.user, sshd.opts())
        try:
            mark = funnel.new_mark()
            t0 = time.monotonic()
            out, *_ = await conn.run(funnel.remote_command(funnel.build_script(spec, mark)), 60)
            return funnel.parse_output(out.decode("utf-8", "replace"), mark), time.monotonic() - t0, len(out)
        finally:
            conn.close()

    return asyncio.run(go())


def test_term_ignoring_nvidia_smi_is_killed(sshd, tmp_path):
    secs = f"{random.randint(3000, 9000)}.{random.randint(10, 99)}"
    bindir = stand_in(tmp_path, f"trap '' TERM\nexec sleep {secs}\n")
    log = write_log(tmp_path / "vllm.log", SEED)
    try:
        fr, took, _ = run_facts(sshd, log, bindir)
        assert took < 15
        assert funnel.CUT not in fr.markers
        assert fr.facts["raw"]["nvidia_smi_error"][0].startswith("exit 137"), fr.facts["raw"]
        time.sleep(0.5)
        left = subprocess.run(
            ["pgrep", "-f", f"sleep {secs}"], capture_output=True, text=True, check=False
        ).stdout.split()
        assert left == [], "a TERM-ignoring nvidia-smi was left running"
    finally:
        subprocess.run(["pkill", "-KILL", "-f", f"sleep {secs}"], capture_output=True, check=False)


def test_endless_nvidia_smi_output_is_capped(sshd, tmp_path):
    bindir = stand_in(tmp_path, "exec yes '0, GPU-0, NVIDIA H200, 10, 143771, 0'\n")
    log = write_log(tmp_path / "vllm.log", SEED)
    fr, _took, size = run_facts(sshd, log, bindir)
    assert funnel.CUT not in fr.markers
    assert size < 2 * facts.SMI_CAP
    assert "gpu" not in fr.facts["raw"]  # a cut answer is not read as GPUs
    assert fr.facts["raw"]["nvidia_smi_error"] == [f"output over {facts.SMI_CAP} bytes: not read"]
    assert fr.status == "ok" and fr.hits  # the funnel itself still ran


def test_normal_nvidia_smi_answer_still_reads(sshd, tmp_path):
    bindir = stand_in(
        tmp_path,
        "case \"$*\" in *query-gpu*) echo '0, GPU-a, NVIDIA H200, 10, 143771, 0'; "
        "echo '1, GPU-b, NVIDIA H200, 10, 143771, 0' ;; esac\n",
    )
    log = write_log(tmp_path / "vllm.log", SEED)
    fr, _, _ = run_facts(sshd, log, bindir)
    assert fr.facts["raw"]["gpu"] == ["0, GPU-a, NVIDIA H200, 10, 143771, 0", "1, GPU-b, NVIDIA H200, 10, 143771, 0"]
    assert "nvidia_smi_error" not in fr.facts["raw"]
