"""The key of a kept connection: everything that decides which connection a command gets, and the plain
(JSON) description the keeper dials from."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..reach import CONNECT_TIMEOUT, DEFAULT_KEY_FILES, TransportOptions


def file_id(path: str | os.PathLike[str] | None, content: bool = False) -> list[Any]:
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
        "jump": plain(jump),
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
        "configs": [file_id(c, content=True) for c in configs],
        "keys": [file_id(k) for k in keys],
        "known_hosts": file_id(known, content=True),
        "accept_new": bool(params.get("accept_new")),
        "agent": params.get("agent_path"),
        "keepalive": params.get("keepalive"),
    }
    blob = json.dumps(decided, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def options(params: dict[str, Any]) -> TransportOptions:
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


def plain(jump: Any) -> Any:
    """A jump (one hop tuple, or a chain of them) as JSON lists."""
    if jump is None:
        return None
    if isinstance(jump, (tuple, list)) and jump and isinstance(jump[0], str):
        return list(jump)
    return [list(hop) for hop in jump]


def unplain(jump: Any) -> Any:
    if jump is None:
        return None
    if jump and isinstance(jump[0], str):
        return tuple(jump)
    return [tuple(hop) for hop in jump]
