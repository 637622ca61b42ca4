"""Send-ahead: a warm ``probe HOST`` sends its command to the keeper before the CLI has imported what
only the answer needs (click's commands, rich, the inventory, the analysis: ~0.3 s), so the host's
work and the round trip run while the rest of the CLI loads.

How it stays exact. The request a probe sends is decided by its arguments, its working directory,
its environment, the inventory and the rules. After a single-host probe through the keeper, the CLI
remembers that request under a digest of the first three (``remember``), with the state of the
inventory file it read, in the keeper's private directory (a file per command line). The next identical command finds it before
importing anything heavy (``send_early``, from ``fleetdiag.entry``) and sends it with ``kept_only``: the
keeper runs it only on a connection it already holds, never dials for it. The CLI then runs exactly as
without send-ahead; where it would send its request (``KeptConnection.execute``), an early request
equal to it is taken instead of sending again (``take``). Anything that would have changed the command
(an edited inventory or rules file, another log) makes the two differ: the early one is dropped, unread,
and the CLI's own goes out as usual. So the output is the one the CLI alone would print.

The end-of-output marker is random per command (a log cannot forge it). The remembered request carries
a fresh one, used once (``send_early`` takes the entry away from its name): the probe builds its command with the early request's marker (``command``), and
``remember`` builds the next one with a new marker.

Only the standard library and ``place`` are imported here: this runs before the CLI's own imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .place import private_dir, runtime_dir, socket_path

OFF_ENV = "FLEETDIAG_AHEAD"  # "0": never send ahead (benchmarks compare both ways)
STORE_DIR = "ahead"  # one file per remembered command line, named by its digest
KEEP = 32  # remembered command lines (the most recently written)
MAX_ENTRY = 4 << 20  # bytes read from one entry at most (a probe's request is ~52 KB)
WAIT = 0.2  # seconds for the keeper's hello (client.HELLO_TIMEOUT): a busy keeper is not waited on
WAIT_ENV = "FLEETDIAG_KEEPER_HELLO"  # client.HELLO_ENV: the same override (a heavily loaded machine, tests)
# What else decides a probe's request besides its arguments: where it looks for its files and whose they are.
ENV_KEYS = ("HOME", "USER", "LOGNAME", "SSH_AUTH_SOCK", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "XDG_DATA_HOME")


@dataclass
class Early:
    """A request sent by ``send_early``; its socket waits for whoever ``take``s it."""

    sock: socket.socket
    request: dict[str, Any]
    mark: str
    sent: float  # time.perf_counter() when it left
    taken: bool = False
    used: bool = False  # taken by an equal request: its answer is the probe's


_early: Early | None = None
_active = False  # set by send_early: only the console entry's probes take part
_probe: tuple[str, str] | None = None  # (command, marker) of this process's probe, from command
_sent: dict[str, Any] | None = None  # the request that carried it, from take
_build: Callable[[str | None], tuple[str, str]] | None = None  # builds it again with another marker


def argv_key(argv: list[str], cwd: str, env: dict[str, str]) -> str:
    """A digest of what decides a command's request besides its files (no secret goes in: a passphrase in
    the environment turns send-ahead off)."""
    picked = {k: v for k, v in env.items() if k in ENV_KEYS or (k.startswith("FLEETDIAG_") and k != OFF_ENV)}
    blob = json.dumps([list(argv), cwd, sorted(picked.items())]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def file_state(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_ino, st.st_size, st.st_mtime_ns]


def _wanted(argv: list[str]) -> bool:
    return "probe" in argv[1:] and os.environ.get(OFF_ENV, "1") != "0" and not os.environ.get("FLEETDIAG_PASSPHRASE")


def _entry(directory: Path, key: str) -> dict[str, Any] | None:
    """The remembered entry of ``key``, claimed: a file of ours, private, of bounded size, that this
    process took away from its name (so its marker goes out once: two CLIs at once, or one killed after
    sending, never send it again; the next CLI that completes remembers a fresh one); None otherwise."""
    store = directory / STORE_DIR
    claimed = store / f".claim.{os.getpid()}.{key}"
    try:  # a rename is atomic: of two processes, one gets the file (the other: no entry)
        os.rename(store / f"{key}.json", claimed)
        fd = os.open(claimed, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        try:
            os.unlink(claimed)
        except OSError:
            pass
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size > MAX_ENTRY:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = json.loads(fh.read(MAX_ENTRY))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _frame(sock: socket.socket) -> bytes:
    """One frame (``wire``'s format: a 4-byte big-endian length, then the payload)."""
    head = _exactly(sock, 4)
    (n,) = struct.unpack(">I", head)
    if n > 1 << 16:
        raise ValueError("frame too large for a hello")
    return _exactly(sock, n)


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("keeper closed")
        buf += chunk
    return buf


def send_early(argv: list[str] | None = None) -> bool:
    """Send the remembered request of this very command line, if there is one and a keeper of ours
    answers at once; True when it left. Never raises: anything unusual means no send-ahead."""
    global _early, _active
    argv = list(sys.argv if argv is None else argv)
    if not _wanted(argv):
        return False
    _active = True
    sock = None
    try:
        directory = runtime_dir()
        if private_dir(directory, create=False) is None:
            return False
        entry = _entry(directory, argv_key(argv[1:], os.getcwd(), dict(os.environ)))
        if not isinstance(entry, dict) or any(file_state(f[0]) != f for f in entry.get("files") or []):
            return False
        req, mark = entry.get("request"), entry.get("mark")
        if not isinstance(req, dict) or req.get("op") != "run" or not isinstance(mark, str):
            return False
        path = socket_path(directory)
        st = os.lstat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(float(os.environ.get(WAIT_ENV) or WAIT))
        sock.connect(str(path))
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", raw)[1] != os.getuid():
            raise ConnectionError("keeper runs as another user")
        if json.loads(_frame(sock)).get("hello") != 1:
            raise ConnectionError("not a keeper")
        payload = json.dumps({**req, "kept_only": True}).encode()
        sock.sendall(struct.pack(">I", len(payload)) + payload)
        sock.setblocking(False)
    except (OSError, ValueError, TypeError, AttributeError):
        if sock is not None:
            sock.close()
        return False
    _early = Early(sock, req, mark, time.perf_counter())
    return True


def command(build: Callable[[str | None], tuple[str, str]]) -> tuple[str, str]:
    """The probe's (command, marker) from ``build(marker)`` (None: a fresh marker): built with the early
    request's marker, so that when nothing else changed it is the very request sent ahead. ``build`` is
    kept to make the next command line's request, with a fresh marker (``remember``)."""
    global _probe, _build
    if not _active:
        return build(None)
    e = _early
    cmd, mark = build(e.mark if e is not None and not e.taken else None)
    if _probe is None:
        _probe, _build = (cmd, mark), build
    return cmd, mark


def take(req: dict[str, Any]) -> socket.socket | None:
    """The early request's socket when ``req`` is exactly what it sent (then its answer is read from
    there); None otherwise, and an early request that differs is dropped unread."""
    global _sent
    if not _active:
        return None
    if _sent is None and _probe is not None and req.get("command") == _probe[0]:
        _sent = dict(req)
    e = _early
    if e is None or e.taken:
        return None
    e.taken = True
    if req != e.request:
        e.sock.close()
        return None
    e.used = True
    return e.sock


def sent_at() -> float | None:
    """``time.perf_counter()`` when the request whose answer this process used was sent ahead (a probe's
    total time counts from there); None when none was."""
    return _early.sent if _early is not None and _early.used else None


def remember(argv: list[str] | None = None, files: list[str] | tuple[str, ...] = ()) -> None:
    """Keep this process's probe request for the next identical command line, with a fresh marker;
    ``files``: what else decided it (the inventory file). Quietly does nothing when it cannot."""
    if not _active or _sent is None or _build is None:
        return
    argv = list(sys.argv if argv is None else argv)
    try:
        directory = runtime_dir()
        if private_dir(directory, create=False) is None:
            return
        cmd, fresh = _build(None)
        req = {**_sent, "command": cmd}
        key = argv_key(argv[1:], os.getcwd(), dict(os.environ))
        _save(directory, key, {"request": req, "mark": fresh, "files": [file_state(os.path.abspath(f)) for f in files]})
    except (OSError, ValueError, TypeError):
        return


def _save(directory: Path, key: str, entry: dict[str, Any]) -> None:
    """Write ``entry`` as ``key``'s file, atomically, private to the user; keep the ``KEEP`` newest."""
    store = directory / STORE_DIR
    store.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(store)
    if not os.path.isdir(store) or os.path.islink(store) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return
    tmp = store / f".{key}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(json.dumps(entry).encode())
    os.replace(tmp, store / f"{key}.json")
    files = sorted(store.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    for old in files[: max(0, len(files) - KEEP)]:
        old.unlink(missing_ok=True)
    _reap(store)


def _reap(store: Path) -> None:
    """Remove what CLIs killed mid-claim (``.claim.PID.KEY``) or mid-write (``.KEY.PID``) left: files of a
    process that is gone, so that kills cannot pile them up (a live process's file is its own)."""
    for name in os.listdir(store):
        if not name.startswith("."):
            continue
        parts = name.split(".")  # ['', 'claim', PID, KEY] or ['', KEY, PID]
        pid = parts[2] if len(parts) == 4 and parts[1] == "claim" else parts[-1] if len(parts) == 3 else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            (store / name).unlink(missing_ok=True)
        except OSError:  # alive, another user's pid number: not ours to judge
            continue


def reset() -> None:
    """Forget this process's send-ahead state (tests that run several commands in one process)."""
    global _early, _active, _probe, _sent, _build, _local, _local_active, _local_build
    if _early is not None and not _early.taken:
        _early.sock.close()
    if _local is not None:
        _stop(_local)
    _early, _active, _probe, _sent, _build = None, False, None, None, None
    _local, _local_active, _local_build = None, False, None


# ---- analyze: the funnel's pass over a local file, started before the CLI's imports
#
# ``fleetdiag analyze FILE`` runs the funnel script through the local ``sh``; the script is decided by
# the file's path and the rules' patterns, so it is remembered the same way as a probe's request (its
# rules files in place of the inventory) and started by the entry point, its output into an unnamed temp
# file. ``local_output`` hands it over only when the CLI built that very script; else it is killed, and
# the CLI runs its own. The same private store, under a ``local-`` key.


@dataclass
class EarlyLocal:
    """The funnel started by ``start_local``; its stdout goes to ``out`` (a temp file: it never blocks)."""

    proc: Any  # subprocess.Popen
    out: Any  # the temp file
    script: str
    mark: str


# The early funnel's ``sh`` ($1) under a watcher that kills its whole process group when the CLI's end of
# the stdin pipe closes: a CLI killed before it took the output (SIGKILL, SIGTERM, a closed terminal: no
# atexit runs) leaves nothing reading the log. The funnel itself reads /dev/null, as before.
_WATCHED = 'exec 3<&0 </dev/null; { read -r _ <&3; kill -KILL 0; } & exec sh -c "$1" 3<&-'

_local: EarlyLocal | None = None
_local_active = False
_local_build: Callable[[str | None], tuple[str, str]] | None = None


def start_local(argv: list[str] | None = None) -> bool:
    """Start the remembered funnel of this ``analyze`` command line; True when it runs. Never raises."""
    global _local, _local_active
    argv = list(sys.argv if argv is None else argv)
    if "analyze" not in argv[1:] or os.environ.get(OFF_ENV, "1") == "0" or "-" in argv[1:]:
        return False
    _local_active = True
    try:
        directory = runtime_dir()
        if private_dir(directory, create=False) is None:
            return False
        entry = _entry(directory, "local-" + argv_key(argv[1:], os.getcwd(), dict(os.environ)))
        if not isinstance(entry, dict) or any(file_state(f[0]) != f for f in entry.get("files") or []):
            return False
        script, mark = entry.get("script"), entry.get("mark")
        if not isinstance(script, str) or not isinstance(mark, str):
            return False
        import subprocess
        import tempfile

        out = tempfile.TemporaryFile()
        proc = subprocess.Popen(  # its own process group: stopped with the pipeline under it (_stop)
            ["sh", "-c", _WATCHED, "sh", script],
            stdin=subprocess.PIPE,  # the CLI's end: when it closes, the watcher stops the group
            stdout=out,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except (OSError, ValueError, TypeError):
        return False
    _local = EarlyLocal(proc, out, script, mark)
    import atexit

    atexit.register(stop_local)  # a CLI that ends before it takes the output (Ctrl-C; cli.run calls it too)
    return True


def _stop(e: EarlyLocal) -> None:
    """Stop the early funnel and every process of its group (its ``sh`` alone would leave the pipeline
    reading the log to its end), and free its output."""
    import signal

    try:
        os.killpg(e.proc.pid, signal.SIGKILL)
    except OSError:  # the group is gone already
        pass
    e.proc.wait()
    _release(e)


def _release(e: EarlyLocal) -> None:
    """Close the watcher's pipe (it ends, with what is left of the group) and the output file."""
    try:
        e.proc.stdin.close()
    except OSError:
        pass
    e.out.close()


def stop_local() -> None:
    """Stop an early funnel whose output was never taken (the command failed before it read its log)."""
    global _local
    e, _local = _local, None
    if e is not None:
        _stop(e)


def local_script(build: Callable[[str | None], tuple[str, str]]) -> tuple[str, str]:
    """``build(marker)``'s (script, marker), with the early funnel's marker when one runs (as ``command``)."""
    global _local_build
    if not _local_active:
        return build(None)
    if _local_build is None:
        _local_build = build
    return build(_local.mark if _local is not None else None)


def local_output(script: str, timeout: float | None = None) -> bytes | None:
    """The early funnel's stdout when it ran ``script``; None otherwise (it is stopped, unread)."""
    global _local
    e, _local = _local, None
    if e is None:
        return None
    if e.script != script:
        _stop(e)
        return None
    try:
        e.proc.wait(timeout)
    except Exception:  # subprocess.TimeoutExpired: as subprocess.run, the child is killed first
        _stop(e)
        raise
    e.out.seek(0)
    data = e.out.read()
    _release(e)
    return data


def remember_local(files: list[str] | tuple[str, ...] = (), argv: list[str] | None = None) -> None:
    """Keep this ``analyze``'s funnel script, with a fresh marker, for the next identical command line;
    ``files``: the rules files that decided it."""
    if not _local_active or _local_build is None:
        return
    argv = list(sys.argv if argv is None else argv)
    try:
        directory = runtime_dir()
        if private_dir(directory) is None:
            return
        script, mark = _local_build(None)
        key = "local-" + argv_key(argv[1:], os.getcwd(), dict(os.environ))
        _save(
            directory, key, {"script": script, "mark": mark, "files": [file_state(os.path.abspath(f)) for f in files]}
        )
    except (OSError, ValueError, TypeError):
        return
