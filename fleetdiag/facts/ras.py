"""NCCL RAS (NCCL ≥ 2.24): what a live NCCL job's own monitor says about its ranks, read on a stalled host's
second trip (``remote/stacks_probe.sh``, ``fd_ras``): the ``STATUS`` query on its client socket (localhost:28028,
or the job's ``NCCL_RAS_ADDR``), through ``ncclras`` (JSON with ``-f json`` where the client offers it, NCCL
≥ 2.28.7) or ``nc``, under a short timeout. Nothing else is sent to the job.

The answer is host data: parsed here, bounded, never executed. Text (the summary tables, then ``Errors`` and
``Warnings`` sections naming missing ranks, dead or unresponsive processes and outlier ranks behind in their
collective counts) or JSON (``communicators[].missing_ranks[]``). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_BYTES = 256 * 1024  # of one answer (FD_RAS_BYTES)
TIMEOUT = 8  # seconds for the query (RAS waits up to a few seconds for unresponsive peers)
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass
class RasNamed:
    """A rank (or process) RAS singles out, and why."""

    why: str  # missing | dead | unresponsive | behind
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    gpu: int | None = None

    def text(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else (f"process {self.pid}" if self.pid else "a process")
        where = ", ".join(
            x
            for x in (
                f"pid {self.pid}" if self.pid and self.rank is not None else "",
                f"node {self.host}" if self.host else "",
                f"GPU {self.gpu}" if self.gpu is not None else "",
            )
            if x
        )
        return f"{who} {self.why}" + (f" ({where})" if where else "")


@dataclass
class RasReport:
    available: bool
    reason: str = ""  # why not, when not available
    via: str | None = None  # ncclras | nc
    fmt: str | None = None  # text | json
    version: str | None = None
    named: list[RasNamed] = field(default_factory=list)
    status: list[str] = field(default_factory=list)  # the communicators' status/error words (RUNNING OK …)

    @property
    def summary(self) -> str:
        if not self.available:
            return f"RAS not available: {self.reason}"
        if not self.named:
            st = ", ".join(dict.fromkeys(self.status)) or "no communicator listed"
            return f"RAS answered ({self.via}, {self.fmt}): no rank singled out ({st})"
        names = "; ".join(n.text() for n in self.named[:6]) + (
            f"; … {len(self.named) - 6} more" if len(self.named) > 6 else ""
        )
        return f"RAS names {names}"

    def to_json(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "via": self.via,
            "format": self.fmt,
            "version": self.version,
            "named": [n.__dict__ for n in self.named],
            "status": self.status,
            "summary": self.summary,
        }


def _clean(s: str) -> str:
    return _CTRL.sub(" ", s)


_PROC = re.compile(r"Process (\d+) on node (\S+) managing GPUs? (\d+)")
_RANK_LINE = re.compile(r"Rank (\d+) -- GPU (\d+) managed by process (\d+) on node (\S+)")
_MISSING = re.compile(r"The missing ranks?: ([\d, ]+)")
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\d+\s+[\d-]+\s+\d+\s+\d+\s+([A-Z]+)\s+([A-Z]+)\s*$")


def parse_text(text: str) -> RasReport:
    """The text answer of ``STATUS`` into the ranks it singles out."""
    rep = RasReport(True, fmt="text")
    section = ""
    heading = ""
    behind_group = False
    for raw in _clean(text[:MAX_BYTES]).splitlines():
        line = raw.strip()
        v = re.match(r"NCCL version (\S+)", line)
        if v and rep.version is None:
            rep.version = v.group(1)[:20]
            continue
        if line in ("Errors", "Warnings") or line.startswith("Communicators") or line.startswith("Job summary"):
            section = line.split()[0]
            continue
        m = _ROW.match(raw)
        if m and section.startswith("Communicators"):
            rep.status.append(f"{m.group(1)} {m.group(2)}")
            continue
        if re.match(r"^(#\d+-\d+ .*|DEAD|INCOMPLETE|TIMEOUT|MISMATCH)$", line):
            heading = line
            behind_group = False
            continue
        if "considered dead" in line:
            heading = "DEAD"
        if re.search(r"ranks? (?:has|have) launched up to operation", line):
            behind_group = True  # the ranks listed under it are the outlier group RAS chose to print
            continue
        for m in _MISSING.finditer(line):
            for r in re.findall(r"\d+", m.group(1))[:64]:
                _add(rep, RasNamed("missing", rank=int(r)))
        m = _PROC.search(line)
        if m:
            why = "dead" if heading == "DEAD" else "unresponsive"
            _add(rep, RasNamed(why, pid=int(m.group(1)), host=m.group(2)[:100], gpu=int(m.group(3))))
            continue
        m = _RANK_LINE.search(line)
        if m and behind_group:
            _add(
                rep,
                RasNamed(
                    "behind", rank=int(m.group(1)), gpu=int(m.group(2)), pid=int(m.group(3)), host=m.group(4)[:100]
                ),
            )
    return rep


def _add(rep: RasReport, n: RasNamed) -> None:
    if len(rep.named) >= 64:
        return
    for o in rep.named:  # one entry per rank/process: a missing rank and its process, merged
        if (n.rank is not None and o.rank == n.rank) or (n.pid and o.pid == n.pid):
            o.host, o.pid, o.gpu = o.host or n.host, o.pid or n.pid, o.gpu if o.gpu is not None else n.gpu
            if n.why == "dead":
                o.why = "dead"
            return
    rep.named.append(n)


def parse_json(text: str) -> RasReport:
    """The JSON answer (NCCL ≥ 2.28.7): every communicator's ``missing_ranks``."""
    rep = RasReport(True, fmt="json")
    try:
        doc = json.loads(text[:MAX_BYTES])
    except ValueError:
        return RasReport(False, reason="its JSON answer did not parse")
    if not isinstance(doc, dict):
        return RasReport(False, reason="its JSON answer is not an object")
    rep.version = _clean(str(doc.get("nccl_version") or ""))[:20] or None
    for c in (doc.get("communicators") or [])[:256] if isinstance(doc.get("communicators"), list) else []:
        if not isinstance(c, dict):
            continue
        miss = c.get("missing_ranks") if isinstance(c.get("missing_ranks"), list) else []
        rep.status.append("INCOMPLETE" if miss else "OK")
        counts: dict[int, int] = {}  # rank -> collectives it launched: one rank behind all others is named
        for r in (c.get("ranks") or [])[:4096] if isinstance(c.get("ranks"), list) else []:
            cc = r.get("collective_counts") if isinstance(r, dict) else None
            if isinstance(r.get("rank"), int) and isinstance(cc, dict):
                counts[r["rank"]] = sum(v for v in cc.values() if isinstance(v, int) and not isinstance(v, bool))
        if len(counts) > 1:
            low = min(counts.values())
            behind = [r for r, n in counts.items() if n == low]
            if len(behind) == 1 and max(counts.values()) > low:
                m = next(x for x in c["ranks"] if isinstance(x, dict) and x.get("rank") == behind[0])
                _add(
                    rep,
                    RasNamed(
                        "behind",
                        rank=behind[0],
                        host=_clean(str(m.get("host") or ""))[:100] or None,
                        pid=m.get("pid") if isinstance(m.get("pid"), int) else None,
                    ),
                )
        for m in miss[:64]:
            if not isinstance(m, dict):
                continue
            st = m.get("status") if isinstance(m.get("status"), dict) else {}
            why = "dead" if st.get("considered_dead") else ("unresponsive" if st.get("unresponsive") else "missing")
            rank = m.get("rank") if isinstance(m.get("rank"), int) else None
            pid = m.get("pid") if isinstance(m.get("pid"), int) else None
            gpu = m.get("cuda_dev") if isinstance(m.get("cuda_dev"), int) else None
            host = _clean(str(m.get("host")))[:100] if m.get("host") else None
            _add(rep, RasNamed(why, rank=rank, host=host, pid=pid, gpu=gpu))
    return rep


def parse(output: str) -> RasReport | None:
    """What ``fd_ras`` printed (``@@fd_ras`` records) into a report; None when it did not run."""
    if "@@fd_ras_start" not in output:
        return None
    head = re.search(r"@@fd_ras_start (.*)", output)
    kv = dict(re.findall(r"(\w+)=(\S*)", head.group(1))) if head else {}
    if kv.get("available") != "yes":
        reason = re.search(r"reason=(.*)$", head.group(1)) if head else None
        return RasReport(False, reason=_clean(reason.group(1)).strip()[:200] if reason else "unknown")
    body = output.split(head.group(0), 1)[1] if head else ""
    body = body.split("@@fd_ras_end", 1)[0]
    end = re.search(r"@@fd_ras_end rc=(\d+)", output)
    if not body.strip():
        rc = end.group(1) if end else "?"
        return RasReport(
            False, reason=f"no answer on {kv.get('addr', '?')} (exit {rc}: no RAS listening, or it timed out)"
        )
    fmt = kv.get("format", "text")
    rep = parse_json(body) if fmt == "json" and body.lstrip().startswith("{") else parse_text(body)
    rep.via = kv.get("via")
    if (
        rep.available
        and not rep.status
        and not rep.named
        and "Job summary" not in body
        and not body.lstrip().startswith("{")
    ):
        return RasReport(False, reason=f"{kv.get('addr', '?')} answered, but not as RAS: {_clean(body.strip())[:80]}")
    return rep
