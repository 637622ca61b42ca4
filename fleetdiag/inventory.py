"""The inventory: which hosts exist, how to reach them, where their logs are.

Loaded from ``inventory.yaml`` (native shape: ``defaults``/``hosts``/``groups``)
or from an Ansible YAML inventory, so teams need not keep two files. Both
become the same :class:`Inventory`.

A wrong inventory sends a fleet probe to the wrong place, so validation is
strict: unknown keys are errors (with a close-match suggestion), types are
checked, and every error names file, line and dotted key, e.g.
``inventory.yaml:12: hosts.gpu01.prot: unknown key 'prot' (did you mean 'port'?)``.
All errors of a file are collected (``InventoryError.errors``) so
``fleetdiag check`` can list them in one go.

Ranges (``gpu[01-16]``) are expanded and folded by ClusterShell's ``NodeSet``;
this module knows nothing of click, rich or SSH. See docs/inventory.md.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import platformdirs
import yaml
from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

__all__ = [
    "ENV_VAR",
    "Host",
    "Inventory",
    "InventoryError",
    "InventoryNotFound",
    "SelectorError",
    "find_inventory",
    "fold",
    "load_inventory",
    "parse_duration",
    "parse_inventory",
    "parse_size",
    "select",
    "split_selector",
    "user_inventory_path",
]

ENV_VAR = "FLEETDIAG_INVENTORY"
DEFAULT_NAME = "inventory.yaml"
TOP_KEYS = ("defaults", "hosts", "groups")
HOST_KEYS = ("address", "port", "user", "jump", "logs", "gpus", "region", "tags", "funnel")
FUNNEL_KEYS = ("tail_lines", "scan_bytes", "run_start", "stall_after", "timeout")
ALL = "all"
# A typo like gpu[1-1000000] must not eat the machine.
MAX_RANGE = 65536

# Host and group names: what a hostname or ssh alias looks like. Excludes the
# selector syntax (, ! & * ? [ ] @) so a name never reads as an operator, and
# a leading '-' so a name can never turn into an ssh option.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%+=~-]*")
_NO_SPACE_RE = re.compile(r"[^\s'\"`\\]+")


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


@dataclass
class Host:
    """One host as the transport and funnel need it, defaults already applied."""

    name: str
    address: str | None = None  # None: the name is the ssh target (~/.ssh/config alias applies)
    port: int | None = None
    user: str | None = None
    jump: str | None = None  # "user@host:port", an inventory host or an ssh alias (ProxyJump)
    logs: dict[str, str] = field(default_factory=dict)  # name -> path or glob; first is the default
    gpus: int | None = None
    region: str | None = None
    tags: list[str] = field(default_factory=list)
    # Normalised overrides: tail_lines int, scan_bytes int (bytes), run_start str (ERE),
    # stall_after float (s), timeout float (s).
    funnel: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        """What to hand ssh: the address, else the name (so ssh config aliases work)."""
        return self.address or self.name

    def log_path(self, name_or_path: str | None = None) -> tuple[str, str]:
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
            f"unknown log '{name_or_path}' for host '{self.name}'{_did_you_mean(name_or_path, self.logs)}; "
            f"known logs: {known} (a path must contain '/')",
            key=key,
        )


@dataclass
class Inventory:
    """Hosts in file order (ranges expanded in order) and resolved groups."""

    path: Path | None
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group -> host names, file order; `all` is implicit, not listed

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    def __len__(self) -> int:
        return len(self.hosts)


# --------------------------------------------------------------------------- sizes, durations

_SIZE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtp])(?:i?b)?|b)?", re.I)
_SIZE_MULT = {None: 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def parse_size(v: Any) -> int:
    """Bytes from ``64M``/``1G``/``512k``/``100`` or an int (K, M, G, T are powers of 1024).

    Raises ValueError (the loader turns it into a located InventoryError).
    """
    if isinstance(v, bool):
        raise ValueError(f"expected a size like 64M or a number of bytes, got {v!r}")
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"size must not be negative, got {v}")
        return v
    if isinstance(v, float) and math.isfinite(v) and v >= 0:
        return int(v)
    if isinstance(v, str):
        m = _SIZE_RE.fullmatch(v.strip())
        if m:
            unit = m.group(2).lower() if m.group(2) else None
            return int(float(m.group(1)) * _SIZE_MULT[unit])
    raise ValueError(f"expected a size like 64M, 1G or a number of bytes, got {v!r}")


from .units import parse_duration  # noqa: E402  (one owner of durations; re-exported here)


# --------------------------------------------------------------------------- ranges


def fold(names: Iterable[str]) -> str:
    """Fold host names into ClusterShell range syntax: gpu01,gpu02,gpu04 -> gpu[01-02,04]."""
    names = list(names)
    if not names:
        return ""
    try:
        return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))
    except NodeSetException:  # names from outside the inventory may not parse
        return ",".join(dict.fromkeys(names))


def _expand_range(pattern: str) -> list[str]:
    """Names a ``gpu[01-04]`` pattern stands for (ValueError if malformed or huge)."""
    try:
        ns = NodeSet(pattern, resolver=RESOLVER_NOGROUP)
    except NodeSetException as e:
        raise ValueError(f"bad range '{pattern}': {e}") from None
    if len(ns) > MAX_RANGE:
        raise ValueError(f"range '{pattern}' expands to {len(ns)} names (limit {MAX_RANGE})")
    return list(ns)


def split_selector(selector: str) -> list[str]:
    """Split ``a,b,gpu[01-02,05]`` on commas outside brackets; blanks dropped."""
    terms: list[str] = []
    depth = 0
    cur: list[str] = []
    for c in selector:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ']' in selector '{selector}'", term=selector)
        if c == "," and depth == 0:
            terms.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if depth:
        raise SelectorError(f"unbalanced '[' in selector '{selector}'", term=selector)
    terms.append("".join(cur).strip())
    return [t for t in terms if t]


# --------------------------------------------------------------------------- selection


class _NoMatch(Exception):
    def __init__(self, message: str, suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.suggestions = list(suggestions)


def _close(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
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


def _quote_list(items: Sequence[str]) -> str:
    q = [f"'{i}'" for i in items]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " or " + q[-1]


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    m = _close(word, candidates)
    return f" (did you mean {_quote_list(m)}?)" if m else ""


def _match(
    term: str,
    hosts: dict[str, int],
    group_of: Callable[[str], list[str] | None],
    group_names: Callable[[], Iterable[str]],
) -> list[str]:
    """Host names one positive term stands for: all, group, host, glob or range."""
    if term == ALL:
        return list(hosts)
    members = group_of(term)
    if members is not None:
        return list(members)
    if term in hosts:
        return [term]
    if "*" in term or "?" in term:
        found = [h for h in hosts if fnmatch.fnmatchcase(h, term)]
        if not found:
            raise _NoMatch(f"'{term}' matches no host")
        return found
    if "[" in term:
        try:
            names = _expand_range(term)
        except ValueError as e:
            raise _NoMatch(str(e)) from None
        out: list[str] = []
        missing: list[str] = []
        for n in names:
            g = group_of(n)
            if g is not None:
                out.extend(g)
            elif n in hosts:
                out.append(n)
            else:
                missing.append(n)
        if missing:
            raise _NoMatch(f"unknown host {fold(missing)} in range '{term}'")
        return out
    sugg = _close(term, [*hosts, *group_names(), ALL])
    msg = f"unknown host or group '{term}'"
    if sugg:
        msg += f"; did you mean {_quote_list(sugg)}?"
    raise _NoMatch(msg, sugg)


def _evaluate(
    terms: Iterable[tuple[str, Any]],
    hosts: dict[str, int],
    group_of: Callable[[str], list[str] | None],
    group_names: Callable[[], Iterable[str]],
    on_error: Callable[[str, Any, _NoMatch], None],
) -> list[str]:
    """Apply terms left to right: plain adds, ``!x`` removes, ``&x`` intersects.

    Like Ansible, a leading ``!``/``&`` term starts from ``all`` (so ``!gpu03``
    means every host but gpu03). The result is in file order.
    """
    chosen: set[str] = set()
    first = True
    for term, ctx in terms:
        op = term[0] if term[0] in "!&" else ""
        body = term[len(op):].strip()
        if first and op:
            chosen = set(hosts)
        first = False
        if not body:
            on_error(term, ctx, _NoMatch(f"empty term after '{op}'"))
            continue
        try:
            found = set(_match(body, hosts, group_of, group_names))
        except _NoMatch as e:
            on_error(body, ctx, e)
            continue
        if op == "!":
            chosen -= found
        elif op == "&":
            chosen &= found
        else:
            chosen |= found
    return sorted(chosen, key=hosts.__getitem__)


def select(inv: Inventory, selectors: Sequence[str]) -> list[Host]:
    """Hosts the selectors name, deduplicated, in file order.

    Each selector may hold several comma-separated terms (commas inside
    ``[...]`` belong to a range). Terms are applied left to right across all
    selectors. A term that names nothing raises SelectorError with close
    matches: a typo must never silently shrink (or, after ``!``, grow) the set.
    """
    if isinstance(selectors, str):
        selectors = [selectors]
    terms: list[tuple[str, None]] = []
    for sel in selectors:
        parts = split_selector(sel)
        if not parts:
            raise SelectorError("empty selector", term=sel)
        terms.extend((p, None) for p in parts)
    order = {name: i for i, name in enumerate(inv.hosts)}

    def fail(term: str, _ctx: Any, e: _NoMatch) -> None:
        raise SelectorError(e.message, term=term, suggestions=e.suggestions)

    names = _evaluate(terms, order, inv.groups.get, lambda: inv.groups, fail)
    return [inv.hosts[n] for n in names]


# --------------------------------------------------------------------------- finding the file


def user_inventory_path() -> Path:
    """The per-user inventory (``~/.config/fleetdiag/inventory.yaml`` on Linux)."""
    return platformdirs.user_config_path("fleetdiag") / DEFAULT_NAME


def find_inventory(explicit: str | None = None) -> Path:
    """Locate the inventory: -i PATH, else $FLEETDIAG_INVENTORY, else ./inventory.yaml, else the user config.

    An explicit path or the variable, when given, must exist: silently
    falling back to another fleet's file would probe the wrong machines.
    """
    if explicit:
        return _must_exist(Path(explicit).expanduser(), "given with -i/--inventory")
    env = os.environ.get(ENV_VAR)
    if env:
        return _must_exist(Path(env).expanduser(), f"from ${ENV_VAR}")
    local = Path(DEFAULT_NAME)
    if local.is_file():
        return local
    user = user_inventory_path()
    if user.is_file():
        return user
    looked = [
        "-i/--inventory (not given)",
        f"${ENV_VAR} (not set)",
        f"./{DEFAULT_NAME} ({Path.cwd() / DEFAULT_NAME})",
        str(user),
    ]
    raise InventoryNotFound(
        "no inventory found; looked at: " + "; ".join(looked)
        + ". Create one (see docs/inventory.md) or pass -i PATH",
        looked=looked,
    )


def _must_exist(p: Path, how: str) -> Path:
    if p.is_file():
        return p
    why = "is not a file" if p.exists() else "does not exist"
    raise InventoryNotFound(f"inventory {p} ({how}) {why}", looked=[f"{p} ({how})"])


def load_inventory(path: Path | str) -> Inventory:
    """Read and validate an inventory file (native or Ansible YAML)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None
    except OSError as e:
        raise InventoryError(f"cannot read inventory: {e.strerror or e}", path=str(path)) from None
    inv = parse_inventory(text, str(path))
    inv.path = Path(path)
    return inv


def parse_inventory(text: str, path: str = "<string>") -> Inventory:
    """Validate inventory text; ``path`` is only used to name the file in errors."""
    return _Parser(path).parse(text)


# --------------------------------------------------------------------------- YAML with line numbers


class _Map(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers where each key is, for located errors."""

    def __init__(self) -> None:
        super().__init__()
        self.line = 1
        self.lines: dict[Any, int] = {}
        self.dups: list[tuple[Any, int, int]] = []  # (key, line, first line)


class _Seq(list):  # type: ignore[type-arg]
    """A YAML sequence that remembers the line of each item."""

    def __init__(self) -> None:
        super().__init__()
        self.line = 1
        self.lines: list[int] = []


class _Loader(yaml.SafeLoader):
    """SafeLoader that builds _Map/_Seq and records duplicate keys instead of dropping them."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[_Map]:
    data = _Map()
    data.line = node.start_mark.line + 1
    yield data
    own = {id(k) for k, _ in node.value if k.tag != _MERGE_TAG}
    loader.flatten_mapping(node)  # `<<: *anchor` keys come first, own keys override them
    first: dict[Any, int] = {}
    for knode, vnode in node.value:
        key = loader.construct_object(knode, deep=False)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found unhashable key", knode.start_mark
            ) from None
        line = knode.start_mark.line + 1
        if id(knode) in own:
            if key in first:
                data.dups.append((key, line, first[key]))
            else:
                first[key] = line
        data[key] = loader.construct_object(vnode, deep=False)
        data.lines[key] = line


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> Iterator[_Seq]:
    data = _Seq()
    data.line = node.start_mark.line + 1
    data.lines = [n.start_mark.line + 1 for n in node.value]
    yield data
    data.extend(loader.construct_object(n, deep=False) for n in node.value)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


# --------------------------------------------------------------------------- validation

_BAD = object()  # a value that failed validation (the error is already recorded)
_ANSIBLE_ALIASES = {
    "ansible_host": "address",
    "ansible_ssh_host": "address",
    "ansible_port": "port",
    "ansible_ssh_port": "port",
    "ansible_user": "user",
    "ansible_ssh_user": "user",
}
_ANSIBLE_PLAIN = ("logs", "gpus", "region", "tags", "funnel", "jump")
_ANSIBLE_GROUP_KEYS = ("hosts", "children", "vars")
_ANSIBLE_RANGE = re.compile(r"\[([^\]:]*):([^\]:]*)(?::([^\]:]*))?\]")
_PYTHON_ONLY_RE = re.compile(r"\\[dD]|\(\?|[*+?}]\?")


def _describe(v: Any) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, (int, float)):
        return f"{v} (a number)"
    if isinstance(v, str):
        return f"'{v}' (a string)"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return type(v).__name__


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Layer ``over`` on ``base``: scalars replace, ``logs``/``funnel`` merge key-wise,
    ``tags`` extend; an explicit null clears the inherited value (or log entry)."""
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out[k] = None
        elif k == "logs":
            logs = dict(out.get("logs") or {})
            for name, p in v.items():
                if p is None:
                    logs.pop(name, None)
                else:
                    logs[name] = p
            out[k] = logs
        elif k == "funnel":
            fun = dict(out.get("funnel") or {})
            for fk, fv in v.items():
                if fv is None:
                    fun.pop(fk, None)
                else:
                    fun[fk] = fv
            out[k] = fun
        elif k == "tags":
            out[k] = list(dict.fromkeys([*(out.get("tags") or []), *v]))
        else:
            out[k] = v
    return out


def _make_host(name: str, s: dict[str, Any]) -> Host:
    return Host(
        name=name,
        address=s.get("address"),
        port=s.get("port"),
        user=s.get("user"),
        jump=s.get("jump"),
        logs={k: v for k, v in (s.get("logs") or {}).items() if v is not None},
        gpus=s.get("gpus"),
        region=s.get("region"),
        tags=list(s.get("tags") or []),
        funnel={k: v for k, v in (s.get("funnel") or {}).items() if v is not None},
    )


def _jump_names(jump: str) -> list[str]:
    """Host parts of a ProxyJump spec ``[user@]host[:port][,...]``."""
    out = []
    for hop in jump.split(","):
        h = hop.strip().rsplit("@", 1)[-1]
        m = re.fullmatch(r"\[([^\]]+)\](?::\d+)?", h) or re.fullmatch(r"([^:]+):\d+", h)
        out.append(m.group(1) if m else h)
    return out


def _ansible_jump(args: str) -> str | None:
    """The ProxyJump in ``ansible_ssh_common_args`` (``-J x`` or ``-o ProxyJump=x``)."""
    try:
        toks = shlex.split(args)
    except ValueError:
        return None
    for i, t in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if t == "-J" and nxt:
            return nxt
        if t.startswith("-J") and len(t) > 2:
            return t[2:]
        opt = nxt if t == "-o" else t[2:] if t.startswith("-o") else None
        if opt:
            m = re.fullmatch(r"(?i)proxyjump\s*[=\s]\s*(\S+)", opt.strip())
            if m:
                return m.group(1)
    return None


Entry = tuple[str, str, int, Any]  # (field, dotted key, line, value)


class _Parser:
    """One validation pass over one file; collects every error it can locate."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[InventoryError] = []
        self.hosts: dict[str, Host] = {}
        self.origin: dict[str, tuple[str, int]] = {}  # host -> (key that defined it, line)

    # -- plumbing

    def err(self, line: int | None, key: str | None, message: str) -> None:
        self.errors.append(InventoryError(message, path=self.path, line=line, key=key))

    def mapping(self, value: Any, key: str, line: int, *, null_ok: bool = True) -> _Map | None:
        """``value`` as a mapping (null → empty), reporting duplicate keys inside it."""
        if value is None and null_ok:
            m = _Map()
            m.line = line
            return m
        if not isinstance(value, _Map):
            self.err(line, key, f"expected a mapping, got {_describe(value)}")
            return None
        for k, ln, first in value.dups:
            self.err(ln, f"{key}.{k}", f"duplicate key (first defined at line {first})")
        return value

    def str_key(self, k: Any, key: str, line: int) -> str | None:
        if isinstance(k, str):
            return k
        if isinstance(k, int) and not isinstance(k, bool):
            return str(k)
        self.err(line, key, f"keys must be strings, got {_describe(k)}")
        return None

    def unknown_key(self, k: str, allowed: Sequence[str], key: str, line: int) -> None:
        hint = _did_you_mean(k, allowed) or f" (allowed: {', '.join(allowed)})"
        self.err(line, key, f"unknown key '{k}'{hint}")

    def name_ok(self, name: str, key: str, line: int, what: str) -> bool:
        if _NAME_RE.fullmatch(name):
            return True
        self.err(
            line, key,
            f"invalid {what} name '{name}': use letters, digits and . _ - : (not starting with '-'; "
            "no spaces, commas or ! & * ? @)",
        )
        return False

    def expand(self, pattern: str, key: str, line: int) -> list[str]:
        """Host names a host key stands for (``gpu[01-04]`` → 4 names)."""
        if "[" in pattern or "]" in pattern:
            outside = re.sub(r"\[[^\]]*\]", "", pattern)
            if any(c in outside for c in ",!&^*?@[] "):
                # NodeSet would read these as set operators; a host key is one range.
                self.err(line, key, f"invalid host range '{pattern}': one name or one range like gpu[01-04]")
                return []
            try:
                names = _expand_range(pattern)
            except ValueError as e:
                self.err(line, key, str(e))
                return []
        else:
            names = [pattern]
        return [n for n in names if self.name_ok(n, key, line, "host")]

    # -- top level

    def parse(self, text: str) -> Inventory:
        data = self.load_yaml(text)
        groups: dict[str, list[str]] = {}
        if data is not None:
            if isinstance(data, _Map) and self._is_ansible(data):
                groups = self.parse_ansible(data)
            else:
                groups = self.parse_native(data)
            if not self.errors:
                for g, members in groups.items():
                    for h in members:
                        self.hosts[h].groups.append(g)
                self.check_jumps()
        if self.errors:
            errs = sorted(self.errors, key=lambda e: (e.line is None, e.line or 0))
            first = errs[0]
            first.errors = errs
            raise first
        return Inventory(path=None if self.path == "<string>" else Path(self.path), hosts=self.hosts, groups=groups)

    def load_yaml(self, text: str) -> Any:
        try:
            data = yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            msg = f"invalid YAML: {e.problem or e.context or 'syntax error'}"
            if mark is not None:
                msg += f" (column {mark.column + 1})"
            if e.context and e.problem:
                msg += f", {e.context}"
                if e.context_mark is not None and mark is not None and e.context_mark.line != mark.line:
                    msg += f" at line {e.context_mark.line + 1}"
            if e.problem and "tag '!" in e.problem:
                msg += "; YAML reads a leading '!' as a tag: quote exclusions, e.g. \"!cn-node\""
            self.err(mark.line + 1 if mark is not None else None, None, msg)
            return None
        except yaml.YAMLError as e:
            self.err(None, None, f"invalid YAML: {e}")
            return None
        if data is None:
            self.err(
                1, None,
                "the inventory is empty: expected 'hosts:' (with optional 'defaults:' and 'groups:') "
                "or an Ansible inventory starting with 'all:'; see docs/inventory.md",
            )
        return data

    @staticmethod
    def _is_ansible(data: _Map) -> bool:
        body = data.get(ALL)
        return isinstance(body, _Map) and any(k in body for k in _ANSIBLE_GROUP_KEYS)

    # -- native shape

    def parse_native(self, data: Any) -> dict[str, list[str]]:
        if not isinstance(data, _Map):
            line = getattr(data, "line", 1)
            self.err(line, None, f"expected a mapping with 'hosts:' at the top level, got {_describe(data)}")
            return {}
        for k in data:
            if k not in TOP_KEYS:
                line = data.lines[k]
                if k == ALL:
                    self.err(line, str(k), "unknown key 'all': an Ansible inventory's 'all:' needs 'hosts:', "
                                           "'children:' or 'vars:'; in this format 'all' is implicit")
                else:
                    self.unknown_key(str(k), TOP_KEYS, str(k), line)
        for k, ln, first in data.dups:
            self.err(ln, str(k), f"duplicate key (first defined at line {first})")

        defaults: dict[str, Any] = {}
        if "defaults" in data:
            dm = self.mapping(data["defaults"], "defaults", data.lines["defaults"])
            if dm is not None:
                defaults = self.native_settings(dm, "defaults")

        if "hosts" not in data:
            self.err(data.line, "hosts", "missing 'hosts:': an inventory needs at least one host")
        else:
            hline = data.lines["hosts"]
            hm = self.mapping(data["hosts"], "hosts", hline)
            if hm is not None:
                if not hm:
                    self.err(hline, "hosts", "no hosts defined")
                for hk in hm:
                    line = hm.lines[hk]
                    name = self.str_key(hk, f"hosts.{hk}", line)
                    if name is None:
                        continue
                    key = f"hosts.{name}"
                    body = self.mapping(hm[hk], key, line)
                    s = self.native_settings(body, key) if body is not None else {}
                    self.add_hosts(name, self.expand(name, key, line), _merge(defaults, s), line)

        raw: dict[str, tuple[int, list[tuple[str, int]], str]] = {}
        if "groups" in data:
            gm = self.mapping(data["groups"], "groups", data.lines["groups"])
            for gk in gm or {}:
                line = gm.lines[gk]  # type: ignore[union-attr]
                g = self.str_key(gk, f"groups.{gk}", line)
                if g is None or not self.group_name_ok(g, f"groups.{g}", line):
                    continue
                raw[g] = (line, self.members(gm[gk], f"groups.{g}", line), f"groups.{g}")  # type: ignore[index]
        return self.resolve_groups(raw)

    def native_settings(self, m: _Map, key: str) -> dict[str, Any]:
        entries: list[Entry] = []
        for k in m:
            line = m.lines[k]
            if k not in HOST_KEYS:
                self.unknown_key(str(k), HOST_KEYS, f"{key}.{k}", line)
                continue
            entries.append((k, f"{key}.{k}", line, m[k]))
        return self.settings(entries)

    def add_hosts(self, key: str, names: list[str], settings: dict[str, Any], line: int) -> None:
        for n in names:
            if n in self.hosts:
                other, oline = self.origin[n]
                by = "" if other == n else f" by '{other}'"
                self.err(line, f"hosts.{key}", f"duplicate host '{n}' (already defined{by} at line {oline})")
                continue
            self.hosts[n] = _make_host(n, settings)
            self.origin[n] = (key, line)

    def group_name_ok(self, g: str, key: str, line: int) -> bool:
        if g == ALL:
            self.err(line, key, "'all' is reserved: it always means every host")
            return False
        if not self.name_ok(g, key, line, "group"):
            return False
        if g in self.hosts:
            self.err(line, key, f"group '{g}' has the same name as a host; rename one so selectors are unambiguous")
            return False
        return True

    def members(self, value: Any, key: str, line: int) -> list[tuple[str, int]]:
        """A group's member terms with their lines (a single string is one term)."""
        if value is None:
            return []
        if isinstance(value, str):
            return [(value, line)]
        if not isinstance(value, _Seq):
            self.err(line, key, f"expected a list of host names, ranges or groups, got {_describe(value)}")
            return []
        out = []
        for i, (item, ln) in enumerate(zip(value, value.lines)):
            if isinstance(item, str) and item.strip():
                out.append((item, ln))
            else:
                self.err(ln, f"{key}[{i}]", f"expected a host name, range or group, got {_describe(item)}")
        return out

    def resolve_groups(self, raw: dict[str, tuple[int, list[tuple[str, int]], str]]) -> dict[str, list[str]]:
        """Resolve nested groups (a member may name a group defined anywhere); cycles are errors.

        ``raw`` maps group -> (line, [(member term, line)], dotted key for errors).
        """
        order = {name: i for i, name in enumerate(self.hosts)}
        resolved: dict[str, list[str]] = {}
        stack: list[str] = []

        class Cycle(Exception):
            pass

        def group_of(name: str) -> list[str] | None:
            return resolve(name) if name in raw else None

        def resolve(g: str) -> list[str]:
            if g in resolved:
                return resolved[g]
            if g in stack:
                cyc = stack[stack.index(g):] + [g]
                self.err(raw[cyc[0]][0], raw[cyc[0]][2], "group cycle: " + " -> ".join(cyc))
                for c in cyc:
                    resolved[c] = []
                raise Cycle
            stack.append(g)
            try:
                terms = []
                for term, ln in raw[g][1]:
                    try:
                        terms.extend((t, ln) for t in split_selector(term))
                    except SelectorError as e:
                        self.err(ln, raw[g][2], e.message)

                def bad(term: str, ln: int, e: _NoMatch) -> None:
                    self.err(ln, raw[g][2], e.message)

                result = _evaluate(terms, order, group_of, lambda: raw, bad)
            finally:
                stack.pop()
            resolved.setdefault(g, result)
            return resolved[g]

        for g in raw:
            try:
                resolve(g)
            except Cycle:
                pass
        return {g: resolved.get(g, []) for g in raw}

    def check_jumps(self) -> None:
        """A host must not jump through itself (easy to get via ``defaults.jump``) or a jump cycle."""
        graph = {h.name: [n for n in _jump_names(h.jump) if n in self.hosts] for h in self.hosts.values() if h.jump}
        for name, via in graph.items():
            if name in via:
                key, line = self.origin[name]
                self.err(line, f"hosts.{key}.jump",
                         f"host '{name}' would jump through itself (inherited from defaults? set 'jump: null' on it)")
        seen: set[str] = set()
        for start in graph:
            path: list[str] = []
            cur: str | None = start
            while cur is not None and cur in graph and cur not in path and cur not in seen:
                path.append(cur)
                nxt = [n for n in graph[cur] if n != cur]
                cur = nxt[0] if nxt else None
            if cur is not None and cur in path:
                cyc = path[path.index(cur):] + [cur]
                key, line = self.origin[cyc[0]]
                self.err(line, f"hosts.{key}.jump", "jump cycle: " + " -> ".join(cyc))
            seen.update(path)

    # -- settings (shared by both shapes)

    def settings(self, entries: Iterable[Entry]) -> dict[str, Any]:
        """Validate and normalise host settings; None values mean 'clear the inherited value'."""
        out: dict[str, Any] = {}
        for fld, key, line, value in entries:
            if value is None:
                out[fld] = None
                continue
            v = getattr(self, f"v_{fld}")(value, key, line)
            if v is not _BAD:
                out[fld] = v
        return out

    def _word(self, v: Any, key: str, line: int, what: str) -> Any:
        if not isinstance(v, str) or not _NO_SPACE_RE.fullmatch(v) or v.startswith("-"):
            self.err(line, key, f"expected {what} (no spaces or quotes, not starting with '-'), got {_describe(v)}")
            return _BAD
        return v

    def v_address(self, v: Any, key: str, line: int) -> Any:
        v = self._word(v, key, line, "a host name or IP address")
        if v is _BAD:
            return v
        if "@" in v:
            self.err(line, key, f"address '{v}' contains a user: put it in 'user:'")
            return _BAD
        if re.fullmatch(r"[^:\[\]]+:\d+", v):
            self.err(line, key, f"address '{v}' contains a port: put it in 'port:'")
            return _BAD
        return v

    def v_port(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            self.err(line, key, f"expected a port number 1-65535, got {_describe(v)}")
            return _BAD
        return v

    def v_user(self, v: Any, key: str, line: int) -> Any:
        v = self._word(v, key, line, "a user name")
        if v is not _BAD and "@" in v:
            self.err(line, key, f"user '{v}' contains '@': put the host in 'address:'")
            return _BAD
        return v

    def v_jump(self, v: Any, key: str, line: int) -> Any:
        return self._word(v, key, line, "a jump host like user@bastion:22, an inventory host or an ssh alias")

    def v_gpus(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            self.err(line, key, f"expected a GPU count (an integer >= 0), got {_describe(v)}")
            return _BAD
        return v

    def v_region(self, v: Any, key: str, line: int) -> Any:
        if not isinstance(v, str) or not v.strip():
            self.err(line, key, f"expected a string (quote numbers), got {_describe(v)}")
            return _BAD
        return v

    def v_tags(self, v: Any, key: str, line: int) -> Any:
        if not isinstance(v, _Seq):
            self.err(line, key, f"expected a list of strings, e.g. [h100, prod], got {_describe(v)}")
            return _BAD
        ok = True
        for i, (t, ln) in enumerate(zip(v, v.lines)):
            if not isinstance(t, str) or not t.strip():
                self.err(ln, f"{key}[{i}]", f"expected a string tag (quote numbers), got {_describe(t)}")
                ok = False
        return list(dict.fromkeys(v)) if ok else _BAD

    def v_logs(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, str):  # `logs: /path/x.log` is shorthand for one log named "default"
            return {"default": v} if self._path_ok(v, key, line) else _BAD
        m = self.mapping(v, key, line, null_ok=False)
        if m is None:
            return _BAD
        out: dict[str, str | None] = {}
        for k in m:
            ln = m.lines[k]
            name = self.str_key(k, f"{key}.{k}", ln)
            if name is None:
                continue
            p = m[k]
            if p is None:
                out[name] = None  # drops a log inherited from defaults
            elif isinstance(p, str) and self._path_ok(p, f"{key}.{name}", ln):
                out[name] = p
            elif not isinstance(p, str):
                self.err(ln, f"{key}.{name}", f"expected a log path or glob, got {_describe(p)}")
        return out

    def _path_ok(self, p: str, key: str, line: int) -> bool:
        if not p.strip() or "\0" in p:  # newlines are legal in file names and are quoted like any byte
            self.err(line, key, f"expected a log path or glob, got {_describe(p)}")
            return False
        return True

    def v_funnel(self, v: Any, key: str, line: int) -> Any:
        m = self.mapping(v, key, line, null_ok=False)
        if m is None:
            return _BAD
        out: dict[str, Any] = {}
        for k in m:
            ln, fk, val = m.lines[k], f"{key}.{k}", m[k]
            if k not in FUNNEL_KEYS:
                self.unknown_key(str(k), FUNNEL_KEYS, fk, ln)
                continue
            if val is None:
                out[k] = None
                continue
            try:
                out[k] = self._funnel_value(k, val)
            except ValueError as e:
                self.err(ln, fk, str(e))
        return out

    @staticmethod
    def _funnel_value(k: str, val: Any) -> Any:
        if k == "tail_lines":
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"expected a number of lines >= 1, got {_describe(val)}")
            return val
        if k == "scan_bytes":
            n = parse_size(val)
            if n <= 0:
                raise ValueError("expected a size > 0, e.g. 64M")
            return n
        if k == "run_start":
            if not isinstance(val, str) or not val.strip():
                raise ValueError(f"expected a regular expression (POSIX ERE), got {_describe(val)}")
            if _PYTHON_ONLY_RE.search(val):
                raise ValueError(
                    "run_start runs under grep -E on the host: use POSIX ERE "
                    "([0-9] not \\d; no (?...) groups or lazy *? +?)"
                )
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    re.compile(val)
            except re.error as e:
                raise ValueError(f"invalid regular expression: {e}") from None
            return val
        secs = parse_duration(val)  # stall_after, timeout
        if secs <= 0:
            raise ValueError("expected a duration > 0, e.g. 90s or 10m")
        return secs

    # -- Ansible shape

    def parse_ansible(self, data: _Map) -> dict[str, list[str]]:
        """Ansible YAML inventory: every top-level key is a group (``all`` the root).

        Variables layer like Ansible's: ``all.vars`` < group vars (parents before
        children, then by name) < host vars. Only ansible_host/port/user (and
        their ansible_ssh_* aliases), a ProxyJump in ansible_ssh_common_args,
        fleetdiag_* vars and plain logs/gpus/region/tags/funnel/jump vars are
        read; other vars belong to Ansible and are ignored.
        """
        self.a_groups: dict[str, dict[str, Any]] = {}
        self.a_host_vars: dict[str, list[dict[str, Any]]] = {}
        self.a_visiting: set[int] = set()
        for k, ln, first in data.dups:
            self.err(ln, str(k), f"duplicate key (first defined at line {first})")
        for gk in data:
            ln = data.lines[gk]
            g = self.str_key(gk, str(gk), ln)
            if g is not None:
                self.a_group(g, data[gk], g, ln, None)
        if not self.hosts and not self.errors:  # after a typo like `host:` this would only be noise
            self.err(data.line, ALL, "no hosts defined")

        raw: dict[str, tuple[int, list[tuple[str, int]], str]] = {}
        for g, gd in self.a_groups.items():
            if g == ALL:
                continue
            if g in self.hosts:
                self.err(gd["line"], gd["key"], f"group '{g}' has the same name as a host; rename one so selectors are unambiguous")
                continue
            raw[g] = (gd["line"], [(m, ln) for m, ln in gd["members"] if m != g], gd["key"])
        resolved = self.resolve_groups(raw)

        depth: dict[str, int] = {}

        def depth_of(g: str, seen: frozenset[str] = frozenset()) -> int:
            if g not in depth:
                parents = [p for p in self.a_groups[g]["parents"] if p not in seen and p != g]
                depth[g] = 1 + max((depth_of(p, seen | {g}) for p in parents), default=0)
            return depth[g]

        member_of: dict[str, list[str]] = {h: [] for h in self.hosts}
        for g, names in resolved.items():
            for h in names:
                member_of[h].append(g)
        base = self.a_vars_of(ALL)
        for h in self.hosts:
            s = dict(base)
            for g in sorted(member_of[h], key=lambda g: (depth_of(g), g)):
                s = _merge(s, self.a_vars_of(g))
            for chunk in self.a_host_vars.get(h, []):
                s = _merge(s, chunk)
            host = _make_host(h, s)
            self.hosts[h] = host
        return resolved

    def a_vars_of(self, g: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for chunk in self.a_groups.get(g, {}).get("vars", []):
            out = _merge(out, chunk)
        return out

    def a_group(self, name: str, body: Any, key: str, line: int, parent: str | None) -> None:
        if not self.name_ok(name, key, line, "group"):
            return
        gd = self.a_groups.setdefault(name, {"line": line, "key": key, "members": [], "parents": [], "vars": []})
        if parent is not None and parent not in gd["parents"]:
            gd["parents"].append(parent)
        if parent is not None and parent != ALL:
            self.a_groups[parent]["members"].append((name, line))
        if parent is None and name != ALL:
            gd["parents"].append(ALL)
        m = self.mapping(body, key, line)
        if m is None or id(m) in self.a_visiting:
            return
        self.a_visiting.add(id(m))
        for k in m:
            if k not in _ANSIBLE_GROUP_KEYS:
                self.unknown_key(str(k), _ANSIBLE_GROUP_KEYS, f"{key}.{k}", m.lines[k])
        if "vars" in m:
            vm = self.mapping(m["vars"], f"{key}.vars", m.lines["vars"])
            if vm is not None:
                gd["vars"].append(self.a_settings(vm, f"{key}.vars"))
        if "hosts" in m:
            hm = self.mapping(m["hosts"], f"{key}.hosts", m.lines["hosts"])
            for hk in hm or {}:
                ln = hm.lines[hk]  # type: ignore[union-attr]
                hname = self.str_key(hk, f"{key}.hosts.{hk}", ln)
                if hname is None:
                    continue
                self.a_host(hname, hm[hk], f"{key}.hosts.{hname}", ln, gd)  # type: ignore[index]
        if "children" in m:
            cm = self.mapping(m["children"], f"{key}.children", m.lines["children"])
            for ck in cm or {}:
                ln = cm.lines[ck]  # type: ignore[union-attr]
                c = self.str_key(ck, f"{key}.children.{ck}", ln)
                if c is None:
                    continue
                if c == ALL:
                    self.err(ln, f"{key}.children.{c}", "'all' cannot be a child group")
                    continue
                self.a_group(c, cm[ck], f"{key}.children.{c}", ln, name)  # type: ignore[index]
        self.a_visiting.discard(id(m))

    def a_host(self, pattern: str, body: Any, key: str, line: int, gd: dict[str, Any]) -> None:
        port = None
        try:
            pattern = self.a_range(pattern)
        except ValueError as e:
            self.err(line, key, str(e))
            return
        hp = re.fullmatch(r"([^:\[\]]+(?:\[[^\]]*\][^:\[\]]*)*):(\d+)", pattern)
        if hp:  # Ansible's `host:port` shorthand
            pattern, port = hp.group(1), int(hp.group(2))
        names = self.expand(pattern, key, line)
        m = self.mapping(body, key, line)
        chunk = self.a_settings(m, key) if m is not None else {}
        if port is not None and "port" not in chunk:
            chunk = {"port": port, **chunk}
        for n in names:
            if n not in self.hosts:
                self.hosts[n] = Host(name=n)  # placeholder; settings are layered at the end
                self.origin[n] = (n, line)
            self.a_host_vars.setdefault(n, []).append(chunk)
            gd["members"].append((n, line))

    @staticmethod
    def a_range(pattern: str) -> str:
        """Ansible ``www[01:50]``/``[0:50:2]`` → ClusterShell ``www[01-50]``/``[0-50/2]``."""

        def conv(m: re.Match[str]) -> str:
            lo, hi, step = m.group(1), m.group(2), m.group(3)
            if not (lo.isdigit() and hi.isdigit() and (step is None or step.isdigit())):
                raise ValueError(f"only numeric host ranges are supported, got '{m.group(0)}'")
            return f"[{lo}-{hi}{'/' + step if step else ''}]"

        return _ANSIBLE_RANGE.sub(conv, pattern)

    def a_settings(self, m: _Map, key: str) -> dict[str, Any]:
        """Our settings from Ansible vars; fleetdiag_* beats ansible_* beats plain names."""
        best: dict[str, tuple[int, Entry]] = {}
        allowed = [f"fleetdiag_{k}" for k in HOST_KEYS]
        for k in m:
            if not isinstance(k, str):
                continue
            ln, dotted, val = m.lines[k], f"{key}.{k}", m[k]
            if k.startswith("fleetdiag_"):
                fld, prio = k[len("fleetdiag_"):], 4
                if fld not in HOST_KEYS:
                    self.unknown_key(k, allowed, dotted, ln)
                    continue
            elif k in _ANSIBLE_ALIASES:
                fld, prio = _ANSIBLE_ALIASES[k], 3 if k.count("_") == 1 else 2
            elif k in _ANSIBLE_PLAIN:
                fld, prio = k, 1
            elif k in ("ansible_ssh_common_args", "ansible_ssh_extra_args") and isinstance(val, str):
                j = _ansible_jump(val)
                if j is None:
                    continue
                fld, prio, val = "jump", 0, j
            else:
                continue
            if fld not in best or prio > best[fld][0]:
                best[fld] = (prio, (fld, dotted, ln, val))
        return self.settings(e for _, e in best.values())
