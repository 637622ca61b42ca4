"""What one host's lines say about the job: the rank's own line, the launcher's report, ranks and world
size, rendezvous endpoints, collectives, whether the error is peer-caused."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import timestamps
from ..units import signal_name
from .clock import normalise
from .evidence import LOOPBACK, HostEvidence
from .rules import JobRules, default_job_rules

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


_OWN_RANK = re.compile(r"\[rank\d+\]|\brank \d+\b")
