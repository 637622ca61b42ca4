"""SSH connections on asyncssh, with every failure turned into a host status.

The user's normal ssh setup applies: ``~/.ssh/config`` (Host aliases,
HostName, Port, User, IdentityFile, ProxyJump, UserKnownHostsFile), the agent
and the default keys. Host keys are checked against known_hosts; an unknown
or changed key is a status, never a prompt. ``accept_new`` is explicit
trust-on-first-use and never applies to a key that changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import getpass
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.config import SSHClientConfig

from . import sshfast
from .reach import (  # noqa: F401  (re-exported: the options and errors live without asyncssh)
    AUTH,
    CLOSED,
    CUT_LOST,
    CUT_OVERSIZE,
    CUT_TIMEOUT,
    DEFAULT_KEY_FILES,
    DNS,
    DONE,
    HOSTKEY_CHANGED,
    HOSTKEY_UNKNOWN,
    JUMP,
    KEY,
    LOCAL,
    MAX_OUTPUT,
    NETWORK,
    NOT_RUN,
    OVERSIZE,
    PASSPHRASE_ENV,
    REFUSED,
    STDERR_KEEP,
    TIMEOUT,
    CommandEnd,
    HostError,
    JumpHop,
    PartialOutput,
    RunOutcome,
    TransportOptions,
    outcome,
    parse_jump_chain,
    scrub,
    too_much,
)


class _Client(asyncssh.SSHClient):
    """Decides on keys known_hosts does not vouch for: new ones only with accept_new.

    asyncssh asks only about a key it does not trust. If known_hosts vouches
    for *other* keys of this host, the key changed: refused, always. Only a
    host with no known key at all may be trusted on first use.
    """

    def __init__(self, opts: TransportOptions, known: KnownHosts | None = None):
        self.opts = opts
        self.known = known
        self.verdict: str | None = None
        self.new_key: asyncssh.SSHKey | None = None
        self.fingerprint = ""
        self.conn: Any = None
        files = known.files if known is not None and known.files else [str(opts.known_hosts_file())]
        self.known_path: Path = Path(files[0]).expanduser()  # where --accept-new appends, as ssh does
        self.key_host: str | None = None  # the name known_hosts knows the host by (HostKeyAlias or target)
        self.key_port: int | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn
        sshfast.shorten(conn)

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.fingerprint = key.get_fingerprint()
        self.key_host, self.key_port = host, port
        if self.known is not None and key in self.known.revoked:  # asyncssh checks this first; so do we
            self.verdict = HOSTKEY_REVOKED
            return False
        trusted = getattr(self.conn, "_trusted_host_keys", None)
        if trusted is None and self.known is not None:  # not the asyncssh we know: our own lookup's answer
            trusted = self.known.trusted
        if trusted:
            self.verdict = HOSTKEY_CHANGED
            return False
        self.verdict = HOSTKEY_UNKNOWN
        if self.opts.accept_new:
            self.new_key = key
            return True
        return False


HOSTKEY_REVOKED = "revoked"  # a verdict of _Client only: reported as HOSTKEY_CHANGED


class KnownHosts:
    """The known_hosts lookup handed to asyncssh (its documented callable form): revoked keys hold on every port.

    asyncssh's own lookup, when nothing *trusted* matches ``[host]:port``, matches again without
    the port and keeps that second answer's revoked list only, so ``@revoked [host]:2222 KEY``
    was dropped and the key looked unknown (then ``--accept-new`` trusted it). Here the revoked
    keys are every ``@revoked`` entry matching the host with its port or without, and they are
    taken out of the trusted ones. A missing file is an empty one (as ssh treats it);
    ``UserKnownHostsFile none`` means no file, so no key is known (asyncssh would check none).
    """

    def __init__(self, files: list[str]):
        self.files = files
        self.revoked: set[Any] = set()
        self.trusted: list[Any] = []

    def _text(self) -> str:
        parts = []
        for name in self.files:
            try:
                with open(Path(name).expanduser(), encoding="utf-8", errors="replace") as fh:
                    parts.append(fh.read(MAX_KNOWN_HOSTS))
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                continue
        return "\n".join(parts)

    def parsed(self) -> tuple[Any, Any]:
        """The files parsed (all entries; the ``@revoked`` ones as plain entries, or None), once per
        process for the same files unchanged: a fleet's known_hosts has a line per host, and parsing
        it again for every connection made a sweep quadratic (37 ms a connection at 5,000 lines)."""
        key = tuple(_stamp(name) for name in self.files)
        hit = _PARSED.get(key)
        if hit is None:
            text = self._text()
            revoked_only = "\n".join(
                _unmark(line) for line in text.splitlines() if line.lstrip().startswith("@revoked")
            )
            hit = (
                asyncssh.import_known_hosts(text),
                asyncssh.import_known_hosts(revoked_only) if revoked_only else None,
            )
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[key] = hit
        return hit

    def __call__(self, host: str, addr: str, port: int | None) -> tuple[list[Any], list[Any], list[Any]]:
        known, marked = self.parsed()
        trusted, ca_keys, *_ = known.match(host, addr, port)
        if marked is not None:
            for p in {port, None}:  # the port's entries, and the host's without a port
                self.revoked.update(marked.match(host, addr, p)[0])
        self.trusted = [k for k in trusted if k not in self.revoked]
        return self.trusted, [k for k in ca_keys if k not in self.revoked], list(self.revoked)


MAX_KNOWN_HOSTS = 16 * 1024 * 1024  # read from each known_hosts file at most
# Parsed known_hosts, keyed by each file's path, inode, size and mtime: a file that changes (an
# accepted new key, an edit) is read again at the next connection. A few sets of files at most.
_PARSED: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_PARSED_MAX = 8


def _stamp(name: str) -> tuple[Any, ...]:
    try:
        st = os.stat(Path(name).expanduser())
    except OSError:
        return (name,)
    return (name, st.st_ino, st.st_size, st.st_mtime_ns)


def _unmark(line: str) -> str:
    """``@revoked PATTERN KEY`` as a plain ``PATTERN KEY`` entry (so matching finds it as a host key)."""
    parts = line.strip()[1:].split(None, 2)
    return " ".join(parts[1:]) if len(parts) == 3 else ""


def known_hosts_files(opts: TransportOptions, config: Any) -> list[str]:
    """The known_hosts files that decide a host's key, as asyncssh picks them: ``--known-hosts``,
    else the ssh config's UserKnownHostsFile and GlobalKnownHostsFile, else ``~/.ssh/known_hosts``."""
    if opts.known_hosts:
        return [str(Path(opts.known_hosts).expanduser())]
    user = config.get("UserKnownHostsFile") if config is not None else None
    if user is not None:
        glob = config.get("GlobalKnownHostsFile") or []
        return [str(Path(f).expanduser()) for f in [*user, *glob]]
    return [str(opts.known_hosts_file())]


@dataclass
class Connection:
    """One live connection per host, reused for every stage and watch cycle.

    After ``run``, ``last_stderr`` holds the start of what the command wrote
    to stderr (bounded) and ``last_status`` its exit status: when the remote
    shell could not run the funnel at all, that is the only explanation.
    """

    conn: asyncssh.SSHClientConnection
    connect_ms: float
    tunnel: asyncssh.SSHClientConnection | None = None
    where: str = "host"
    last_stderr: bytes = field(default=b"", init=False, repr=False)
    last_status: int | None = field(default=None, init=False)
    hops: list[Any] = field(default_factory=list, init=False, repr=False)  # every jump connection, first hop first
    spare: sshfast.Spare | None = field(default=None, init=False, repr=False)  # kept connections: see keep_spare
    open_trips: int = field(default=2, init=False)  # round trips the last command took to start: open + exec, or exec
    last_rtt_ms: float | None = field(default=None, init=False)  # from the last command's start

    def keep_spare(self) -> None:
        """From now on keep one session channel open ahead of need: each command costs its exec only.

        For connections that serve many commands (the keeper's); a one-command probe does not need it.
        The next spare opens when a command ends (``command_done``), not while it runs."""
        if self.spare is None:
            self.spare = sshfast.Spare(self.conn)
        self.spare.prime()

    async def create_process(self, command: str, **redirect: Any) -> Any:
        """asyncssh's ``create_process`` (bytes, no encoding), on the spare channel when one is open."""
        self.open_trips = 2
        if self.spare is None:
            return await self.conn.create_process(command, encoding=None, **redirect)
        used = self.spare.used
        try:
            return await self.spare.create_process(command, **redirect)
        finally:
            self.open_trips = 1 if self.spare.used > used else 2

    def command_done(self) -> None:
        """A command ended: open the next spare now (with its close, in the same flight) when spares are kept."""
        if self.spare is not None:
            self.spare.prime()

    async def execute(self, command: str, timeout: float | None, cap: int = MAX_OUTPUT) -> RunOutcome:
        """Run one command (``reach.Runner``): its outcome, never raised; a cut output keeps what arrived."""
        out: list[bytes] = []
        err: list[bytes] = []
        end = await run_on(self, command, timeout, cap, out.append, err.append)
        res = outcome(end, b"".join(out), b"".join(err), self.where, timeout, cap)
        self.last_stderr, self.last_status, self.last_rtt_ms = res.stderr, res.status, res.rtt_ms
        return res

    async def run(
        self, command: str, timeout: float | None, cap: int = MAX_OUTPUT
    ) -> tuple[bytes, int | None, float, float]:
        """Run one command; returns (stdout, exit status, open+exec ms, total ms).

        Raises HostError when the command could not start or its output
        passed ``cap`` bytes (reading stops there), PartialOutput
        (with what arrived) when its output was cut by the timeout or a
        dropped connection.
        """
        return (await self.execute(command, timeout, cap)).result()

    @asynccontextmanager
    async def stream(self, command: str, cap: int | None = MAX_OUTPUT) -> AsyncIterator[LineStream]:
        """Start a long-running command and read its stdout line by line (watch's follower).

        Stderr is discarded. The command is closed when the block ends.
        Raises HostError when the command could not start.
        """
        try:
            proc = await self.create_process(command, stdin=asyncssh.DEVNULL, stderr=asyncssh.DEVNULL)
        except (asyncssh.Error, OSError) as exc:
            raise explain(exc) from exc
        ls = LineStream(proc, self.where, cap)
        try:
            yield ls
        finally:
            proc.close()
            self.command_done()

    def close(self) -> None:
        self.conn.close()
        for t in reversed(self.hops or ([self.tunnel] if self.tunnel is not None else [])):
            t.close()


async def run_on(
    conn: Connection,
    command: str,
    timeout: float | None,
    cap: int,
    on_stdout: Callable[[bytes], Any],
    on_stderr: Callable[[bytes], Any],
) -> CommandEnd:
    """Start ``command`` on ``conn`` and read it to its end: the one command semantics, for the direct
    runner and the keeper alike (which passes callbacks that send frames to its client).

    stdout goes to ``on_stdout`` until ``cap`` bytes (then the command is closed: oversize); the
    start of stderr (``STDERR_KEEP``) to ``on_stderr``; the callbacks may be coroutines. Never raises
    for the host's doing: how it ended is in the returned :class:`CommandEnd`.
    """
    t0 = time.perf_counter()
    try:
        proc = await asyncio.wait_for(conn.create_process(command, stdin=asyncssh.DEVNULL), timeout)
    except (asyncio.TimeoutError, TimeoutError):
        return CommandEnd(
            NOT_RUN,
            kind=TIMEOUT,
            reason=f"no answer within {timeout:g}s to the command: logged in, then the host stopped answering",
        )
    except (asyncssh.Error, OSError) as exc:
        he = explain(exc, where=conn.where)  # the address and port dialled, as the connection names them
        return CommandEnd(NOT_RUN, kind=he.kind, reason=str(he))
    trips = conn.open_trips  # read now: another command may start on this connection meanwhile
    end = CommandEnd(open_ms=(time.perf_counter() - t0) * 1000, trips=trips)
    left = None if timeout is None else max(0.1, timeout - end.open_ms / 1000)

    async def give(fn: Callable[[bytes], Any], data: bytes) -> None:
        r = fn(data)
        if asyncio.iscoroutine(r):
            await r

    async def drain_err() -> None:
        kept = 0
        while True:
            data = await proc.stderr.read(65536)
            if not data:
                return
            if kept < STDERR_KEEP:
                piece = data[: STDERR_KEEP - kept]
                kept += len(piece)
                await give(on_stderr, piece)

    async def drain() -> None:
        err_task = asyncio.ensure_future(drain_err())
        try:
            while True:
                data = await proc.stdout.read(65536)
                if not data:
                    break
                end.got += len(data)
                if end.got > cap:
                    end.ended = CUT_OVERSIZE
                    proc.close()
                    return
                await give(on_stdout, data)
            await err_task
        finally:
            err_task.cancel()
        await proc.wait_closed()

    try:
        await asyncio.wait_for(drain(), left)
    except (asyncio.TimeoutError, TimeoutError):
        proc.close()
        end.ended = CUT_TIMEOUT
    except (asyncssh.Error, OSError) as exc:
        end.ended = CUT_LOST
        end.reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    except BaseException:  # the caller went away (deadline, Ctrl-C, the keeper's client): stop the command
        proc.close()
        raise
    finally:
        conn.command_done()
    if end.ended == DONE:
        end.status = proc.exit_status
    end.total_ms = (time.perf_counter() - t0) * 1000
    return end


class LineStream:
    """Lines from a running remote command, with a bound on what is held.

    ``cap`` bounds the bytes read while it is set (the snapshot phase) and,
    always, the length of one line: a host that prints without a newline or
    without end raises HostError(OVERSIZE) instead of filling memory.
    Set ``cap = None`` after the bounded phase to read records for hours.
    """

    CHUNK = 65536

    def __init__(self, proc: Any, where: str, cap: int | None = MAX_OUTPUT):
        self.proc = proc
        self.where = where
        self.cap = cap
        self.read_bytes = 0
        self._buf = bytearray()
        self._eof = False

    @property
    def exit_status(self) -> int | None:
        return self.proc.exit_status

    async def readline(self) -> bytes:
        """The next line with its newline; the unfinished tail at the end; b"" at EOF."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                return line
            if len(self._buf) > MAX_OUTPUT:
                self.proc.close()
                raise HostError(OVERSIZE, too_much(MAX_OUTPUT, self.where))
            if self._eof:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            try:
                data = await self.proc.stdout.read(self.CHUNK)
            except (asyncssh.Error, OSError) as exc:
                raise explain(exc) from exc
            if not data:
                self._eof = True
                continue
            self.read_bytes += len(data)
            if self.cap is not None and self.read_bytes > self.cap:
                self.proc.close()
                raise HostError(OVERSIZE, too_much(self.cap, self.where))
            self._buf += data


_UNREAD: Any = object()  # _connect_kwargs reads the ssh config itself


def _connect_kwargs(
    target: str, port: int | None, user: str | None, opts: TransportOptions, config: Any = _UNREAD
) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "connect_timeout": opts.connect_timeout,
        "login_timeout": opts.connect_timeout,
        "keepalive_interval": opts.keepalive or 0,
    }
    if port:
        kw["port"] = port
    if user:
        kw["username"] = user
    if opts.ssh_config is not None:
        kw["config"] = opts.ssh_config
    if opts.client_keys is not None:
        kw["client_keys"] = opts.client_keys
        kw["agent_path"] = None
    secret = opts.secret()
    if secret:
        kw["passphrase"] = secret
    if config is _UNREAD:
        config = _ssh_config(target, port, user, opts)
    kw["known_hosts"] = KnownHosts(known_hosts_files(opts, config))
    if config is None or config.get("Ciphers") is None:  # else the user chose, and asyncssh applies it
        kw["encryption_algs"] = _ciphers()
    kw.update(opts.extra)
    return kw


class Dropped(HostError):
    """The server closed a connection it had accepted before its SSH greeting (MaxStartups)."""

    def __init__(self, message: str) -> None:
        super().__init__(CLOSED, message)


DROP_RETRY_S = (0.5, 1.5)  # the back-off before the retry of a dropped handshake: uniform in this range
DROP_RETRIES = 1  # retries of a dropped handshake (once: a burst has passed by then; a full sshd stays full)


async def connect(
    target: str,
    port: int | None = None,
    user: str | None = None,
    opts: TransportOptions | None = None,
    jump: tuple[str, int | None, str | None] | list[tuple[str, int | None, str | None]] | None = None,
) -> Connection:
    """Open and authenticate a connection, or raise HostError with plain words.

    ``jump`` is one hop or a chain of hops (ProxyJump ``a,b``), connected through in order.
    Without one, the ssh config's ProxyJump for the target is read here (through the one
    parser, ``reach.parse_jump_chain``) and connected through the same way, so every hop
    gets fleetdiag's options (keys, known_hosts, timeouts) and a failing hop is named.
    """
    opts = opts or TransportOptions()
    config = _ssh_config(target, port, user, opts)  # read once: the jump chain and the ciphers
    if jump is None:
        try:
            jump = [(h.host, h.port, h.user) for h in _jump_of(config)]
        except ValueError as exc:
            raise HostError(JUMP, f"ProxyJump in ssh config for {target}: {exc}") from None
    hops = [jump] if isinstance(jump, tuple) else list(jump or [])
    tunnel = None
    opened: list[Any] = []
    t0 = time.perf_counter()
    via = None
    try:
        for jt, jp, ju in hops:
            hop_config = _ssh_config(jt, jp, ju, opts)
            hop = dialled(jt, jp, hop_config)  # the port the hop's ssh config gives it, not 22
            try:
                tunnel = await _open(jt, jp, ju, opts, tunnel, via=via, config=hop_config)
            except HostError as exc:
                raise HostError(JUMP, f"jump host {hop}: {exc}") from exc
            opened.append(tunnel)
            via = hop
        for attempt in range(DROP_RETRIES + 1):
            try:
                conn = await _open(target, port, user, opts, tunnel, via=via, config=config)
                break
            except Dropped as exc:  # after a back-off: the burst that filled sshd's MaxStartups has passed
                if attempt == DROP_RETRIES:
                    if attempt:
                        raise Dropped(f"{exc} (dropped again: retried once after a back-off)") from exc
                    raise
                import random

                await asyncio.sleep(random.uniform(*DROP_RETRY_S))
    except BaseException:
        for t in reversed(opened):
            t.close()
        raise
    c = Connection(conn, (time.perf_counter() - t0) * 1000, tunnel, where=dialled(target, port, config))
    c.hops = opened
    return c


def _ssh_config(target: str, port: int | None, user: str | None, opts: TransportOptions) -> Any:
    """The ssh config asyncssh will apply to ``target`` (``opts.ssh_config``, else ``~/.ssh/config``
    when readable), or None when there is none or it cannot be read (asyncssh reports that itself)."""
    paths: list[str] | None = opts.ssh_config
    if paths is None:
        default = Path("~", ".ssh", "config").expanduser()
        paths = [str(default)] if os.access(default, os.R_OK) else []
    if not paths:
        return None
    args = (getpass.getuser(), user or (), target, port or ())
    try:
        try:
            return SSHClientConfig.load(None, paths, False, False, False, *args)  # canonical, final: asyncssh >= 2.19
        except TypeError:
            return SSHClientConfig.load(None, paths, False, *args)  # asyncssh 2.18
    except (OSError, ValueError, TypeError, KeyError, asyncssh.Error):
        return None


@dataclass
class Resolved:
    """What one host resolves to, as ``ssh -G`` would print it: the address and port dialled, the
    login, the jump chain, the keys offered and the known_hosts checked (``hosts --ssh``, messages)."""

    target: str
    hostname: str
    port: int
    user: str
    jump: list[str]
    identity_files: list[str]
    known_hosts: list[str]
    config_files: list[str]

    @property
    def where(self) -> str:
        """The address and port actually dialled, named as the user named the host."""
        return _named(self.target, self.hostname, self.port)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def resolve(target: str, port: int | None, user: str | None, opts: TransportOptions, config: Any = _UNREAD) -> Resolved:
    """``target`` as the connection will see it: the inventory's values first, then the ssh config
    (HostName, Port, User, ProxyJump, IdentityFile, UserKnownHostsFile), then ssh's defaults."""
    if config is _UNREAD:
        config = _ssh_config(target, port, user, opts)

    def get(key: str) -> Any:
        return config.get(key) if config is not None else None

    hostname = str(get("Hostname") or get("HostName") or target)
    cport = get("Port")
    try:
        jump = [f"{h.user + '@' if h.user else ''}{_hop_where(h, opts)}" for h in _jump_of(config)]
    except ValueError as exc:
        jump = [f"(malformed ProxyJump: {exc})"]
    if opts.client_keys is not None:
        ids = list(opts.client_keys)
    else:
        ids = [str(Path(str(i)).expanduser()) for i in (get("IdentityFile") or ())]
    known = known_hosts_files(opts, config)  # as the connection checks them
    files = list(opts.ssh_config) if opts.ssh_config is not None else []
    if opts.ssh_config is None and config is not None:
        files = [str(Path("~", ".ssh", "config").expanduser())]
    return Resolved(
        target=target,
        hostname=hostname,
        port=int(port or cport or 22),
        user=str(user or get("User") or getpass.getuser()),
        jump=jump,
        identity_files=ids,
        known_hosts=known,
        config_files=files,
    )


def _named(target: str, hostname: str, port: int) -> str:
    return f"{target}:{port}" if hostname == target else f"{target} ({hostname}:{port})"


def dialled(target: str, port: int | None, config: Any) -> str:
    """``target`` as dialled under ``config`` (HostName, Port), cheaply: for every message."""
    name = str((config.get("Hostname") if config is not None else None) or target)
    return _named(target, name, int(port or (config.get("Port") if config is not None else None) or 22))


def _hop_where(hop: JumpHop, opts: TransportOptions) -> str:
    """A jump hop as dialled: its own ssh config's HostName and Port apply (one level, never a loop)."""
    return dialled(hop.host, hop.port, _ssh_config(hop.host, hop.port, hop.user, opts))


# --------------------------------------------------------------------------- what decided trust

_INCLUDE_DEPTH = 16


@dataclass
class Trust:
    """What decided a connection's trust, so a kept connection is reused only while it holds.

    ``files``: every file (and Include directory) that took part, by its state on disk, checked
    cheaply on each reuse; ``digest``: their contents (ssh config and its Includes, known_hosts)
    or identity (key files), compared when a state changed."""

    files: dict[str, Any]
    digest: str

    def unchanged(self) -> bool:
        return all(_stat_sig(p) == sig for p, sig in self.files.items())


def _stat_sig(path: str) -> Any:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _config_files(paths: list[str]) -> tuple[list[str], list[str]]:
    """The ssh config files and every file they Include (recursively, as asyncssh resolves them),
    and the directories Include patterns look in (a file added there changes what applies)."""
    files: list[str] = []
    dirs: list[str] = []
    todo = [(str(Path(p).expanduser()), 0) for p in paths]
    while todo:
        name, depth = todo.pop(0)
        if name in files:
            continue
        files.append(name)
        try:
            with open(name, encoding="utf-8", errors="replace") as fh:
                text = fh.read(1 << 20)
        except OSError:
            continue
        if depth >= _INCLUDE_DEPTH:
            continue
        for line in text.splitlines():
            words = line.replace("=", " ", 1).split()
            if len(words) < 2 or words[0].lower() != "include":
                continue
            for pattern in words[1:]:
                path = Path(pattern).expanduser()
                base = Path(path.anchor) if path.anchor else Path("~", ".ssh").expanduser()
                rel = str(Path(*path.parts[1:])) if path.anchor else pattern
                dirs.append(str((base / rel).parent))
                with contextlib.suppress(OSError, ValueError):
                    todo += [(str(f), depth + 1) for f in sorted(base.glob(rel)) if f.is_file()]
    return files, dirs


def trust_of(target: str, port: int | None, user: str | None, opts: TransportOptions, jump: Any = None) -> Trust:
    """The :class:`Trust` a connection to ``target`` (through ``jump``) is opened under now."""
    paths = opts.ssh_config
    if paths is None:
        paths = [str(Path("~", ".ssh", "config").expanduser())]
    configs, include_dirs = _config_files(list(paths))
    hops: list[tuple[str, int | None, str | None]] = [(target, port, user)]
    config = _ssh_config(target, port, user, opts)
    if jump is None:
        with contextlib.suppress(ValueError):
            jump = [(h.host, h.port, h.user) for h in _jump_of(config)]
    hops += [jump] if isinstance(jump, tuple) else list(jump or [])
    known: list[str] = []
    keys: list[str] = []
    for i, (t, p, u) in enumerate(hops):
        cfg = config if i == 0 else _ssh_config(t, p, u, opts)
        known += known_hosts_files(opts, cfg)
        if opts.client_keys is not None:
            keys += list(opts.client_keys)
        else:
            keys += [str(Path.home() / ".ssh" / n) for n in DEFAULT_KEY_FILES]
            for option in ("IdentityFile", "CertificateFile"):
                value = cfg.get(option) if cfg is not None else None
                keys += [value] if isinstance(value, str) else list(value or [])
    keys = [str(Path(k).expanduser()) for k in keys]
    keys += [k + suffix for k in keys for suffix in (".pub", "-cert.pub")]
    digest = hashlib.sha256()
    files: dict[str, Any] = {}
    for group, names, by_content in (("config", configs, True), ("known", known, True), ("key", keys, False)):
        for name in dict.fromkeys(names):
            files[name] = _stat_sig(name)
            digest.update(f"{group}\0{name}\0".encode())
            if by_content:
                try:
                    with open(name, "rb") as fh:
                        digest.update(hashlib.sha256(fh.read(MAX_KNOWN_HOSTS)).digest())
                except OSError:
                    digest.update(b"-")
            else:
                digest.update(repr(files[name]).encode())
    for d in dict.fromkeys(include_dirs):
        files[d] = _stat_sig(d)
    return Trust(files, digest.hexdigest())


def config_jump(target: str, port: int | None, user: str | None, opts: TransportOptions) -> list[JumpHop]:
    """The ProxyJump chain the ssh config gives ``target``, first hop first ([] for none or ``none``).

    Raises ValueError for a malformed chain.
    """
    return _jump_of(_ssh_config(target, port, user, opts))


def _jump_of(config: Any) -> list[JumpHop]:
    value = config.get("ProxyJump") if config is not None else None
    return parse_jump_chain(value) if isinstance(value, str) and value else []


# Ciphers, AES-GCM first: as strong as ChaCha20-Poly1305 (OpenSSH's first choice), hardware-accelerated
# on server CPUs, and in asyncssh about a third less of the client's CPU per host (it builds a new
# ChaCha20 context in Python for every packet). The rest of asyncssh's list follows, in its order.
GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _ciphers() -> list[str]:
    from asyncssh.encryption import get_default_encryption_algs

    rest = [a.decode() for a in get_default_encryption_algs()]
    return [c for c in GCM_FIRST if c in rest] + [c for c in rest if c not in GCM_FIRST]


async def _open(
    target: str,
    port: int | None,
    user: str | None,
    opts: TransportOptions,
    tunnel: Any,
    via: str | None = None,
    config: Any = _UNREAD,
) -> asyncssh.SSHClientConnection:
    if config is _UNREAD:
        config = _ssh_config(target, port, user, opts)
    kw = _connect_kwargs(target, port, user, opts, config)
    client = _Client(opts, kw["known_hosts"])
    if tunnel is not None:
        kw["tunnel"] = tunnel
    where = dialled(target, port, config)  # the address and port the ssh config made of it, as dialled
    try:
        conn = await asyncio.wait_for(
            asyncssh.connect(target, client_factory=lambda: client, **kw),
            opts.connect_timeout * 2 + 1,
        )
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise HostError(
            TIMEOUT,
            f"connect to {where} timed out after {opts.connect_timeout:g}s"
            f"{' (through jump host ' + via + ')' if via else ''}: no answer from the host",
        ) from exc
    except asyncssh.HostKeyNotVerifiable as exc:
        if client.verdict == HOSTKEY_REVOKED or (client.verdict is None and client.known and client.known.revoked):
            raise HostError(
                HOSTKEY_CHANGED,
                f"REVOKED HOST KEY for {where}: {client.known_path} marks this host's key @revoked; refused, "
                "never accepted (not even with --accept-new); this may be an attack",
            ) from exc
        if client.verdict == HOSTKEY_CHANGED:
            raise HostError(
                HOSTKEY_CHANGED,
                f"HOST KEY CHANGED for {where} (now {client.fingerprint}): refused, never accepted "
                f"(not even with --accept-new); this may be an attack. If the host was reinstalled, "
                f"remove its old line from {client.known_path} and check the new key",
            ) from exc
        if client.verdict == HOSTKEY_UNKNOWN:
            raise HostError(
                HOSTKEY_UNKNOWN,
                f"host key unknown for {where} ({client.fingerprint or 'no fingerprint'}): "
                "run ssh to it once, or pass --accept-new",
            ) from exc
        raise HostError(HOSTKEY_CHANGED, f"host key of {where} refused: {exc.reason or exc}") from exc
    except asyncssh.ChannelOpenError as exc:
        if via:  # the jump host could not open the forward to the target
            raise HostError(
                REFUSED if "refused" in str(exc.reason).lower() else NETWORK,
                f"jump host {via} could not reach {where}: {exc.reason or exc}",
            ) from exc
        raise explain(exc, target, port, where) from exc
    except asyncssh.PermissionDenied as exc:
        raise HostError(AUTH, _auth_reason(where, opts)) from exc
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        raise HostError(KEY, _key_reason(opts, exc)) from exc
    except ValueError as exc:
        if "known hosts" in str(exc).lower():  # asyncssh quotes the offending line: never show it
            raise HostError(HOSTKEY_UNKNOWN, _known_hosts_reason(opts)) from exc
        he = explain(exc, target, port, where)
        raise HostError(he.kind, _scrub(str(he), opts)) from exc
    except (asyncssh.Error, OSError) as exc:
        proxied = config is not None and config is not _UNREAD and bool(config.get("ProxyCommand"))
        if client.conn is not None and not client.conn.get_extra_info("server_version") and not proxied:
            # TCP accepted, then closed before sshd said a word: what sshd does to a handshake past MaxStartups
            raise Dropped(
                f"{where} closed the connection before the SSH greeting ({type(exc).__name__}: {exc}); "
                "sshd drops handshakes past its MaxStartups limit: lower --per-address"
            ) from exc
        he = explain(exc, target, port, where)
        raise HostError(he.kind, _scrub(str(he), opts)) from exc
    if client.new_key is not None:
        _remember(client, target, port)
    return conn


def _known_hosts_reason(opts: TransportOptions) -> str:
    """A known_hosts file that does not parse, named but never quoted (it may not be a known_hosts file at all)."""
    name = opts.known_hosts or "the known_hosts file of your ssh config"
    return f"{name} is not a valid known_hosts file (its contents are not shown); pass the right file to --known-hosts"


def _key_reason(opts: TransportOptions, exc: BaseException) -> str:
    """A client key that does not load, named but never quoted (the file may hold anything)."""
    files = ", ".join(opts.client_keys) if opts.client_keys else "a key from the agent, ~/.ssh or IdentityFile"
    locked = isinstance(exc, asyncssh.KeyEncryptionError) or "passphrase" in str(exc).lower()
    if locked:
        return (
            f"cannot load a client key ({files}): it is encrypted and the passphrase is missing or wrong "
            f"(put it in ${PASSPHRASE_ENV}, or use an ssh-agent)"
        )
    return (
        f"cannot load a client key ({files}): not a valid private key file (its contents are not shown); "
        f"an encrypted key needs its passphrase in ${PASSPHRASE_ENV}, or an ssh-agent"
    )


def _auth_reason(where: str, opts: TransportOptions) -> str:
    """Key refused, in plain words; says when there was nothing to offer (no agent, no key)."""
    text = f"authentication refused by {where}: no offered key"
    if opts.client_keys is not None:
        return f"{text} was accepted ({', '.join(opts.client_keys)})"
    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock:
        agent = "no ssh-agent (SSH_AUTH_SOCK is not set)"
    elif not os.path.exists(sock):
        agent = f"no ssh-agent (SSH_AUTH_SOCK={sock} does not exist)"
    else:
        agent = None
    ssh_dir = Path.home() / ".ssh"
    has_keys = any((ssh_dir / n).exists() for n in DEFAULT_KEY_FILES)
    if agent and not has_keys:
        return (
            f"{text}: {agent} and no default key in {ssh_dir}; start ssh-agent and ssh-add, or pass --identity KEYFILE"
        )
    if agent:
        return f"{text} was accepted: {agent}; tried the default keys in {ssh_dir}"
    return f"{text} or agent identity was accepted"


def _remember(client: _Client, target: str, port: int | None) -> None:
    """Append a newly accepted key (trust on first use) to the known_hosts asyncssh reads, as ssh's accept-new does."""
    assert client.new_key is not None
    path = client.known_path
    host = client.key_host or target
    kport = client.key_port if client.key_port is not None else port
    name = host if not kport or kport == 22 else f"[{host}]:{kport}"
    line = f"{name} {client.new_key.export_public_key('openssh').decode().strip()}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def explain(exc: BaseException, target: str = "", port: int | None = None, where: str | None = None) -> HostError:
    """Map a connection exception to a HostError with a plain-words reason (``where``: the address and
    port dialled, when known; else ``target:port``)."""
    where = where or (f"{target}:{port or 22}" if target else "host")
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, ConnectionRefusedError):
        return HostError(REFUSED, f"connection refused by {where} (is sshd listening on that port?)")
    if isinstance(exc, socket.gaierror):
        return HostError(DNS, f"name '{target}' does not resolve ({exc.strerror or exc})")
    if isinstance(exc, asyncssh.PermissionDenied):
        return HostError(AUTH, f"authentication refused by {where}: no offered key or agent identity was accepted")
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return HostError(KEY, _key_reason(TransportOptions(), exc))
    if isinstance(exc, asyncssh.ConnectionLost):
        return HostError(CLOSED, f"connection to {where} lost: {exc}")
    if isinstance(exc, asyncssh.DisconnectError):
        return HostError(CLOSED, f"{where} closed the connection: {exc.reason or exc}")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return HostError(CLOSED, f"{where} refused a session channel: {exc.reason or exc}")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return HostError(TIMEOUT, f"{where} timed out")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return HostError(
            LOCAL,
            f"this machine ran out of file descriptors ({exc.strerror}); "
            "not the host's fault: raise `ulimit -n` or lower --fanout",
        )
    if isinstance(exc, OSError):
        return HostError(NETWORK, f"{where}: {exc.strerror or exc}")
    return HostError(NETWORK, f"{where}: {type(exc).__name__}: {_scrub(str(exc))}")


def _scrub(text: str, opts: TransportOptions | None = None) -> str:
    """Never let a passphrase (option or environment) reach a message."""
    return scrub(text, opts.passphrase if opts else None)
