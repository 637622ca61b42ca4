"""Shared fixtures: a real OpenSSH sshd on loopback, and log writers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Commands the tests run keep no connections unless a test asks (--persist): no keeper outlives the suite.
os.environ.setdefault("FLEETDIAG_PERSIST", "0")

from .procs import pids_with
from .sshd import Sshd, start_sshd

# Hermetic. The tests' sshd is this machine: discovery (a host with no log, or a configured log that is
# missing) would see every process on it and read another user's vllm logs; and the CLI would read this
# user's ~/.config rules and history, ~/.ssh/config, known_hosts and keys, and offer its agent's keys. So
# discovery sees only the processes this test session started (its descendants: the fake jobs, sshd's
# sessions); home, config, data and state live in a session dir, and no agent is inherited. (The CLI
# subprocesses the tests spawn inherit all of it; sshd's sessions get the account's own home, as a host's do.)
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="fleetdiag-tests-"))
os.environ["FLEETDIAG_DISCOVER_UNDER"] = str(os.getpid())
for _var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
    os.environ[_var] = str(_SESSION_DIR / _var.lower())
(_SESSION_DIR / "home" / ".ssh").mkdir(parents=True, mode=0o700)
# the keeper's socket and what commands remember to send ahead (ssh/keeper/ahead.py): the session's own
(_SESSION_DIR / "runtime").mkdir(mode=0o700)
os.environ["XDG_RUNTIME_DIR"] = str(_SESSION_DIR / "runtime")
os.environ["HOME"] = str(_SESSION_DIR / "home")
os.environ.pop("SSH_AUTH_SOCK", None)
# Ctrl-C as a user's terminal sends it: a suite started in the background by a shell without job control
# (``cmd &`` in a script, nohup) inherits SIGINT ignored, and its CLI subprocesses would inherit that too
# (Python installs no KeyboardInterrupt handler for a signal ignored at start), so the tests that press
# Ctrl-C would wait on a CLI that never saw it. Handled here, the signal is the default again after exec.
signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
LOGS = ROOT / "logs"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Sshd:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def strace() -> str:
    """strace, which scripts/test installs: a test that traces the remote part's system calls fails without it
    rather than passing unproven."""
    path = shutil.which("strace")
    assert path is not None, "strace is not installed: scripts/test installs it (apt-get install strace)"
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home of the test's own (no ~/.ssh, no ~/.config): for what reads HOME itself."""
    d = tmp_path / "home"
    (d / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(d))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(d / ".config"))
    return d


def inventory_file(path: Path, hosts: dict[str, Any], server: Sshd, **top: Any) -> Path:
    """Write a native inventory of ``hosts`` on ``server`` to ``path``: the one writer of test inventories.

    A string (or path) is the host's log; a mapping holds inventory keys (``log`` is short for
    ``logs: {app: LOG}``; ``address``, ``port`` and ``user`` default to the server's); ``top``: other
    top-level keys (``defaults``, ``groups``). Module-scoped fixtures call it directly; tests use the
    ``write_inventory`` fixture.
    """
    out: dict[str, Any] = {}
    for host, spec in hosts.items():
        entry = {"log": str(spec)} if isinstance(spec, (str, Path)) else dict(spec)
        h: dict[str, Any] = {"address": "127.0.0.1", "port": server.port, "user": server.user}
        if "log" in entry:
            h["logs"] = {"app": str(entry.pop("log"))}
        h.update(entry)
        out[host] = h
    path.write_text(json.dumps({**top, "hosts": out}, indent=1) + "\n")  # JSON is YAML: every value quoted
    return path


@pytest.fixture
def write_inventory(tmp_path: Path, sshd: Sshd) -> Callable[..., Path]:
    """Writes a native inventory of hosts on the tests' sshd (``inventory_file``) and returns its path.

    ``write_inventory({"gpu01": "/path/train.log", "gpu02": {"logs": {"app": {"command": "cat x"}},
    "funnel": {"timeout": 2}}})``. ``server``: another ``Sshd``; ``name``: the file's name in the
    test's tmp dir.
    """

    def write(hosts: dict[str, Any], name: str = "inventory.yaml", server: Sshd | None = None, **top: Any) -> Path:
        return inventory_file(tmp_path / name, hosts, server or sshd, **top)

    return write


@pytest.fixture
def rt(tmp_path):
    """A private runtime dir for this test's keeper; whatever keeper serves it is killed at the end."""
    d = tmp_path / "rt"
    yield d
    for pid in pids_with("fleetdiag.ssh.keeper", str(d)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
