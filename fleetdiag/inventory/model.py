"""The inventory's records and errors: what a loaded inventory is, whatever file shape it came from."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOP_KEYS = ("defaults", "hosts", "groups")
HOST_KEYS = (
    "address",
    "port",
    "user",
    "jump",
    "logs",
    "gpus",
    "region",
    "tags",
    "funnel",
    "identity_file",
    "path_prepend",
)
FUNNEL_KEYS = ("tail_lines", "scan_bytes", "run_start", "stall_after", "timeout")
ALL = "all"
# A log entry is a path or glob, or one of these streams: ``{journal: UNIT}``, ``{docker: CONTAINER}``,
# ``{command: "..."}`` (its stdout is the log). ``{file: PATH}`` is the long form of a path.
SOURCE_KINDS = ("file", "journal", "docker", "command")
DISCOVER = "discover"


# --------------------------------------------------------------------------- errors


class InventoryError(Exception):
    """A problem with the inventory, located as precisely as we know.

    ``str(e)`` is ``"file:line: dotted.key: message"`` (parts we do not know
    are left out). ``errors`` holds every error found in the file, this one
    first, so ``fleetdiag check`` can report them all.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line
        self.key = key
        self.errors: list[InventoryError] = [self]

    def __str__(self) -> str:
        loc = ""
        if self.path is not None:
            loc = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        elif self.line is not None:
            loc = f"line {self.line}"
        return ": ".join(p for p in (loc, self.key or "", self.message) if p)


class SelectorError(InventoryError):
    """A selector term that names nothing in the inventory (or is malformed)."""

    def __init__(self, message: str, *, term: str | None = None, suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.term = term
        self.suggestions = list(suggestions)


class InventoryNotFound(InventoryError):
    """No inventory file where we looked; ``looked`` lists each place."""

    def __init__(self, message: str, *, looked: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.looked = list(looked)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class LogSource:
    """Where one log is read from: ``kind`` is file (value: path or glob), journal (a systemd unit),
    docker (a container), command (a shell command whose stdout is the log), or discover (find it
    on the host from the job's process)."""

    kind: str
    value: str = ""

    def __str__(self) -> str:
        if self.kind == "file":
            return self.value
        return "discover" if self.kind == DISCOVER else f"{self.kind}: {self.value}"


@dataclass
class Host:
    """One host as the transport and funnel need it, defaults already applied."""

    name: str
    address: str | None = None  # None: the name is the ssh target (~/.ssh/config alias applies)
    port: int | None = None
    user: str | None = None
    jump: str | None = None  # "user@host:port", an inventory host or an ssh alias (ProxyJump)
    # name -> path or glob (str) or a stream source (LogSource); the first is the default
    logs: dict[str, str | LogSource] = field(default_factory=dict)
    gpus: int | None = None
    region: str | None = None
    tags: list[str] = field(default_factory=list)
    # Normalised overrides: tail_lines int, scan_bytes int (bytes), run_start str (ERE),
    # stall_after float (s), timeout float (s).
    funnel: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    identity_file: str | None = None  # a client key for this host only (ansible_ssh_private_key_file)
    path_prepend: str | None = None  # remote dirs searched first for host tools (nvidia-smi, dmesg in odd places)

    @property
    def target(self) -> str:
        """What to hand ssh: the address, else the name (so ssh config aliases work)."""
        return self.address or self.name

    def log_source(self, name_or_path: str | None = None) -> tuple[str, LogSource]:
        """Resolve ``--log NAME|PATH`` to ``(log name, source)``.

        With no logs configured and no ``--log``, the source is ``discover``:
        the host finds its job's log itself (in the same round trip).
        """
        if not name_or_path and not self.logs:
            return DISCOVER, LogSource(DISCOVER)
        name, value = self._log_entry(name_or_path)
        return name, value if isinstance(value, LogSource) else LogSource("file", value)

    def file_globs(self) -> list[str]:
        """Every configured file log (paths and globs): where a dead job's log may be."""
        return [v for v in self.logs.values() if isinstance(v, str)]

    def log_path(self, name_or_path: str | None = None) -> tuple[str, str]:
        """``log_source`` for callers that need a file (``watch``): a stream source is an error here."""
        name, value = self._log_entry(name_or_path)
        if isinstance(value, LogSource):
            raise InventoryError(
                f"log '{name}' of host '{self.name}' is a {value.kind} stream ({value}), not a file",
                key=f"hosts.{self.name}.logs.{name}",
            )
        return name, value

    def _log_entry(self, name_or_path: str | None = None) -> tuple[str, str | LogSource]:
        """Resolve ``--log NAME|PATH`` to ``(log name, path)``.

        None picks the first configured log; a configured name its path; a
        value containing ``/``, ``*`` or ``?`` is taken as a literal path (its
        own name). Anything else is a typo and fails listing the known names,
        rather than probing a file that cannot exist.
        """
        key = f"hosts.{self.name}.logs"
        if not name_or_path:
            if not self.logs:
                raise InventoryError(
                    f"no logs configured for host '{self.name}': add 'logs:' to the inventory or pass --log PATH",
                    key=key,
                )
            name = next(iter(self.logs))
            return name, self.logs[name]
        if name_or_path in self.logs:
            return name_or_path, self.logs[name_or_path]
        if any(c in name_or_path for c in "/*?"):
            return name_or_path, name_or_path
        known = ", ".join(self.logs) if self.logs else "none"
        raise InventoryError(
            f"unknown log '{name_or_path}' for host '{self.name}'{did_you_mean(name_or_path, self.logs)}; "
            f"known logs: {known} (a path must contain '/')",
            key=key,
        )


@dataclass
class Inventory:
    """Hosts in file order (ranges expanded in order) and resolved groups."""

    path: Path | None
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group -> host names, file order; `all` is implicit, not listed
    warnings: list[str] = field(default_factory=list)  # keys read but not used (never silently dropped)
    persist: float | None = None  # defaults.persist: seconds connections are kept (None: the command's default)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    def __len__(self) -> int:
        return len(self.hosts)


# --------------------------------------------------------------------------- suggestions


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Close matches for a typo: the best ones only, so 'uk-nod' suggests 'uk-node' and not every '*-node'."""
    cands = list(dict.fromkeys(candidates))
    lower = {c.lower(): c for c in cands}
    if word.lower() in lower and lower[word.lower()] != word:
        return [lower[word.lower()]]
    sm = difflib.SequenceMatcher(b=word)
    scored = []
    for c in cands:
        sm.set_seq1(c)
        if sm.real_quick_ratio() >= 0.6 and sm.quick_ratio() >= 0.6:
            r = sm.ratio()
            if r >= 0.6:
                scored.append((r, c))
    if not scored:
        return []
    scored.sort(key=lambda rc: -rc[0])
    best = scored[0][0]
    return [c for r, c in scored[:n] if r >= best - 0.1]


def quote_list(items: Sequence[str]) -> str:
    q = [f"'{i}'" for i in items]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " or " + q[-1]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    m = close_matches(word, candidates)
    return f" (did you mean {quote_list(m)}?)" if m else ""
