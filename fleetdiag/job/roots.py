"""Each job's root cause: the local-origin failure first, else the straggler; and its words."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..units import signal_name
from .clock import normalise
from .evidence import KEEP_WIDTH, WINDOW_S, HostEvidence, RootCause, evidence_from_result
from .lines import (
    _LAUNCHER,
    _OWN_RANK,
    _collective,
    _killed,
    _stamp,
    endpoints,
    event_time,
    is_launcher_line,
    oom_line,
    own_line,
    ranks_of,
)
from .membership import _Host, _span, groups
from .rules import JobRules, default_job_rules

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
    counts = _named_by(group)
    named = [h for h in group if counts[id(h)] == len(group) - 1]
    if len(named) == 1:
        h = named[0]
        return (
            h,
            h.ev.rank,
            h.ev.line,
            (f"every other host's peer-caused error names {h.ev.host}; it has no local-origin error in the lines read"),
        )
    return None


def _named_by(group: list[_Host]) -> Counter[int]:
    """How many other hosts of the group name each one (by id) in their error lines: counted from each host's
    ``named`` once groups() indexed them, not asked of every pair."""
    if any(h.named is None for h in group):
        return Counter(id(h) for h in group for o in group if o is not h and o.names(h))
    ids = {id(h) for h in group}
    return Counter(k for o in group for k in o.named or () if k in ids)


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
