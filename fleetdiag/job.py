"""A job across hosts: which node broke it.

A multi-node job fails on every node at once and most nodes only show a
consequence (a peer's NCCL error, a watchdog timeout, the agent's SIGTERM).
This module takes one ``HostEvidence`` per failed host and names, per job,
the host and rank whose own failure started it. Pure: no I/O; the rules come
from fleetdiag.jobrules (data/peer.yaml).

Order of evidence: a local-origin failure beats a peer-caused one even when
the peer-caused one is stamped earlier; among local-origin failures the
earliest by corrected time wins; without any, the straggler that others'
watchdog evidence leaves out, or the rank a launcher reports killed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from .jobrules import JobRules, default_job_rules

WINDOW_S = 120.0  # failures of one job fall within this many seconds (after clock correction)
LOOPBACK = re.compile(r"^(?:localhost|127\.\d+\.\d+\.\d+|::1|0\.0\.0\.0)$")


# ---------------------------------------------------------------- clocks


def clock_offset(local_receive: float, rtt: float, remote_now: float) -> float:
    """Seconds to add to a remote clock reading to get the local clock.

    The remote clock was read about half a round trip before its answer
    arrived here: offset = local receive time − RTT/2 − remote time.
    """
    return local_receive - rtt / 2.0 - remote_now


_T_ISO = re.compile(
    r"(?<!\d)(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T _](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d(?:[.,]\d+)?)"
    r"(?P<z>Z|[+-]\d\d:?\d\d)?"
)
_T_GLOG = re.compile(r"(?<![\d-])(?P<mo>\d{1,2}?)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d(?:\.\d+)?)")
_T_MD = re.compile(r"(?<![\d-])(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d(?:[.,]\d+)?)")
_T_GLOG_LINE = re.compile(r"(?:^|[\[\]:\s])[IWEF](?P<t>\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?)")


def _zone(host_zone: Any) -> tzinfo:
    if isinstance(host_zone, tzinfo):
        return host_zone
    if isinstance(host_zone, (int, float)):
        return timezone(timedelta(seconds=float(host_zone)))
    if isinstance(host_zone, str) and host_zone:
        m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", host_zone)
        if m:
            sec = (int(m.group(2)) * 3600 + int(m.group(3)) * 60) * (1 if m.group(1) == "+" else -1)
            return timezone(timedelta(seconds=sec))
        try:
            from zoneinfo import ZoneInfo

            return ZoneInfo(host_zone)
        except (KeyError, ValueError, OSError):  # unknown zone name: UTC, as when no zone is known
            return timezone.utc
    return timezone.utc


def _frac(s: str) -> tuple[int, float]:
    v = float(s.replace(",", "."))
    return int(v), v - int(v)


def normalise(
    raw_time: str | None, host_zone: Any = None, mtime: float | None = None, offset: float = 0.0
) -> float | None:
    """A framework timestamp as seconds since the epoch on the local clock, or None.

    Accepts ISO (``2024-11-20 14:37:16[.f][Z|±hh:mm]``, torchrun's
    ``2024-11-20_14:37:16``), glog ``1120 14:37:16.123`` (also inside
    ``I1120 …``/``[rank0]:[W1120 …]``, and ``626 06:24:44.9`` for June 26),
    and vLLM/Ray ``11-20 14:37:16``. A time without zone is read in
    ``host_zone`` (IANA name, ``+hh:mm``, seconds east of UTC or a tzinfo;
    UTC when unknown); one without year takes the year that puts it nearest
    the log's ``mtime``. ``offset`` is the host's ``clock_offset``.
    """
    if not raw_time or not isinstance(raw_time, str):
        return None
    tz = _zone(host_zone)
    m = _T_ISO.search(raw_time)
    year: int | None = None
    if m:
        year = int(m.group("y"))
        z = m.group("z")
        if z:
            tz = timezone.utc if z == "Z" else _zone(z)
    else:
        g = _T_GLOG_LINE.search(raw_time)
        m = _T_MD.search(raw_time) or (_T_GLOG.search(g.group("t")) if g else None) or _T_GLOG.search(raw_time)
    if not m:
        return None
    try:
        mo, d, h, mi = (int(m.group(k)) for k in ("mo", "d", "h", "mi"))
        sec, frac = _frac(m.group("s"))
    except (ValueError, TypeError):
        return None

    def at(y: int) -> float | None:
        try:
            return datetime(y, mo, d, h, mi, min(sec, 59), tzinfo=tz).timestamp() + frac
        except ValueError:
            return None

    if year is not None:
        t = at(year)
    else:
        ref = mtime if mtime is not None else datetime.now(timezone.utc).timestamp()
        y0 = datetime.fromtimestamp(ref, tz).year
        cands = [c for c in (at(y) for y in (y0 - 1, y0, y0 + 1)) if c is not None]
        t = min(cands, key=lambda c: abs(c - ref)) if cands else None
    return None if t is None else t + (offset or 0.0)


# ---------------------------------------------------------------- input and output records


@dataclass
class HostEvidence:
    """What one failed host says about the job, in the shape the job analysis needs.

    ``lines`` are the host's log lines as read (error lines and their
    neighbours at least), used for times, ranks and watchdog evidence.
    """

    host: str
    line: str  # the decisive line, raw
    message: str = ""
    kind: str = ""  # filled by classify(): a peer-caused kind, or "" for local-origin
    process: str | None = None
    rank: int | None = None
    time: str | None = None  # the decisive line's raw timestamp, when it has one
    fingerprint: str = ""
    traceback: list[str] = field(default_factory=list)
    pos: int | None = None
    lineno: int | None = None
    address: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    offset: float = 0.0  # clock_offset of the host
    rtt: float | None = None
    mtime: float | None = None
    zone: Any = None
    lines: list[str] = field(default_factory=list)


@dataclass
class RootCause:
    """The node that broke a job, and the hosts that failed because of it."""

    host: str
    rank: int | None
    line: str
    time: str | None  # ISO 8601, UTC, on the local (corrected) clock
    fingerprint: str
    affected: list[str]
    why: str
    consequences: list[tuple[str, str, float | None]] = field(default_factory=list)  # host, kind, seconds after root

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "line": self.line,
            "time": self.time,
            "fingerprint": self.fingerprint,
            "affected": list(self.affected),
            "why": self.why,
        }


def evidence_from_result(
    result: Any,
    *,
    lines: Sequence[str] | None = None,
    offset: float | None = None,
    rtt: float | None = None,
    mtime: float | None = None,
    zone: Any = None,
) -> HostEvidence | None:
    """HostEvidence from a ``fleetdiag.records.HostResult`` (None when it has no decisive error).

    Clock inputs missing here are read from ``result.facts["clock"]``
    (``{offset}`` or ``{local_receive, remote_now}``), ``facts["zone"]`` and
    ``timing.rtt_ms`` when present.
    """
    dec = getattr(result, "decisive", None)
    if dec is None:
        return None
    facts = dict(getattr(result, "facts", None) or {})
    clock = facts.get("clock") if isinstance(facts.get("clock"), dict) else {}
    timing = getattr(result, "timing", None)
    if rtt is None and timing is not None and getattr(timing, "rtt_ms", None) is not None:
        rtt = timing.rtt_ms / 1000.0
    if offset is None:
        if "offset" in clock:
            offset = float(clock["offset"])
        elif "local_receive" in clock and "remote_now" in clock:
            offset = clock_offset(float(clock["local_receive"]), rtt or 0.0, float(clock["remote_now"]))
    if mtime is None:
        mtime = clock.get("mtime") or facts.get("log_mtime")
    kept = facts.get("job") if isinstance(facts.get("job"), dict) else {}
    if lines is None and isinstance(kept.get("lines"), list):
        lines = [str(x) for x in kept["lines"]]
    return HostEvidence(
        host=result.host,
        line=dec.line,
        message=dec.message,
        process=dec.process,
        rank=dec.rank,
        time=dec.time,
        fingerprint=dec.fingerprint,
        traceback=list(dec.traceback or []),
        pos=dec.pos,
        lineno=dec.lineno,
        address=getattr(result, "address", None),
        facts=facts,
        offset=offset or 0.0,
        rtt=rtt,
        mtime=mtime,
        zone=zone if zone is not None else facts.get("zone"),
        lines=list(lines) if lines is not None else list(dec.traceback or []) or [dec.line],
    )


# ---------------------------------------------------------------- classification and per-host facts


def classify(ev: HostEvidence, rules: JobRules) -> str:
    """The peer-caused kind of the host's decisive error, or "" when it is local-origin."""
    texts = [ev.line, ev.message] + ev.traceback[-12:]
    for r in rules.peer_caused:
        if any(r.regex.search(t) for t in texts if t):
            return r.key
    return ""


def _stamp(text: str) -> str | None:
    m = _T_ISO.search(text) or _T_MD.search(text) or _T_GLOG_LINE.search(text)
    if m is None:
        return None
    return m.group("t") if "t" in m.re.groupindex else m.group(0)


def event_time(ev: HostEvidence) -> tuple[float | None, str]:
    """Corrected time of the decisive error, and how it was found.

    A traceback line carries no stamp: the next stamped line after it (the
    process's exit) bounds it, else the last stamped line before it.
    """
    t = normalise(ev.time, ev.zone, ev.mtime, ev.offset)
    if t is not None:
        return t, "its own timestamp"
    idx = _find(ev)
    if idx is not None:
        for j in range(idx + 1, len(ev.lines)):
            s = _stamp(ev.lines[j])
            if s and (t := normalise(s, ev.zone, ev.mtime, ev.offset)) is not None:
                return t, "the next timestamped line (its own has none)"
        for j in range(idx - 1, -1, -1):
            s = _stamp(ev.lines[j])
            if s and (t := normalise(s, ev.zone, ev.mtime, ev.offset)) is not None:
                return t, "the last timestamped line before it (its own has none)"
    return None, "no timestamp"


def _find(ev: HostEvidence) -> int | None:
    if ev.lineno is not None and 0 < ev.lineno <= len(ev.lines) and ev.lines[ev.lineno - 1] == ev.line:
        return ev.lineno - 1
    for i, ln in enumerate(ev.lines):
        if ln == ev.line:
            return i
    return None


# [rank1] (torch's prefix), rank 1/2, rank 1 in world size 2, [Rank 1], and a script's own "rank 1: " at a line's start.
_RANK_SEEN = re.compile(
    r"\[rank(\d+)\]|\brank (\d+)/(\d+)\b|\brank (\d+) in world size (\d+)|\[Rank (\d+)\]|^\s*[Rr]ank (\d+): "
)
_WORLD = re.compile(r"\brank \d+/(\d+)\b|\bin world size (\d+)|\bWORLD_SIZE=(\d+)|--nnodes[= ](\d+)")


def ranks_of(ev: HostEvidence) -> tuple[set[int], int | None]:
    """The ranks this host's log speaks for, and the world size when it says so."""
    ranks: set[int] = set()
    world: int | None = None
    for ln in ev.lines:
        # Both patterns need one of these words: a substring test skips the regexes on most lines.
        if (
            "rank" not in ln
            and "Rank" not in ln
            and "world size" not in ln
            and "WORLD_SIZE" not in ln
            and ("--nnodes" not in ln)
        ):
            continue
        for m in _RANK_SEEN.finditer(ln):
            for g in (m.group(1), m.group(2), m.group(4), m.group(6), m.group(7)):
                if g is not None:
                    ranks.add(int(g))
        wm = _WORLD.search(ln)
        if wm and world is None and (wm.group(1) or wm.group(2) or wm.group(3)):
            world = int(wm.group(1) or wm.group(2) or wm.group(3))
    if ev.rank is not None and not ranks:
        ranks.add(ev.rank)
    return ranks, world


def endpoints(ev: HostEvidence, rules: JobRules) -> set[str]:
    """The rendezvous endpoints this host names (command line, environment, log); loopback ones do not count."""
    texts: list[str] = []
    f = ev.facts
    serving = f.get("serving") if isinstance(f.get("serving"), dict) else {}
    for v in (f.get("cmdline"), serving.get("cmdline"), f.get("command")):
        if isinstance(v, str):
            texts.append(v)
    for env in (f.get("environ"), f.get("env"), serving.get("env")):
        if isinstance(env, dict):
            texts.append(" ".join(f"{k}={v}" for k, v in env.items()))
    texts.extend(ln for ln in ev.lines if "addr" in ln or "endpoint" in ln or "address" in ln or "MASTER" in ln)
    out: set[str] = set()
    for t in texts:
        for r in rules.endpoints:
            for m in r.regex.finditer(t):
                addr = m.group("addr").strip("'\"[]")
                if LOOPBACK.match(addr):
                    continue
                port = m.groupdict().get("port")
                out.add(f"{addr}:{port}" if port else addr)
    return out


_ERE_CLASS = {"s": "[:space:]", "S": None, "d": "0-9", "w": "[:alnum:]_"}


def endpoint_ere(rules: JobRules | None = None) -> str:
    """One POSIX ERE that every line an ``endpoints`` rule can match also matches (a prefilter).

    The funnel greps the head of the latest run with it (torchrun, vLLM and Ray print the
    rendezvous near the start, which the end-of-log passes do not bring back); the rules
    themselves, in Python ``re``, decide afterwards. Word boundaries are dropped (wider, never
    narrower); ``\\s``/``\\d``/``\\w`` become POSIX classes. "" when there are no rules.
    """
    rules = rules or default_job_rules()
    return "|".join(f"({_to_ere(r.regex.pattern)})" for r in rules.endpoints)


def _to_ere(pat: str) -> str:
    out: list[str] = []
    i, inside = 0, False
    while i < len(pat):
        c = pat[i]
        if c == "\\" and i + 1 < len(pat):
            n = pat[i + 1]
            i += 2
            if n == "b":
                continue
            if n in "sdw":
                out.append(_ERE_CLASS[n] if inside else f"[{_ERE_CLASS[n]}]")
            elif n == "S":
                out.append("[^[:space:]]" if not inside else "[:graph:]")
            else:
                out.append("\\" + n if n in ".[]()*+?{}|^$\\/" else n)
            continue
        if c == "(" and pat.startswith("(?P<", i):
            i = pat.index(">", i) + 1
            out.append("(")
            continue
        if c == "(" and pat.startswith("(?:", i):
            i += 3
            out.append("(")
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside and out and out[-1] not in ("[", "[^"):
            inside = False
        out.append(c)
        if c == "^" and inside and out[-2] == "[":
            out[-2:] = ["[^"]
        i += 1
    return "".join(out)


def _collective(ev: HostEvidence, rules: JobRules) -> list[tuple[int, int | None]]:
    """(SeqNum, rank) pairs from the host's watchdog evidence."""
    out: list[tuple[int, int | None]] = []
    for ln in ev.lines:
        for r in rules.collective:
            m = r.regex.search(ln)
            if m:
                rk = m.groupdict().get("rank")
                out.append((int(m.group("seq")), int(rk) if rk is not None else None))
    return out


def _killed(ev: HostEvidence, rules: JobRules) -> tuple[str, int | None] | None:
    for ln in ev.lines:
        for r in rules.killed:
            m = r.regex.search(ln)
            if m:
                rk = m.groupdict().get("rank")
                return ln, int(rk) if rk is not None else None
    return None


def _keys(ev: HostEvidence) -> set[str]:
    """The names another host's error could call this one by (host name, address)."""
    # a name short and wordlike ("a", "gpu") would match ordinary words: only distinctive names count
    return {
        k for k in (ev.host, ev.address) if k and not LOOPBACK.match(k) and (len(k) >= 4 and re.search(r"[\d.-]", k))
    }


_WORDISH = re.compile(r"[\w.-]+")
_PLAIN_KEY = re.compile(r"[\w.-]+")


class _Text:
    """One host's error text, with the names it could mention as a set (a lookup per other host,
    not a regex pass over the text: the membership and root steps ask for every pair)."""

    def __init__(self, ev: HostEvidence) -> None:
        self.text = "\n".join([ev.line, ev.message] + ev.traceback + ev.lines)
        words: set[str] = set()
        for w in _WORDISH.findall(self.text):
            words.add(w)
            i = w.find(".")
            while i > 0:  # "node1.cluster" and "node1." also name node1, as the regex boundary allows
                words.add(w[:i])
                i = w.find(".", i + 1)
        self.words = words

    def names(self, keys: set[str]) -> bool:
        for k in keys:
            if _PLAIN_KEY.fullmatch(k):
                if k in self.words:
                    return True
            elif re.search(r"(?<![\w.-])" + re.escape(k) + r"(?![\w-])", self.text):
                return True
        return False


def _names(ev: HostEvidence, other: HostEvidence) -> bool:
    """Whether ``ev``'s error lines name ``other`` (its host name or address)."""
    keys = _keys(other)
    return bool(keys) and _Text(ev).names(keys)


# ---------------------------------------------------------------- membership


@dataclass
class _Host:
    ev: HostEvidence
    kind: str
    t: float | None
    t_how: str
    eps: set[str]
    keys: set[str] = field(default_factory=set)
    text: _Text | None = None

    def names(self, other: _Host) -> bool:
        """Whether this host's error lines name ``other``."""
        if not other.keys:
            return False
        if self.text is None:
            self.text = _Text(self.ev)
        return self.text.names(other.keys)


def groups(hosts: list[_Host], window: float = WINDOW_S) -> list[list[_Host]]:
    """Hosts that form one job.

    Hosts naming the same rendezvous endpoint are one job. Hosts with no
    endpoint join by their failures: within ``window`` seconds (corrected)
    and linked by a peer-caused error that names the other host, or, when
    the error names no host at all, points at "a peer" among the failures
    of that window. Hosts with different endpoints never join.
    """
    n = len(hosts)
    parent = list(range(n))
    for h in hosts:
        if not h.keys:
            h.keys = _keys(h.ev)
    names_any = [any(o is not h and h.names(o) for o in hosts) if h.kind else False for h in hosts]

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    for i in range(n):
        for j in range(i + 1, n):
            a, b = hosts[i], hosts[j]
            if a.eps and b.eps:
                if a.eps & b.eps:
                    union(i, j)
                continue
            if a.t is None or b.t is None or abs(a.t - b.t) > window:
                continue
            if not (a.kind or b.kind):
                continue  # two local-origin failures at the same time are two stories unless facts say otherwise
            ab = a.kind and (a.names(b) or not names_any[i])
            ba = b.kind and (b.names(a) or not names_any[j])
            if ab or ba:
                union(i, j)
    out: dict[int, list[_Host]] = {}
    for i in range(n):
        out.setdefault(find(i), []).append(hosts[i])
    return list(out.values())


# ---------------------------------------------------------------- the root cause


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _delta(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else round(t - t0, 3)


def _straggler(group: list[_Host], rules: JobRules) -> tuple[_Host, int | None, str] | None:
    """The host whose rank never reached the collective that others' watchdog names."""
    waiting: dict[int, set[int]] = {}
    reporters: set[str] = set()
    for h in group:
        for seq, rk in _collective(h.ev, rules):
            waiting.setdefault(seq, set())
            if rk is not None:
                waiting[seq].add(rk)
            reporters.add(h.ev.host)
    if not waiting:
        return None
    seq = min(waiting)
    silent = [h for h in group if h.ev.host not in reporters]
    if len(silent) != 1:
        return None
    h = silent[0]
    ranks, _ = ranks_of(h.ev)
    world = max((w for g in group if (w := ranks_of(g.ev)[1]) is not None), default=None)
    missing = ranks - waiting[seq]
    if not missing and world is not None:
        seen = set().union(*(ranks_of(g.ev)[0] for g in group))
        missing = set(range(world)) - waiting[seq] - (seen - ranks)
    rank = min(missing) if len(missing) == 1 else (min(ranks) if len(ranks) == 1 else None)
    others = sorted(reporters)
    why = (
        f"hang: {', '.join(others)} waited in collective SeqNum={seq} until the watchdog fired "
        f"(ranks {', '.join(map(str, sorted(waiting[seq]))) or '?'}); {h.ev.host}"
        f"{f' (rank {rank})' if rank is not None else ''} shows no collective error of its own: it never reached it"
    )
    return h, rank, why


def _root(group: list[_Host], rules: JobRules) -> tuple[_Host, int | None, str, str] | None:
    """(root host, rank, line, why) for one job, or None when the evidence names none."""
    local = [h for h in group if not h.kind]
    if local:
        local.sort(key=lambda h: (h.t is None, h.t or 0.0))
        best = local[0]
        parts = [f"local-origin error on {best.ev.host}, time from {best.t_how}"]
        peer = [h for h in group if h.kind]
        if peer:
            early = [h.ev.host for h in peer if h.t is not None and best.t is not None and h.t < best.t]
            parts.append(
                f"{len(peer)} other host{'s show' if len(peer) != 1 else ' shows'} only peer-caused errors"
                + (f" ({', '.join(early)} stamped earlier, demoted as a consequence)" if early else "")
            )
        if len(local) > 1:
            parts.append(f"earliest of {len(local)} local-origin failures by corrected time")
        return best, best.ev.rank, best.ev.line, "; ".join(parts)
    st = _straggler(group, rules)
    if st is not None:
        h, rank, why = st
        return h, rank, h.ev.line, why
    for h in sorted(group, key=lambda h: (h.t is None, h.t or 0.0)):
        k = _killed(h.ev, rules)
        if k is not None:
            line, rank = k
            return (
                h,
                rank if rank is not None else h.ev.rank,
                line,
                (
                    f"the launcher on {h.ev.host} reports its rank killed (SIGKILL) with no traceback of its own; "
                    "the other hosts show only consequences"
                ),
            )
    named = [h for h in group if sum(1 for o in group if o is not h and o.names(h)) == len(group) - 1]
    if len(named) == 1:
        h = named[0]
        return (
            h,
            h.ev.rank,
            h.ev.line,
            (f"every other host's peer-caused error names {h.ev.host}; it has no local-origin error in the lines read"),
        )
    return None


def root_causes(results: Sequence[Any], *, rules: JobRules | None = None, window: float = WINDOW_S) -> list[RootCause]:
    """One RootCause per job among the failed hosts; [] when no job-level cause can be named.

    ``results`` are HostEvidence or HostResult records (a HostResult without
    a decisive error is ignored). A job with a single failed host makes no
    job-level claim: its own card says it all.
    """
    rules = rules or default_job_rules()
    hosts: list[_Host] = []
    for r in results:
        ev = r if isinstance(r, HostEvidence) else evidence_from_result(r)
        if ev is None:
            continue
        ev.kind = classify(ev, rules)
        t, how = event_time(ev)
        hosts.append(_Host(ev, ev.kind, t, how, endpoints(ev, rules)))
    out: list[RootCause] = []
    for g in groups(hosts, window):
        if len(g) < 2:
            continue
        found = _root(g, rules)
        if found is None:
            continue
        h, rank, line, why = found
        others = sorted((o for o in g if o is not h), key=lambda o: o.ev.host)
        cons = [(o.ev.host, o.kind or "local-origin error", _delta(o.t, h.t)) for o in others]
        out.append(
            RootCause(
                host=h.ev.host,
                rank=rank,
                line=line,
                time=_iso(h.t),
                fingerprint=h.ev.fingerprint,
                affected=[o.ev.host for o in others],
                why=why,
                consequences=cons,
            )
        )
    out.sort(key=lambda rc: (rc.time is None, rc.time or "", rc.host))
    return out


def summary_line(rc: RootCause, width: int = 60) -> str:
    """The fleet view's opening line for a job."""
    msg = rc.line.strip()
    for prefix in re.findall(r"^(?:\[[^\]]*\]:?\s*)+", msg)[:1]:
        msg = msg[len(prefix) :]
    if len(msg) > width:
        msg = msg[:width].rstrip() + " …"
    head = f"job root cause: {rc.host}" + (f" · rank {rc.rank}" if rc.rank is not None else "") + f" · {msg}"
    if not rc.consequences:
        return head
    n = len(rc.consequences)
    bits = [consequence_text(host, kind, d) for host, kind, d in rc.consequences]
    return head + f" · {n} other host{'s' if n != 1 else ''} failed as a consequence: " + ", ".join(bits)


def consequence_text(host: str, kind: str, delay: float | None) -> str:
    """``node0 (NCCL remote error, 30.0 s later)``: a victim and when its error came, against the root's.

    Words, not a sign: a victim's line is often stamped *before* the root's (the root's traceback has no
    stamp of its own and takes its process's exit time), and "-0.4 s" read as a typo. Such a victim says
    ``stamped 0.4 s earlier``: its kind, not its time, made it a consequence.
    """
    if delay is None:
        return f"{host} ({kind})"
    if abs(delay) < 0.05:
        when = "at the same time"
    elif delay > 0:
        when = f"{delay:.1f} s later"
    else:
        when = f"stamped {-delay:.1f} s earlier"
    return f"{host} ({kind}, {when})"


# ---------------------------------------------------------------- wiring: what a probe keeps, what a report says

CLOCK_DEADBAND_S = 1.0  # offsets this small are within the measurement's own error: not applied
KEEP_LINES = 80  # at most this many log lines kept per host for the job analysis
KEEP_WIDTH = 1000  # each clipped to this many characters
_PEERISH = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|<\d+>|\bpeer\b|\bremote\b", re.IGNORECASE)
_CLOCK = re.compile(r"^\s*(?P<s>\d+(?:\.\d+)?)\S*(?:\s+(?P<z>[+-]\d\d:?\d\d))?")


def clock_sample(text: str | None, local_receive: float, rtt: float | None) -> dict[str, Any] | None:
    """``facts["clock"]`` from the remote ``date '+%s.%N %z'`` read last in the funnel.

    ``offset`` is what is applied to the host's log times: the measured one,
    or 0 when it is smaller than the measurement's own error (RTT and the
    1 s resolution of a ``date`` without ``%N``), so hosts in sync are not
    reordered by noise.
    """
    m = _CLOCK.match(text or "")
    if not m:
        return None
    remote_now = float(m.group("s"))
    measured = clock_offset(local_receive, rtt or 0.0, remote_now)
    noise = max(CLOCK_DEADBAND_S, rtt or 0.0)
    return {
        "local_receive": round(local_receive, 3),
        "remote_now": remote_now,
        "rtt": rtt,
        "measured": round(measured, 3),
        "offset": 0.0 if abs(measured) <= noise else round(measured, 3),
        **({"zone": m.group("z")} if m.group("z") else {}),
    }


def keep_lines(ev: HostEvidence, rules: JobRules | None = None, cap: int = KEEP_LINES) -> list[str]:
    """The few log lines the job analysis reads, in log order: what a probe keeps in ``facts["job"]``.

    The decisive line and the stamped lines that bound it, watchdog and
    launcher lines, the first line showing each rank and the world size,
    rendezvous endpoints, and peer-caused or peer-naming lines. Taken from
    the funnel's lines, they give the same root causes as the whole set.
    """
    rules = rules or default_job_rules()
    lines = ev.lines
    must: set[int] = set()
    extra: list[int] = []
    idx = _find(ev)
    if idx is not None:
        must.add(idx)
        nxt = next((j for j in range(idx + 1, len(lines)) if _stamp(lines[j])), None)
        prv = next((j for j in range(idx - 1, -1, -1) if _stamp(lines[j])), None)
        must.update(j for j in (nxt, prv) if j is not None)
    ranks: set[int] = set()
    world = False
    eps: set[str] = set()
    seen_coll: set[tuple[int, int | None]] = set()
    killed = False
    for i, ln in enumerate(lines):
        one = HostEvidence(host=ev.host, line="", lines=[ln])
        coll = [c for c in _collective(one, rules) if c not in seen_coll]
        if coll:
            seen_coll.update(coll)
            must.add(i)
            continue
        if not killed and _killed(one, rules) is not None:
            killed = True
            must.add(i)
            continue
        r, w = ranks_of(one)
        if (r - ranks) or (w is not None and not world):
            ranks |= r
            world = world or w is not None
            must.add(i)
            continue
        e = endpoints(one, rules) - eps
        if e:
            eps |= e
            must.add(i)
            continue
        if rules.any_peer_caused(ln) or _PEERISH.search(ln):
            extra.append(i)
    chosen = sorted(must)[:cap]
    room = cap - len(chosen)
    seen_text = {lines[i] for i in chosen}
    for i in extra:
        if room <= 0:
            break
        if lines[i] not in seen_text:
            seen_text.add(lines[i])
            chosen.append(i)
            room -= 1
    return [_clip(lines[i]) for i in sorted(chosen)]


def _clip(line: str) -> str:
    return line if len(line) <= KEEP_WIDTH else line[:KEEP_WIDTH] + " …"


def job_facts(result: Any, lines: Sequence[str], rules: JobRules | None = None) -> dict[str, Any] | None:
    """``facts["job"]`` for a host with a decisive error: the lines the job analysis needs
    (so sweeps, reports and the history can name a job's root cause later), and the
    error's peer-caused kind ("" when it is local-origin)."""
    ev = evidence_from_result(result, lines=list(lines))
    if ev is None:
        return None
    rules = rules or default_job_rules()
    return {"kind": classify(ev, rules), "lines": keep_lines(ev, rules)}


def annotate(results: Sequence[Any], rcs: Sequence[RootCause]) -> None:
    """Mark each host of a job in its ``facts["job"]``: the root (``role: root``, ``rank``,
    ``affected``, ``why``) or a consequence (``role: consequence``, ``root``): what the
    history keeps as the job's one incident and its affected hosts."""
    by_host = {getattr(r, "host", None): r for r in results}
    for r in results:  # a previous analysis's marks (watch re-analyses the same records)
        j = (getattr(r, "facts", None) or {}).get("job")
        if isinstance(j, dict):
            for k in _ROLE_KEYS:
                j.pop(k, None)
    for rc in rcs:
        root = by_host.get(rc.host)
        if root is not None:
            root.facts.setdefault("job", {}).update(
                role="root", rank=rc.rank, affected=list(rc.affected), why=rc.why, time=rc.time
            )
        for h in rc.affected:
            v = by_host.get(h)
            if v is not None:
                v.facts.setdefault("job", {}).update(role="consequence", root=rc.host)


_ROLE_KEYS = ("role", "root", "rank", "affected", "why", "time")


def report(results: Sequence[Any]) -> list[dict[str, Any]]:
    """``root_causes`` for a JSON report; marks the hosts (``annotate``) on the way."""
    rcs = root_causes(results)
    annotate(results, rcs)
    return [rc.to_json() for rc in rcs]
