"""Selectors: which hosts ``gpu[01-04],!gpu03,&prod`` names, over an inventory or a plain list of names.

Terms apply left to right: a plain term adds, ``!x`` removes, ``&x``
intersects; a term is ``all``, a group, a host, a glob or a ClusterShell range,
or ClusterShell's ``@group`` (``@rack[1-2]`` for several groups, ``@all``:
every host), so ``@serving&@uk,!gpu03`` reads as it does for ``nodeset``.
A selector ``^hosts.txt`` or ``-`` (stdin) is a list of terms, a few a line.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from .model import ALL, Host, Inventory, InventoryError, SelectorError, close_matches, quote_list

# A typo like gpu[1-1000000] must not eat the machine.
MAX_RANGE = 65536


def fold(names: Iterable[str]) -> str:
    """Fold host names into ClusterShell range syntax: gpu01,gpu02,gpu04 -> gpu[01-02,04]."""
    names = list(names)
    if not names:
        return ""
    try:
        return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))
    except NodeSetException:  # names from outside the inventory may not parse
        return ",".join(dict.fromkeys(names))


_BRACKET_RE = re.compile(r"\[([^\[\]]*)\]")
_RANGE_ITEM_RE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?")


def range_size(pattern: str) -> int:
    """How many names ``pattern`` stands for, by arithmetic on its ``[a-b/step,...]`` blocks.

    ClusterShell builds every name when it parses a range, so ``gpu[1-100000000]``
    would take gigabytes before its length is known: the size is computed from
    the text first. Items it cannot read count as one (NodeSet reports them).
    """
    total = 1
    for block in _BRACKET_RE.findall(pattern):
        n = 0
        for item in block.split(","):
            m = _RANGE_ITEM_RE.fullmatch(item)
            if not m or m.group(2) is None:
                n += 1
                continue
            lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
            n += (hi - lo) // max(step, 1) + 1 if hi >= lo else 1
        total *= max(n, 1)
    return total


def _expand_range(pattern: str) -> list[str]:
    """Names a ``gpu[01-04]`` pattern stands for (ValueError if malformed or huge)."""
    size = range_size(pattern)
    if size > MAX_RANGE:
        raise ValueError(f"range '{pattern}' stands for {size} names (limit {MAX_RANGE})")
    try:
        ns = NodeSet(pattern, resolver=RESOLVER_NOGROUP)
    except NodeSetException as e:
        raise ValueError(f"bad range '{pattern}': {e}") from None
    if len(ns) > MAX_RANGE:
        raise ValueError(f"range '{pattern}' stands for {len(ns)} names (limit {MAX_RANGE})")
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


def split_ops(term: str) -> list[str]:
    """nodeset's inline operators, outside brackets: ``@a&@b!c`` -> ``@a``, ``&@b``, ``!c``."""
    parts: list[str] = []
    depth = 0
    cur = ""
    for c in term:
        depth += (c == "[") - (c == "]")
        if c in "&!" and depth == 0 and cur.strip() not in ("", "!", "&"):
            parts.append(cur.strip())
            cur = ""
        cur += c
    parts.append(cur.strip())
    return [p for p in parts if p]


class _NoMatch(Exception):
    def __init__(self, message: str, suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.suggestions = list(suggestions)


def _match(
    term: str,
    hosts: dict[str, int],
    group_of: Callable[[str], list[str] | None],
    group_names: Callable[[], Iterable[str]],
) -> list[str]:
    """Host names one positive term stands for: all, @group, group, host, glob or range."""
    if term.startswith("@"):
        return _groups(term[1:], hosts, group_of, group_names)
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
    sugg = close_matches(term, [*hosts, *group_names(), ALL])
    msg = f"unknown host or group '{term}'"
    if sugg:
        msg += f"; did you mean {quote_list(sugg)}?"
    raise _NoMatch(msg, sugg)


def _groups(
    name: str,
    hosts: dict[str, int],
    group_of: Callable[[str], list[str] | None],
    group_names: Callable[[], Iterable[str]],
) -> list[str]:
    """``@name`` (ClusterShell group syntax): a group of the inventory, never a host; ``@all`` is every host."""
    if name == ALL:
        return list(hosts)
    if not name:
        raise _NoMatch("'@' names no group")
    try:
        names = _expand_range(name) if "[" in name else [name]
    except ValueError as e:
        raise _NoMatch(str(e)) from None
    out: list[str] = []
    for n in names:
        members = group_of(n)
        if members is None:
            hint = f" ('{n}' is a host: drop the '@')" if n in hosts else ""
            sugg = [f"@{g}" for g in close_matches(n, group_names())]
            msg = f"unknown group '@{n}'{hint}"
            if sugg and not hint:
                msg += f"; did you mean {quote_list(sugg)}?"
            raise _NoMatch(msg, sugg)
        out.extend(members)
    return out


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
        body = term[len(op) :].strip()
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


def is_list(sel: str) -> bool:
    """``^FILE`` or ``-``: a selector that is a list of hosts to read."""
    return sel == "-" or (sel.startswith("^") and len(sel) > 1)


def read_list(sel: str, stdin: TextIO | None = None) -> list[tuple[str, str]]:
    """(``file:line``, word) pairs of ``^FILE`` or ``-`` (stdin): words split on blanks, ``#`` comments."""
    name = "<stdin>" if sel == "-" else sel[1:]
    try:
        text = (stdin or sys.stdin).read() if sel == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(f"cannot read the host list: {e}", key=sel) from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for term in line.split("#", 1)[0].split():
            out.append((f"{name}:{n}", term))
    return out


def _terms(selectors: Sequence[str] | str, stdin: TextIO | None = None) -> list[tuple[str, str | None]]:
    """(term, where) pairs; ``where`` is ``file:line`` for a term read from ``^FILE`` or ``-``."""
    if isinstance(selectors, str):
        selectors = [selectors]
    terms: list[tuple[str, str | None]] = []
    read: dict[str, list[tuple[str, str]]] = {}  # stdin is read once, however often '-' is named
    for sel in selectors:
        if is_list(sel):
            if sel not in read:
                read[sel] = read_list(sel, stdin)
            if not read[sel]:
                raise SelectorError(f"no host in {'<stdin>' if sel == '-' else sel[1:]}", term=sel)
            terms.extend((o, where) for where, word in read[sel] for p in split_selector(word) for o in split_ops(p))
            continue
        parts = split_selector(sel)
        if not parts:
            raise SelectorError("empty selector", term=sel)
        terms.extend((o, None) for p in parts for o in split_ops(p))
    return terms


def _fail(term: str, where: Any, e: _NoMatch) -> None:
    raise SelectorError(f"{where}: {e.message}" if where else e.message, term=term, suggestions=e.suggestions)


def select_names(
    names: Sequence[str],
    selectors: Sequence[str] | str,
    groups: Mapping[str, Sequence[str]] | None = None,
    stdin: TextIO | None = None,
) -> list[str]:
    """The names the selectors pick from a plain list of names, in list order.

    The one selection routine: ``all``, names, globs, ranges, ``groups`` keys,
    ``!x`` (remove), ``&x`` (intersect), a leading ``!``/``&`` starting from
    all. Each selector may hold comma-separated terms. A term that names
    nothing raises SelectorError with close matches: a typo must never
    silently shrink (or, after ``!``, grow) the set. ``@g`` is group ``g``
    only; ``^FILE`` and ``-`` (``stdin``, else sys.stdin) are lists of terms.
    """
    order = {name: i for i, name in enumerate(dict.fromkeys(names))}
    grp = groups or {}

    def group_of(name: str) -> list[str] | None:
        g = grp.get(name)
        return list(g) if g is not None else None

    return _evaluate(_terms(selectors, stdin), order, group_of, lambda: grp, _fail)


def select(inv: Inventory, selectors: Sequence[str] | str, stdin: TextIO | None = None) -> list[Host]:
    """Hosts the selectors name, deduplicated, in file order (see :func:`select_names`)."""
    return [inv.hosts[n] for n in select_names(list(inv.hosts), selectors, inv.groups, stdin)]
