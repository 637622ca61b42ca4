"""The native inventory shape: ``defaults:``, ``hosts:`` (names or ranges), ``groups:``."""

from __future__ import annotations

from typing import Any

from .fields import Entry, FieldParser, _describe, _make_host, _merge
from .model import ALL, HOST_KEYS, TOP_KEYS
from .yamlload import YMap, YSeq


class NativeParser(FieldParser):
    """Validates a native inventory; ``parse`` returns the resolved groups, hosts land in ``self.hosts``."""

    def parse(self, data: Any) -> dict[str, list[str]]:
        if not isinstance(data, YMap):
            line = getattr(data, "line", 1)
            self.err(line, None, f"expected a mapping with 'hosts:' at the top level, got {_describe(data)}")
            return {}
        for k in data:
            if k not in TOP_KEYS:
                line = data.lines[k]
                if k == ALL:
                    self.err(
                        line,
                        str(k),
                        "unknown key 'all': an Ansible inventory's 'all:' needs 'hosts:', "
                        "'children:' or 'vars:'; in this format 'all' is implicit",
                    )
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

    def native_settings(self, m: YMap, key: str) -> dict[str, Any]:
        entries: list[Entry] = []
        for k in m:
            line = m.lines[k]
            if key == "defaults" and k == "persist":  # how long connections are kept: the whole inventory's
                self.persist = self.v_persist(m[k], f"{key}.{k}", line)
                continue
            if k not in HOST_KEYS:
                self.unknown_key(str(k), HOST_KEYS, f"{key}.{k}", line)
                continue
            entries.append((k, f"{key}.{k}", line, m[k]))
        return self.settings(entries)

    def v_persist(self, v: Any, key: str, line: int) -> float | None:
        from ..units import parse_duration

        try:
            return parse_duration(v)
        except ValueError as e:
            self.err(line, key, str(e))
            return None

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
        if not isinstance(value, YSeq):
            self.err(line, key, f"expected a list of host names, ranges or groups, got {_describe(value)}")
            return []
        out = []
        for i, (item, ln) in enumerate(zip(value, value.lines)):
            if isinstance(item, str) and item.strip():
                out.append((item, ln))
            else:
                self.err(ln, f"{key}[{i}]", f"expected a host name, range or group, got {_describe(item)}")
        return out
