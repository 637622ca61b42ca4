"""What a probe keeps for the job analysis (``job_facts``, ``keep_lines``) and the roles marked on the
results before any output (``mark``, ``assign_roles``, ``report``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..records import JobFacts, JobRole
from .evidence import KEEP_WIDTH, HostEvidence, RootCause, evidence_from_result
from .lines import (
    _ENDPOINT_WORDS,
    _LAUNCHER,
    _OWN_RANK,
    _SUM_ERRFILE,
    _SUM_EXIT,
    _SUM_HOST,
    _SUM_RANK,
    _collective,
    _find,
    _killed,
    _stamp,
    endpoints,
    is_launcher_line,
    own_line,
    ranks_of,
)
from .roots import root_causes
from .rules import JobRules, default_job_rules

# ---------------------------------------------------------------- wiring: what a probe keeps, what a report says


KEEP_LINES = 80  # at most this many log lines kept per host for the job analysis
_PEERISH = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|<\d+>|\bpeer\b|\bremote\b", re.IGNORECASE)


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


def job_facts(result: Any, lines: Sequence[str], rules: JobRules | None = None) -> JobFacts | None:
    """``HostResult.job`` for a host with a decisive error: the lines the job analysis needs
    (so sweeps, reports and the history can name a job's root cause later), and the
    error's peer-caused kind ("" when it is local-origin)."""
    ev = evidence_from_result(result, lines=list(lines))
    if ev is None:
        return None
    rules = rules or default_job_rules()
    kept = keep_lines(ev, rules)
    own_line(ev, rules)
    return JobFacts(
        kind=ev.kind, lines=kept, line=ev.line if ev.chosen else None, chosen=ev.chosen, signal=ev.signal or None
    )


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
