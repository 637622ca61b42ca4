"""The Ansible YAML inventory shape, read so teams need not keep two files.

Every top-level key is a group (``all`` the root); only the variables that
say how to reach a host (and fleetdiag_* ones) are read.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from .fields import Entry, FieldParser, _make_host, _merge
from .model import ALL, HOST_KEYS, Host
from .yamlload import YMap

_ANSIBLE_ALIASES = {
    "ansible_host": "address",
    "ansible_ssh_host": "address",
    "ansible_port": "port",
    "ansible_ssh_port": "port",
    "ansible_user": "user",
    "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "identity_file",
    "ansible_private_key_file": "identity_file",
}
# Ansible vars fleetdiag reads nothing from on purpose: named in no warning.
_ANSIBLE_QUIET = (
    "ansible_connection",
    "ansible_python_interpreter",
    "ansible_shell_type",
    "ansible_ssh_pass",
    "ansible_password",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
)
_ANSIBLE_PLAIN = ("logs", "gpus", "region", "tags", "funnel", "jump", "path_prepend")
_ANSIBLE_GROUP_KEYS = ("hosts", "children", "vars")
_ANSIBLE_RANGE = re.compile(r"\[([^\]:]*):([^\]:]*)(?::([^\]:]*))?\]")


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


class AnsibleParser(FieldParser):
    """Validates an Ansible YAML inventory; ``parse`` returns the resolved groups."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.groups: dict[str, dict[str, Any]] = {}  # group -> line, key, members, parents, vars chunks
        self.host_vars: dict[str, list[dict[str, Any]]] = {}  # host -> settings chunks in file order
        self.visiting: set[int] = set()  # mappings on the current path (YAML anchors can loop)
        self.unused: dict[str, int] = {}  # Ansible vars read but not understood -> first line
        self.become: int | None = None  # line of an ansible_become var

    @property
    def warnings(self) -> list[str]:
        """What was read but not used, so nothing is dropped silently."""
        out = []
        if self.unused:
            names = sorted(self.unused, key=lambda k: self.unused[k])
            out.append(f"{self.path}:{self.unused[names[0]]}: ignored vars fleetdiag does not use: " + ", ".join(names))
        if self.become is not None:
            out.append(
                f"{self.path}:{self.become}: ansible_become noted: fleetdiag never escalates, "
                "it reads logs as the login user"
            )
        return out

    @staticmethod
    def is_ansible(data: YMap) -> bool:
        body = data.get(ALL)
        return isinstance(body, YMap) and any(k in body for k in _ANSIBLE_GROUP_KEYS)

    def parse(self, data: YMap) -> dict[str, list[str]]:
        """Ansible YAML inventory: every top-level key is a group (``all`` the root).

        Variables layer like Ansible's: ``all.vars`` < group vars (parents before
        children, then by name) < host vars. Only ansible_host/port/user (and
        their ansible_ssh_* aliases), a ProxyJump in ansible_ssh_common_args,
        fleetdiag_* vars and plain logs/gpus/region/tags/funnel/jump vars are
        read; other vars belong to Ansible and are ignored.
        """
        self.groups.clear()
        self.host_vars.clear()
        for k, ln, first in data.dups:
            self.err(ln, str(k), f"duplicate key (first defined at line {first})")
        for gk in data:
            ln = data.lines[gk]
            g = self.str_key(gk, str(gk), ln)
            if g is not None:
                self.group(g, data[gk], g, ln, None)
        if not self.hosts and not self.errors:  # after a typo like `host:` this would only be noise
            self.err(data.line, ALL, "no hosts defined")

        raw: dict[str, tuple[int, list[tuple[str, int]], str]] = {}
        for g, gd in self.groups.items():
            if g == ALL:
                continue
            if g in self.hosts:
                self.err(
                    gd["line"],
                    gd["key"],
                    f"group '{g}' has the same name as a host; rename one so selectors are unambiguous",
                )
                continue
            raw[g] = (gd["line"], [(m, ln) for m, ln in gd["members"] if m != g], gd["key"])
        resolved = self.resolve_groups(raw)

        depth: dict[str, int] = {}

        def depth_of(g: str, seen: frozenset[str] = frozenset()) -> int:
            if g not in depth:
                parents = [p for p in self.groups[g]["parents"] if p not in seen and p != g]
                depth[g] = 1 + max((depth_of(p, seen | {g}) for p in parents), default=0)
            return depth[g]

        member_of: dict[str, list[str]] = {h: [] for h in self.hosts}
        for g, names in resolved.items():
            for h in names:
                member_of[h].append(g)
        base = self.vars_of(ALL)
        for h in self.hosts:
            s = dict(base)
            for g in sorted(member_of[h], key=lambda g: (depth_of(g), g)):
                s = _merge(s, self.vars_of(g))
            for chunk in self.host_vars.get(h, []):
                s = _merge(s, chunk)
            host = _make_host(h, s)
            self.hosts[h] = host
        return resolved

    def vars_of(self, g: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for chunk in self.groups.get(g, {}).get("vars", []):
            out = _merge(out, chunk)
        return out

    def group(self, name: str, body: Any, key: str, line: int, parent: str | None) -> None:
        if not self.name_ok(name, key, line, "group"):
            return
        gd = self.groups.setdefault(name, {"line": line, "key": key, "members": [], "parents": [], "vars": []})
        if parent is not None and parent not in gd["parents"]:
            gd["parents"].append(parent)
        if parent is not None and parent != ALL:
            self.groups[parent]["members"].append((name, line))
        if parent is None and name != ALL:
            gd["parents"].append(ALL)
        m = self.mapping(body, key, line)
        if m is None or id(m) in self.visiting:
            return
        self.visiting.add(id(m))
        for k in m:
            if k not in _ANSIBLE_GROUP_KEYS:
                self.unknown_key(str(k), _ANSIBLE_GROUP_KEYS, f"{key}.{k}", m.lines[k])
        if "vars" in m:
            vm = self.mapping(m["vars"], f"{key}.vars", m.lines["vars"])
            if vm is not None:
                gd["vars"].append(self.vars_settings(vm, f"{key}.vars"))
        for hname, hbody, ln in self.named_entries(m, "hosts", key):
            self.host(hname, hbody, f"{key}.hosts.{hname}", ln, gd)
        for c, cbody, ln in self.named_entries(m, "children", key):
            if c == ALL:
                self.err(ln, f"{key}.children.{c}", "'all' cannot be a child group")
                continue
            self.group(c, cbody, f"{key}.children.{c}", ln, name)
        self.visiting.discard(id(m))

    def named_entries(self, m: Any, section: str, key: str) -> list[tuple[str, Any, int]]:
        """A group's ``hosts:`` or ``children:`` mapping as (name, body, line), each name checked."""
        if section not in m:
            return []
        sm = self.mapping(m[section], f"{key}.{section}", m.lines[section])
        out = []
        for k in sm or {}:
            ln = sm.lines[k]  # type: ignore[union-attr]
            name = self.str_key(k, f"{key}.{section}.{k}", ln)
            if name is not None:
                out.append((name, sm[k], ln))  # type: ignore[index]
        return out

    def host(self, pattern: str, body: Any, key: str, line: int, gd: dict[str, Any]) -> None:
        port = None
        try:
            pattern = self.host_range(pattern)
        except ValueError as e:
            self.err(line, key, str(e))
            return
        hp = re.fullmatch(r"([^:\[\]]+(?:\[[^\]]*\][^:\[\]]*)*):(\d+)", pattern)
        if hp:  # Ansible's `host:port` shorthand
            pattern, port = hp.group(1), int(hp.group(2))
        names = self.expand(pattern, key, line)
        m = self.mapping(body, key, line)
        chunk = self.vars_settings(m, key) if m is not None else {}
        if port is not None and "port" not in chunk:
            chunk = {"port": port, **chunk}
        for n in names:
            if n not in self.hosts:
                self.hosts[n] = Host(name=n)  # placeholder; settings are layered at the end
                self.origin[n] = (n, line)
            self.host_vars.setdefault(n, []).append(chunk)
            gd["members"].append((n, line))

    @staticmethod
    def host_range(pattern: str) -> str:
        """Ansible ``www[01:50]``/``[0:50:2]`` → ClusterShell ``www[01-50]``/``[0-50/2]``."""

        def conv(m: re.Match[str]) -> str:
            lo, hi, step = m.group(1), m.group(2), m.group(3)
            if not (lo.isdigit() and hi.isdigit() and (step is None or step.isdigit())):
                raise ValueError(f"only numeric host ranges are supported, got '{m.group(0)}'")
            return f"[{lo}-{hi}{'/' + step if step else ''}]"

        return _ANSIBLE_RANGE.sub(conv, pattern)

    def vars_settings(self, m: YMap, key: str) -> dict[str, Any]:
        """Our settings from Ansible vars; fleetdiag_* beats ansible_* beats plain names."""
        best: dict[str, tuple[int, Entry]] = {}
        allowed = [f"fleetdiag_{k}" for k in HOST_KEYS]
        for k in m:
            if not isinstance(k, str):
                continue
            ln, dotted, val = m.lines[k], f"{key}.{k}", m[k]
            if k.startswith("fleetdiag_"):
                fld, prio = k[len("fleetdiag_") :], 4
                if fld not in HOST_KEYS:
                    self.unknown_key(k, allowed, dotted, ln)
                    continue
            elif k in _ANSIBLE_ALIASES:
                fld, prio = _ANSIBLE_ALIASES[k], 2 if k.startswith("ansible_ssh_") else 3
            elif k in _ANSIBLE_PLAIN:
                fld, prio = k, 1
            elif k in ("ansible_ssh_common_args", "ansible_ssh_extra_args") and isinstance(val, str):
                j = _ansible_jump(val)
                if j is None:
                    continue
                fld, prio, val = "jump", 0, j
            else:
                if k.startswith("ansible_become"):
                    self.become = self.become or ln
                elif k not in _ANSIBLE_QUIET:
                    self.unused.setdefault(k, ln)
                continue
            if fld not in best or prio > best[fld][0]:
                best[fld] = (prio, (fld, dotted, ln, val))
        return self.settings(e for _, e in best.values())


# --------------------------------------------------------------------------- INI and --list JSON
#
# Both become the YAML inventory's shape (YMap with lines), so one parser validates all three.


def _ymap(line: int) -> YMap:
    m = YMap()
    m.line = line
    return m


def _put(m: YMap, key: Any, value: Any, line: int) -> None:
    if key in m:
        m.dups.append((key, line, m.lines[key]))
    m[key] = value
    m.lines[key] = line


_INI_SECTION = re.compile(r"\[([^\]\s]+)\]\s*")


def looks_ini(text: str) -> bool:
    """An Ansible INI inventory: its first significant line is a ``[section]`` header (YAML would
    read that as a list) or a ``host key=value`` line."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "---")):
            continue
        if _INI_SECTION.fullmatch(line):
            return True
        return bool(re.fullmatch(r"[^\s:]+(\s+[A-Za-z_][A-Za-z0-9_]*=\S*)+", line))
    return False


def _ini_value(v: str, line: int = 0) -> Any:
    """A var's value as Ansible reads it: a number, a JSON/Python literal mapping or list
    (``fleetdiag_logs='{"train": "/x.log"}'``, as a mapping, not a path), else the text."""
    if v.isdigit():
        return int(v)
    if v[:1] in ("{", "[") and v[-1:] in ("}", "]"):
        import ast
        import json

        for load in (json.loads, ast.literal_eval):
            try:
                return _as_ymap(load(v), line)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                continue
    return v


def _as_ymap(value: Any, line: int) -> Any:
    """A parsed literal in the YAML shape: mappings become YMaps, all on the var's line."""
    if isinstance(value, dict):
        m = _ymap(line)
        for k, v in value.items():
            _put(m, k, _as_ymap(v, line), line)
        return m
    if isinstance(value, list):
        return [_as_ymap(v, line) for v in value]
    return value


def ini_to_ymap(text: str, err: Any) -> YMap:
    """Ansible's INI inventory as the YAML shape: ``[g]`` host lines with ``k=v`` vars,
    ``[g:vars]``, ``[g:children]``; hosts before any section are ``ungrouped``."""
    top = _ymap(1)
    groups: dict[str, YMap] = {ALL: _ymap(1)}
    _put(top, ALL, groups[ALL], 1)

    def group(name: str, line: int) -> YMap:
        if name not in groups:
            g = _ymap(line)
            groups[name] = g
            _put(top, name, g, line)
        return groups[name]

    def part(g: YMap, key: str, line: int) -> YMap:
        if key not in g:
            _put(g, key, _ymap(line), line)
        return g[key]

    name, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        m = _INI_SECTION.fullmatch(line)
        if m:
            name, _, kind = m.group(1).partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children"):
                err(n, m.group(1), f"unknown section kind ':{kind}' (expected :vars or :children)")
                kind = "skip"
            group(name, n)
            continue
        if kind == "skip":
            continue
        g = group(name, n)
        if kind == "vars":
            k, eq, v = line.partition("=")
            if not eq or not k.strip():
                err(n, f"{name}.vars", f"expected key=value, got '{line}'")
                continue
            _put(part(g, "vars", n), k.strip(), _ini_value(v.strip(), n), n)
        elif kind == "children":
            _put(part(g, "children", n), line, None, n)
        else:
            try:
                toks = shlex.split(line, comments=True)
            except ValueError as e:
                err(n, name, f"cannot split the host line: {e}")
                continue
            if not toks:
                continue
            hv = _ymap(n)
            for t in toks[1:]:
                k, eq, v = t.partition("=")
                if not eq:
                    err(n, f"{name}.hosts.{toks[0]}", f"expected key=value, got '{t}'")
                    continue
                _put(hv, k, _ini_value(v, n), n)
            _put(part(g, "hosts", n), toks[0], hv, n)
    return top


def is_list_json(data: Any) -> bool:
    """``ansible-inventory --list`` output: ``_meta.hostvars`` and groups with host lists."""
    return isinstance(data, YMap) and isinstance(data.get("_meta"), YMap)


def list_json_to_ymap(data: YMap) -> YMap:
    """``{"_meta": {"hostvars": {h: vars}}, "g": {"hosts": [h], "children": [g], "vars": {}}}`` as
    the YAML shape: host vars go with the host's first group, lists become mappings."""
    top = _ymap(data.line)
    if ALL not in data:
        _put(top, ALL, _ymap(data.line), data.line)
    meta = data.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, YMap) else None
    if not isinstance(hostvars, YMap):
        hostvars = _ymap(data.line)
    placed: set[str] = set()

    def as_map(v: Any, line: int, with_vars: bool) -> Any:
        if not isinstance(v, list):
            return v
        m = _ymap(line)
        lines = getattr(v, "lines", [line] * len(v))
        for item, ln in zip(v, lines):
            body = None
            if with_vars and isinstance(item, str) and item not in placed:
                placed.add(item)
                body = hostvars.get(item)
            _put(m, item, body, ln)
        return m

    for g in data:
        if g == "_meta":
            continue
        body = data[g]
        ln = data.lines.get(g, data.line)
        if isinstance(body, YMap):
            nb = _ymap(body.line)
            for k in body:
                kl = body.lines.get(k, body.line)
                _put(nb, k, as_map(body[k], kl, k == "hosts") if k in ("hosts", "children") else body[k], kl)
            body = nb
        _put(top, g, body, ln)
    rest = [h for h in hostvars if h not in placed]
    if rest:  # hosts only in _meta (Ansible lists them under `ungrouped` or `all`)
        a = top.get("all")
        if not isinstance(a, YMap):
            a = _ymap(data.line)
            _put(top, "all", a, data.line)
        hm = a.get("hosts") if isinstance(a.get("hosts"), YMap) else _ymap(a.line)
        for h in rest:
            _put(hm, h, hostvars[h], hostvars.lines.get(h, data.line))
        a["hosts"] = hm
        a.lines.setdefault("hosts", a.line)
    return top
