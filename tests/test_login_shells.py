"""Every login shell runs the same fixed exec request: a log path, pattern or --path-prepend with a
newline (or any other shell syntax) stays data under bash, dash, zsh, tcsh and fish.

tcsh splits single-quoted text at newlines and fish reads backslashes inside single quotes, so
the script travels as base64 behind a fixed wrapper (``fleetdiag.remote``). Each shell is a real
sshd whose ForceCommand runs the exec request through it, as a user's login shell would.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import pytest

from fleetdiag import remote
from fleetdiag.analysis import load_rules
from fleetdiag.facts import parse_launch
from fleetdiag.preflight import preflight_host
from fleetdiag.probe import ProbeSettings, probe_host, spec_for
from fleetdiag.records import FAILED
from fleetdiag.remote import follow, funnel
from fleetdiag.ssh.transport import connect

from .sshd import start_sshd
from .test_reliability import SEED, make_host, write_log

RULES = load_rules(user_default=False)
SHELLS = ["bash", "dash", "zsh", "tcsh", "fish"]


@pytest.fixture(scope="module", params=SHELLS)
def shell_sshd(request, tmp_path_factory):
    path = shutil.which(request.param)
    if path is None:
        pytest.skip(f"{request.param} not installed (scripts/test installs it)")
    server = start_sshd(tmp_path_factory.mktemp("sshd-" + request.param), login_shell=path)
    yield server
    server.stop()


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def hostile_path(d: Path, canary: Path) -> str:
    return f"{d}/x\ntouch {canary}\n'\ntouch {canary}\n\\\ntouch {canary}\n"


def test_wrapper_is_fixed_and_payload_is_inert():
    cmd = remote.remote_command("echo '\n'; touch /tmp/x\n")
    wrapper, _, payload = cmd.rpartition(" ")
    assert wrapper == remote.WRAPPER
    assert set(payload) <= set(remote.B64 + "=")
    for c in "\\\n!":
        assert c not in cmd


def test_probe_hostile_log_path_runs_nothing_and_real_log_fails(shell_sshd, tmp_path):
    canary = Path("/tmp") / f"PWNED-{uuid.uuid4().hex}"
    log = write_log(tmp_path / "vllm.log", SEED)
    try:
        bad = asyncio.run(
            probe_host(
                make_host(shell_sshd.port, hostile_path(tmp_path, canary)),
                ProbeSettings(transport=shell_sshd.opts(), rules=RULES),
            )
        )
        assert not canary.exists()
        assert bad.verdict != FAILED and bad.error, bad
        good = asyncio.run(
            probe_host(make_host(shell_sshd.port, log), ProbeSettings(transport=shell_sshd.opts(), rules=RULES))
        )
        assert good.verdict == FAILED, good
        assert good.decisive is not None
    finally:
        if canary.exists():
            canary.unlink()


def test_preflight_hostile_path_prepend_runs_nothing(shell_sshd, tmp_path):
    canary = Path("/tmp") / f"PWNED-{uuid.uuid4().hex}"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *query-gpu*) echo '0, GPU-1, NVIDIA H200, 10, 143771, 0' ;; esac\n")
    smi.chmod(0o755)
    launch = parse_launch(["vllm", "serve", "m", "-tp", "1"])
    try:
        for prepend in (f"{bindir}\ntouch {canary}\n", str(bindir)):
            settings = ProbeSettings(transport=shell_sshd.opts(), rules=RULES, path_prepend=prepend)
            res = asyncio.run(preflight_host(make_host(shell_sshd.port, "/dev/null"), launch, settings))
            assert not canary.exists()
            assert res.error is None, res
        names = {c.name: c for c in res.checks}
        assert names["nvidia-smi"].status == "pass", res.checks  # the clean path found the stand-in
    finally:
        if canary.exists():
            canary.unlink()


def test_follower_hostile_log_runs_nothing_and_streams(shell_sshd, tmp_path):
    canary = Path("/tmp") / f"PWNED-{uuid.uuid4().hex}"
    log = write_log(tmp_path / "vllm.log", b"starting\n")

    async def follow_once(path: str, grow: bool) -> list:
        conn = await connect("127.0.0.1", shell_sshd.port, shell_sshd.user, shell_sshd.opts())
        mark = funnel.new_mark()
        spec = follow.FollowSpec(funnel=spec_for(path, RULES), heartbeat=0.3, poll=0.1, session="t1")
        proc = await conn.conn.create_process(funnel.remote_command(follow.build_script(spec, mark)), encoding=None)
        recs: list = []
        try:

            async def read() -> None:
                seen_end = False
                while True:
                    line = await proc.stdout.readline()
                    if not line:
                        return
                    text = line.decode().rstrip("\n")
                    if text == mark + " end":
                        seen_end = True
                        if grow:
                            await asyncio.to_thread(append, log, b"RuntimeError: boom\n")
                        continue
                    if seen_end:
                        rec = follow.parse_record(text)
                        recs.append(rec)
                        if not grow and isinstance(rec, follow.Heartbeat):
                            return
                        if isinstance(rec, follow.Line) and "boom" in rec.text:
                            return

            await asyncio.wait_for(read(), 20)
        finally:
            proc.close()
            conn.close()
        return recs

    try:
        recs = asyncio.run(follow_once(hostile_path(tmp_path, canary), False))
        assert not canary.exists()
        assert any(isinstance(r, follow.Heartbeat) for r in recs)
        recs = asyncio.run(follow_once(str(log), True))
        assert any(isinstance(r, follow.Line) and r.text == "RuntimeError: boom" for r in recs)
    finally:
        if canary.exists():
            canary.unlink()
