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

The wire (``wire``): frames of a 4-byte length and a payload; a request is one
JSON frame (``op``: ``run``, ``list``, ``close``); ``run`` names the host's
connection and the command, and is the open too (the keeper dials when it holds
none), so a warm command costs the CLI one request; it answers with stdout,
stderr and end frames. The keeper stops reading a command's output at ``cap``
bytes (8 MiB by default).

Its modules: ``place`` (the private directory and socket) · ``key`` (what
decides a connection) · ``wire`` (framing, the peer's uid) · ``server`` (the
keeper process) · ``start`` (spawning it, detached) · ``client`` (a command's
side: ``open_kept``, ``KeptConnection``, ``list_kept``, ``close_kept``).
"""

from __future__ import annotations

from ...lazy import resolver

# Each public name and the module that owns it, imported on first use: the entry point's send-ahead
# (``ahead``) reads ``place`` before the CLI has imported asyncio, and must not pay for ``client``.
_OWNERS = {
    "HELLO_ENV": "client",
    "HELLO_TIMEOUT": "client",
    "RUN_HELLO": "client",
    "KeeperUnavailable": "client",
    "KeptConnection": "client",
    "close_kept": "client",
    "list_kept": "client",
    "open_kept": "client",
    "usable": "client",
    "connect_params": "key",
    "connection_key": "key",
    "LOCK_NAME": "place",
    "RUNTIME_ENV": "place",
    "SOCKET_NAME": "place",
    "private_dir": "place",
    "runtime_dir": "place",
    "socket_path": "place",
    "Keeper": "server",
    "Kept": "server",
    "serve_forever": "server",
    "START_WAIT": "start",
    "detach_main": "start",
    "spawn": "start",
    "DEFAULT_PERSIST": "wire",
    "OUTPUT_CAP": "wire",
    "PERSIST_ENV": "wire",
}


__getattr__ = resolver(__name__, _OWNERS)


__all__ = [
    "DEFAULT_PERSIST",
    "HELLO_ENV",
    "HELLO_TIMEOUT",
    "LOCK_NAME",
    "OUTPUT_CAP",
    "PERSIST_ENV",
    "RUNTIME_ENV",
    "RUN_HELLO",
    "SOCKET_NAME",
    "START_WAIT",
    "Keeper",
    "KeeperUnavailable",
    "Kept",
    "KeptConnection",
    "close_kept",
    "connect_params",
    "connection_key",
    "detach_main",
    "list_kept",
    "open_kept",
    "private_dir",
    "runtime_dir",
    "serve_forever",
    "socket_path",
    "spawn",
    "usable",
]
