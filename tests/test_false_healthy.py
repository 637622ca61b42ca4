"""No silent healthy: CR-only line ends are lines, a line the scan window cut is named, and the
follower's byte positions stay integers past 2 GiB under mawk."""

from __future__ import annotations

import os
import subprocess
import time

from fleetdiag.analysis import load_rules
from fleetdiag.probe import spec_for
from fleetdiag.remote import follow, funnel

RULES = load_rules(user_default=False)


def test_cr_only_log_is_split_into_lines(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"INFO starting\rINFO loading\rRuntimeError: CUDA error: out of memory\rINFO after\r")
    fr = funnel.run_local(spec_for(str(log), RULES), timeout=30)
    texts = [ln.text for ln in fr.hits]
    assert "RuntimeError: CUDA error: out of memory" in texts
    assert [ln.text for ln in fr.tail][-2:] == ["RuntimeError: CUDA error: out of memory", "INFO after"]
    assert any("CR" in m for m in fr.markers)
    pos = next(ln.pos for ln in fr.hits if ln.text.startswith("RuntimeError"))
    assert log.read_bytes()[pos : pos + 12] == b"RuntimeError"  # offsets stay exact


def test_window_cutting_a_long_line_says_so(tmp_path):
    log = tmp_path / "vllm.log"
    with open(log, "wb") as fh:
        fh.write(b"INFO ok\nRuntimeError: CUDA error: an illegal memory access " + b"x" * 3_000_000 + b"\nINFO next\n")
    spec = spec_for(str(log), RULES)
    spec.scan_bytes = 1_000_000
    fr = funnel.run_local(spec, timeout=30)
    assert any("starts inside a line" in m for m in fr.markers), fr.markers


def test_short_cut_line_is_not_noise(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"INFO routine line\n" * 100_000)
    spec = spec_for(str(log), RULES)
    spec.scan_bytes = 100_001
    fr = funnel.run_local(spec, timeout=30)
    assert not any("starts inside" in m for m in fr.markers), fr.markers


def test_follower_positions_past_4_gib_are_integers(tmp_path):
    log = tmp_path / "big.log"
    with open(log, "wb") as fh:
        fh.truncate(10 * 1024**3)  # sparse: 10 GiB of NUL, no disk
        fh.seek(0, os.SEEK_END)
        fh.write(b"\nINFO up\n")
    mark = funnel.new_mark()
    spec = follow.FollowSpec(funnel=spec_for(str(log), RULES), mode="poll", poll=0.1, heartbeat=0.3)
    spec.funnel.scan_bytes = 4096
    env = dict(os.environ, PATH="/usr/bin:/bin")
    proc = subprocess.Popen(
        ["sh", "-c", follow.build_script(spec, mark)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.stdout is not None
        while proc.stdout.readline().decode().rstrip("\n") != mark + " end":
            pass
        with open(log, "ab") as fh:
            fh.write(b"RuntimeError: boom\n")
        deadline = time.monotonic() + 20
        raws = []
        while time.monotonic() < deadline:
            raw = proc.stdout.readline().decode().rstrip("\n")
            raws.append(raw)
            rec = follow.parse_record(raw)
            if isinstance(rec, follow.Line) and rec.text == "RuntimeError: boom":
                assert rec.pos == 10 * 1024**3 + len(b"\nINFO up\n")
                break
        else:
            raise AssertionError(raws[-5:])
        assert not any("e+" in r for r in raws)
    finally:
        proc.kill()
        proc.wait()
