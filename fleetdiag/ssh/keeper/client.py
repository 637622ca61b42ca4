"""The keeper's client: a command's kept connection, and ``fleetdiag connections``' list and close."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from ..reach import (
    CLOSED,
    CONNECT_TIMEOUT,
    KEEPER_LOST,
    KEY,
    NOT_RUN,
    STDERR_KEEP,
    CommandEnd,
    HostError,
    Runner,
    RunOutcome,
    TransportOptions,
    outcome,
)
from . import ahead
from .key import connect_params, connection_key
from .place import private_dir, runtime_dir, socket_path
from .start import START_WAIT, spawn
from .wire import CONNECTED, CONNECTED_KEY, FAILED, NOT_KEPT, OUTPUT_CAP, peer_uid, recv, send

HELLO_TIMEOUT = 0.2  # a keeper that does not say hello within this is wedged: connect directly
HELLO_ENV = "FLEETDIAG_KEEPER_HELLO"  # seconds, to override HELLO_TIMEOUT (a heavily loaded machine, tests)
# A connection's later run requests go to a keeper that answered its first one: it is alive, maybe
# busy (hundreds of hosts' commands in one process), so it gets this long to say hello.
RUN_HELLO = 10.0


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
        if peer_uid(writer.get_extra_info("socket")) != os.getuid():
            raise KeeperUnavailable("keeper runs as another user")
        hello = json.loads(await asyncio.wait_for(recv(reader), hello_wait))
        if hello.get("hello") != 1:
            raise KeeperUnavailable("not a keeper")
        await send(writer, json.dumps(req).encode())
    except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as exc:
        # closed or reset before its hello: no keeper serves this socket any more (the connect was queued and
        # dropped as the keeper died): nothing listens, as for a refused connect, and a new keeper may start
        writer.close()
        raise KeeperUnavailable(f"keeper gone: {exc!r}", absent=True) from exc
    except (OSError, ValueError, asyncio.TimeoutError, TimeoutError) as exc:
        writer.close()
        raise KeeperUnavailable(f"keeper wedged: {exc}") from exc
    except KeeperUnavailable:
        writer.close()
        raise
    return reader, writer


async def _ask(directory: Path, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    reader, writer = await _request(directory, req)
    try:
        return json.loads(await asyncio.wait_for(recv(reader), timeout))
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError, TimeoutError) as exc:
        raise KeeperUnavailable(f"keeper did not answer: {exc}") from exc
    finally:
        writer.close()


Gate = Callable[[], AbstractAsyncContextManager[Any]]  # a handshake slot for one host (the scheduler's)


class _Slot:
    """A host's handshake slot (``Gate``), held from a connection's first request until the keeper says its
    connection is ready (or the direct connection is open): a dial through the keeper counts against the
    address's handshakes as a direct one does, and a kept connection costs a moment in the slot."""

    def __init__(self, gate: Gate | None):
        self.gate = gate
        self.held: AbstractAsyncContextManager[Any] | None = None

    async def take(self) -> None:
        if self.gate is not None and self.held is None:
            held = self.gate()
            await held.__aenter__()
            self.held = held

    async def give(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            await held.__aexit__(None, None, None)


class KeptConnection:
    """A ``transport.Connection`` look-alike whose commands run on the keeper's connection.

    Made by ``open_kept`` without a word to the keeper: the first command's ``run`` request is the open
    too (the keeper dials when it holds no connection for ``key``), so a warm command costs one request.
    Until the keeper has answered, ``direct`` is how this host is reached without it: a keeper that is
    absent and cannot be started, wedged or not ours, or that cannot unlock a key this command can,
    means that command and the ones after it run on a direct connection, silently. ``gate``: the host's
    handshake slot, held while that first request may dial (``_Slot``). A connection made without
    ``direct`` counts as answered (its keeper is known alive)."""

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
        direct: Callable[[], Awaitable[Runner]] | None = None,
        gate: Gate | None = None,
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
        self._direct = direct  # None once the keeper answered
        self._gate = gate
        self._fallback: Runner | None = None  # the direct connection, once the keeper could not be used

    async def execute(self, command: str, timeout: float | None, cap: int | None = None) -> RunOutcome:
        """Run one command on the keeper's connection (``reach.Runner``), with ``Connection.execute``'s
        semantics: the keeper runs ``transport.run_on``, and its end record goes through ``reach.outcome``.

        The first command's request finds the keeper (starting one when none listens) and is the open:
        the keeper dials if it must, and a host it cannot reach is this command's error. A keeper that
        cannot be used for it: the command runs directly (``direct``). Later, a keeper gone before it took
        the request: ``started`` is False (the command never reached the host). A keeper that stops
        answering mid-command: the output is incomplete, an internal error."""
        cap = cap or self.cap
        if self._fallback is not None:
            return self._keep(await self._fallback.execute(command, timeout, cap))
        slot = _Slot(self._gate if self._direct is not None else None)
        try:
            return await self._execute(command, timeout, cap, slot)
        finally:
            await slot.give()

    async def _execute(self, command: str, timeout: float | None, cap: int, slot: _Slot) -> RunOutcome:
        first = self._direct is not None
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
        early = ahead.take(req)  # the same request, sent before the CLI's imports: its answer is read
        if early is not None:
            try:
                reader, writer = await asyncio.open_unix_connection(sock=early)
            except OSError:
                early.close()
                early = None
            else:  # sent ahead, it runs only on a connection the keeper holds: no handshake to wait for
                await slot.take()
                await slot.give()
        if early is None:
            t0 = time.perf_counter()
            try:
                if first:
                    await slot.take()
                    reader, writer = await self._first_request({**req, CONNECTED_KEY: True} if slot.held else req)
                else:
                    reader, writer = await _request(self.directory, req, RUN_HELLO)
            except KeeperUnavailable as exc:
                if first:
                    return await self._go_direct(command, timeout, cap, slot)
                end = CommandEnd(NOT_RUN, kind=CLOSED, reason=f"connection keeper for {self.where} went away ({exc})")
                res = outcome(end, b"", b"", self.where, timeout, cap)
                res.started = False
                return self._keep(res)
            if first:  # finding the keeper (starting it) is part of reaching the host
                self.connect_ms += (time.perf_counter() - t0) * 1000
        out: list[bytes] = []
        err: list[bytes] = []
        gone = False
        connect = float(self.params.get("connect_timeout") or CONNECT_TIMEOUT)
        limit = None if timeout is None else timeout * 2 + connect * 2 + 5
        if limit is not None and first and self.params.get("jump"):  # the keeper may dial through the chain
            limit += 2 * (connect * 2 + 1)
        try:
            while True:
                frame = await asyncio.wait_for(recv(reader), limit)
                kind, data = frame[:1], frame[1:]
                if kind == b"O":
                    out.append(data)
                elif kind == b"E":
                    err.append(data)
                elif kind == b"X":
                    end = CommandEnd.from_plain(json.loads(data))
                    break
                elif kind == CONNECTED:
                    await slot.give()
        except (OSError, ValueError, TypeError, asyncio.IncompleteReadError, asyncio.TimeoutError, TimeoutError) as exc:
            silent = isinstance(exc, (asyncio.TimeoutError, TimeoutError))
            end = CommandEnd(KEEPER_LOST, reason=f"nothing for {limit:g}s" if silent else "it ended")
            gone = not silent  # the keeper closed the socket: it died or restarted
        finally:
            writer.close()
        await slot.give()
        if early is not None and (gone or (end.ended == NOT_RUN and end.kind == NOT_KEPT)):
            # sent ahead and not run, or its keeper gone since (killed, restarted): the command's own request
            # goes now, as it would have without send-ahead (once: ``take`` hands the early socket out once)
            return await self._execute(command, timeout, cap, slot)
        if first and end.ended == NOT_RUN and end.kind == KEY:
            # the keeper lacks what unlocks a key (its environment): this command may not
            return await self._go_direct(command, timeout, cap, slot)
        if first and end.ended != KEEPER_LOST:
            self._direct = None  # the keeper answered: later requests give it longer to say hello
        if end.reused is not None:  # whether the keeper's connection was there already for this command
            self.reused = bool(end.reused)
        if end.reused is False:  # the keeper had to dial (first use, or the connection had died)
            self.connect_ms += float(end.connect_ms or 0)
        return self._keep(outcome(end, b"".join(out), b"".join(err), self.where, timeout, cap))

    async def _first_request(self, req: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Send a connection's first request: to the keeper that listens, else to one started for it.

        KeeperUnavailable: none usable (wedged, not ours, could not start, not ready in time)."""
        try:
            return await _request(self.directory, req)
        except KeeperUnavailable as exc:
            if not exc.absent:  # wedged or not ours: direct, without waiting on it again
                raise
            started = await asyncio.get_running_loop().run_in_executor(None, spawn, self.directory, self.persist)
            if started == FAILED:
                raise KeeperUnavailable("the keeper could not start") from exc
        deadline = time.monotonic() + START_WAIT
        while True:
            try:
                return await _request(self.directory, req)
            except KeeperUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    async def _go_direct(self, command: str, timeout: float | None, cap: int, slot: _Slot) -> RunOutcome:
        """This command, and the ones after it, on a direct connection (its handshake in the host's slot):
        the keeper could not be used."""
        dial, self._direct = self._direct, None
        if dial is None:  # not reached: only a connection's first command falls back
            raise KeeperUnavailable("no direct connection to fall back on")
        await slot.take()
        try:
            self._fallback = await dial()
        except HostError as exc:  # the host's error, as a direct connection's open raises it
            return self._keep(RunOutcome(error=exc))
        finally:
            await slot.give()
        self.connect_ms += self._fallback.connect_ms
        self.reused = False
        return self._keep(await self._fallback.execute(command, timeout, cap))

    def _keep(self, res: RunOutcome) -> RunOutcome:
        self.last_stderr, self.last_status, self.last_rtt_ms = res.stderr, res.status, res.rtt_ms
        return res

    async def run(self, command: str, timeout: float | None) -> tuple[bytes, int | None, float, float]:
        """As ``Connection.run``: (stdout, exit status, open+exec ms, total ms); same errors."""
        return (await self.execute(command, timeout)).result()

    def close(self) -> None:
        """The connection stays with the keeper: nothing to close here (but a direct one, when it fell back)."""
        if self._fallback is not None:
            self._fallback.close()


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
    gate: Gate | None = None,
) -> KeptConnection:
    """The host's kept connection, as a ``KeptConnection`` whose first command is also its open: nothing
    is asked of the keeper here, so a warm command costs one request; ``gate``: the host's handshake slot.

    Raises KeeperUnavailable when the keeper cannot be used for these options or this directory (the
    caller connects directly). A keeper found unusable at the first command, or one that could not
    unlock a key: that command connects directly, silently; a host the keeper could not reach is that
    command's error (a HostError, as from a direct connection).
    """
    if not usable(opts):
        raise KeeperUnavailable("options the keeper cannot have")
    directory = directory or runtime_dir()
    if private_dir(directory) is None:
        raise KeeperUnavailable(f"{directory} is not a private directory")
    params = connect_params(target, port, user, opts, jump)

    async def direct() -> Runner:
        from ..transport import connect  # asyncssh loads only when a host is really reached directly

        return await connect(target, port, user, opts, jump=jump)

    key = connection_key(params)
    return KeptConnection(directory, key, params, label, persist, 0.0, False, direct=direct, gate=gate)


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
