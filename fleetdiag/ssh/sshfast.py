"""Round trips the SSH protocol lets a client skip, and asyncssh does not: the one place that does it.

A probe is mostly round trips: at 240 ms each, they are most of the wait.
The login (``shorten``) costs three fewer than asyncssh's and OpenSSH's
default, for each connection ``transport`` opens:

1. **No ``none`` request.** A client normally opens with the ``none`` method
   only to learn which methods the server takes. Public-key auth is tried
   first instead; if it fails, the server's failure reply carries that list
   and the usual order resumes (``none`` stays behind ``publickey``, so a
   client with no key still asks).
2. **No public-key query.** RFC 4252 §7 lets the client send the *signed*
   request at once instead of first asking "would you take this key?". Done
   for keys read from files only: an agent key may ask for a confirmation and
   a hardware (``sk-``) key for a touch, so those still ask first, as ssh does.
3. **Auth pipelined behind the service request** (OpenSSH servers only: their
   sshd reads the requests in order). The first auth request leaves in the
   same flight as ``ssh-userauth``'s service request instead of waiting for
   the service accept. An RSA key waits for the accept when the server's
   signature algorithms are not known yet (they pick ``rsa-sha2-*``).

On a kept connection (``keeper``), a command normally costs two round trips:
the channel open, then the exec. ``Spare`` opens the next session channel
ahead of need, right after the previous command started, so the next command
costs its exec alone. Nothing runs on the host until then: sshd holds an
open session with no process behind it.

Both reach into asyncssh's client internals, so they are switched on only for
the asyncssh releases they were tested on (``TESTED``: CI runs the SSH tests
on the oldest and the newest release pyproject allows). On any other release,
when asyncssh is not shaped as expected, or with ``FLEETDIAG_SSH_LOGIN=standard``,
nothing changes and the login and channels are asyncssh's own: a few round
trips slower, never wrong. A spare channel sends the session's environment
(``SetEnv``/``SendEnv``) as asyncssh's own session would.
``tests/test_round_trips.py`` pins the counts through a real sshd and a delay
proxy.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

LOGIN_ENV = "FLEETDIAG_SSH_LOGIN"  # "standard": asyncssh's own login flow
# The asyncssh releases the shortcuts were tested on: from the first (inclusive) to the second
# (exclusive). 2.14-2.19 lack the client's ``begin_auth`` hook the pipelined auth calls; on 2.20 and
# 2.22 the spare channel was not taken. A release outside may move any of the private names below:
# widen the range only with tests/test_round_trips.py and tests/test_keeper.py passing on it.
TESTED = ((2, 24), (2, 25))


def _release(text: str) -> tuple[int, ...]:
    """``"2.24.1"`` -> (2, 24, 1); a part that is not a number ends it (``2.25.0rc1`` -> (2, 25))."""
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


try:
    from asyncssh.version import __version__ as _ASYNCSSH_VERSION
except ImportError:  # pragma: no cover
    _ASYNCSSH_VERSION = "0"
ASYNCSSH_VERSION = _release(_ASYNCSSH_VERSION)


def tested(version: tuple[int, ...] | None = None) -> bool:
    """Whether this asyncssh release (default: the one installed) is one the shortcuts were tested on."""
    v = ASYNCSSH_VERSION if version is None else version
    return TESTED[0] <= v[:2] < TESTED[1]


_FLAG = "_fleetdiag_short_login"
_USERAUTH = b"ssh-userauth"

try:  # the private pieces this module relies on
    from asyncssh import PIPE
    from asyncssh import auth as _auth
    from asyncssh.channel import SSHClientChannel
    from asyncssh.connection import MSG_SERVICE_ACCEPT
    from asyncssh.misc import encode_env, lookup_env
    from asyncssh.packet import Boolean, SSHPacketHandler, String
    from asyncssh.process import SSHClientProcess

    _BASE: Any = _auth._ClientPublicKeyAuth
    _HANDLERS: Any = _auth._client_auth_handlers
except (ImportError, AttributeError):  # pragma: no cover - another asyncssh: keep its login
    _BASE = None
    _HANDLERS = None
    SSHClientChannel = object  # type: ignore[assignment, misc]


def _asks_first(keypair: Any) -> bool:
    """Keys that may involve a person or a device when used: query before signing, as ssh does."""
    kind = type(keypair).__name__
    return "Agent" in kind or "PKCS11" in kind or bytes(getattr(keypair, "algorithm", b"")).startswith(b"sk-")


def _is_rsa(keypair: Any) -> bool:
    algorithm = bytes(getattr(keypair, "algorithm", b""))
    return algorithm.startswith((b"ssh-rsa", b"rsa-sha2-"))


if _BASE is not None:

    class _SignFirst(_BASE):  # type: ignore[misc, valid-type]
        """Public-key auth that sends the signed request without the PK_OK query (RFC 4252 §7)."""

        async def _start(self) -> None:
            state = getattr(self._conn, _FLAG, None)
            if state is None:
                await super()._start()
                return
            self._keypair = await self._conn.public_key_auth_requested()
            if self._keypair is None:
                self._conn.try_next_auth(next_method=True)
                return
            if _is_rsa(self._keypair) and not self._conn._server_sig_algs:
                await state.accepted  # the signature name depends on server-sig-algs
                self._keypair = _reselect(self._conn, self._keypair)
            if _asks_first(self._keypair):
                await self.send_request(
                    Boolean(False), String(self._keypair.algorithm), String(self._keypair.public_data)
                )
                return
            await self._send_signed_request()


def _reselect(conn: Any, keypair: Any) -> Any:
    """Pick the RSA signature name again now that server-sig-algs is known (as asyncssh does)."""
    choose = getattr(conn, "_choose_signature_alg", None)
    if choose is not None:
        try:
            choose(keypair)
        except (ValueError, TypeError):
            pass
    return keypair


class _State:
    """Per-connection: whether auth went out early, and when the service accept came."""

    def __init__(self) -> None:
        self.early = False
        self.accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()


def enabled() -> bool:
    """Whether the short login and spare channels apply in this process."""
    return _BASE is not None and tested() and os.environ.get(LOGIN_ENV, "").strip().lower() != "standard"


def install() -> None:
    """Put the sign-first public-key method in asyncssh's table (inactive on connections not shortened),
    and the packet log's words made only when they are logged (``_log_packet``)."""
    if _BASE is not None and _HANDLERS.get(b"publickey") is _BASE:
        _HANDLERS[b"publickey"] = _SignFirst
    if _BASE is not None and getattr(SSHPacketHandler, "_log_packet", None) is _LOG_PACKET:
        SSHPacketHandler._log_packet = _log_packet


_LOG_PACKET = getattr(SSHPacketHandler, "_log_packet", None) if _BASE is not None else None


def _log_packet(self: Any, msg: str, pkttype: int, pktid: Any, packet: Any, note: str) -> None:
    """asyncssh builds every packet's log line (a copy of its payload, its type's name, its size) before
    its logger, which logs packets at debug level 3 only (``SSHLogger.packet``), drops it: a probe's
    answer is ~30 packets. The logger's own test comes first here; at level 3 the line is asyncssh's."""
    if getattr(self.logger, "_debug_level", 3) >= 3:
        _LOG_PACKET(self, msg, pkttype, pktid, packet, note)  # type: ignore[misc]


def shorten(conn: Any) -> bool:
    """Shorten this connection's login; called from the client's ``connection_made``. False = unchanged."""
    if not enabled():
        return False
    install()
    if _HANDLERS.get(b"publickey") is not _SignFirst:
        return False
    methods = getattr(conn, "_auth_methods", None)
    handlers = getattr(conn, "_packet_handlers", None)
    send_service_request = getattr(conn, "send_service_request", None)
    if methods != [b"none"] or not isinstance(handlers, dict) or send_service_request is None:
        return False
    state = _State()
    setattr(conn, _FLAG, state)
    conn._auth_methods = [b"publickey", b"none"]

    def early_service_request(service: bytes) -> None:
        send_service_request(service)
        version = bytes(getattr(conn, "_server_version", b"") or b"")
        if service == _USERAUTH and b"OpenSSH_" in version and not getattr(conn, "_auth_in_progress", True):
            state.early = True
            conn._auth_in_progress = True
            owner = getattr(conn, "_owner", None)
            if owner is not None:
                owner.begin_auth(conn._username)
            conn.try_next_auth()

    accept = handlers[MSG_SERVICE_ACCEPT]

    def service_accept(self: Any, pkttype: int, pktid: int, packet: Any) -> Any:
        if not state.accepted.done():
            state.accepted.set_result(None)
        if not state.early:
            return accept(self, pkttype, pktid, packet)
        service = packet.get_string()
        packet.check_end()
        if service != conn._next_service:
            return accept(self, pkttype, pktid, _Replay(service))
        conn._next_service = None
        return True

    own = dict(handlers)
    own[MSG_SERVICE_ACCEPT] = service_accept
    conn._packet_handlers = own
    conn.send_service_request = early_service_request
    return True


class _Replay:
    """A consumed SERVICE_ACCEPT handed back to asyncssh's own handler (which then rejects it)."""

    def __init__(self, service: bytes):
        self._service = service

    def get_string(self) -> bytes:
        return self._service

    def check_end(self) -> None:
        return None


# --------------------------------------------------------------------------- spare channels

_PLACEHOLDER = "fleetdiag-spare"  # never sent: the exec carries the real command


class _SpareChannel(SSHClientChannel):  # type: ignore[misc, valid-type]
    """A session channel whose open is done now and whose exec waits for a command."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.wanted: asyncio.Future[str] = loop.create_future()
        self.real_command = ""
        self.exec_sent = False

    async def _open(self, chantype: bytes, *args: bytes) -> Any:
        packet = await super()._open(chantype, *args)
        if not self.opened.done():
            self.opened.set_result(None)
        self.real_command = await self.wanted
        return packet

    async def _make_request(self, request: bytes, *args: bytes) -> Any:
        if request == b"exec":
            self.exec_sent = True
            self._command = self.real_command
            args = (String(self.real_command),)
        return await super()._make_request(request, *args)


class Spare:
    """At most one session channel opened ahead of need on one connection."""

    def __init__(self, conn: Any):
        self.conn = conn
        self._chan: Any = None
        self._task: asyncio.Task[Any] | None = None
        self.used = 0  # commands that started on a spare (tests and the bench read it)

    def prime(self) -> None:
        """Open the next spare channel in the background (no-op when one is pending or spares are off)."""
        if self._task is not None or not enabled() or self.conn.is_closed():
            return
        try:
            options = self.conn._options
            self.conn._update_recv_pktlen(options.max_pktsize)
            chan = _SpareChannel(
                self.conn,
                self.conn._loop,
                self.conn._utf8_decode_errors,
                None,
                "strict",
                options.window,
                options.max_pktsize,
            )
            task = asyncio.ensure_future(
                chan.create(
                    SSHClientProcess,
                    _PLACEHOLDER,
                    None,
                    _session_env(options),
                    False,
                    None,
                    None,
                    {},
                    False,
                    None,
                    None,
                    False,
                    False,
                )
            )
        except Exception:  # another asyncssh, a closing connection: no spare, commands open their own
            return
        task.add_done_callback(_quiet)
        self._chan, self._task = chan, task

    async def create_process(self, command: str, **redirect: Any) -> Any:
        """Start ``command`` on the spare channel when it is open, else on a new one (asyncssh's way)."""
        chan, task = self._chan, self._task
        self._chan = self._task = None
        self.prime()  # the next command's channel opens in this one's flight, and is open by its end
        if chan is not None and task is not None:
            alive = getattr(chan, "_conn", None) is not None and not task.done() and not chan.wanted.done()
            if alive and not chan.opened.done():  # its open is on the way: no sooner than a new one
                await asyncio.wait([chan.opened, task], return_when=asyncio.FIRST_COMPLETED)
                alive = getattr(chan, "_conn", None) is not None and not task.done()
            if alive and chan.opened.done():
                chan.wanted.set_result(command)
                try:
                    process = await task
                    await process.redirect(*(redirect.get(k, PIPE) for k in ("stdin", "stdout", "stderr")))
                except Exception:
                    chan.close()
                    if chan.exec_sent:  # the command may have started: never run it twice
                        raise
                else:
                    self.used += 1
                    return process
            else:
                task.cancel()
                chan.close()
        return await self.conn.create_process(command, encoding=None, **redirect)


def _session_env(options: Any) -> dict[bytes, bytes]:
    """The environment asyncssh's own session would send for this connection (ssh config
    ``SendEnv`` from this process's environment, then ``SetEnv``), in its encoding."""
    env: dict[bytes, bytes] = {}
    if options.send_env:
        env.update(lookup_env(options.send_env))
    if options.env:
        env.update(encode_env(options.env))
    return env


def _quiet(task: asyncio.Task[Any]) -> None:
    """A spare that failed or was cancelled is simply not used: read its exception so nobody logs it."""
    if not task.cancelled():
        task.exception()
