"""Host keys: what known_hosts vouches for (revoked keys on every port), the client that decides on a key it
does not (a changed key refused always, a new one only with accept_new), and trust on first use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import asyncssh

from . import sshfast
from .reach import HOSTKEY_CHANGED, HOSTKEY_UNKNOWN, TransportOptions


class HostKeyClient(asyncssh.SSHClient):
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


HOSTKEY_REVOKED = "revoked"  # a verdict of HostKeyClient only: reported as HOSTKEY_CHANGED


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


def remember_key(client: HostKeyClient, target: str, port: int | None) -> None:
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
