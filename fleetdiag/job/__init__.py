"""A job across hosts: which node broke it.

A multi-node job fails on every node at once and most nodes only show a
consequence (a peer's NCCL error, a watchdog timeout, the agent's SIGTERM).
This module takes one ``HostEvidence`` per failed host and names, per job,
the host and rank whose own failure started it. Pure: no I/O; the rules come
from fleetdiag.job.rules (data/peer.yaml).

Order of evidence: a local-origin failure beats a peer-caused one even when
the peer-caused one is stamped earlier; among local-origin failures the
earliest by corrected time wins; without any, the straggler that others'
watchdog evidence leaves out, or the rank a launcher reports killed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import timestamps
from ..records import JobRole
from ..units import signal_name
from .rules import JobRules, default_job_rules

WINDOW_S = 120.0  # failures of one job fall within this many seconds (after clock correction)
LOOPBACK = re.compile(r"^(?:localhost|127\.\d+\.\d+\.\d+|::1|0\.0\.0\.0)$")


# ---------------------------------------------------------------- clocks


def clock_offset(local_receive: float, rtt: float, remote_now: float) -> float:
    """Seconds to add to a remote clock reading to get the local clock.

    The remote clock was read about half a round trip before its answer
    arrived here: offset = local receive time − RTT/2 − remote time.
    """
    return local_receive - rtt / 2.0 - remote_now


def normalise(
    raw_time: str | None, host_zone: Any = None, mtime: float | None = None, offset: float = 0.0
) -> float | None:
    """A framework timestamp as seconds since the epoch on the local clock, or None.

    Read by ``timestamps.epoch`` (its year rule against the log's ``mtime``, its zone rule with
    ``host_zone``); ``offset`` is the host's ``clock_offset``.
    """
    t = timestamps.epoch(raw_time, host_zone, mtime)
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
    signal: str | None = None  # filled by own_line(): the rank died by this signal with no error of its own
    pid: int | None = None  # the rank's pid, from its launcher's report
    chosen: str = ""  # how the host's line was chosen, when not the analyzer's decisive line
    kernel: list[str] = field(default_factory=list)  # the host's kernel lines the probe read (OOM killer)
    err_time: float | None = None  # the rank's error file's timestamp (epoch seconds, the host's clock)
    role: str | None = None  # the analyzer's role of the decisive line, where it gives one (peer-caused …)
    below: str | None = None  # the cause below the log the host's analysis found (a kernel line), when it did
    quiet: bool = False  # no error of its own (a stalled host, a rank still asleep): only a straggler candidate


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
    formed: str = ""  # how the hosts were found to be one job ("same rendezvous 10.0.0.1:29500; ranks 0–7 of 8")
    evidence: list[str] = field(default_factory=list)  # what the nodes recorded: error file, Flight Recorder, RAS

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "line": self.line,
            "time": self.time,
            "fingerprint": self.fingerprint,
            "affected": list(self.affected),
            "why": self.why,
            "formed": self.formed,
            "evidence": list(self.evidence),
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
    quiet = dec is None
    if quiet:
        if not _quiet_member(result):
            return None
        dec = _QuietLine(line=str(getattr(result, "summary", "") or "no error of its own"))
        if lines is None:  # its own log lines, not the summary (a straggler's last line is one of them)
            kept_q = (getattr(result, "facts", None) or {}).get("job")
            lines = [str(x) for x in kept_q.get("lines") or []] if isinstance(kept_q, dict) else []
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
    below = None
    if getattr(dec, "source", "log") not in ("log", None) and not quiet:
        # a cause below the log (a kernel line, the GPU's health): its stamp is the kernel's clock, often boot
        # seconds; the job is ordered by the application's own line, the cause named beside it
        below = dec.line
        dec = _QuietLine(
            line=str(getattr(dec, "consequence", None) or dec.line),
            rank=dec.rank,
            fingerprint=dec.fingerprint,
        )
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
        kernel=[
            str(e.get("line") or "")
            for e in (getattr(result, "evidence", None) or [])
            if isinstance(e, dict) and e.get("source") == "kernel"
        ][:64],
        role=getattr(dec, "role", None),
        quiet=quiet,
        below=below,
    )


@dataclass
class _QuietLine:
    """The stand-in decisive record of a host with no error of its own (stalled, or its rank asleep)."""

    line: str
    message: str = ""
    process: str | None = None
    rank: int | None = None
    time: str | None = None
    fingerprint: str = ""
    traceback: list[str] = field(default_factory=list)
    pos: int | None = None
    lineno: int | None = None


def _quiet_member(result: Any) -> bool:
    """A host with no error that may still be a job's straggler: stalled, or with ranks the node's facts name."""
    if str(getattr(result, "verdict", "")) != "stalled":
        return False
    facts = getattr(result, "facts", None) or {}
    return bool(facts.get("stacks") or facts.get("node"))


# ---------------------------------------------------------------- classification and per-host facts


def classify(ev: HostEvidence, rules: JobRules) -> str:
    """The peer-caused kind of the host's decisive error, or "" when it is local-origin."""
    texts = [ev.line, ev.message] + ev.traceback[-12:]
    for r in rules.peer_caused:
        if any(r.regex.search(t) for t in texts if t):
            return r.key
    return ""


_STOPPED_BY_AGENT = {1, 2, 15}
_ABORT = re.compile(
    r"Fatal Python error: Aborted|terminate called (?:after|without)|Aborted \(core dumped\)|SIGABRT"
)  # the agent's own teardown signals: a consequence, never a rank's own death
# torchrun's launcher line and its summary's fields (the summary: "rank : 2 (local_rank: 0)", "exitcode : -9 (pid: 7)")
_LAUNCHER = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<lr>\d+) \(pid: (?P<pid>\d+)\)")
_SUM_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<lr>\d+)\)")
_SUM_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_SUM_HOST = re.compile(r"^\s*host\s*:\s*(?P<host>[\w.-]+)\s*$")
_SUM_ERRFILE = re.compile(r"^\s*error_file\s*:\s*(?P<path>/\S+)")
_SUMMARY_LINE = re.compile(
    r"failed \(exitcode: -?\d+\) local_rank:|ChildFailedError|^\s*(?:rank|exitcode|host|time|error_file|traceback)\s*:|"
    r"Root Cause \(first observed failure\)|^\s*\[\d+\]:\s*$|^=+$|FAILED\s*$"
)


@dataclass
class LauncherReport:
    """What torchrun said about its rank's exit: the launcher line and the summary's fields."""

    code: int | None = None
    pid: int | None = None
    rank: int | None = None  # the global rank (the summary's ``rank :``), never the local rank
    local_rank: int | None = None
    hosts: list[str] = field(default_factory=list)  # the summary's ``host :`` fields
    error_files: list[str] = field(default_factory=list)
    line: str | None = None  # the launcher's ``failed (exitcode: N)`` line

    @property
    def signal(self) -> str | None:
        """The signal the rank died by (exit code -N), unless it is the agent's own teardown signal."""
        if self.code is None or self.code >= 0 or -self.code in _STOPPED_BY_AGENT:
            return None
        return signal_name(-self.code)


def launcher_report(lines: Sequence[str]) -> LauncherReport:
    """The launcher's report of its rank's exit, from the lines read (the last one wins)."""
    rep = LauncherReport()
    for ln in lines:
        if "exitcode" in ln:
            m = _LAUNCHER.search(ln)
            if m:
                rep.code, rep.pid, rep.local_rank, rep.line = int(m["code"]), int(m["pid"]), int(m["lr"]), ln
                continue
            m = _SUM_EXIT.search(ln)
            if m:
                rep.code, rep.pid = int(m["code"]), int(m["pid"])
                continue
        if "rank" in ln and (m := _SUM_RANK.search(ln)):
            rep.rank, rep.local_rank = int(m["rank"]), int(m["lr"])
        elif "host" in ln and (m := _SUM_HOST.search(ln)):
            if m["host"] not in rep.hosts:
                rep.hosts.append(m["host"])
        elif "error_file" in ln and (m := _SUM_ERRFILE.search(ln)):
            if m["path"] not in rep.error_files:
                rep.error_files.append(m["path"])
    return rep


def is_launcher_line(line: str) -> bool:
    """A line torchrun's agent writes about its rank (its ``failed (exitcode: N)`` line or summary): never the
    rank's own error."""
    return bool(_SUMMARY_LINE.search(line))


def _rank_of_line(line: str) -> int | None:
    m = re.match(r"^\s*\[rank(\d+)\]", line)
    return int(m.group(1)) if m else None


def own_line(ev: HostEvidence, rules: JobRules) -> None:
    """Make the host's line its rank's own, and classify it (class 3: the rank's error, not its launcher's).

    A launcher's ``failed (exitcode: 1)`` or its summary is what a victim's log ends with; the rank's own line
    is above it: its transport or watchdog error (peer-caused), or its exception. A rank that died by a signal
    with no error of its own (``exitcode: -9``, ``-11``) is local-origin, the signal named; the kernel's
    OOM-killer line for its pid, when the probe read one, goes with it. The analyzer's ``role`` (when the
    decisive record carries one) is trusted first.
    """
    rep = launcher_report(ev.lines)
    err = _error_file(ev, rep)
    if err is not None and isinstance(err.get("timestamp"), (int, float)):
        ev.err_time = float(err["timestamp"])
    if rep.pid is not None:
        ev.pid = rep.pid
    if rep.rank is not None and (ev.rank is None or is_launcher_line(ev.line)):
        ev.rank = rep.rank
    ev.kind = classify(ev, rules)
    if not ev.kind and ev.role and "peer" in ev.role:
        ev.kind = "peer-caused"
    first = _first_signal_death(ev, rules)
    if first is not None:  # an earlier attempt's rank died by a signal; what the log shows after is its restart's
        line, code, pid = first
        ev.line = ev.message = line
        ev.traceback, ev.lineno, ev.time = [], None, _stamp(line)
        ev.kind, ev.pid = "", pid
        ev.signal = signal_name(-code)
        ev.chosen = f"its rank died by {ev.signal} (exit code {code}) before the error the log ends with (a restart's)"
        return
    if not ev.kind and _ABORT.search(ev.line):
        # an abort after the rank's own watchdog or transport error is that error's end (the watchdog aborts the
        # process): the earlier, peer-caused line is the rank's
        idx = _find(ev)
        before = [ln for ln in ev.lines[: idx if idx is not None else 0] if rules.any_peer_caused(ln)]
        before = [ln for ln in before if not is_launcher_line(ln)]
        if before:
            pick = next((ln for ln in before if _rank_of_line(ln) is not None), before[0])
            ev.line, ev.message, ev.traceback, ev.lineno = pick, pick, [], None
            ev.time = _stamp(pick)
            ev.kind = classify(ev, rules) or "peer-caused"
            ev.chosen = "the rank's own error before the abort it ended in"
            return
    if not is_launcher_line(ev.line):
        return
    peer = [ln for ln in ev.lines if not is_launcher_line(ln) and rules.any_peer_caused(ln)]
    own = [ln for ln in peer if _rank_of_line(ln) is not None] or peer
    if own:
        pick = own[0]
        ev.line, ev.message, ev.traceback = pick, pick, []
        ev.time = _stamp(pick) if _stamp(pick) else None
        ev.lineno = None
        ev.kind = classify(ev, rules) or "peer-caused"
        r = _rank_of_line(pick)
        if r is not None:
            ev.rank = r
        ev.chosen = "the rank's own line above its launcher's report"
        return
    m = _LAUNCHER.search(ev.line)
    if m and int(m["code"]) < 0 and -int(m["code"]) not in _STOPPED_BY_AGENT:
        # the launcher's line itself reports a signal death: a killed rank writes no error file (one on the node
        # is a restart's)
        code = int(m["code"])
        ev.signal, ev.kind, ev.pid = signal_name(-code), "", int(m["pid"])
        ev.chosen = f"its rank died by {ev.signal} (exit code {code}) with no error of its own"
        return
    if err is not None and err.get("message"):  # the rank's own error, as its @record wrote it
        ev.line = ev.message = str(err["message"])
        ev.traceback, ev.lineno, ev.time = [], None, None
        ev.kind = classify(ev, rules)
        ev.chosen = f"its torchelastic error file ({err.get('path')})"
        return
    if rep.signal:
        ev.signal = rep.signal
        ev.kind = ""
        ev.chosen = f"its rank died by {rep.signal} (exit code {rep.code}) with no error of its own"
        if rep.line and ev.line != rep.line and not _LAUNCHER.search(ev.line):
            ev.line = rep.line


def _first_signal_death(ev: HostEvidence, rules: JobRules) -> tuple[str, int, int] | None:
    """The launcher's first report of a rank killed by a signal, when it comes before the host's decisive line
    and no transport error of the rank's own precedes it: (line, exit code, pid)."""
    idx = _find(ev)
    for i, ln in enumerate(ev.lines):
        if idx is not None and i >= idx:
            return None
        if not is_launcher_line(ln) and rules.any_peer_caused(ln):
            return None
        m = _LAUNCHER.search(ln) if "exitcode" in ln else None
        if m:
            code = int(m["code"])
            if code < 0 and -code not in _STOPPED_BY_AGENT and ln != ev.line:
                return (ln, code, int(m["pid"])) if idx is not None else None
            return None
    return None


def _error_file(ev: HostEvidence, rep: LauncherReport) -> dict[str, Any] | None:
    """The rank's torchelastic error file as the node read it: the one its summary names, else the only one."""
    node = ev.facts.get("node") if isinstance(ev.facts.get("node"), dict) else {}
    files = [e for e in node.get("error_files") or [] if isinstance(e, dict) and e.get("message")]
    named = [e for e in files if e.get("path") in rep.error_files]
    if named:
        return named[-1]
    return files[0] if len(files) == 1 else None


def oom_line(ev: HostEvidence) -> str | None:
    """The kernel's OOM-killer line for the rank's pid, among the kernel lines the probe read."""
    if ev.pid is None:
        return None
    pat = re.compile(rf"(?:Killed process |pid[= ]){ev.pid}\b")
    hits = [ln for ln in ev.kernel if pat.search(ln) and re.search(r"[Oo]ut of memory|oom[-_]kill|Killed process", ln)]
    hits.sort(key=lambda ln: "Killed process" not in ln)  # the kernel's own sentence first
    return hits[0] if hits else None


def _stamp(text: str) -> str | None:
    return timestamps.find(text)


def event_time(ev: HostEvidence) -> tuple[float | None, str]:
    """Corrected time of the decisive error, and how it was found.

    A traceback line carries no stamp: the next stamped line after it (the
    process's exit) bounds it, else the last stamped line before it.
    """
    t = normalise(ev.time, ev.zone, ev.mtime, ev.offset)
    if t is not None:
        return t, "its own timestamp"
    if ev.err_time is not None:
        return ev.err_time + (ev.offset or 0.0), "its torchelastic error file's timestamp"
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
    """The ranks this host speaks for, and the world size when it says so: its log (torch's ``[rank1]``
    prefix, ``rank 1/8``, torchrun's summary ``rank : 1``), then the node's facts (the job processes'
    ``RANK``/``WORLD_SIZE``, the Flight Recorder's process group)."""
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
        if "rank" in ln and (m := _SUM_RANK.search(ln)):
            ranks.add(int(m["rank"]))
        wm = _WORLD.search(ln)
        if wm and world is None and (wm.group(1) or wm.group(2) or wm.group(3)):
            world = int(wm.group(1) or wm.group(2) or wm.group(3))
    fr, fw = facts_ranks(ev.facts)
    ranks |= fr
    world = world if world is not None else fw
    if ev.rank is not None and not ranks:
        ranks.add(ev.rank)
    return ranks, world


def facts_ranks(facts: dict[str, Any]) -> tuple[set[int], int | None]:
    """Ranks and world size from what the node itself said: its job processes' environment (``facts["node"]``,
    ``facts["stacks"]``) and its Flight Recorder dumps."""
    ranks: set[int] = set()
    world: int | None = None
    node = facts.get("node") if isinstance(facts.get("node"), dict) else {}
    stacks = facts.get("stacks") if isinstance(facts.get("stacks"), dict) else {}
    for p in list(node.get("procs") or []) + list(stacks.get("procs") or []):
        env = p.get("env") if isinstance(p, dict) else None
        if not isinstance(env, dict):
            continue
        if str(env.get("RANK", "")).isdigit():
            ranks.add(int(env["RANK"]))
        if world is None and str(env.get("WORLD_SIZE", "")).isdigit():
            world = int(env["WORLD_SIZE"])
    for d in node.get("flight_recorder") or []:
        if isinstance(d, dict) and isinstance(d.get("rank"), int):
            ranks.add(d["rank"])
            if world is None and isinstance(d.get("world"), int):
                world = d["world"]
    return ranks, world


_ENDPOINT_WORDS = re.compile("addr|endpoint|address|MASTER")  # the log lines ``endpoints`` reads


def endpoints(ev: HostEvidence, rules: JobRules) -> set[str]:
    """The rendezvous endpoints this host names (command line, environment, log); loopback ones do not count."""
    texts: list[str] = []
    f = ev.facts
    serving = f.get("serving") if isinstance(f.get("serving"), dict) else {}
    for v in (f.get("cmdline"), serving.get("cmdline"), f.get("command")):
        if isinstance(v, str):
            texts.append(v)
    node = f.get("node") if isinstance(f.get("node"), dict) else {}
    stacks = f.get("stacks") if isinstance(f.get("stacks"), dict) else {}
    envs = [f.get("environ"), f.get("env"), serving.get("env")]
    for p in list(node.get("procs") or []) + list(stacks.get("procs") or []):
        if isinstance(p, dict):
            envs.append(p.get("env"))
            if isinstance(p.get("cmdline"), str):
                texts.append(p["cmdline"])
    for env in envs:
        if isinstance(env, dict):
            texts.append(" ".join(f"{k}={v}" for k, v in sorted(env.items())))
    texts.extend(ln for ln in ev.lines if "addr" in ln or "endpoint" in ln or "address" in ln or "MASTER" in ln)
    out: set[str] = set()
    for t in texts:
        for r in rules.endpoints:
            for m in r.regex.finditer(t):
                addr = m.group("addr").strip("'\"[]")
                if r.key.endswith(" id"):  # a rendezvous id names a job wherever it is; torchrun's default does not
                    if addr.lower() not in ("none", "default", "0", ""):
                        out.add(f"id {addr}")
                    continue
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
    if rules._ere is None:  # built once per rule set: every host's funnel carries it
        rules._ere = "|".join(f"({_to_ere(r.regex.pattern)})" for r in rules.endpoints)
    return rules._ere


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
    ranks: set[int] = field(default_factory=set)
    world: int | None = None

    def names(self, other: _Host) -> bool:
        """Whether this host's error lines name ``other``."""
        if not other.keys:
            return False
        if self.text is None:
            self.text = _Text(self.ev)
        return self.text.names(other.keys)


class _Union:
    """Union-find over hosts; each component keeps what it knows (ranks, world, endpoints) and why it formed."""

    def __init__(self, hosts: list[_Host]) -> None:
        self.parent = list(range(len(hosts)))
        self.ranks = [set(h.ranks) for h in hosts]
        self.world = [h.world for h in hosts]
        self.eps = [set(h.eps) for h in hosts]
        self.why: list[list[str]] = [[] for _ in hosts]

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def conflict(self, i: int, j: int) -> bool:
        """Evidence that two components are different jobs: other endpoints, another world size, a rank twice."""
        a, b = self.find(i), self.find(j)
        if a == b:
            return False
        if self.eps[a] and self.eps[b] and not (self.eps[a] & self.eps[b]):
            return True
        if self.world[a] is not None and self.world[b] is not None:
            # ranks are global only where the world size is known (an NCCL "[Rank 0]" may be a subgroup's)
            return self.world[a] != self.world[b] or bool(self.ranks[a] & self.ranks[b])
        return False

    def union(self, i: int, j: int, why: str) -> None:
        a, b = self.find(i), self.find(j)
        if a == b:
            return
        self.parent[a] = b
        self.ranks[b] |= self.ranks[a]
        self.world[b] = self.world[b] if self.world[b] is not None else self.world[a]
        self.eps[b] |= self.eps[a]
        self.why[b] = [w for w in self.why[b] + self.why[a] + [why] if w]


def _span(ranks: set[int]) -> str:
    """'0–7', or '0, 2, 5' when the ranks are not one run."""
    rs = sorted(ranks)
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"{rs[0]}–{rs[-1]}"
    return ", ".join(map(str, rs))


def groups(hosts: list[_Host], window: float = WINDOW_S) -> list[tuple[list[_Host], str]]:
    """Hosts that form one job, each group with how it was formed.

    1. The same non-loopback rendezvous endpoint or id.
    2. Ranks that fit one world: hosts reporting the same world size, their failures within ``window`` s (a
       host with no failure time, a stalled one, joins any), no rank twice.
    3. Failures within ``window`` s linked by a peer-caused error naming the other host, or naming no host
       of the selection ("a peer"): when the candidates could only be one job.
    Never joined: other endpoints, another world size, the same rank on two hosts (two jobs).
    """
    n = len(hosts)
    for h in hosts:
        if not h.keys:
            h.keys = _keys(h.ev)
    u = _Union(hosts)
    for i in range(n):  # 1: endpoints
        for j in range(i + 1, n):
            shared = hosts[i].eps & hosts[j].eps
            if shared and not u.conflict(i, j):
                u.union(i, j, f"same rendezvous {sorted(shared)[0]}")
    by_world: dict[int, list[int]] = {}
    for i, h in enumerate(hosts):  # 2: ranks of one world
        if h.world is not None and h.ranks:
            by_world.setdefault(h.world, []).append(i)
    for w, idx in by_world.items():
        timed = sorted((i for i in idx if hosts[i].t is not None), key=lambda i: hosts[i].t or 0.0)
        untimed = [i for i in idx if hosts[i].t is None]
        clusters: list[list[int]] = []
        for i in timed:
            if clusters and (hosts[i].t or 0.0) - (hosts[clusters[-1][-1]].t or 0.0) <= window:
                clusters[-1].append(i)
            else:
                clusters.append([i])
        if untimed:
            if len(clusters) <= 1:
                clusters = [(clusters[0] if clusters else []) + untimed]
        for c in clusters:
            seen: list[int] = [r for i in c for r in hosts[i].ranks]
            if len(c) < 2 or len(seen) != len(set(seen)) or max(seen) >= w:
                continue  # a rank twice: two jobs of one size in one window, told apart only by other evidence
            if all(not hosts[i].kind and not hosts[i].ev.quiet for i in c):
                continue  # local-origin failures only, nothing pointing at a peer: a coincidence is not a job
            for i in c[1:]:
                if not u.conflict(c[0], i):
                    u.union(c[0], i, f"ranks of one world of {w}")
    names_any = [any(o is not h and h.names(o) for o in hosts) if h.kind else False for h in hosts]
    for i in range(n):  # 3: failures in one window, pointing at a peer
        a = hosts[i]
        if not a.kind or a.t is None or a.ev.quiet:
            continue
        cands: dict[int, int] = {}
        for j in range(n):
            b = hosts[j]
            if j == i or b.t is None or b.ev.quiet or abs(a.t - b.t) > window or u.find(i) == u.find(j):
                continue
            if (a.names(b) or not names_any[i]) and not u.conflict(i, j):
                cands.setdefault(u.find(j), j)
        picks = list(cands.values())
        if any(u.conflict(x, y) for k, x in enumerate(picks) for y in picks[k + 1 :]):
            continue  # the peer could be in either of two jobs: no claim
        for j in picks:
            if not u.conflict(i, j):
                u.union(i, j, f"failures within {window:.0f} s, peer-caused on all but one")
    out: dict[int, list[_Host]] = {}
    for i in range(n):
        out.setdefault(u.find(i), []).append(hosts[i])
    result = []
    for root, g in out.items():
        why = list(dict.fromkeys(u.why[root]))
        ranks, world = u.ranks[root], u.world[root]
        if any(w.startswith("ranks of one world") for w in why):
            why = [w for w in why if not w.startswith("ranks of one world")]
        if ranks and world is not None:
            why.append(f"ranks {_span(ranks)} of {world}")
        elif ranks and len(g) > 1:
            why.append(f"ranks {_span(ranks)}")
        result.append((g, "; ".join(why)))
    return result


# ---------------------------------------------------------------- the root cause


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _delta(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else round(t - t0, 3)


def _rank_host(group: list[_Host], rank: int) -> _Host | None:
    hits = [h for h in group if rank in h.ranks]
    return hits[0] if len(hits) == 1 else None


def _fr_straggler(group: list[_Host]) -> tuple[_Host, int, str] | None:
    """From Flight Recorder dumps: the rank whose last enqueued collective is behind the others'."""
    last: dict[int, tuple[int, int | None, str]] = {}
    for h in group:
        for d in (h.ev.facts.get("node") or {}).get("flight_recorder") or []:
            if isinstance(d, dict) and isinstance(d.get("rank"), int) and isinstance(d.get("last_enqueued"), int):
                last[d["rank"]] = (d["last_enqueued"], d.get("last_completed"), str(d.get("op") or "collective"))
    if len(last) < 2:
        return None
    top = max(v[0] for v in last.values())
    behind = [r for r, v in last.items() if v[0] < top]
    if len(behind) != 1:
        return None
    rank = behind[0]
    h = _rank_host(group, rank)
    if h is None:
        return None
    ahead = sorted(r for r, v in last.items() if v[0] == top)
    op = last[ahead[0]][2]
    why = (
        f"hang: the Flight Recorder dumps of ranks {_span(set(last))} show ranks {_span(set(ahead))} entered "
        f"{op} #{top} and rank {rank} never did (its last: #{last[rank][0]}, completed #{last[rank][1]})"
    )
    return h, rank, why


def _ras_straggler(group: list[_Host]) -> tuple[_Host, int, str] | None:
    """From NCCL RAS (a live NCCL job's own monitor): the one rank it names missing, dead or behind."""
    for g in group:
        ras = (g.ev.facts.get("stacks") or {}).get("ras")
        if not isinstance(ras, dict) or not ras.get("available"):
            continue
        named = [n for n in ras.get("named") or [] if isinstance(n, dict) and isinstance(n.get("rank"), int)]
        ranks = {n["rank"] for n in named}
        if len(ranks) == 1:
            rank = ranks.pop()
            h = _rank_host(group, rank)
            if h is not None:
                return (
                    h,
                    rank,
                    f"hang: NCCL RAS on {g.ev.host} names rank {rank} ({named[0].get('why')}): {ras.get('summary')}",
                )
    return None


def _where_now(h: _Host, rank: int | None) -> str | None:
    """Where a live straggler is, as its stacks say (py-spy's frame, or /proc)."""
    for p in (h.ev.facts.get("stacks") or {}).get("procs") or []:
        if isinstance(p, dict) and (rank is None or p.get("rank") == rank) and p.get("what"):
            return str(p["what"]) + (f" at {p['where']}" if p.get("where") else "")
    return None


def _knows_where(h: _Host) -> bool:
    """Whether a stalled host says where its ranks are: stacks, Flight Recorder dumps, RAS."""
    node = h.ev.facts.get("node") if isinstance(h.ev.facts.get("node"), dict) else {}
    ras = (h.ev.facts.get("stacks") or {}).get("ras")
    return bool(_stack_waits(h) or node.get("flight_recorder") or (isinstance(ras, dict) and ras.get("available")))


def _stack_waits(h: _Host) -> dict[int, str]:
    """rank -> wait kind, from the host's stacks facts (py-spy or /proc)."""
    out: dict[int, str] = {}
    for p in (h.ev.facts.get("stacks") or {}).get("procs") or []:
        if isinstance(p, dict) and isinstance(p.get("rank"), int) and p.get("wait"):
            out[p["rank"]] = str(p["wait"])
    return out


_WAITING = {"collective"}
_TIMEOUTS = {"collective timeout", "gloo timeout"}
_NOT_TRANSPORT = {"SIGTERM from the agent", "rendezvous closed", "peer-caused"}  # kinds that are no transport error
# doing something else than waiting in the collective: sleeping, reading (a socket, a pipe, a queue), in I/O,
# loading data, running; a rank's collective wait is a futex beside its gloo/NCCL threads, or its stack says so
_OUTSIDE = {"sleep", "io", "running", "data", "checkpoint", "compile", "queue", "socket", "child", "event-loop"}


def _stack_straggler(group: list[_Host]) -> tuple[_Host, int, str] | None:
    """From where each rank waits (py-spy stacks, or /proc when py-spy is absent): the one rank outside the
    collective its peers wait in."""
    waits: dict[int, tuple[str, _Host]] = {}
    for h in group:
        for r, w in _stack_waits(h).items():
            waits[r] = (w, h)
    inside = {r for r, (w, _) in waits.items() if w in _WAITING}
    outside = [r for r, (w, _) in waits.items() if w in _OUTSIDE]
    if not inside or len(outside) != 1 or len(inside) + 1 != len(waits):
        return None  # a rank on a lock or a socket of its own could be either: no claim
    rank = outside[0]
    w, h = waits[rank]
    via = {
        str(p.get("via"))
        for g in group
        for p in (g.ev.facts.get("stacks") or {}).get("procs") or []
        if isinstance(p, dict) and p.get("via")
    }
    how = "py-spy stacks" if via == {"py-spy"} else ("/proc (syscall and wchan)" if "py-spy" not in via else "stacks")
    why = (
        f"hang: ranks {_span(inside)} wait in a collective and rank {rank} on {h.ev.host} is outside it "
        f"({w}), by {how}: its peers wait for it"
    )
    return h, rank, why


def _straggler(group: list[_Host], rules: JobRules) -> tuple[_Host, int | None, str] | None:
    """The rank that never reached the collective the others wait or timed out in: the Flight Recorder's
    sequence numbers, the watchdog's SeqNum, the ranks with a timed-out recv/send (gloo) against the one
    without, the stacks."""
    st = _fr_straggler(group) or _ras_straggler(group)
    if st is not None:
        return st
    waiting: dict[int, set[int]] = {}
    reporters: set[str] = set()
    for h in group:
        for seq, rk in _collective(h.ev, rules):
            waiting.setdefault(seq, set())
            if rk is not None:
                waiting[seq].add(rk)
            reporters.add(h.ev.host)
    timed_out = {h.ev.host for h in group if h.kind in _TIMEOUTS}
    if not waiting and not timed_out:
        return _stack_straggler(group)
    # a transport error of its own (a timeout, a connection its peer closed): not the rank the others waited for
    transport = {h.ev.host for h in group if h.kind and h.kind not in _NOT_TRANSPORT}
    silent = [h for h in group if h.ev.host not in reporters | timed_out | transport]
    if len(silent) != 1:
        return _stack_straggler(group)
    h = silent[0]
    ranks = h.ranks
    world = max((g.world for g in group if g.world is not None), default=None)
    seen = set().union(*(g.ranks for g in group))
    if waiting:
        seq = min(waiting)
        missing = ranks - waiting[seq]
        if not missing and world is not None:
            missing = set(range(world)) - waiting[seq] - (seen - ranks)
        rank = min(missing) if len(missing) == 1 else (min(ranks) if len(ranks) == 1 else None)
        why = (
            f"hang: {', '.join(sorted(reporters))} waited in collective SeqNum={seq} until the watchdog fired "
            f"(ranks {', '.join(map(str, sorted(waiting[seq]))) or '?'}); {h.ev.host}"
            f"{f' (rank {rank})' if rank is not None else ''} shows no collective error of its own: it never reached it"
        )
        return h, rank, why
    others = sorted(seen - ranks)
    rank = min(ranks) if len(ranks) == 1 else None
    timed_out |= transport
    if rank is None and world is not None:
        left = set(range(world)) - set(others)
        rank = min(left) if len(left) == 1 else None
    why = (
        f"hang: {', '.join(sorted(timed_out))}"
        + (f" (ranks {_span(set(others))})" if others else "")
        + f" timed out waiting for a recv/send; {h.ev.host}"
        + (f" (rank {rank})" if rank is not None else "")
        + " has no transport error of its own: the rank they waited for"
    )
    return h, rank, why


def _root(group: list[_Host], rules: JobRules) -> tuple[_Host, int | None, str, str] | None:
    """(root host, rank, line, why) for one job, or None when the evidence names none."""
    local = [h for h in group if not h.kind and not h.ev.quiet]
    if local:
        local.sort(key=lambda h: (h.t is None, h.t or 0.0))
        best = local[0]
        if best.ev.signal:
            parts = [f"{best.ev.host}'s rank died by {best.ev.signal} with no error of its own"]
            oom = oom_line(best.ev)
            parts.append(
                f"the kernel: {oom.strip()}" if oom else "no OOM-killer line for its pid in the kernel log read"
            )
            parts.append(f"time from {best.t_how}")
        else:
            parts = [f"local-origin error on {best.ev.host}, time from {best.t_how}"]
        if best.ev.below and not (best.ev.signal and oom_line(best.ev)):
            parts.insert(1, f"below it, the kernel: {best.ev.below.strip()[:300]}")
        peer = [h for h in group if h.kind or h.ev.quiet]
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
        who = f"rank {rank}" if rank is not None else h.ev.host
        first = min((g.t for g in group if g is not h and g.kind and g.t is not None), default=None)
        last = _last_own(h.ev, first)
        where = _where_now(h, rank) if h.ev.quiet else None
        line = (
            f"straggler: {who} never reached the collective its peers wait in"
            + (f" — {where}" if where else "")
            + (f"; its last line: {last}" if last else "")
        )
        return h, rank, line, why
    for h in sorted(group, key=lambda h: (h.t is None, h.t or 0.0)):
        k = _killed(h.ev, rules)
        if k is not None:
            line, rank = k
            return (
                h,
                h.ev.rank if h.ev.rank is not None else rank,
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


def _last_own(ev: HostEvidence, before: float | None = None) -> str | None:
    """The straggler's last line of its own (the step it is stuck in): the last line of the rank, neither its
    launcher's nor a consequence, stamped before its peers timed out (``before``, corrected time)."""
    rules = default_job_rules()
    last = None
    for ln in ev.lines:
        st = _stamp(ln)
        t = normalise(st, ev.zone, ev.mtime, ev.offset) if st else None
        if before is not None and t is not None and t > before:
            break
        if _OWN_RANK.search(ln) and not is_launcher_line(ln) and not rules.any_peer_caused(ln):
            if "Traceback" not in ln and "File " not in ln:
                last = ln.strip()[:KEEP_WIDTH]
    return last


_OWN_RANK = re.compile(r"\[rank\d+\]|\brank \d+\b")


def node_evidence(ev: HostEvidence) -> list[str]:
    """What the root's node recorded, for the job line: its error file, the Flight Recorder dumps, RAS."""
    node = ev.facts.get("node") if isinstance(ev.facts.get("node"), dict) else {}
    out: list[str] = []
    for e in node.get("error_files") or []:
        if isinstance(e, dict) and e.get("message"):
            out.append(f"error file {e.get('path')}: {e['message']}" + (f" (at {e['time']})" if e.get("time") else ""))
    return out


def _group_evidence(group: list[_Host]) -> list[str]:
    out: list[str] = []
    found, missing = set(), set()
    world = max((g.world for g in group if g.world is not None), default=None)
    for h in group:
        node = h.ev.facts.get("node") if isinstance(h.ev.facts.get("node"), dict) else {}
        for d in node.get("flight_recorder") or []:
            if isinstance(d, dict) and isinstance(d.get("rank"), int):
                found.add(d["rank"])
        ras = node.get("ras") or (h.ev.facts.get("stacks") or {}).get("ras")
        if isinstance(ras, dict) and ras.get("available") and ras.get("summary"):
            out.append(f"NCCL RAS on {h.ev.host}: {ras['summary']}")
    if found:
        if world is not None:
            missing = set(range(world)) - found
        out.append(
            f"Flight Recorder dumps found for ranks {_span(found)}"
            + (f" (none for {_span(missing)})" if missing else "")
        )
    return out


def root_causes(results: Sequence[Any], *, rules: JobRules | None = None, window: float = WINDOW_S) -> list[RootCause]:
    """One RootCause per job among the failed hosts; [] when no job-level cause can be named.

    ``results`` are HostEvidence or HostResult records (a HostResult without a decisive error joins only
    when it is stalled with stacks or node facts: a straggler candidate). A job with a single failed host
    makes no job-level claim: its own card says it all.
    """
    rules = rules or default_job_rules()
    hosts: list[_Host] = []
    for r in results:
        ev = r if isinstance(r, HostEvidence) else evidence_from_result(r)
        if ev is None:
            continue
        own_line(ev, rules)
        t, how = event_time(ev) if not ev.quiet else (None, "no error")
        h = _Host(ev, ev.kind, t, how, endpoints(ev, rules))
        h.ranks, h.world = ranks_of(ev)
        if ev.quiet and ev.rank is None and len(h.ranks) == 1:
            ev.rank = next(iter(h.ranks))
        hosts.append(h)
    out: list[RootCause] = []
    for g, formed in groups(hosts, window):
        if len(g) < 2 or (all(h.ev.quiet for h in g) and not any(_knows_where(h) for h in g)):
            continue
        found = _root(g, rules)
        if found is None:
            continue
        h, rank, line, why = found
        others = sorted((o for o in g if o is not h), key=lambda o: o.ev.host)
        cons = [
            (o.ev.host, "waiting, no error" if o.ev.quiet else (o.kind or "local-origin error"), _delta(o.t, h.t))
            for o in others
        ]
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
                formed=formed,
                evidence=node_evidence(h.ev) + _group_evidence(g),
            )
        )
    out.sort(key=lambda rc: (rc.time is None, rc.time or "", rc.host))
    return out


_GLOG_HEAD = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+\] ")


def summary_line(rc: RootCause, width: int = 80) -> str:
    """The fleet view's opening line for a job."""
    msg = rc.line.strip()
    for prefix in re.findall(r"^(?:\[[^\]]*\]:?\s*)+", msg)[:1]:
        msg = msg[len(prefix) :]
    m = _LAUNCHER.search(msg)
    if m and int(m["code"]) < 0:  # a signal death: the signal, not the launcher's words
        sig = signal_name(-int(m["code"]))
        msg = f"died by {sig} (exitcode {m['code']}, pid {m['pid']})"
    msg = _GLOG_HEAD.sub("", msg)
    if len(msg) > width:
        msg = msg[:width].rstrip() + " …"
    head = f"job root cause: {rc.host}" + (f" · rank {rc.rank}" if rc.rank is not None else "") + f" · {msg}"
    tail = f" · job: {rc.formed}" if rc.formed else ""
    if not rc.consequences:
        return head + tail
    n = len(rc.consequences)
    bits = [consequence_text(host, kind, d) for host, kind, d in rc.consequences]
    return head + f" · {n} other host{'s' if n != 1 else ''} failed as a consequence: " + ", ".join(bits) + tail


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
    # each line's two answers, asked once: the passes below ask them of the same lines again
    peer = [rules.any_peer_caused(ln) for ln in lines]
    launcher = [is_launcher_line(ln) for ln in lines]
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
    peer_own = False
    for i, ln in enumerate(lines):
        if ("exitcode" in ln or "rank" in ln or "host" in ln or "error_file" in ln) and (
            _LAUNCHER.search(ln)
            or _SUM_EXIT.search(ln)
            or _SUM_RANK.search(ln)
            or _SUM_HOST.search(ln)
            or _SUM_ERRFILE.search(ln)
        ):
            must.add(i)  # the launcher's report: the rank, its exit code or signal, its host, its error file
            continue
        if not peer_own and not launcher[i] and peer[i]:
            peer_own = True  # the rank's own transport error, above its launcher's report
            must.add(i)
            nxt = next((j for j in range(i + 1, len(lines)) if _stamp(lines[j])), None)
            if nxt is not None:
                must.add(nxt)
            continue
        one = HostEvidence(host=ev.host, line="", lines=[ln])
        coll = [c for c in _collective(one, rules) if c not in seen_coll] if rules.may_match("collective", ln) else []
        if coll:
            seen_coll.update(coll)
            must.add(i)
            continue
        if not killed and rules.may_match("killed", ln) and _killed(one, rules) is not None:
            killed = True
            must.add(i)
            continue
        r, w = ranks_of(one)
        if (r - ranks) or (w is not None and not world):
            ranks |= r
            world = world or w is not None
            must.add(i)
            continue
        e = endpoints(one, rules) - eps if _ENDPOINT_WORDS.search(ln) else set()
        if e:
            eps |= e
            must.add(i)
            continue
        if peer[i] or _PEERISH.search(ln):
            extra.append(i)
    # the rank's last own line before its first consequence or launcher line (a straggler's: the step it is
    # stuck in), and its last own line overall
    first = next((i for i in range(len(lines)) if launcher[i] or peer[i]), len(lines))
    for end in (first, len(lines)):
        for i in range(end - 1, -1, -1):
            ln = lines[i]
            if _OWN_RANK.search(ln) and not launcher[i] and not peer[i] and "File " not in ln:
                must.add(i)
                break
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


QUIET_LINES = 20  # log lines kept for a stalled host with no error of its own


def clip(line: str) -> str:
    """A kept line, cut to KEEP_WIDTH."""
    return _clip(line)


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
    kept = keep_lines(ev, rules)
    own_line(ev, rules)
    out: dict[str, Any] = {"kind": ev.kind, "lines": kept}
    if ev.chosen:
        out["line"] = ev.line
        out["chosen"] = ev.chosen
    if ev.signal:
        out["signal"] = ev.signal
    return out


def mark(results: Sequence[Any], rcs: Sequence[RootCause]) -> None:
    """Record each host's part in a job (``HostResult.job_role``): the root (``rank``, ``affected``,
    ``why``, ``time``) or a consequence (``root``): what the history keeps as the job's one incident
    and its affected hosts. Any earlier marks go first (watch re-analyses the same records)."""
    by_host = {getattr(r, "host", None): r for r in results}
    for r in results:
        r.job_role = None
    for rc in rcs:
        root = by_host.get(rc.host)
        if root is not None:
            root.job_role = JobRole("root", rank=rc.rank, affected=list(rc.affected), why=rc.why, time=rc.time)
        for h in rc.affected:
            v = by_host.get(h)
            if v is not None:
                v.job_role = JobRole("consequence", root=rc.host)


def assign_roles(results: Sequence[Any]) -> list[RootCause]:
    """The job analysis as one explicit step before any output: the root causes, each host marked (``mark``)."""
    rcs = root_causes(results)
    mark(results, rcs)
    return rcs


def report(results: Sequence[Any]) -> list[dict[str, Any]]:
    """``root_causes`` for a JSON report, as JSON, the hosts marked on the way (``assign_roles``)."""
    return [rc.to_json() for rc in assign_roles(results)]
