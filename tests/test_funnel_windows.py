"""The keyword pass reads backwards in growing windows and stops at the latest run start: the
result is exactly that of one pass over the whole ``scan_bytes`` (same hits, line numbers, tags,
context, markers), with GNU tools and on a busybox-only node (awk scan, busybox awk)."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetdiag.analysis import load_rules
from fleetdiag.probe import spec_for
from fleetdiag.remote import funnel

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
SEED = (DEMO / "dp_rank.log").read_bytes()
RULES = load_rules(user_default=False)
MIB = 1024 * 1024
BUSYBOX = shutil.which("busybox")


def chatter(n: int, seed: int = 3) -> bytes:
    """``n`` bytes of an earlier run: INFO lines with a few error-shaped ones among them."""
    rng = random.Random(seed)
    out = bytearray()
    i = 0
    while len(out) < n:
        i += 1
        if i % 997 == 0:
            out += f"(EngineCore_DP{i % 4} pid={1000 + i % 7}) RuntimeError: CUDA error: old failure {i}\n".encode()
        else:
            out += f"INFO 07-09 12:{i % 60:02d}:00 [engine.py:{rng.randint(1, 999)}] Avg throughput {rng.random():.3f}\n".encode()
    return bytes(out)


def write(path: Path, *parts: bytes) -> Path:
    path.write_bytes(b"".join(parts))
    return path


def both(log: Path, env: dict | None = None, argv: list[str] | None = None, **spec_kw):
    """The windowed result and the one-pass reference (first window 0: the cap at once)."""
    spec = dataclasses.replace(spec_for(str(log), RULES), **spec_kw)
    ref = dataclasses.replace(spec, first_window=0)
    return run(spec, env, argv), run(ref, env, argv)


def run(spec: funnel.FunnelSpec, env: dict | None, argv: list[str] | None) -> funnel.FunnelResult:
    if env is None:
        return funnel.run_local(spec, timeout=60)
    mark = funnel.new_mark()
    proc = subprocess.run(
        [*(argv or ["sh", "-c"]), funnel.build_script(spec, mark)],
        capture_output=True,
        env=env,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    return funnel.parse_output(proc.stdout.decode("utf-8", "replace"), mark)


def same(a: funnel.FunnelResult, b: funnel.FunnelResult) -> None:
    for name in ("hits", "tail", "context", "tags", "markers", "run_start", "size", "status"):
        assert getattr(a, name) == getattr(b, name), name


def true_lineno(data: bytes, pos: int) -> int:
    return data.count(b"\n", 0, pos) + 1


def test_run_in_the_last_mib_reads_one_mib(tmp_path):
    log = write(tmp_path / "vllm.log", chatter(6 * MIB), SEED)
    win, ref = both(log)
    same(win, ref)
    assert win.window_start == log.stat().st_size - MIB  # stopped at the first window
    assert ref.window_start == 0
    assert win.run_start is not None and win.run_start > log.stat().st_size - len(SEED) - 1
    data = log.read_bytes()
    assert win.hits and all(h.lineno == true_lineno(data, h.pos) for h in win.hits)  # whole-file line numbers
    assert not any("old failure" in h.text for h in win.hits)


def test_run_start_beyond_the_first_window_grows_it(tmp_path):
    """The run started 2 MiB from the end: 1 MiB holds no banner, 8 MiB does."""
    log = write(tmp_path / "vllm.log", chatter(10 * MIB), SEED, chatter(2 * MIB, seed=5))
    win, ref = both(log)
    same(win, ref)
    assert win.window_start == log.stat().st_size - 8 * MIB
    assert any("old failure" in h.text for h in win.hits)  # the latest run's own errors, after its start


def test_no_run_start_scans_the_cap(tmp_path):
    log = write(tmp_path / "vllm.log", chatter(3 * MIB))
    win, ref = both(log, scan_bytes=2 * MIB)
    same(win, ref)
    assert win.window_start == ref.window_start == log.stat().st_size - 2 * MIB
    assert win.run_start is None


def test_banner_on_a_window_edge_is_not_lost(tmp_path):
    """A run-start line cut by the 1 MiB window's first byte is read whole by the next window."""
    banner = b"INFO 07-09 12:00:00 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000\n"
    after = b"(EngineCore_DP0 pid=7) RuntimeError: CUDA error: boom\n"
    pad = b"INFO x\n" * ((MIB - (len(banner) - 5) - len(after)) // 7)
    rest = banner[5:] + after + pad
    rest += b"\n" * (MIB - len(rest))  # exactly 1 MiB from 5 bytes into the banner
    log = write(tmp_path / "vllm.log", chatter(3 * MIB), banner[:5], rest)
    size = log.stat().st_size
    assert size - MIB == 3 * MIB + (len(chatter(3 * MIB)) - 3 * MIB) + 5
    win, ref = both(log)
    same(win, ref)
    assert win.run_start == size - MIB - 5
    assert win.window_start == 0  # the next window (8 MiB) holds the whole file
    assert [h.text for h in win.hits][-1].endswith("CUDA error: boom")


@pytest.mark.skipif(BUSYBOX is None, reason="busybox not installed (scripts/test installs it)")
def test_busybox_node_same_result(tmp_path):
    box = tmp_path / "bb"
    box.mkdir()
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        (box / a).symlink_to(BUSYBOX)
    # Small windows (32 KiB, then 256 KiB): busybox awk's regex scan is slow on megabytes.
    log = write(tmp_path / "vllm.log", chatter(300_000), SEED, chatter(70_000, seed=5))
    env = {"PATH": str(box)}
    win, ref = both(log, env=env, argv=[str(box / "sh"), "-c"], first_window=32768)
    assert "no GNU grep: awk scan" in win.markers
    same(win, ref)
    assert win.window_start == log.stat().st_size - 8 * 32768
    gnu, _ = both(log, first_window=32768)
    assert [(h.pos, h.lineno, h.text) for h in win.hits] == [(h.pos, h.lineno, h.text) for h in gnu.hits]


@pytest.mark.skipif(shutil.which("mawk") is None, reason="mawk not installed")
def test_mawk_same_result(tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    (box / "awk").symlink_to(shutil.which("mawk"))
    log = write(tmp_path / "vllm.log", chatter(6 * MIB), SEED)
    env = dict(os.environ, PATH=f"{box}:{os.environ['PATH']}")
    win, ref = both(log, env=env)
    same(win, ref)
    assert win.window_start == log.stat().st_size - MIB


def test_cr_only_log_line_numbers_in_a_window(tmp_path):
    """CR-only line ends: the newlines before the window are counted as CRs, as the whole-file pass reads them."""
    log = write(tmp_path / "vllm.log", chatter(3 * MIB).replace(b"\n", b"\r"), SEED.replace(b"\n", b"\r"))
    win, ref = both(log)
    same(win, ref)
    assert win.window_start == log.stat().st_size - MIB
    data = log.read_bytes()
    assert win.hits and all(h.lineno == data.count(b"\r", 0, h.pos) + 1 for h in win.hits)
