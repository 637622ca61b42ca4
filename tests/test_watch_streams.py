"""``watch`` over a stream source: journald, docker, a command's stdout, and a host found by discovery.

Real parts: a real sshd and the real follower (the same exec as every watch). Stand-ins on the node's
PATH, since no journald or docker daemon runs here: ``journalctl`` honouring ``-u UNIT [-f] [-n N]
-o cat --no-pager`` and ``docker`` honouring ``logs [-f] [--tail N] NAME``, both over a plain file
(``tail -n N [-f]``). What that leaves unproven: the real ``journalctl -f`` and ``docker logs -f``
flushing per line (both do upstream; the contract used is only their documented flags). The
discovery case is a real process started as a user would, its stdout a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetdiag.inventory import parse_inventory
from fleetdiag.watch import FAILED, HEALTHY, STARTING, Watch

from .test_watch import DECISIVE, SEED_FAILURE, SEED_HEAD, Run, append, settings

STANDIN = """#!/bin/sh
# stand-in {cmd}: the argument contract of the real one, over plain files
f=; n=all; fol=
{parse}
[ -n "$f" ] || {{ echo "{cmd}: no such unit or container" >&2; exit 1; }}
if [ -n "$fol" ]; then
  sleep {delay}  # a follow that starts late: what the log got meanwhile must not be lost
  if [ "$n" = all ]; then exec tail -n +1 -f "$f"; fi
  exec tail -n "$n" -f "$f"
fi
if [ "$n" = all ]; then exec cat "$f"; fi
exec tail -n "$n" "$f"
"""

JOURNAL_PARSE = """while [ $# -gt 0 ]; do
  case $1 in
    -u) [ "$2" = {unit} ] && f={src}; shift 2 ;;
    -f) fol=1; shift ;;
    -n) n=$2; shift 2 ;;
    -o) [ "$2" = cat ] || exit 2; shift 2 ;;
    --no-pager) shift ;;
    *) echo "journalctl: unknown argument $1" >&2; exit 2 ;;
  esac
done"""

DOCKER_PARSE = """[ "$1" = logs ] || exit 2; shift
while [ $# -gt 1 ]; do
  case $1 in -f) fol=1; shift ;; --tail) n=$2; shift 2 ;; *) echo "docker: unknown flag $1" >&2; exit 2 ;; esac
done
[ "$1" = {name} ] && f={src}"""


def standin(bin_dir: Path, cmd: str, parse: str, delay: float = 0) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / cmd).write_text(STANDIN.format(cmd=cmd, parse=parse, delay=delay))
    (bin_dir / cmd).chmod(0o755)


def host_inv(sshd: Any, logs: str) -> Any:
    text = f"hosts:\n  gpu01:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n" + (
        f"    logs:\n      serve: {logs}\n" if logs else ""
    )
    return parse_inventory(text, "streams.yaml")


def tail_reads(path: Path) -> bool:
    """Whether a ``tail`` process (the follower's command, on this machine's sshd) has ``path`` open."""
    want = str(path)
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or (proc / "comm").read_text().strip() != "tail":
                continue
            if any(os.readlink(fd) == want for fd in (proc / "fd").iterdir()):
                return True
        except OSError:
            continue
    return False


def watch_until_failed(
    sshd: Any,
    inv: Any,
    src: Path,
    bin_dir: Path | None = None,
    shell: str = "auto",
    settle: float = 0.5,
    ready: Callable[[], bool] | None = None,
) -> Any:
    """Watch until the host is up, append the failure, and wait for ``failed``; ``ready``: what must hold
    before the failure is appended (else ``settle`` seconds pass)."""

    async def go() -> Run:
        s = settings(sshd, path_prepend=str(bin_dir) if bin_dir else None, shell=shell)
        async with Run(Watch(list(inv.hosts.values()), s)) as run:
            await run.state("gpu01", HEALTHY, STARTING)
            assert run.watch.views["gpu01"].state != FAILED
            if ready is not None:
                await run.until(ready, what="the follower ready for the appended line")
            else:
                await asyncio.sleep(settle)  # the follower is past its snapshot: the line arrives through it
            append(src, SEED_FAILURE)
            await run.state("gpu01", FAILED)
            return run

    return asyncio.run(go())


@pytest.mark.parametrize("shell", ["auto", "sh"])  # bash's fork-free naps, and plain sh with sleep
def test_journal_source_is_followed_with_journalctl_f(sshd, tmp_path, shell):
    src = tmp_path / "unit.log"
    src.write_text(SEED_HEAD)
    standin(tmp_path / "bin", "journalctl", JOURNAL_PARSE.format(unit="vllm.service", src=src), delay=1)
    # appended right after the snapshot, while `journalctl -f` is still starting (its -n N lines bring it)
    run = watch_until_failed(sshd, host_inv(sshd, "{journal: vllm.service}"), src, tmp_path / "bin", shell, 0)
    v = run.watch.views["gpu01"]
    assert DECISIVE in v.result.decisive.line
    assert v.result.log_source["kind"] == "journal"
    assert v.idle_from == "last line received"
    assert any("idle time counts from the last line received" in m for m in v.to_result().markers)
    failed = [e for e in run.events if e.state == FAILED]
    assert failed[0].to_json()["idle_from"] == "last line received"
    # nothing twice: the -n N lines that repeat the snapshot's end were dropped
    texts = [ln.text for ln in run.watch.watchers[0].buffer.lines()]
    assert texts and len(texts) == len(set(texts)), [t for t in texts if texts.count(t) > 1][:3]
    assert run.watch.watchers[0]._pos == len((SEED_HEAD + SEED_FAILURE).encode())


def test_docker_source_is_followed_with_docker_logs_f(sshd, tmp_path):
    src = tmp_path / "ctr.log"
    src.write_text(SEED_HEAD)
    standin(tmp_path / "bin", "docker", DOCKER_PARSE.format(name="vllm-server", src=src))
    run = watch_until_failed(sshd, host_inv(sshd, "{docker: vllm-server}"), src, tmp_path / "bin")
    v = run.watch.views["gpu01"]
    assert DECISIVE in v.result.decisive.line and v.result.log_source["kind"] == "docker"


def test_command_source_stdout_is_followed_as_a_stream(sshd, tmp_path):
    src = tmp_path / "it's $HOME; `x`.log"  # reaches the remote shell only as quoted data
    src.write_text(SEED_HEAD)
    q = "'" + str(src).replace("'", "'\\''") + "'"
    # the snapshot reads it once; the follower's run (FLEETDIAG_FOLLOW set) streams what comes next
    cmd = f'if [ -n "$FLEETDIAG_FOLLOW" ]; then exec tail -n 0 -f {q}; else cat {q}; fi'
    # `tail -n 0 -f` starts at the end: a line written before it opened the log was never the stream's
    run = watch_until_failed(sshd, host_inv(sshd, json.dumps({"command": cmd})), src, ready=lambda: tail_reads(src))
    v = run.watch.views["gpu01"]
    assert DECISIVE in v.result.decisive.line
    assert v.result.log_source["kind"] == "command" and v.idle_from == "last line received"


@pytest.fixture
def vllm_stdout_file(tmp_path):
    """A stand-in ``vllm`` started as a user would, ``vllm serve ... > some.log 2>&1``, that keeps running."""
    log = tmp_path / "some.log"
    exe = tmp_path / "vllm"
    exe.write_text(
        f"#!{sys.executable}\nimport sys, time\nsys.stdout.write({SEED_HEAD!r})\nsys.stdout.flush()\ntime.sleep(600)\n"
    )
    exe.chmod(0o755)
    proc = subprocess.Popen(
        ["sh", "-c", "exec ./vllm serve facebook/opt-125m > some.log 2>&1"], cwd=tmp_path, start_new_session=True
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (log.exists() and log.stat().st_size >= len(SEED_HEAD.encode())):
        time.sleep(0.05)
    yield log
    proc.kill()
    proc.wait()


def test_host_without_logs_discovers_then_follows_the_found_file(sshd, vllm_stdout_file):
    log = vllm_stdout_file
    run = watch_until_failed(sshd, host_inv(sshd, ""), log)
    v = run.watch.views["gpu01"]
    assert DECISIVE in v.result.decisive.line
    assert v.result.log_source["kind"] == "file" and "stdout" in v.result.log_source["found_by"]
    assert v.log == str(log) and v.idle_from == "log mtime"
