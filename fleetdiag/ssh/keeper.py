"""Kept connections: a small per-user background process that holds SSH connections open.

Like OpenSSH's ControlPersist. The first command that probes with ``--persist``
starts the keeper; it dials each host once and keeps the authenticated
connection for ``persist`` seconds after its last use, so the next probe,
sweep or watch of that host costs a channel open and an exec (about two round
trips) instead of a whole handshake (nine to twelve).

Why it is shaped like this:

- **Safe by construction.** The socket lives in the user's runtime directory
  (platformdirs, else ``/tmp/fleetdiag-UID``): the directory must be 0700 and
  owned by the user, the socket is 0600, and both ends check the other's uid
  with ``SO_PEERCRED`` on every connection. Nothing secret is written: the
  keeper dials with the same ssh config, agent and key files the client names,
  and an encrypted key's passphrase reaches it only through the environment it
  inherits from the command that started it.
- **Keyed by everything that decides a connection**: address, port, user, the
  jump chain, identity files, known_hosts, ssh config (their contents or
  identity on disk), the agent socket and the options that change the login.
  A changed inventory entry or ssh config therefore never reuses a connection.
- **Trust re-checked on every reuse.** A kept connection remembers every file that
  decided its trust (``transport.trust_of``: the ssh config and the files it
  Includes, each known_hosts file that applied, the key files); on each reuse,
  and while idle, a changed one closes it, so a revoked or removed key is refused
  by the next command exactly as a direct connection would refuse it.
- **Never in the way.** The client waits at most ~200 ms for the keeper's
  hello; a missing, stale or wedged keeper means a direct connection, silently.
  The keeper detaches fully (double fork, ``setsid``, stdio on /dev/null, no
  inherited descriptors), so a cron job's pipe closes when the command ends.
  It closes each connection once idle past ``persist`` and exits when it holds
  none. A dead connection is dropped and redialled once.

Protocol: frames of a 4-byte big-endian length and a payload. The keeper opens
with ``{"hello": 1, "pid": ...}``. A request is one JSON frame
(``op``: ``open``, ``run``, ``list``, ``close``). ``run`` answers with
frames whose first byte says what follows: ``O`` stdout bytes, ``E`` stderr
bytes, ``X`` a JSON end record (exit status, timings, error). The keeper stops
reading a command's output at ``cap`` bytes (8 MiB by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import child
from .reach import (
    CLOSED,
    CONNECT_TIMEOUT,
    CUT_LOST,
    DEFAULT_KEY_FILES,
    KEEPER_LOST,
    KEY,
    MAX_OUTPUT,
    NOT_RUN,
    STDERR_KEEP,
    TIMEOUT,
    CommandEnd,
    HostError,
    RunOutcome,
    TransportOptions,
    outcome,
)

PERSIST_ENV = "FLEETDIAG_PERSIST"
RUNTIME_ENV = "FLEETDIAG_RUNTIME_DIR"  # where the socket lives (tests, or a user who wants it elsewhere)
DEFAULT_PERSIST = 600.0
OUTPUT_CAP = MAX_OUTPUT  # the one cap on what is read from a host (reach.py)
HELLO_TIMEOUT = 0.2  # a keeper that does not say hello within this is wedged: connect directly
HELLO_ENV = "FLEETDIAG_KEEPER_HELLO"  # seconds, to override HELLO_TIMEOUT (a heavily loaded machine, tests)
# A command's run request goes to a keeper that answered its open a moment ago: it is alive, maybe
# busy (hundreds of hosts' commands in one process), so it gets this long to say hello.
RUN_HELLO = 10.0
START_WAIT = 3.0  # how long a command waits for a keeper it started before connecting directly
SOCKET_NAME = "keeper.sock"
LOCK_NAME = "keeper.lock"
EXIT_GRACE = 2.0  # an idle keeper with no connection exits after this
TRUST_CHECK = 5.0  # seconds between checks of idle connections' trust files (every reuse checks them too)


# --------------------------------------------------------------------------- the place


def runtime_dir() -> Path:
    """The keeper's directory: $FLEETDIAG_RUNTIME_DIR, the user's runtime dir, else /tmp/fleetdiag-UID."""
    env = os.environ.get(RUNTIME_ENV)
    if env:
        return Path(env)
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            import platformdirs

            base = Path(platformdirs.user_runtime_dir("fleetdiag"))
        except Exception:  # noqa: BLE001 (no platformdirs, or it failed: the fallback below)
            base = None
    if base is not None and base.parent.is_dir() and os.access(base.parent, os.W_OK):
        return base
    return Path(f"/tmp/fleetdiag-{os.getuid()}")


def private_dir(path: Path, create: bool = True) -> Path | None:
    """``path`` when it is a directory of ours that only we can use (0700); None otherwise."""
    try:
        if create:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    try:
        parent = os.stat(path.parent)
    except OSError:
        return None
    if parent.st_uid not in (0, os.getuid()):  # someone else could swap our directory for theirs
        return None
    if len(os.fsencode(path / SOCKET_NAME)) > 100:  # AF_UNIX paths are short (108 bytes on Linux)
        return None
    return path


def socket_path(directory: Path | None = None) -> Path:
    return (directory or runtime_dir()) / SOCKET_NAME


# --------------------------------------------------------------------------- the key


def _file_id(path: str | os.PathLike[str] | None, content: bool = False) -> list[Any]:
    """What identifies a file's state: its contents' hash (not secret files), else inode/size/mtime."""
    if not path:
        return [None]
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError:
        return [str(p), None]
    if content and st.st_size < 1 << 20:
        try:
            return [str(p), hashlib.sha256(p.read_bytes()).hexdigest()]
        except OSError:
            pass
    return [str(p), st.st_ino, st.st_size, st.st_mtime_ns]


def connect_params(
    target: str, port: int | None, user: str | None, opts: TransportOptions, jump: Any = None
) -> dict[str, Any]:
    """The plain (JSON) description of one connection: what the keeper needs to dial it. No secrets."""
    return {
        "target": target,
        "port": port,
        "user": user,
        "jump": _plain(jump),
        "known_hosts": opts.known_hosts,
        "accept_new": opts.accept_new,
        "connect_timeout": opts.connect_timeout,
        "ssh_config": opts.ssh_config,
        "client_keys": opts.client_keys,
        "keepalive": opts.keepalive,
        "agent_path": os.environ.get("SSH_AUTH_SOCK"),
    }


def connection_key(params: dict[str, Any]) -> str:
    """A digest of everything that decides which connection ``params`` gets.

    Files count by their state on disk: an edited ssh config or known_hosts, or
    a replaced key file, is a different connection.
    """
    home_ssh = Path.home() / ".ssh"
    configs = params.get("ssh_config")
    if configs is None:
        configs = [str(home_ssh / "config")]
    keys = params.get("client_keys")
    if keys is None:
        keys = [str(home_ssh / n) for n in DEFAULT_KEY_FILES]
    known = params.get("known_hosts") or str(home_ssh / "known_hosts")
    decided = {
        "where": [params["target"], params.get("port"), params.get("user"), params.get("jump")],
        "configs": [_file_id(c, content=True) for c in configs],
        "keys": [_file_id(k) for k in keys],
        "known_hosts": _file_id(known, content=True),
        "accept_new": bool(params.get("accept_new")),
        "agent": params.get("agent_path"),
        "keepalive": params.get("keepalive"),
    }
    blob = json.dumps(decided, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _options(params: dict[str, Any]) -> TransportOptions:
    """The transport options a kept connection is dialled with, from its plain description."""
    opts = TransportOptions(
        known_hosts=params.get("known_hosts"),
        accept_new=bool(params.get("accept_new")),
        connect_timeout=float(params.get("connect_timeout") or CONNECT_TIMEOUT),
        ssh_config=params.get("ssh_config"),
        client_keys=params.get("client_keys"),
        keepalive=params.get("keepalive") or 30.0,  # notices a dead peer while idle
    )
    if params.get("client_keys") is None:  # the client's agent, not the one the keeper was started with
        opts.extra["agent_path"] = params.get("agent_path")
    return opts


def _plain(jump: Any) -> Any:
    """A jump (one hop tuple, or a chain of them) as JSON lists."""
    if jump is None:
        return None
    if isinstance(jump, (tuple, list)) and jump and isinstance(jump[0], str):
        return list(jump)
    return [list(hop) for hop in jump]


def _unplain(jump: Any) -> Any:
    if jump is None:
        return None
    if jump and isinstance(jump[0], str):
        return tuple(jump)
    return [tuple(hop) for hop in jump]


# --------------------------------------------------------------------------- framing


async def _send(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(struct.pack(">I", len(payload)) + payload)
    await writer.drain()


async def _recv(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    (n,) = struct.unpack(">I", head)
    if n > 64 * 1024 * 1024:
        raise ValueError("frame too large")
    return await reader.readexactly(n)


def _peer_uid(sock: socket.socket) -> int | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


# --------------------------------------------------------------------------- the keeper process


@dataclass
class Kept:
    """One held SSH connection and what ``fleetdiag connections`` shows of it."""

    key: str
    label: str
    where: str
    conn: Any  # transport.Connection
    opened: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    persist: float = DEFAULT_PERSIST
    rtt_ms: float | None = None
    uses: int = 0
    spare_uses: int = 0  # commands that started on a channel opened ahead of need
    busy: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    trust: Any = None  # transport.Trust: what decided this connection's trust when it was dialled

    def alive(self) -> bool:
        c = self.conn.conn
        tunnel = self.conn.tunnel
        return not c.is_closed() and (tunnel is None or not tunnel.is_closed())


class Keeper:
    """The server: holds connections by key, runs commands on them, closes them when idle."""

    def __init__(self, directory: Path, persist: float):
        self.dir = directory
        self.persist = persist
        self.kept: dict[str, Kept] = {}
        self.dialling: dict[str, asyncio.Lock] = {}
        self.active = 0
        self.last_activity = time.monotonic()
        self.stop = asyncio.Event()
        self.sock_ino: int | None = None

    # ---- connections

    async def get(
        self, key: str, params: dict[str, Any], label: str, persist: float, fresh: bool = False
    ) -> tuple[Kept, bool, float]:
        """The kept connection for ``key`` (dialled when missing or dead); (kept, reused, dial ms)."""
        lock = self.dialling.setdefault(key, asyncio.Lock())
        async with lock:
            k = self.kept.get(key)
            if k is not None and (fresh or not k.alive() or not self.trusted(k)):
                self.drop(key)
                k = None
            if k is not None:
                k.persist = max(k.persist, persist)
                return k, True, 0.0
            from .transport import connect, trust_of

            opts = _options(params)
            jump = _unplain(params.get("jump"))
            trust = trust_of(params["target"], params.get("port"), params.get("user"), opts, jump)
            conn = await connect(params["target"], params.get("port"), params.get("user"), opts, jump=jump)
            conn.keep_spare()  # the next command on this host costs its exec alone
            k = Kept(key, label, conn.where, conn, persist=persist)  # the address and port dialled
            k.params, k.trust = params, trust
            self.kept[key] = k
            return k, False, conn.connect_ms

    def trusted(self, k: Kept) -> bool:
        """Whether what decided ``k``'s trust (ssh config and its Includes, known_hosts, key files) still
        holds: a kept connection never outlives a revoked or removed key. Cheap when nothing changed."""
        if k.trust is None or k.trust.unchanged():
            return True
        from .transport import trust_of

        params = k.params
        now = trust_of(
            params["target"], params.get("port"), params.get("user"), _options(params), _unplain(params.get("jump"))
        )
        if now.digest != k.trust.digest:
            return False
        k.trust = now  # touched, not changed
        return True

    def drop(self, key: str) -> None:
        k = self.kept.pop(key, None)
        if k is not None:
            with contextlib.suppress(Exception):
                k.conn.close()

    # ---- requests

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or _peer_uid(sock) != os.getuid():  # only our own user, checked on every accept
            writer.close()
            return
        self.active += 1
        self.last_activity = time.monotonic()
        try:
            await _send(writer, json.dumps({"hello": 1, "pid": os.getpid()}).encode())
            req = json.loads(await _recv(reader))
            op = req.get("op")
            if op == "open":
                await self.op_open(req, writer)
            elif op == "run":
                await self.op_run(req, writer)
            elif op == "list":
                await _send(writer, json.dumps({"connections": self.listing(), "pid": os.getpid()}).encode())
            elif op == "close":
                n = len(self.kept)
                for key in list(self.kept):
                    self.drop(key)
                await _send(writer, json.dumps({"closed": n, "pid": os.getpid()}).encode())
                self.stop.set()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError):
            pass
        finally:
            self.active -= 1
            self.last_activity = time.monotonic()
            with contextlib.suppress(Exception):
                writer.close()

    async def op_open(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        try:
            k, reused, dial_ms = await self.get(
                req["key"], req["params"], req.get("label") or "", float(req.get("persist") or self.persist)
            )
        except HostError as exc:
            await _send(writer, json.dumps({"error": [exc.kind, str(exc)]}).encode())
            return
        k.last_used = time.monotonic()
        await _send(writer, json.dumps({"reused": reused, "connect_ms": dial_ms}).encode())

    async def op_run(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """Run one command on the kept connection: its output as frames, then its ``CommandEnd``.

        The command semantics (caps, timeouts, stderr kept, how it ended) are ``transport.run_on``'s,
        the very ones of a direct connection; the client maps the end with ``reach.outcome``."""
        from .transport import run_on

        key, params = req["key"], req["params"]
        persist = float(req.get("persist") or self.persist)
        timeout = req.get("timeout")
        cap = int(req.get("cap") or OUTPUT_CAP)

        async def out(data: bytes) -> None:
            await _send(writer, b"O" + data)

        async def err(data: bytes) -> None:
            await _send(writer, b"E" + data)

        for attempt in (0, 1):  # a dead connection is dropped and redialled once
            try:
                k, reused, dial_ms = await self.get(key, params, req.get("label") or "", persist, fresh=attempt > 0)
            except HostError as exc:
                end = CommandEnd(NOT_RUN, kind=exc.kind, reason=str(exc))
                await _send(writer, b"X" + json.dumps(dataclasses.asdict(end)).encode())
                return
            k.busy += 1
            try:
                end = await run_on(k.conn, req["command"], timeout, cap, out, err)
            finally:
                k.busy -= 1
            if end.ended == NOT_RUN and end.kind != TIMEOUT:  # the connection could not start a command
                self.drop(key)
                if attempt == 0 and reused:
                    continue
            elif end.ended != NOT_RUN:
                k.uses += 1
                k.last_used = time.monotonic()
                k.rtt_ms = (end.open_ms or 0.0) / max(1, end.trips)
                k.spare_uses += end.trips == 1
            if end.ended == CUT_LOST:
                self.drop(key)
            end.reused, end.connect_ms = reused, dial_ms
            await _send(writer, b"X" + json.dumps(dataclasses.asdict(end)).encode())
            return

    def listing(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "host": k.label or k.where,
                "where": k.where,
                "key": k.key[:12],
                "age_s": round(time.time() - k.opened, 1),
                "idle_s": round(now - k.last_used, 1),
                "rtt_ms": None if k.rtt_ms is None else round(k.rtt_ms, 1),
                "uses": k.uses,
                "spare_uses": k.spare_uses,
                "persist_s": k.persist,
            }
            for k in self.kept.values()
        ]

    # ---- lifecycle

    async def reap(self) -> None:
        """Close connections idle past their persist; exit when none is left, or the socket is not ours."""
        checked = time.monotonic()
        while not self.stop.is_set():
            await asyncio.sleep(0.5)
            now = time.monotonic()
            check = now - checked >= TRUST_CHECK  # idle connections' trust files: every few seconds, not 2/s
            checked = now if check else checked
            for key, k in list(self.kept.items()):
                if k.busy == 0 and (now - k.last_used > k.persist or not k.alive() or (check and not self.trusted(k))):
                    self.drop(key)
            try:
                if os.stat(socket_path(self.dir)).st_ino != self.sock_ino:
                    break  # our socket was removed or replaced: nobody can reach us
            except OSError:
                break
            if not self.kept and self.active == 0 and now - self.last_activity > EXIT_GRACE:
                break
        self.stop.set()

    async def serve(self, sock: socket.socket) -> None:
        server = await asyncio.start_unix_server(self.handle, sock=sock)
        reaper = asyncio.ensure_future(self.reap())
        await self.stop.wait()
        server.close()
        reaper.cancel()
        for key in list(self.kept):
            self.drop(key)


def _bind(directory: Path) -> socket.socket | None:
    """The listening socket (0600), or None when another keeper holds this directory."""
    lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        return None
    # the lock stays held (lock_fd open) for the keeper's life
    path = socket_path(directory)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket: its keeper is gone (it would hold the lock)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


READY, FAILED, TAKEN = b"0", b"1", b"2"  # what a starting keeper tells the command that started it


def serve_forever(directory: Path, persist: float, ready_fd: int | None = None) -> int:
    """The keeper's main, after it detached; ``ready_fd`` hears READY, FAILED or TAKEN, then is closed."""

    def tell(what: bytes) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, what)
                os.close(ready_fd)
            ready_fd = None

    try:
        if private_dir(directory) is None:
            tell(FAILED)
            return 1
        sock = _bind(directory)
    except OSError:
        tell(FAILED)
        return 1
    if sock is None:
        tell(TAKEN)
        return 0
    _raise_fd_limit()  # one descriptor per kept host
    keeper = Keeper(directory, persist)
    keeper.sock_ino = os.stat(socket_path(directory)).st_ino
    tell(READY)
    try:
        asyncio.run(keeper.serve(sock))
    finally:
        with contextlib.suppress(OSError):
            if os.stat(socket_path(directory)).st_ino == keeper.sock_ino:
                os.unlink(socket_path(directory))
    return 0


def _raise_fd_limit() -> None:
    with contextlib.suppress(Exception):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


# The keeper runs this fleetdiag (an editable checkout too), whatever PYTHONPATH the command had, and
# nothing from the command's working directory (child.py: isolated mode, fixed cwd, explicit sys.path).
_BOOT = "from fleetdiag.ssh.keeper import _detach_main; sys.exit(_detach_main(sys.argv[2:]))"


def spawn(directory: Path, persist: float) -> bytes:
    """Start a keeper for ``directory``, fully detached; returns READY, TAKEN (another keeper won) or FAILED.

    The started process double-forks; the first one waits only until the keeper
    has bound its socket (or failed), so no command polls for it.
    """
    try:
        proc = subprocess.run(  # `fleetdiag.ssh.keeper` in its argv: ps shows what it is
            child.python_argv(_BOOT, "fleetdiag.ssh.keeper", str(directory), repr(float(persist))),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            cwd=child.CHILD_CWD,
            timeout=START_WAIT * 2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return FAILED
    return {0: READY, 2: TAKEN}.get(proc.returncode, FAILED)


def _detach_main(argv: list[str]) -> int:
    directory, persist = Path(argv[0]), float(argv[1])
    r, w = os.pipe()
    if os.fork() > 0:  # the process the command waits for: exits once the keeper is ready (or is not)
        os.close(w)
        answer = os.read(r, 1)
        os._exit({READY: 0, TAKEN: 2}.get(answer, 1))
    os.close(r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    os.umask(0o077)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, w)  # nothing inherited stays open (a cron job's pipe, a lock) but the ready pipe
    os.closerange(w + 1, 1 << 16)
    return serve_forever(directory, persist, ready_fd=w)


# --------------------------------------------------------------------------- the client


class KeeperUnavailable(Exception):
    """No usable keeper: the caller connects directly.

    ``absent``: nothing listens (no socket, or a stale one), so starting a keeper may help;
    otherwise one is there but wedged, foreign or unusable, and the command goes direct at once.
    """

    def __init__(self, message: str, absent: bool = False):
        super().__init__(message)
        self.absent = absent


async def _request(
    directory: Path, req: dict[str, Any], hello: float | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect, check the keeper is our own user's and alive (hello within 200 ms, or ``hello``
    seconds), send ``req``."""
    path = socket_path(directory)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise KeeperUnavailable("no keeper", absent=True) from exc
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise KeeperUnavailable("keeper socket not private")
    try:
        hello_wait = float(os.environ.get(HELLO_ENV) or HELLO_TIMEOUT)
    except ValueError:
        hello_wait = HELLO_TIMEOUT
    hello_wait = max(hello_wait, hello or 0.0)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), hello_wait)
    except (ConnectionRefusedError, FileNotFoundError) as exc:
        raise KeeperUnavailable("stale keeper socket", absent=True) from exc
    except (OSError, asyncio.TimeoutError, TimeoutError) as exc:
        raise KeeperUnavailable(f"keeper not answering: {exc}") from exc
    try:
        if _peer_uid(writer.get_extra_info("socket")) != os.getuid():
            raise KeeperUnavailable("keeper runs as another user")
        hello = json.loads(await asyncio.wait_for(_recv(reader), hello_wait))
        if hello.get("hello") != 1:
            raise KeeperUnavailable("not a keeper")
        await _send(writer, json.dumps(req).encode())
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError, TimeoutError) as exc:
        writer.close()
        raise KeeperUnavailable(f"keeper wedged: {exc}") from exc
    except KeeperUnavailable:
        writer.close()
        raise
    return reader, writer


async def _ask(directory: Path, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    reader, writer = await _request(directory, req)
    try:
        return json.loads(await asyncio.wait_for(_recv(reader), timeout))
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError, TimeoutError) as exc:
        raise KeeperUnavailable(f"keeper did not answer: {exc}") from exc
    finally:
        writer.close()


class KeptConnection:
    """A ``transport.Connection`` look-alike whose commands run on the keeper's connection."""

    STDERR_KEEP = STDERR_KEEP

    def __init__(
        self,
        directory: Path,
        key: str,
        params: dict[str, Any],
        label: str,
        persist: float,
        connect_ms: float,
        reused: bool,
        cap: int = OUTPUT_CAP,
    ):
        self.directory = directory
        self.key = key
        self.params = params
        self.label = label
        self.persist = persist
        self.connect_ms = connect_ms
        self.reused = reused
        self.cap = cap
        self.where = f"{params['target']}:{params.get('port') or 22}"
        self.last_stderr = b""
        self.last_status: int | None = None
        self.last_rtt_ms: float | None = None

    async def execute(self, command: str, timeout: float | None, cap: int | None = None) -> RunOutcome:
        """Run one command on the keeper's connection (``reach.Runner``), with ``Connection.execute``'s
        semantics: the keeper runs ``transport.run_on``, and its end record goes through ``reach.outcome``.

        A keeper gone before it took the request: ``started`` is False (the command never reached the
        host). A keeper that stops answering mid-command: the output is incomplete, an internal error."""
        cap = cap or self.cap
        req = {
            "op": "run",
            "key": self.key,
            "params": self.params,
            "label": self.label,
            "persist": self.persist,
            "command": command,
            "timeout": timeout,
            "cap": cap,
        }
        try:
            reader, writer = await _request(self.directory, req, RUN_HELLO)
        except KeeperUnavailable as exc:
            end = CommandEnd(NOT_RUN, kind=CLOSED, reason=f"connection keeper for {self.where} went away ({exc})")
            res = outcome(end, b"", b"", self.where, timeout, cap)
            res.started = False
            return self._keep(res)
        out: list[bytes] = []
        err: list[bytes] = []
        limit = (
            None
            if timeout is None
            else timeout * 2 + float(self.params.get("connect_timeout") or CONNECT_TIMEOUT) * 2 + 5
        )
        try:
            while True:
                frame = await asyncio.wait_for(_recv(reader), limit)
                kind, data = frame[:1], frame[1:]
                if kind == b"O":
                    out.append(data)
                elif kind == b"E":
                    err.append(data)
                elif kind == b"X":
                    end = CommandEnd.from_plain(json.loads(data))
                    break
        except (OSError, ValueError, TypeError, asyncio.IncompleteReadError, asyncio.TimeoutError, TimeoutError) as exc:
            why = f"nothing for {limit:g}s" if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else "it ended"
            end = CommandEnd(KEEPER_LOST, reason=why)
        finally:
            writer.close()
        if end.reused is False:  # the keeper had to dial again (the connection had died)
            self.connect_ms += float(end.connect_ms or 0)
        return self._keep(outcome(end, b"".join(out), b"".join(err), self.where, timeout, cap))

    def _keep(self, res: RunOutcome) -> RunOutcome:
        self.last_stderr, self.last_status, self.last_rtt_ms = res.stderr, res.status, res.rtt_ms
        return res

    async def run(self, command: str, timeout: float | None) -> tuple[bytes, int | None, float, float]:
        """As ``Connection.run``: (stdout, exit status, open+exec ms, total ms); same errors."""
        return (await self.execute(command, timeout)).result()

    def close(self) -> None:
        """The connection stays with the keeper: nothing to close here."""


def usable(opts: TransportOptions) -> bool:
    """Whether the keeper can dial as this command would: not with in-memory secrets or options."""
    return not opts.passphrase and not opts.extra


async def open_kept(
    target: str,
    port: int | None,
    user: str | None,
    opts: TransportOptions,
    jump: Any,
    label: str,
    persist: float,
    directory: Path | None = None,
) -> KeptConnection:
    """The host's kept connection (dialled by the keeper when it holds none); starts the keeper if needed.

    Raises KeeperUnavailable when there is no usable keeper (the caller connects
    directly), HostError when the keeper could not reach the host.
    """
    if not usable(opts):
        raise KeeperUnavailable("options the keeper cannot have")
    directory = directory or runtime_dir()
    if private_dir(directory) is None:
        raise KeeperUnavailable(f"{directory} is not a private directory")
    params = connect_params(target, port, user, opts, jump)
    key = connection_key(params)
    t0 = time.perf_counter()
    req = {"op": "open", "key": key, "params": params, "label": label, "persist": persist}
    limit = opts.connect_timeout * 2 + 3 + (2 * (opts.connect_timeout * 2 + 1) if jump else 0)
    try:
        answer = await _ask(directory, req, limit)
    except KeeperUnavailable as exc:
        if not exc.absent:  # wedged or not ours: direct, without waiting on it again
            raise
        started = await asyncio.get_running_loop().run_in_executor(None, spawn, directory, persist)
        if started == FAILED:
            raise KeeperUnavailable("the keeper could not start") from exc
        deadline = time.monotonic() + START_WAIT
        while True:
            try:
                answer = await _ask(directory, req, limit)
                break
            except KeeperUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
    if "error" in answer:
        kind, text = answer["error"]
        if kind == KEY:  # the keeper lacks what unlocks a key (its environment): this command may not
            raise KeeperUnavailable(text)
        raise HostError(kind, text)
    return KeptConnection(
        directory, key, params, label, persist, (time.perf_counter() - t0) * 1000, bool(answer.get("reused"))
    )


def list_kept(directory: Path | None = None) -> list[dict[str, Any]] | None:
    """What the keeper holds; None when no keeper runs."""
    try:
        return asyncio.run(_ask(directory or runtime_dir(), {"op": "list"}, 5.0))["connections"]
    except KeeperUnavailable:
        return None


def close_kept(directory: Path | None = None, wait: float = 5.0) -> int | None:
    """Close every kept connection and end the keeper; the number closed, None when no keeper ran."""
    try:
        answer = asyncio.run(_ask(directory or runtime_dir(), {"op": "close"}, 5.0))
    except KeeperUnavailable:
        return None
    pid = int(answer.get("pid") or 0)
    deadline = time.monotonic() + wait
    while pid and time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            break
        time.sleep(0.02)
    return int(answer.get("closed") or 0)


if __name__ == "__main__":  # python -m fleetdiag.ssh.keeper DIR PERSIST: a keeper started by hand
    sys.exit(_detach_main(sys.argv[1:]))
