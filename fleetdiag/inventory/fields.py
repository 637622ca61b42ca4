"""Per-key validation shared by both file shapes, and the rules for values that reach ssh.

Host, address, user and jump values reach ssh and, through a user's
``ProxyCommand`` (``%h``, ``%r``), a local shell. Like OpenSSH (ssh.c:
valid_hostname, valid_ruser) only what a host name, an IPv4/[IPv6] address or
a user name can be is accepted, control and invisible characters are refused
in every key and string of the file, and the environment is never expanded.
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..ssh.reach import JumpHop, parse_jump_chain
from ..units import parse_duration
from .model import FUNNEL_KEYS, SOURCE_KINDS, Host, Inventory, InventoryError, LogSource, did_you_mean
from .selection import SelectorError, _evaluate, _expand_range, _NoMatch, split_selector
from .yamlload import Loader, YMap, YSeq

# Host and group names: what a hostname or ssh alias looks like. Excludes the
# selector syntax (, ! & * ? [ ] @) so a name never reads as an operator, and
# a leading '-' so a name can never turn into an ssh option.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%+=~-]*")

MAX_HOST_LEN = 253
MAX_USER_LEN = 64
# DNS names and ssh aliases (letters, digits, '.', '-', '_'); never a leading '-' or '.'.
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*)")
# POSIX portable user names ('.', '_', '-' inside); never a leading '-'.
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_ZONE_RE = re.compile(r"[A-Za-z0-9_.-]+")
# Cc control characters (NUL, ESC, newline, DEL, C1), Cf format characters (bidi
# overrides like U+202E, zero-width joiners), Zl/Zp separators and lone surrogates.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs"}
_LOG_PATH_CHARS = "\n\t"  # legal in file names; log paths reach the host as data


def hidden_char(s: str, allow: str = "") -> str | None:
    """The first control, format or separator character in ``s`` not in ``allow`` (None if there is none)."""
    for c in s:
        if unicodedata.category(c) in _HIDDEN_CATEGORIES and c not in allow:
            return c
    return None


def visible(s: str) -> str:
    """``s`` with every control/format character spelled out (``\\x1b``, ``\\u202e``), for messages."""
    out = []
    for c in s:
        if unicodedata.category(c) in _HIDDEN_CATEGORIES or c == "\\":
            o = ord(c)
            out.append(
                "\\\\" if c == "\\" else f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"
            )
        else:
            out.append(c)
    return "".join(out)


def _hidden_reason(s: str, allow: str = "") -> str | None:
    c = hidden_char(s, allow)
    if c is None:
        return None
    name = unicodedata.name(c, "") or "control character"
    return f"contains a control or invisible character {visible(c)} ({name})"


def _argument_problem(v: str) -> str | None:
    """What makes ``v`` no ssh argument at all: a hidden character, nothing, or a leading '-'."""
    r = _hidden_reason(v)
    if r:
        return r
    if not v:
        return "is empty"
    if v.startswith("-"):
        return "starts with '-' (ssh would read it as an option)"
    return None


def host_problem(v: str) -> str | None:
    """Why ``v`` is not a host name, IPv4 address, IPv6 address or ``[IPv6]`` (None when it is)."""
    r = _argument_problem(v)
    if r:
        return r
    inner = v[1:-1] if v.startswith("[") and v.endswith("]") else v
    if ":" in inner:
        addr, _, zone = inner.partition("%")
        try:
            ipaddress.IPv6Address(addr)
        except ValueError:
            return "is not a valid IPv6 address"
        if zone and not _ZONE_RE.fullmatch(zone):
            return "has an IPv6 zone with characters other than letters, digits and . _ -"
        return None
    if inner is not v:
        return "has brackets around something that is not an IPv6 address"
    if len(v) > MAX_HOST_LEN:
        return f"is longer than {MAX_HOST_LEN} characters"
    if not _HOSTNAME_RE.fullmatch(v):
        return _charset_problem(v, "a leading dot")
    return None


_UNIT_RE = re.compile(r"[A-Za-z0-9:_.@\\-]+")
_CONTAINER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def source_problem(kind: str, v: str) -> str | None:
    """Why a ``journal``/``docker``/``command`` value is refused, or None. These values reach the
    host only as quoted data; a unit or container name still must not look like an option."""
    if "\0" in v:
        return "contains a NUL byte"
    if kind == "journal":
        if v.startswith("-") or not _UNIT_RE.fullmatch(v) or len(v) > 256:
            return f"'{visible(v)}' is not a systemd unit name (letters, digits, ':_.@-\\'; no leading '-')"
    elif kind == "docker":
        if not _CONTAINER_RE.fullmatch(v) or len(v) > 128:
            return f"'{visible(v)}' is not a container name or id (letters, digits, '_.-'; no leading '-')"
    elif kind == "command":
        if hidden_char(v, "\t") is not None:
            return f"'{visible(v)}' {_hidden_reason(v, chr(9))}"
    return None


def user_problem(v: str) -> str | None:
    """Why ``v`` is not a user name ssh may be given (None when it is)."""
    r = _argument_problem(v)
    if r:
        return r
    if len(v) > MAX_USER_LEN:
        return f"is longer than {MAX_USER_LEN} characters"
    if not _USER_RE.fullmatch(v):
        return _charset_problem(v, "")
    return None


def _charset_problem(v: str, otherwise: str) -> str:
    """Why a host or user name is refused: the characters OpenSSH would refuse too, named."""
    bad = sorted({c for c in v if not (c.isascii() and (c.isalnum() or c in "._-"))})
    found = " ".join(repr(c) for c in bad) or otherwise
    return f"may only hold letters, digits and . _ - (like OpenSSH, no shell metacharacters); found {found}"


def parse_jump_hops(spec: str) -> list[JumpHop]:
    """Validate a ProxyJump chain ``[user@]host[:port][,...]``; ValueError says which hop is bad.

    The syntax is read by the one ProxyJump parser (``reach.parse_jump_chain``,
    the same the transport connects with); here each hop's values are checked
    like any host and user that reaches ssh.
    """
    r = _hidden_reason(spec)
    if r:
        raise ValueError(r)
    hops = parse_jump_chain(spec)
    for i, hop in enumerate(hops):
        where = f"hop {i + 1} '{spec.split(',')[i].strip()}': " if len(hops) > 1 else ""
        if hop.user is not None:
            p = user_problem(hop.user)
            if p:
                raise ValueError(f"{where}user '{hop.user}' {p}")
        p = host_problem(hop.host)
        if p:
            raise ValueError(f"{where}host '{hop.host}' {p}")
    return hops


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


# --------------------------------------------------------------------------- shared helpers

_BAD = object()  # a value that failed validation (the error is already recorded)
_PYTHON_ONLY_RE = re.compile(r"\\[dD]|\(\?|[*+?}]\?")


def _describe(v: Any) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, (int, float)):
        return f"{v} (a number)"
    if isinstance(v, str):
        return f"'{visible(v)}' (a string)"
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
        elif k in ("logs", "funnel"):  # merged entry by entry; a null entry removes the inherited one
            merged = dict(out.get(k) or {})
            for name, p in v.items():
                if p is None:
                    merged.pop(name, None)
                else:
                    merged[name] = p
            out[k] = merged
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
        identity_file=s.get("identity_file"),
        path_prepend=s.get("path_prepend"),
    )


def jump_hosts(jump: str) -> list[str]:
    """Host parts of a ProxyJump chain (brackets of ``[IPv6]`` removed), for jump cycle checks."""
    return [h.host[1:-1] if h.host.startswith("[") else h.host for h in parse_jump_hops(jump)]


Entry = tuple[str, str, int, Any]  # (field, dotted key, line, value)


class FieldParser:
    """One validation pass over one file: error plumbing, host keys and ranges,
    groups, per-key value checks; a file shape (native, Ansible) subclasses it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[InventoryError] = []
        self.hosts: dict[str, Host] = {}
        self.origin: dict[str, tuple[str, int]] = {}  # host -> (key that defined it, line)
        self.persist: float | None = None  # defaults.persist (native shape only)

    def err(self, line: int | None, key: str | None, message: str) -> None:
        self.errors.append(InventoryError(message, path=self.path, line=line, key=key))

    def mapping(self, value: Any, key: str, line: int, *, null_ok: bool = True) -> YMap | None:
        """``value`` as a mapping (null → empty), reporting duplicate keys inside it."""
        if value is None and null_ok:
            m = YMap()
            m.line = line
            return m
        if not isinstance(value, YMap):
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
        hint = did_you_mean(k, allowed) or f" (allowed: {', '.join(allowed)})"
        self.err(line, key, f"unknown key '{k}'{hint}")

    def name_ok(self, name: str, key: str, line: int, what: str) -> bool:
        if _NAME_RE.fullmatch(name):
            return True
        self.err(
            line,
            key,
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

    def parse(self, data: Any) -> dict[str, list[str]]:
        """Validate one file shape; hosts land in ``self.hosts``, the resolved groups are returned."""
        raise NotImplementedError

    def load_yaml(self, text: str) -> Any:
        try:
            data = yaml.load(text, Loader=Loader)  # noqa: S506 - SafeLoader subclass
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
                1,
                None,
                "the inventory is empty: expected 'hosts:' (with optional 'defaults:' and 'groups:') "
                "or an Ansible inventory starting with 'all:'; see docs/inventory.md",
            )
        return data

    def finish(self, groups: dict[str, list[str]]) -> Inventory:
        """Cross-host checks once every host is known; raise all errors in line order, or return the inventory."""
        if not self.errors:
            for g, members in groups.items():
                for h in members:
                    self.hosts[h].groups.append(g)
            self.check_targets()
            self.check_jumps()
        if self.errors:
            errs = sorted(self.errors, key=lambda e: (e.line is None, e.line or 0))
            first = errs[0]
            first.errors = errs
            raise first
        return Inventory(
            path=None if self.path == "<string>" else Path(self.path),
            hosts=self.hosts,
            groups=groups,
            persist=self.persist,
        )

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
                cyc = stack[stack.index(g) :] + [g]
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

    def check_hidden(self, node: Any, key: str, allow: str = "") -> None:
        """Refuse control and invisible characters (NUL, ESC, U+202E...) in every key and string of the file.

        Log paths alone may hold a newline or tab: file names can, and the
        remote script passes paths as data, never as shell text.
        """
        items: Iterable[tuple[Any, Any, int]]
        if isinstance(node, YMap):
            items = ((k, v, node.lines.get(k, node.line)) for k, v in node.items())
        elif isinstance(node, YSeq):
            items = ((i, v, ln) for i, (v, ln) in enumerate(zip(node, node.lines)))
        else:
            return
        for k, v, ln in items:
            if isinstance(node, YSeq):
                dotted = f"{key}[{k}]"
            else:
                dotted = f"{key}.{visible(str(k))}" if key else visible(str(k))
                if isinstance(k, str) and hidden_char(k) is not None:
                    self.err(ln, dotted, f"key {_hidden_reason(k)}")
            sub = _LOG_PATH_CHARS if k in ("logs", "fleetdiag_logs") else allow
            if isinstance(v, str):
                if hidden_char(v, sub) is not None:
                    self.err(ln, dotted, f"value '{visible(v)}' {_hidden_reason(v, sub)}")
            else:
                self.check_hidden(v, dotted, sub)

    def check_targets(self) -> None:
        """A host without ``address:`` is reached by its name, so the name must be a valid ssh host."""
        for h in self.hosts.values():
            if h.address is None:
                why = host_problem(h.name)
                if why:
                    key, line = self.origin[h.name]
                    self.err(
                        line,
                        f"hosts.{key}",
                        f"host '{h.name}' has no 'address:', so its name is the ssh target, and it {why}",
                    )

    def check_jumps(self) -> None:
        """A host must not jump through itself (easy to get via ``defaults.jump``) or a jump cycle."""
        graph = {h.name: [n for n in jump_hosts(h.jump) if n in self.hosts] for h in self.hosts.values() if h.jump}
        for name, via in graph.items():
            if name in via:
                key, line = self.origin[name]
                self.err(
                    line,
                    f"hosts.{key}.jump",
                    f"host '{name}' would jump through itself (inherited from defaults? set 'jump: null' on it)",
                )
        seen: set[str] = set()
        for start in graph:
            path: list[str] = []
            cur: str | None = start
            while cur is not None and cur in graph and cur not in path and cur not in seen:
                path.append(cur)
                nxt = [n for n in graph[cur] if n != cur]
                cur = nxt[0] if nxt else None
            if cur is not None and cur in path:
                cyc = path[path.index(cur) :] + [cur]
                key, line = self.origin[cyc[0]]
                self.err(line, f"hosts.{key}.jump", "jump cycle: " + " -> ".join(cyc))
            seen.update(path)

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

    def v_address(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, str) and hidden_char(v) is not None:
            return _BAD  # check_hidden has reported it, for every key of the file
        if isinstance(v, str) and hidden_char(v) is None:
            if "@" in v:
                self.err(line, key, f"address '{v}' contains a user: put it in 'user:'")
                return _BAD
            if re.fullmatch(r"[^:\[\]]+:\d+", v):
                self.err(line, key, f"address '{v}' contains a port: put it in 'port:'")
                return _BAD
        if not isinstance(v, str):
            self.err(line, key, f"expected a host name or IP address, got {_describe(v)}")
            return _BAD
        why = host_problem(v)
        if why:
            self.err(line, key, f"address '{visible(v)}' {why}")
            return _BAD
        return v

    def v_port(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            self.err(line, key, f"expected a port number 1-65535, got {_describe(v)}")
            return _BAD
        return v

    def v_user(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, str) and hidden_char(v) is not None:
            return _BAD  # reported by check_hidden
        if not isinstance(v, str):
            self.err(line, key, f"expected a user name, got {_describe(v)}")
            return _BAD
        if "@" in v and hidden_char(v) is None:
            self.err(line, key, f"user '{v}' contains '@': put the host in 'address:'")
            return _BAD
        why = user_problem(v)
        if why:
            self.err(line, key, f"user '{visible(v)}' {why}")
            return _BAD
        return v

    def v_jump(self, v: Any, key: str, line: int) -> Any:
        if isinstance(v, str) and hidden_char(v) is not None:
            return _BAD  # reported by check_hidden
        if not isinstance(v, str):
            self.err(
                line,
                key,
                f"expected a jump host like user@bastion:22, an inventory host or an ssh alias, got {_describe(v)}",
            )
            return _BAD
        try:
            parse_jump_hops(v)
        except ValueError as e:
            self.err(line, key, f"jump '{visible(v)}': {e}")
            return _BAD
        return v

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
        if not isinstance(v, YSeq):
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
            elif isinstance(p, YMap):
                src = self._log_stream(p, f"{key}.{name}", ln)
                if src is not None:
                    out[name] = src
            elif not isinstance(p, str):
                self.err(
                    ln,
                    f"{key}.{name}",
                    f"expected a log path or glob, or one of "
                    f"{{journal: UNIT}}, {{docker: CONTAINER}}, {{command: ...}}, got {_describe(p)}",
                )
        return out

    def _log_stream(self, m: YMap, key: str, line: int) -> Any:
        """``{journal: UNIT}``, ``{docker: CONTAINER}``, ``{command: "..."}`` or ``{file: PATH}``: one key."""
        keys = list(m)
        if len(keys) != 1:
            self.err(
                line,
                key,
                "a log source has exactly one of the keys "
                + ", ".join(SOURCE_KINDS)
                + (f", got {len(keys)}" if keys else ", got none"),
            )
            return None
        kind = keys[0]
        ln, k2 = m.lines.get(kind, line), f"{key}.{kind}"
        if kind not in SOURCE_KINDS:
            self.unknown_key(str(kind), SOURCE_KINDS, k2, ln)
            return None
        v = m[kind]
        if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).strip():
            self.err(ln, k2, f"expected a non-empty string, got {_describe(v)}")
            return None
        v = str(v)
        if kind == "file":
            return v if self._path_ok(v, k2, ln) else None
        why = source_problem(kind, v)
        if why:
            self.err(ln, k2, why)
            return None
        return LogSource(kind, v)

    def _path_ok(self, p: str, key: str, line: int) -> bool:
        if not p.strip() or "\0" in p:  # newlines are legal in file names and are quoted like any byte
            self.err(line, key, f"expected a log path or glob, got {_describe(p)}")
            return False
        return True

    def v_identity_file(self, v: Any, key: str, line: int) -> Any:
        if not isinstance(v, str) or not v.strip() or "\0" in v:
            self.err(line, key, f"expected the path of a private key file, got {_describe(v)}")
            return _BAD
        return v

    def v_path_prepend(self, v: Any, key: str, line: int) -> Any:
        if not isinstance(v, str) or not v.strip() or any(c in v for c in "\0\n\r"):
            self.err(line, key, f"expected remote directories (DIR or DIR:DIR), got {_describe(v)}")
            return _BAD
        return v

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
        if k == "flight_recorder":  # the job's TORCH_FR_DUMP_TEMP_FILE: where its dumps are when it is gone
            if not isinstance(val, str) or not val.startswith("/") or any(c in val for c in "\0\n*?["):
                raise ValueError(f"expected an absolute path prefix (TORCH_FR_DUMP_TEMP_FILE), got {_describe(val)}")
            return val
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
