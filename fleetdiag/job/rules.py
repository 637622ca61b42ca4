"""The job-level rules (data/peer.yaml plus the user's peer.yaml), validated and compiled.

Kept apart from fleetdiag.job so that the job analysis stays pure: this is the
only part that reads files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..analysis.rules import RulesError, user_file_key

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built: ~5x faster

SECTIONS = {"peer_caused": "kind", "collective": "name", "killed": "name", "endpoints": "name"}


PEER_MEMO = 50_000  # line texts whose any_peer_caused answer is kept ...
PEER_MEMO_CHARS = 4_000_000  # ... and their characters at most


@dataclass
class JobRule:
    key: str  # kind (peer_caused) or name
    regex: re.Pattern[str]


@dataclass
class JobRules:
    peer_caused: list[JobRule] = field(default_factory=list)
    collective: list[JobRule] = field(default_factory=list)
    killed: list[JobRule] = field(default_factory=list)
    endpoints: list[JobRule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    _peer_any: Any = field(default=None, init=False, repr=False, compare=False)
    _gates: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _ere: str | None = field(default=None, init=False, repr=False, compare=False)
    # answers by line text: the job analysis asks of each line several times, and a watch asks again of a
    # host's whole buffer on every failure; bounded (emptied at PEER_MEMO texts)
    _peer_memo: dict[str, bool] = field(default_factory=dict, init=False, repr=False, compare=False)
    _peer_memo_chars: int = field(default=0, init=False, repr=False, compare=False)

    def any_peer_caused(self, line: str) -> bool:
        """Whether any peer_caused rule matches: one alternation, one pass over the line (the job
        analysis asks this of every kept line of every host)."""
        hit = self._peer_memo.get(line)
        if hit is None:
            if len(self._peer_memo) >= PEER_MEMO or self._peer_memo_chars >= PEER_MEMO_CHARS:
                self._peer_memo.clear()
                self._peer_memo_chars = 0
            hit = self._peer_memo[line] = self._any_peer_caused(line)
            self._peer_memo_chars += len(line)
        return hit

    def _any_peer_caused(self, line: str) -> bool:
        if self._peer_any is None:
            try:
                self._peer_any = re.compile("|".join(f"(?:{r.regex.pattern})" for r in self.peer_caused) or "(?!)")
                if any(r.regex.flags != self.peer_caused[0].regex.flags for r in self.peer_caused):
                    raise re.error("mixed flags")
            except re.error:  # a pattern with its own global flags: one by one, as written
                self._peer_any = False
        if self._peer_any is False:
            return any(r.regex.search(line) for r in self.peer_caused)
        return self._peer_any.search(line) is not None

    def may_match(self, section: str, line: str) -> bool:
        """False only when no rule of ``section`` can match ``line``: one alternation of the section's
        patterns (named groups made plain) as a gate before the rules' own searches; True when the
        patterns do not combine (back-references, global flags)."""
        gate = self._gates.get(section)
        if gate is None:
            rules: list[JobRule] = getattr(self, section)
            try:
                pats = [_PLAIN_GROUP.sub("(?:", r.regex.pattern) for r in rules]
                gate = re.compile("|".join(f"(?:{p})" for p in pats) or "(?!)")
                if any(r.regex.flags != rules[0].regex.flags for r in rules) or any("(?P=" in p for p in pats):
                    raise re.error("not combinable")
            except re.error:
                gate = False
            self._gates[section] = gate
        return gate is False or gate.search(line) is not None


_PLAIN_GROUP = re.compile(r"(?<!\\)\(\?P<[A-Za-z_][A-Za-z0-9_]*>")  # a named group, not an escaped paren


def _merge(merged: dict[str, list[dict[str, Any]]], data: Any, src: str) -> None:
    if not isinstance(data, dict):
        raise RulesError(f"{src}: must be a mapping")
    unknown = set(data) - set(SECTIONS) - {"version"}
    if unknown:
        raise RulesError(f"{src}: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")
    for sec, key in SECTIONS.items():
        items = data.get(sec) or []
        if not isinstance(items, list):
            raise RulesError(f"{src}: {sec}: must be a list")
        for idx, item in enumerate(items):
            where = f"{src}: {sec}[{idx}]"
            if not isinstance(item, dict) or key not in item:
                raise RulesError(f"{where}: must be a mapping with {key}")
            extra = set(item) - {key, "pattern", "disable"}
            if extra:
                raise RulesError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
            target = merged[sec]
            target[:] = [t for t in target if t[key] != item[key]]
            if item.get("disable"):
                continue
            if not isinstance(item.get("pattern"), str):
                raise RulesError(f"{where}: pattern must be a string")
            try:
                re.compile(item["pattern"])
            except re.error as exc:
                raise RulesError(f"{where}: invalid regex {item['pattern']!r}: {exc}") from None
            # a user's rule is tried before the shipped ones
            target.insert(0, dict(item)) if merged.get("_user") else target.append(dict(item))


def user_peer_rules_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_path("fleetdiag")) / "peer.yaml"


def load_job_rules(extra: Iterable[Path | str] = (), *, user_default: bool = True) -> JobRules:
    """Shipped rules, then the user's peer.yaml (when present), then ``extra`` files."""
    merged: dict[str, Any] = {k: [] for k in SECTIONS}
    shipped = resources.files("fleetdiag").joinpath("data/peer.yaml").read_text(encoding="utf-8")
    _merge(merged, yaml.load(shipped, Loader=_LOADER), "peer.yaml (shipped)")  # noqa: S506 (a safe loader)
    sources = ["peer.yaml (shipped)"]
    paths = [Path(p) for p in extra]
    if user_default:
        up = user_peer_rules_path()
        if up.is_file():
            paths.insert(0, up)
    merged["_user"] = True
    for p in paths:
        try:
            data = yaml.load(p.read_text(encoding="utf-8"), Loader=_LOADER) or {}  # noqa: S506 (a safe loader)
        except (OSError, yaml.YAMLError) as exc:
            raise RulesError(f"{p}: {exc}") from None
        _merge(merged, data, str(p))
        sources.append(str(p))
    out = JobRules(sources=sources)
    for sec, key in SECTIONS.items():
        setattr(out, sec, [JobRule(str(i[key]), re.compile(i["pattern"])) for i in merged[sec]])
    return out


@lru_cache(maxsize=4)
def _cached(user_key: tuple[str, int] | None) -> JobRules:
    return load_job_rules(user_default=user_key is not None)


def default_job_rules() -> JobRules:
    """Shipped + user rules, cached by the user file's path and mtime (a ``watch`` that runs for days sees
    an edit); a broken user file falls back to the shipped rules alone."""
    key = user_file_key(user_peer_rules_path())
    try:
        return _cached(key)
    except RulesError:
        return _cached(None)
