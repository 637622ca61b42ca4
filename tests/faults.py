"""An in-process asyncssh server that misbehaves on purpose, for the fault tests.

Real OpenSSH (tests/sshd.py) covers what sshd does by itself; this server
covers what a real fleet throws at a client that sshd will not do on demand:
a session that hangs, a connection dropped mid-output, output trickling in,
a login shell that prints junk or is not a POSIX shell, a key the server
refuses. Exec requests run through a real ``/bin/sh -c`` (like sshd running
the user's login shell), in a clean environment like sshd's, so the funnel
that runs here is the real one.

Plus two network helpers that need no server at all:
:class:`FreezeProxy` (a host that stops answering after login: the TCP
connection stays open, nothing comes back) and :func:`silent_port` (a port
whose listen queue is full, so a connect gets no answer at all).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from fleetdiag.ssh.transport import TransportOptions


@dataclass
class Behaviour:
    """What the server does with an exec request. The defaults behave like sshd."""

    argv: list[str] = field(default_factory=lambda: ["/bin/sh", "-c"])  # the "login shell"
    env: dict[str, str] = field(default_factory=dict)  # on top of a clean sshd-like environment
    cwd: str | None = None
    prefix: bytes = b""  # written before the command's output (a banner, a chatty rc file)
    suffix: bytes = b""  # written after it (a logout script)
    hang: bool = False  # accept the exec, then never answer
    hang_after: int | None = None  # send this many bytes of output, then hang
    drop_after: int | None = None  # send this many bytes of output, then cut the connection
    chunk: int = 4096  # output is relayed in chunks of this size ...
    chunk_delay: float = 0.0  # ... this many seconds apart (slow output)


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: FaultServer):
        self.owner = owner

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.owner.connections.append(conn)

    def begin_auth(self, username: str) -> bool:
        return True


@dataclass
class FaultServer:
    """``async with FaultServer(tmp, Behaviour(...)) as srv``: ``srv.opts()`` reaches it."""

    workdir: Path
    behaviour: Behaviour = field(default_factory=Behaviour)
    authorize_client: bool = True  # False: the client's key is refused
    client_passphrase: str | None = None  # write the client key encrypted with this
    port: int = 0
    host_key: asyncssh.SSHKey = field(init=False)
    client_key_path: Path = field(init=False)
    known_hosts: Path = field(init=False)
    commands: list[str] = field(default_factory=list, init=False)
    connections: list[Any] = field(default_factory=list, init=False)
    _server: Any = field(default=None, init=False)
    _tasks: set[asyncio.Task] = field(default_factory=set, init=False)
    _procs: set[Any] = field(default_factory=set, init=False)

    async def __aenter__(self) -> FaultServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = self.workdir / "client_ed25519"
        if self.client_passphrase is None:
            client_key = asyncssh.generate_private_key("ssh-ed25519")
            client_key.write_private_key(str(self.client_key_path))
            os.chmod(self.client_key_path, 0o600)
        else:  # ssh-keygen: asyncssh needs bcrypt to write an encrypted OpenSSH key
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", self.client_passphrase, "-f", str(self.client_key_path)],
                check=True,
            )
            client_key = asyncssh.read_public_key(str(self.client_key_path) + ".pub")
        other = asyncssh.generate_private_key("ssh-ed25519")
        allowed = client_key if self.authorize_client else other
        self._server = await asyncssh.create_server(
            lambda: _Server(self),
            "127.0.0.1",
            self.port,
            server_host_keys=[self.host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(allowed.export_public_key().decode()),
            process_factory=self._handle,
            encoding=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.known_hosts = self.workdir / "known_hosts"
        self.known_hosts.write_text(self.known_line())
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self.connections:
            conn.abort()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for proc in list(self._procs):  # whatever a cancelled session left behind
            await _reap(proc)
        self._server.close()
        await self._server.wait_closed()
        await asyncio.sleep(0.05)  # let the pipes' close callbacks run before the loop goes away

    def known_line(self, port: int | None = None) -> str:
        pub = self.host_key.export_public_key().decode().strip()
        return f"[127.0.0.1]:{port or self.port} {pub}\n"

    def opts(self, **kw: Any) -> TransportOptions:
        base: dict[str, Any] = dict(
            known_hosts=str(self.known_hosts),
            client_keys=[str(self.client_key_path)],
            ssh_config=[],
            connect_timeout=5,
            command_timeout=10,
        )
        base.update(kw)
        return TransportOptions(**base)

    def clean_env(self) -> dict[str, str]:
        """What sshd gives a session: a short PATH, HOME, USER, SSH_CLIENT, no SHLVL."""
        home = str(Path.home())
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "USER": os.environ.get("USER", "root"),
            "LOGNAME": os.environ.get("USER", "root"),
            "SHELL": "/bin/sh",
            "SSH_CLIENT": f"127.0.0.1 50000 {self.port}",
            "SSH_CONNECTION": f"127.0.0.1 50000 127.0.0.1 {self.port}",
        }
        env.update(self.behaviour.env)
        return env

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._run(process)
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _run(self, process: asyncssh.SSHServerProcess) -> None:
        b = self.behaviour
        command = process.command or "true"
        self.commands.append(command)
        if b.hang:
            await asyncio.Event().wait()
        if b.prefix:
            process.stdout.write(b.prefix)
        proc = await asyncio.create_subprocess_exec(
            *b.argv,
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.clean_env(),
            cwd=b.cwd or str(Path.home()),
        )
        self._procs.add(proc)
        assert proc.stdout is not None and proc.stderr is not None
        sent = 0

        async def pump_err() -> None:
            while data := await proc.stderr.read(65536):
                process.stderr.write(data)

        err_task = asyncio.ensure_future(pump_err())
        try:
            while data := await proc.stdout.read(b.chunk):
                for limit, action in ((b.drop_after, "drop"), (b.hang_after, "hang")):
                    if limit is not None and sent + len(data) >= limit:
                        process.stdout.write(data[: max(0, limit - sent)])
                        await process.stdout.drain()
                        if action == "drop":
                            await asyncio.sleep(0.05)
                            process.get_extra_info("connection").abort()
                            return
                        await asyncio.Event().wait()
                process.stdout.write(data)
                sent += len(data)
                if b.chunk_delay:
                    await process.stdout.drain()
                    await asyncio.sleep(b.chunk_delay)
            await err_task
            code = await proc.wait()
            if b.suffix:
                process.stdout.write(b.suffix)
            process.exit(code if code >= 0 else 128 - code)
        except (asyncssh.Error, OSError, asyncio.CancelledError):
            pass
        finally:
            err_task.cancel()
            await _reap(proc)
            self._procs.discard(proc)


async def _reap(proc: Any) -> None:
    """Kill (if needed), wait for and close a subprocess, so no pipe outlives the event loop."""
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        await asyncio.shield(proc.wait())
    except asyncio.CancelledError:
        pass
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


@dataclass
class FreezeProxy:
    """A TCP relay that can freeze: after ``freeze()`` nothing passes either way,
    but both connections stay open (a host that hung, a silent network partition)."""

    target_port: int
    port: int = 0
    frozen: bool = False
    _server: Any = field(default=None, init=False)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list, init=False)

    async def start(self) -> FreezeProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def freeze(self) -> None:
        self.frozen = True

    async def stop(self) -> None:
        for w in self._writers:
            w.close()
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [w1, w2]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    if not self.frozen:
                        w.write(data)
                        await w.drain()
            except (OSError, asyncio.CancelledError):
                pass

        await asyncio.gather(pipe(r1, w2), pipe(r2, w1))


class SilentPort:
    """A port that never answers a TCP connect: its listen queue is full, so the
    kernel drops further SYNs (a firewalled port, a host that is down)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.fillers: list[socket.socket] = []
        for _ in range(2):  # the queue holds backlog + 1
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self.fillers.append(s)

    def close(self) -> None:
        for s in self.fillers + [self.listener]:
            s.close()


class MuteServer:
    """A port that accepts TCP and then says nothing: no SSH banner ever comes."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]

    def close(self) -> None:
        self.listener.close()


class ServerThread:
    """A FaultServer on its own event loop in a thread, for CLI tests (the CLI runs its own loop)."""

    def __init__(self, workdir: Path, behaviour: Behaviour | None = None, **kw: Any):
        self.server = FaultServer(workdir, behaviour or Behaviour(), **kw)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FaultServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.__aenter__(), self.loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.__aexit__(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
