"""A stalled host, wired into the product: judge the silence, then ask where the job's processes wait.

``judge_silence`` is the one rule probe, analyze and watch share (``probe.finish`` and ``watch.decide``):
``cadence.judge`` with the rules file's ``ready``/``waiting`` matchers, the host's ``stall_after`` as the
limit when the log has no cadence, and as the floor when it is lower than the default one (a user who asks
for a quick stall gets one).

When probe finds a host stalled it makes a second round trip on the same connection (``SCRIPT``:
``remote/stacks.sh`` and ``remote/stacks_probe.sh``): py-spy dumps where py-spy is installed, the /proc
view always, for the job's processes (the PIDs the first trip's facts named, and the processes holding the
log open). ``apply`` puts what came back into the HOST record: ``evidence`` entries of source ``stack``, a
``facts.stacks`` record with the notes (py-spy missing, ptrace refused, with the fix) and, in the summary,
where each process waits. Pure: no SSH, no UI.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from .. import remote
from ..analysis import Rules
from ..analysis.lines import LogLine, parse_all
from ..records import HostResult, Line
from . import cadence
from . import stacks as stacks_mod

SCRIPT = remote.load("stacks.sh") + remote.load("stacks_probe.sh")
TRIP_TIMEOUT = 20.0  # seconds for the whole second round trip, at most (less when the command timeout is short)
DUMP_TIMEOUT = 5  # seconds per py-spy dump (FD_STACKS_TIMEOUT; stacks.sh alone allows 20)
MAX_PROCS = 8  # processes read per host (FD_STACKS_MAX)
SHOWN = 3  # processes named in the one-line summary (all of them are in the evidence and on the card)


def run_lines(lines: Sequence[Line], run_start: int | None) -> list[Line]:
    """The lines of the latest run (from its start banner on), the only ones whose rhythm counts."""
    if run_start is None:
        return list(lines)
    return [ln for ln in lines if ln.pos >= run_start]


def judge_silence(
    lines: Sequence[Line] | Sequence[LogLine],
    mtime: float | None,
    now: float | None,
    rules: Rules,
    stall_after: float,
    alive: bool | None = None,
) -> cadence.Silence:
    """Is this log's silence a stall? The same judgement for probe, analyze and watch.

    ``stall_after``: the host's fixed limit (``--stall-after``, ``funnel.stall_after``), used when the log
    has too few time-stamped lines for a cadence; below the 60 s floor it lowers the floor too.
    ``lines`` may be already parsed (``parse_all``): a watch judges the same lines many times.
    """
    floor = min(cadence.FLOOR, stall_after) if stall_after > 0 else cadence.FLOOR
    fallback = stall_after if stall_after > 0 else cadence.FALLBACK
    parsed = lines if all(isinstance(ln, LogLine) for ln in lines) else parse_all(lines)  # type: ignore[arg-type]
    return cadence.judge(
        parsed,
        mtime,
        now,
        alive=alive,
        fallback=fallback,
        floor=floor,
        # a line that answers a request (the analyzer's ``serving`` section) says the server is up, like ``ready``
        is_ready=lambda raw: rules.is_ready(raw) or rules.is_serving(raw),
        is_waiting=rules.is_waiting,
    )


def stall_summary(sil: cadence.Silence, starting: str | None = None) -> str:
    """The one line a stalled host shows: the judgement's reason, then what the log last said while starting."""
    return sil.reason + (f" — {starting}" if starting else "")


def silence_fact(sil: cadence.Silence) -> dict[str, Any]:
    """``facts.silence``: the numbers behind a verdict on a quiet log."""

    def r(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, 1)

    return {
        "phase": sil.phase,
        "stalled": sil.stalled,
        "cadence_s": r(sil.cadence_s),
        "median_s": r(sil.median_s),
        "silent_s": r(sil.silent_s),
        "threshold_s": r(sil.threshold_s),
        "reason": sil.reason,
    }


def alive_from_facts(facts: dict[str, Any]) -> bool | None:
    """True when the first trip saw the serving process with the log open; else unknown."""
    serving = facts.get("serving") or {}
    return True if serving.get("writes_log") else None


def job_pids(facts: dict[str, Any], log_source: dict[str, Any] | None = None) -> list[int]:
    """The job's PIDs the first trip named: the process whose output discovery found the log in, the serving
    process that writes the log, the GPUs' compute processes. The remote side keeps only those that live
    and are Python/ML processes."""
    out: list[int] = []
    m = re.search(r"\bpid (\d+)", str((log_source or {}).get("found_by") or ""))
    if m:
        out.append(int(m.group(1)))
    serving = facts.get("serving") or {}
    if serving.get("writes_log") and isinstance(serving.get("pid"), int) and serving["pid"] not in out:
        out.append(serving["pid"])
    for g in facts.get("gpus") or []:
        for p in (g.get("processes") or []) if isinstance(g, dict) else []:
            pid = p.get("pid") if isinstance(p, dict) else None
            if isinstance(pid, int) and pid not in out:
                out.append(pid)
    return out[:MAX_PROCS]


def script_vars(
    pids: Sequence[int],
    log: str | None,
    path_prepend: str | None = None,
    pyspy: str | None = None,
    dump_timeout: float = DUMP_TIMEOUT,
) -> dict[str, object]:
    """The variables the second trip's script reads (quoted and exported by the builder)."""
    env: dict[str, object] = {
        "FD_STACKS_PIDS": " ".join(str(int(p)) for p in pids),
        "FD_STACKS_LOG": log or "",
        "FD_STACKS_TIMEOUT": max(1, int(dump_timeout)),
        "FD_STACKS_MAX": MAX_PROCS,
        "FD_SPATH": path_prepend or "",
    }
    if pyspy:
        env["FD_STACKS_PYSPY"] = pyspy
    return env


def command(
    pids: Sequence[int],
    log: str | None,
    path_prepend: str | None = None,
    pyspy: str | None = None,
    dump_timeout: float = DUMP_TIMEOUT,
) -> str:
    """The exec request of the second round trip (the one builder, the one wrapper every login shell reads)."""
    return remote.remote_command(remote.script(script_vars(pids, log, path_prepend, pyspy, dump_timeout), SCRIPT))


def brief(p: stacks_mod.ProcStack, w: stacks_mod.Wait) -> str:
    """'rank 0: in a collective / CUDA sync (all_reduce)' — who and where, for one line."""
    tag = f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}"
    if p.gone:
        return f"{tag}: exited"
    at = w.where or (w.at if w.at and w.at != "0" else None)
    return f"{tag}: {w.what}" + (f" ({at})" if at else "")


_JOB_WAIT = {
    stacks_mod.COLLECTIVE: "collective",
    stacks_mod.SLEEP: "sleep",
    stacks_mod.IO: "io",
    stacks_mod.DATA_LOADER: "data",
    stacks_mod.CHECKPOINT: "checkpoint",
    stacks_mod.COMPILE: "compile",
}


def rank_waits(rep: stacks_mod.StackReport) -> list[dict[str, Any]]:
    """Per rank of the job (a process with a RANK): where it waits, in the words the job analysis compares
    across hosts (``collective`` against ``sleep``/``io``/``data``/``running``), with how it was seen and
    the rank/rendezvous variables of its environment."""
    util_of = {g.index: g.util for g in rep.gpus if g.util is not None}
    out: list[dict[str, Any]] = []
    for p in rep.procs:
        if p.gone or p.rank is None:
            continue
        w = stacks_mod.where_waits(p)
        util = util_of.get(rep.gpu_of_pid.get(p.pid, -1))
        wait = _JOB_WAIT.get(w.kind, w.kind)
        if w.kind == stacks_mod.RUNNING:
            wait = "collective" if util is not None and util >= stacks_mod.BUSY else "running"
        env = {
            k: v for k, v in p.env.items() if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }
        out.append(
            {"pid": p.pid, "rank": p.rank, "wait": wait, "via": w.via, "what": w.what, "where": w.where, "env": env}
        )
    return out[:MAX_PROCS]


def apply(res: HostResult, rep: stacks_mod.StackReport, cut: str | None = None, ras: Any = None) -> HostResult:
    """Put one stacks report into a stalled host's record: evidence, facts, and the summary's 'waits'."""
    entries = stacks_mod.evidence(rep)
    res.evidence = list(res.evidence) + entries
    notes = rep.notes()
    if cut:
        notes.append(f"stacks output cut ({cut}): the processes read before it are shown")
    res.facts["stacks"] = {
        "pyspy": rep.pyspy,
        "user": rep.user,
        "ptrace_scope": rep.ptrace_scope,
        "pids": [p.pid for p in rep.procs],
        "notes": notes,
        "procs": rank_waits(rep),
    }
    if ras is not None:
        res.facts["stacks"]["ras"] = ras.to_json()
    live = [p for p in rep.procs if not p.gone]
    if live:
        waits = [brief(p, stacks_mod.where_waits(p)) for p in live[:SHOWN]]
        more = f" · … {len(live) - SHOWN} more" if len(live) > SHOWN else ""
        res.summary = (f"{res.summary} — " if res.summary else "") + "waits: " + " · ".join(waits) + more
    return res
