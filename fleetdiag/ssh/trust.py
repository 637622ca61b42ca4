"""What decided a connection's trust (ssh config and its Includes, known_hosts, key files), so a kept
connection is reused only while it holds."""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hostkeys import MAX_KNOWN_HOSTS
from .reach import DEFAULT_KEY_FILES, TransportOptions
from .sshconfig import config_for, jump_of, known_hosts_files

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
    config = config_for(target, port, user, opts)
    if jump is None:
        with contextlib.suppress(ValueError):
            jump = [(h.host, h.port, h.user) for h in jump_of(config)]
    hops += [jump] if isinstance(jump, tuple) else list(jump or [])
    known: list[str] = []
    keys: list[str] = []
    for i, (t, p, u) in enumerate(hops):
        cfg = config if i == 0 else config_for(t, p, u, opts)
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
