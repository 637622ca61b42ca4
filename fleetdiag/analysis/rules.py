"""The analyzer's rules: shipped YAML plus the user's files, validated and compiled.

Rules are data so that a new wrapper message or error signature is a YAML
edit, not a code change. Five sections also feed the remote funnel (POSIX
ERE for grep/awk); the rest are Python regexes used only here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

try:  # the regex parser, to find the literal text a pattern cannot match without
    from re import _constants as _sre_c  # type: ignore[attr-defined]
    from re import _parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

CATEGORIES = ("config", "oom", "cuda", "nccl", "import", "python", "network", "disk", "other")
ERE_SECTIONS = ("keywords", "run_start", "tags", "waiting", "ready", "block_heads")
LIST_SECTIONS = ERE_SECTIONS + ("benign", "serving")
# What an error line is to the failure (DESIGN §14): raised where it happened, quoting another
# error, a launcher reporting a child, a transport/watchdog error blaming another process, or a
# consequence of the failure.
CAUSE, WRAPPER, LAUNCHER, PEER, CONSEQUENCE = "cause", "wrapper", "launcher", "peer-caused", "consequence"
ROLES = (CAUSE, WRAPPER, LAUNCHER, PEER, CONSEQUENCE)
# a signature's condition on its traceback's frames ("" = none): analysis/frames.py decides it
ANOTHER_PACKAGE = "another-package"  # the failing frame and its caller are in different packages
RAISED_UNDER = "raised-under"  # the pattern matches a frame of the exception's own traceback, not its message
FRAME_CONDITIONS = ("", ANOTHER_PACKAGE, RAISED_UNDER)


class RulesError(ValueError):
    """A rules file is unreadable or invalid; the message names file and key."""


def _runs(seq: Any) -> list[tuple[str, ...]]:
    """Needle sets for a parsed sequence: each set's members cover every way it can match."""
    cands: list[tuple[str, ...]] = []
    cur = ""
    for op, av in seq:
        if op is _sre_c.LITERAL:
            cur += chr(av)
            continue
        if cur:
            cands.append((cur,))
            cur = ""
        if op is _sre_c.BRANCH:  # the parser factors a common prefix out of an alternation
            alt = _branch(av[1])
            if alt:
                cands.append(alt)
        elif op is _sre_c.SUBPATTERN:
            if av[1] & re.IGNORECASE:  # (?i:...) : its letters may match in any case
                continue
            inner = list(av[-1])
            if len(inner) == 1 and inner[0][0] is _sre_c.BRANCH:
                alt = _branch(inner[0][1][1])
                if alt:
                    cands.append(alt)
            elif inner:
                sub = _best(_runs(inner))
                if sub:
                    cands.append(sub)
    if cur:
        cands.append((cur,))
    return cands


def _best(cands: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    good = [c for c in cands if min(len(n) for n in c) >= 3]
    return max(good, key=lambda c: min(len(n) for n in c)) if good else None


def _branch(branches: Any) -> tuple[str, ...] | None:
    out: list[str] = []
    for b in branches:
        best = _best(_runs(list(b)))
        if best is None:
            return None
        out.extend(best)
    return tuple(dict.fromkeys(out))


def needles(pattern: str) -> tuple[str, ...] | None:
    """Literal strings of which any match must contain one, or None when unknown.

    A substring test is far cheaper than a regex search, and most lines match
    no rule, so every rule is pre-checked this way.
    """
    try:
        parsed = _sre_parse.parse(pattern)
        if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
            return None
        items = list(parsed)
        if len(items) == 1 and items[0][0] is _sre_c.BRANCH:
            return _branch(items[0][1][1])
        return _best(_runs(items))
    except Exception:  # a private-API change must only cost speed
        return None


class Pat:
    """A compiled regex with a cheap literal pre-check."""

    __slots__ = ("regex", "needles")

    def __init__(self, pattern: str) -> None:
        self.regex = re.compile(pattern)
        self.needles = needles(pattern)

    def search(self, text: str) -> re.Match[str] | None:
        nd = self.needles
        if nd is not None:
            for n in nd:
                if n in text:
                    break
            else:
                return None
        return self.regex.search(text)


def gate(pats: Sequence[Pat]) -> re.Pattern[str] | None:
    """One literal-only regex that must match before any of the patterns can.

    Literal alternations are searched far faster than a Python loop over the
    patterns; None when some pattern has no known literal.
    """
    lits: set[str] = set()
    for p in pats:
        if p.needles is None:
            return None
        lits.update(p.needles)
    if not lits:
        return None
    return re.compile("|".join(re.escape(n) for n in sorted(lits, key=len, reverse=True)))


MEMO = 100_000  # (test, line text) answers a Rules object keeps ...
MEMO_CHARS = 8_000_000  # ... and the characters of those texts at most


def _any(pats: Sequence[Pat], g: re.Pattern[str] | None, text: str) -> bool:
    if g is not None and g.search(text) is None:
        return False
    return any(p.search(text) is not None for p in pats)


class _Compiled:
    """A rule whose ``pattern`` is compiled once, when the rule is made."""

    pattern: str
    pat: Pat

    def __post_init__(self) -> None:
        self.pat = Pat(self.pattern)

    @property
    def regex(self) -> re.Pattern[str]:
        return self.pat.regex


@dataclass
class Signature(_Compiled):
    """An error shape: pattern → category and hint."""

    name: str
    pattern: str
    category: str = "other"
    hint: str | None = None
    hint_facts: list[dict[str, str]] = field(default_factory=list)
    standalone: bool = False  # a matching line is an error whatever its level
    weak: bool = False  # loses to any other error (e.g. a launcher's exit code)
    role: str = CAUSE  # a launcher's exit code, a peer's transport error: they lose to a cause
    # a runtime's generic error whose own detail line, printed right under it, says why (torch_npu's "NPU function
    # error" over CANN's EE1001 / EL0004 record): a cause a signature knows on that line wins over it
    detailed: bool = False
    # a condition on the traceback's frames (see analysis/frames.py): "another-package" matches only when
    # the failing frame and the frame calling it belong to different packages; "raised-under" matches the
    # pattern against the exception's own frames instead of its text
    frames: str = ""
    pat: Pat = field(init=False, repr=False, compare=False)


@dataclass
class SecondaryRule(_Compiled):
    """A wrapper or consequence of an error reported elsewhere."""

    kind: str
    pattern: str
    header: bool = False  # match the line introducing a traceback, not the error line
    role: str = CONSEQUENCE  # wrapper | launcher | peer-caused | consequence
    pat: Pat = field(init=False, repr=False, compare=False)

    @property
    def carries_cause(self) -> bool:
        return "cause" in self.regex.groupindex


# the rule lists a Rules holds: what a copy with one rule disabled (Rules.without) or a recording copy starts from
RULE_FIELDS = (
    "keywords",
    "run_start",
    "tags",
    "block_heads",
    "waiting",
    "ready",
    "benign",
    "serving",
    "secondary",
    "signatures",
    "peer",
    "sources",
    "extra_tags",
)


@dataclass
class Rules:
    """Compiled rules. The ERE lists are also what the remote funnel greps with."""

    keywords: list[str] = field(default_factory=list)
    run_start: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    # lines that open an error whose message follows them (a Python traceback, a Rust panic): in a log with
    # no process tags the funnel's context pass reads on from the first of them; each is a keyword as well
    block_heads: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    benign: list[str] = field(default_factory=list)
    serving: list[str] = field(default_factory=list)  # a server answering requests: errors before it were survived
    secondary: list[SecondaryRule] = field(default_factory=list)
    signatures: list[Signature] = field(default_factory=list)
    peer: list[SecondaryRule] = field(default_factory=list)  # data/peer.yaml peer_caused: blames another process
    sources: list[str] = field(default_factory=list)  # files read, in order
    extra_tags: list[str] = field(default_factory=list)  # tags the line parser does not know built in

    def __post_init__(self) -> None:
        self.compile()

    def compile(self) -> None:
        """(Re)build the matchers; call after editing the lists."""
        # a block head is searched for as a keyword too: the funnel's context pass sees only keyword lines
        self._keyword_list = [*self.keywords, *(p for p in self.block_heads if p not in self.keywords)]
        self.keyword_pats = [Pat(p) for p in self._keyword_list]
        self.run_start_pats = [Pat(p) for p in self.run_start]
        self.waiting_pats = [Pat(p) for p in self.waiting]
        self.ready_pats = [Pat(p) for p in self.ready]
        self.benign_pats = [Pat(p) for p in self.benign]
        self.serving_pats = [Pat(p) for p in self.serving]
        self._line_rules = [r for r in self.secondary if not r.header]
        self._header_rules = [r for r in self.secondary if r.header]
        self._standalone = [s for s in self.signatures if s.standalone]
        self._peer_gate = gate([r.pat for r in self.peer])
        self.tag_peelers = [(re.compile(t[1:] if t.startswith("^") else t), t.startswith("^")) for t in self.extra_tags]
        self._gates = {
            name: gate(pats)
            for name, pats in (
                ("keywords", self.keyword_pats),
                ("run_start", self.run_start_pats),
                ("waiting", self.waiting_pats),
                ("ready", self.ready_pats),
                ("benign", self.benign_pats),
                ("serving", self.serving_pats),
                ("secondary", [r.pat for r in self._line_rules]),
                ("signatures", [x.pat for x in self.signatures]),
                ("standalone", [x.pat for x in self._standalone]),
            )
        }
        self._memo: dict[tuple[str, str], bool] = {}  # (test, line text) -> answer; see _remember
        self._memo_chars = 0

    def _open(self, name: str, text: str) -> bool:
        hit = self._memo.get((name, text))
        if hit is None:
            g = self._gates.get(name)
            hit = self._remember(name, text, g is None or g.search(text) is not None)
        return hit

    def _is(self, name: str, pats: Sequence[Pat], text: str) -> bool:
        hit = self._memo.get(("is " + name, text))
        if hit is None:
            hit = self._remember("is " + name, text, _any(pats, self._gates[name], text))
        return hit

    def _remember(self, name: str, text: str, answer: bool) -> bool:
        """Answers by line text: an analysis asks them of every line, and a watch re-analyses a host's
        buffer on every burst. Bounded: emptied at MEMO texts or MEMO_CHARS characters of them."""
        if len(self._memo) >= MEMO or self._memo_chars >= MEMO_CHARS:
            self._memo.clear()
            self._memo_chars = 0
        self._memo[(name, text)] = answer
        self._memo_chars += len(text)
        return answer

    # -- what the funnel asks for: one ERE per list --
    def keyword_ere(self) -> str:
        return ere_union(self._keyword_list)

    def run_start_ere(self) -> str:
        return ere_union(self.run_start)

    def tag_ere(self) -> str:
        return ere_union(self.tags)

    def block_head_ere(self) -> str:
        return ere_union(self.block_heads)

    def waiting_ere(self) -> str:
        return ere_union(self.waiting)

    def ready_ere(self) -> str:
        return ere_union(self.ready)

    # -- lookups the analyzer uses --
    def signature_for(self, *texts: str, frames: Callable[[str], bool] | None = None) -> Signature | None:
        """The first signature, in rules order, that matches any of the texts.

        Rules order is specificity order, so an error line saying "NCCL error"
        whose detail line says "out of memory" is an out-of-memory error.
        A signature with a ``frames`` condition counts only when ``frames``
        (the caller's test of its traceback) says it holds for that signature.
        """
        live = [t for t in texts if t and self._open("signatures", t)]
        if not live and frames is None:
            return None
        for sig in self.signatures:
            if sig.frames:
                if frames is not None and frames(sig):
                    return sig
                continue
            for text in live:
                if sig.pat.search(text) is not None:
                    return sig
        return None

    def standalone_for(self, text: str) -> Signature | None:
        """The signature that makes this line an error whatever its level, if any."""
        if not self._open("standalone", text):
            return None
        for sig in self._standalone:
            if sig.pat.search(text) is not None:
                return sig
        return None

    def secondary_for(self, text: str, header: str | None = None) -> tuple[SecondaryRule, re.Match[str]] | None:
        """The wrapper/consequence rule matching an error line (or its traceback's header)."""
        if text and self._open("secondary", text):
            for rule in self._line_rules:
                m = rule.pat.search(text)
                if m is not None:
                    return rule, m
        if header:
            for rule in self._header_rules:
                m = rule.pat.search(header)
                if m is not None:
                    return rule, m
        return None

    def peer_for(self, *texts: str) -> SecondaryRule | None:
        """The peer_caused rule (data/peer.yaml) a line matches: a transport or watchdog error
        that blames another process."""
        for text in texts:
            if not text or (self._peer_gate is not None and self._peer_gate.search(text) is None):
                continue
            for rule in self.peer:
                if rule.pat.search(text) is not None:
                    return rule
        return None

    def rule_ids(self) -> list[str]:
        """Every rule's id, as ``disable`` takes them: ``signature:NAME``, ``secondary:KIND``,
        ``peer:KIND``, ``benign:N``, ``serving:N``, ``ready:N``, ``waiting:N``, ``run_start:N``."""
        out = [f"signature:{s.name}" for s in self.signatures]
        out += [f"secondary:{r.kind}" for r in self.secondary]
        out += [f"peer:{r.kind}" for r in self.peer]
        for sec in ("benign", "serving", "ready", "waiting", "run_start"):
            out += [f"{sec}:{k}" for k in range(len(getattr(self, sec)))]
        return out

    def without(self, rule_id: str) -> Rules:
        """A copy with one rule removed (the rule-support sweep: which cases need it)."""
        sec, _, key = rule_id.partition(":")
        kw: dict[str, Any] = {f: list(getattr(self, f)) for f in RULE_FIELDS}
        if sec == "signature":
            kw["signatures"] = [s for s in self.signatures if s.name != key]
        elif sec in ("secondary", "peer"):
            kw[sec] = [r for r in getattr(self, sec) if r.kind != key]
        elif sec in ("benign", "serving", "ready", "waiting", "run_start"):
            kw[sec] = [p for k, p in enumerate(getattr(self, sec)) if str(k) != key]
        else:
            raise KeyError(rule_id)
        return Rules(**kw)

    def is_benign(self, text: str) -> bool:
        return self._is("benign", self.benign_pats, text)

    def is_run_start(self, text: str) -> bool:
        return self._is("run_start", self.run_start_pats, text)

    def is_waiting(self, text: str) -> bool:
        return self._is("waiting", self.waiting_pats, text)

    def is_ready(self, text: str) -> bool:
        return self._is("ready", self.ready_pats, text)

    def is_serving(self, text: str) -> bool:
        return self._is("serving", self.serving_pats, text)

    def is_keyword(self, text: str) -> bool:
        return self._is("keywords", self.keyword_pats, text)


def ere_union(patterns: Sequence[str]) -> str:
    """One ERE matching any of the patterns (each kept in its own group)."""
    return "|".join(f"({p})" for p in patterns)


_ERE_ESCAPABLE = set(".[]()*+?{}|^$\\/")


def check_ere(pattern: str) -> str | None:
    """Why a pattern is not portable ERE (grep -E, mawk, busybox awk, Python re), or None.

    The funnel greps with these on hosts we do not control, so anything a
    POSIX tool would read differently from Python is refused here.
    """
    if not pattern:
        return "empty pattern"
    i, n, in_bracket = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if in_bracket:
            if c == "\\":
                return "backslash inside [...] (POSIX reads it literally, Python does not)"
            if pattern.startswith("[:", i) or pattern.startswith("[=", i) or pattern.startswith("[.", i):
                return "POSIX character class [:...:] (Python re lacks it)"
            if c == "]":
                in_bracket = False
            i += 1
            continue
        if c == "\\":
            if i + 1 >= n:
                return "trailing backslash"
            nxt = pattern[i + 1]
            if nxt not in _ERE_ESCAPABLE:
                return f"\\{nxt} is not POSIX ERE (use a bracket expression such as [0-9] or [A-Za-z])"
            i += 2
            continue
        if c == "[":
            in_bracket = True
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                return "']' first in [...] (Python and POSIX differ)"
            i = j
            continue
        if c == "(" and i + 1 < n and pattern[i + 1] == "?":
            return "(?...) groups are Python-only"
        if c == "{":
            return "{n,m} intervals are missing from older mawk; repeat the atom instead"
        if c in "*+?" and i + 1 < n and pattern[i + 1] in "?+":
            return "lazy/possessive quantifiers are Python-only"
        i += 1
    if in_bracket:
        return "unterminated [...]"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"invalid regex: {exc}"
    return None


# ---------------------------------------------------------------- loading


def shipped_rules_path() -> Path:
    return Path(str(resources.files("fleetdiag") / "data" / "rules.yaml"))


def user_rules_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_path("fleetdiag")) / "rules.yaml"


def load_rules(extra: Iterable[Path | str] = (), *, user_default: bool = True, disable: Iterable[str] = ()) -> Rules:
    """Shipped rules, then the user's default file (if any), then ``extra`` files.

    Later files extend the lists; a signature or secondary rule with the name
    of an existing one replaces it (``disable: true`` removes it). New
    signatures from a later file are tried before earlier ones, so a user's
    specific rule wins over a shipped generic one. ``disable`` drops rules by
    id (``Rules.rule_ids``). Raises RulesError.
    """
    files: list[Path] = [shipped_rules_path()]
    if user_default:
        up = user_rules_path()
        if up.is_file():
            files.append(up)
    files.extend(Path(p) for p in extra)
    merged: dict[str, Any] = {k: [] for k in LIST_SECTIONS}
    merged.update(secondary=[], signatures=[])
    shipped_tags: list[str] = []
    for i, path in enumerate(files):
        _merge(merged, _read(path), str(path), first=(i == 0))
        if i == 0:
            shipped_tags = list(merged["tags"])
    extra_tags = [t for t in merged["tags"] if t not in shipped_tags]
    out = _build(merged, [str(p) for p in files], extra_tags, _peer_rules())
    for rid in disable:
        out = out.without(rid)
    return out


def _peer_rules() -> list[SecondaryRule]:
    """data/peer.yaml's peer_caused kinds: the one list of errors that blame another process,
    shared with the job analysis (fleetdiag.job)."""
    text = (resources.files("fleetdiag") / "data" / "peer.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}  # noqa: S506 (a safe loader)
    return [
        SecondaryRule(str(r["kind"]), str(r["pattern"]), role=PEER)
        for r in data.get("peer_caused") or []
        if isinstance(r, dict) and "kind" in r and "pattern" in r
    ]


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RulesError(f"{path}: cannot read rules file: {exc.strerror or exc}") from None
    try:  # libyaml when present: the shipped rules parse in a tenth of the time
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        data = None
    else:
        text = ""
    try:
        if text:  # the pure loader again, for its message and line
            data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise RulesError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RulesError(f"{path}: the top level must be a mapping of sections")
    return data


_KNOWN = set(LIST_SECTIONS) | {"version", "secondary", "signatures"}


def _merge(merged: dict[str, Any], data: dict[str, Any], src: str, first: bool) -> None:
    unknown = set(data) - _KNOWN
    if unknown:
        raise RulesError(f"{src}: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KNOWN))}")
    for key in LIST_SECTIONS:
        items = data.get(key) or []
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise RulesError(f"{src}: {key}: must be a list of pattern strings")
        for idx, pat in enumerate(items):
            if key in ERE_SECTIONS:
                why = check_ere(pat)
                if why:
                    raise RulesError(f"{src}: {key}[{idx}] {pat!r}: {why}")
            else:
                _check_py(pat, f"{src}: {key}[{idx}]")
            if pat not in merged[key]:
                merged[key].append(pat)
    _merge_named(
        merged["secondary"],
        data.get("secondary") or [],
        src,
        "secondary",
        "kind",
        ("kind", "pattern"),
        ("kind", "pattern", "header", "role", "disable"),
        first,
    )
    _merge_named(
        merged["signatures"],
        data.get("signatures") or [],
        src,
        "signatures",
        "name",
        ("name", "pattern"),
        (
            "name",
            "pattern",
            "category",
            "hint",
            "hint_facts",
            "standalone",
            "weak",
            "role",
            "frames",
            "detailed",
            "disable",
        ),
        first,
    )


def _merge_named(
    target: list[dict[str, Any]],
    items: Any,
    src: str,
    section: str,
    key: str,
    required: tuple[str, ...],
    allowed: tuple[str, ...],
    first: bool,
) -> None:
    if not isinstance(items, list):
        raise RulesError(f"{src}: {section}: must be a list")
    new: list[dict[str, Any]] = []
    for idx, item in enumerate(items):
        where = f"{src}: {section}[{idx}]"
        if isinstance(item, dict) and item.get("disable") and key in item:
            target[:] = [t for t in target if t[key] != item[key]]
            continue
        _need(item, where, required, allowed)
        _check_py(item["pattern"], where)
        if section == "signatures":
            cat = item.get("category", "other")
            if cat not in CATEGORIES:
                raise RulesError(f"{where}: category {cat!r} is not one of {', '.join(CATEGORIES)}")
            hf = item.get("hint_facts") or []
            if not isinstance(hf, list) or not all(isinstance(h, (str, dict)) for h in hf):
                raise RulesError(f"{where}: hint_facts must be a list of strings or {{text, if}} mappings")
        if section == "secondary" and not isinstance(item.get("header", False), bool):
            raise RulesError(f"{where}: header must be true or false")
        if section == "signatures" and item.get("frames", "") not in FRAME_CONDITIONS:
            raise RulesError(f"{where}: frames must be one of {', '.join(c for c in FRAME_CONDITIONS if c)}")
        if "role" in item and item["role"] not in ROLES:
            raise RulesError(f"{where}: role {item['role']!r} is not one of {', '.join(ROLES)}")
        for i, old in enumerate(target):
            if old[key] == item[key]:
                target[i] = dict(item)
                break
        else:
            new.append(dict(item))
    if first:
        target.extend(new)
    else:
        target[:0] = new


def _need(item: Any, where: str, required: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    if not isinstance(item, dict):
        raise RulesError(f"{where}: must be a mapping")
    missing = [k for k in required if k not in item]
    if missing:
        raise RulesError(f"{where}: missing {', '.join(missing)}")
    extra = {str(k) for k in item} - set(allowed)
    if extra:
        raise RulesError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
    if not isinstance(item["pattern"], str):
        raise RulesError(f"{where}: pattern must be a string")


def _check_py(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise RulesError(f"{where}: invalid regex {pattern!r}: {exc}") from None


def _build(
    merged: dict[str, Any], sources: list[str], extra_tags: list[str], peer: list[SecondaryRule] | None = None
) -> Rules:
    sigs = []
    for s in merged["signatures"]:
        hf = [h if isinstance(h, dict) else {"text": h} for h in (s.get("hint_facts") or [])]
        sigs.append(
            Signature(
                name=str(s["name"]),
                pattern=s["pattern"],
                category=s.get("category", "other"),
                hint=s.get("hint"),
                hint_facts=hf,
                standalone=bool(s.get("standalone")),
                weak=bool(s.get("weak")),
                detailed=bool(s.get("detailed")),
                role=str(s.get("role", CAUSE)),
                frames=str(s.get("frames", "")),
            )
        )
    return Rules(
        keywords=merged["keywords"],
        run_start=merged["run_start"],
        tags=merged["tags"],
        block_heads=merged["block_heads"],
        waiting=merged["waiting"],
        ready=merged["ready"],
        benign=merged["benign"],
        serving=merged["serving"],
        secondary=[
            SecondaryRule(str(s["kind"]), s["pattern"], bool(s.get("header", False)), str(s.get("role", CONSEQUENCE)))
            for s in merged["secondary"]
        ],
        signatures=sigs,
        peer=list(peer or []),
        sources=sources,
        extra_tags=extra_tags,
    )


def user_file_key(path: Path) -> tuple[str, int] | None:
    """A user's rules file as a cache key: its path and mtime, so a long ``watch`` sees an edit; None when absent."""
    try:
        return (str(path), os.stat(path).st_mtime_ns) if path.is_file() else None
    except OSError:
        return None


@lru_cache(maxsize=4)
def _cached(user_key: tuple[str, int] | None) -> Rules:
    return load_rules(user_default=user_key is not None)


def default_rules() -> Rules:
    """Rules for ``analyze(rules=None)``: shipped + the user's file, cached by its mtime.

    A broken user file must not make analysis fail, so it falls back to the
    shipped rules alone (the CLI's load_rules() reports the error).
    """
    key = user_file_key(user_rules_path())
    try:
        return _cached(key)
    except RulesError:
        return _cached(None)
