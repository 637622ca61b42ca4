"""One host's kernel and GPU evidence applied to its result: the step ``probe.finish`` ends with.

The probe's round trip carries ``kernel.sh`` after the funnel and the facts (``SCRIPT``); its lines come back
as the FunnelResult's ``kernel`` records. Here they become the HOST record's ``evidence`` and, when the
decision (``correlate.decide``) says so, its decisive cause:

- the log names an error: the application's error (its process, pid, GPU through CUDA_VISIBLE_DEVICES, its time
  on the remote clock) is matched against the kernel events; a kernel event that wins becomes the decisive
  cause (``source: kernel``) and the application's error its ``consequence``. Without a kernel line, a GPU
  that is faulty now and is the failing rank's own GPU is the cause (``source: gpu``).
- the log names no error but fell silent: a kernel fault around the log's last write (an OOM kill, a GPU that
  fell off the bus) is why it stopped: the host failed, with the kernel line as its cause.
- nothing failed, but a GPU is faulty (lost, uncorrectable ECC, remap failure, narrower link): ``degraded``.

A kernel log that cannot be read is a fact with its fix (``facts.kernel_log``), never silence.
Pure: no SSH, no UI.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .. import facts as facts_mod
from .. import remote, timestamps
from ..analysis.fingerprint import fingerprint
from ..records import (
    DEGRADED,
    FAILED,
    HEALTHY,
    NO_LOG,
    STALLED,
    STARTING,
    Decisive,
    FunnelResult,
    HostResult,
)
from ..units import iso
from .correlate import AppError, KernelDecision, current, decide, evidence, standalone, unrecovered
from .gpu_health import GpuHealth, degraded, parse_health
from .kernel import KernelCollection, bus_key, parse_sections
from .xid import XidTable, default_xid_table


def table_or_default(table: XidTable | None) -> XidTable:
    return table or default_xid_table()


# The remote part: kernel.sh's functions, then the call that prints its sections as K records.
SCRIPT = remote.load("kernel.sh") + remote.load("kernel_probe.sh")
QUIET_AFTER = 60.0  # a log silent this long (and naming no error) may have been stopped by a kernel event
# A failed job's own error this far from the GPU (its code, its imports, its disk) keeps its place next to an
# unrecovered GPU fault; any other (CUDA, NCCL, OOM, a native crash, a GPU count that no longer adds up, unknown)
# is taken as the fault's consequence.
UNRELATED = ("import", "python", "disk")
GPU_HINT = (
    "the failing rank's GPU is faulty now: drain the node and reset the GPU; RMA it if the fault persists after a reset"
)


def script_vars(path_prepend: str | None = None) -> dict[str, str]:
    """The shell variables the kernel part reads (the funnel quotes and exports each)."""
    return {"FD_KPATH": path_prepend or ""}


# ------------------------------------------------------------------ the application's side


_PID = re.compile(r"\bpid[=:]?\s*(\d+)|\[(\d+)\]")
# the shell reporting a native program's death: sh/bash 'line 15:   341 Segmentation fault      (core dumped) CMD',
# zsh '[1]    2111498 segmentation fault (core dumped)  CMD': the pid and the program the kernel names (comm)
_SHELL_DEATH = re.compile(
    r"(?:^|:\s+|^\[\d+\][+-]?\s+)(?P<pid>\d+)\s+(?:Segmentation fault|Aborted|Killed|Bus error|Illegal instruction|"
    r"Floating point exception|Trace/breakpoint trap|segmentation fault|abort|killed|bus error|"
    r"illegal hardware instruction)\s+(?:\(core dumped\)\s+)?(?P<cmd>\S+)"
)
_NAME = re.compile(r"^\(?([A-Za-z_][\w:.\-]*)")
_DEVICE = re.compile(r"current device: (\d+)|\bcuda:(\d+)|\bGPU (\d+)\b|\bdevice (\d+)\b")
_UUID = re.compile(r"\bGPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_PCI = re.compile(r"\b(?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?\b")


def _host_gpu(ordinal: int | None, facts: dict[str, Any]) -> int | None:
    """A CUDA device ordinal (as the process numbers its GPUs) → the host's GPU index, through
    CUDA_VISIBLE_DEVICES when the facts know it."""
    if ordinal is None:
        return None
    vis = facts_mod.visibility(facts.get("cuda_visible_devices"), facts.get("gpus"))
    if vis.indices:
        return vis.indices[ordinal % len(vis.indices)]
    return ordinal


_RANK_PID = "(?:\\[rank{r}\\]|\\brank {r}/\\d+).*?\\bpid[=:]?\\s*(\\d+)"


def _rank_pid(rank: int, lines: list[str]) -> int | None:
    """The rank's pid as the log states it: its own line ('[rank1] … pid 659'), else torchelastic's summary
    ('rank : 1 (local_rank: 0)' then 'exitcode : -6 (pid: 2136)')."""
    rx = re.compile(_RANK_PID.format(r=rank))
    for text in lines:
        m = rx.search(text)
        if m:
            return int(m.group(1))
    head = re.compile(rf"^\s*rank\s*:\s*{rank}\b")
    for i, text in enumerate(lines):
        if head.match(text):
            for nxt in lines[i + 1 : i + 3]:
                m = re.search(r"\(pid: (\d+)\)", nxt)
                if m:
                    return int(m.group(1))
    return None


_CHILD_PID = re.compile(
    r"failed \(exitcode: -?\d+\) local_rank: \d+ \(pid: (\d+)\)|^\s*exitcode\s*: -?\d+ \(pid: (\d+)\)"
)


def _launcher_pid(lines: list[str]) -> int | None:
    """The one child pid a launcher reports failed (torchelastic's 'failed (exitcode: -6) local_rank: 0
    (pid: 2136)' and its summary's 'exitcode : -6 (pid: 2136)'): the failing process, when the error line
    names none. Several failed children name no one."""
    pids = {int(m.group(1) or m.group(2)) for m in (_CHILD_PID.search(t) for t in lines) if m}
    return pids.pop() if len(pids) == 1 else None


_PROGRAM_NAME = re.compile(r"(?:/|\b)([A-Za-z_][\w+-]{5,})(?:\.(?:cu|cpp|cc|c)\b|\s|$|:)")


class LogNames:
    """Program names the log names: the last part of a path ('/tmp/native/illegal_address_32g'), a source
    file's stem ('illegal_address_32g.cu:26'). The kernel's comm (15 characters) links to one of these.

    Found on first use: only a kernel event that names a process asks (``correlate``), and the search
    over 400 lines is a fifth of a host's analysis."""

    def __init__(self, lines: list[str]) -> None:
        self._lines: list[str] | None = lines
        self._names: frozenset[str] = frozenset()

    def _found(self) -> frozenset[str]:
        if self._lines is not None:
            out: set[str] = set()
            for text in self._lines[:400]:
                out.update(m.group(1) for m in _PROGRAM_NAME.finditer(text))
                if len(out) > 2000:
                    break
            self._names, self._lines = frozenset(out), None
        return self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._found())

    def __contains__(self, name: object) -> bool:
        return name in self._found()

    def __len__(self) -> int:
        return len(self._found())

    def __eq__(self, other: object) -> bool:
        return self._found() == (other._found() if isinstance(other, LogNames) else other)

    __hash__ = None  # type: ignore[assignment]


def _log_names(lines: list[str]) -> LogNames:
    return LogNames(lines)


def app_error(d: Decisive, facts: dict[str, Any], when: float | None, log_lines: list[str] | None = None) -> AppError:
    """What correlate needs of the log's decisive error: its line, time, pid, process name and GPU.

    ``log_lines`` (the funnel's lines) add the rank's pid where the log states it ('[rank1] … pid 659') and
    the program names the log names, for a native program whose error line names neither."""
    proc = d.process or ""
    pid = None
    for src in (proc, d.line):
        m = _PID.search(src)
        if m:
            pid = int(m.group(1) or m.group(2))
            break
    name = None
    m = _NAME.match(proc.strip())
    if m and not m.group(1).startswith(("rank", "pid")):
        name = m.group(1)
    shell = _SHELL_DEATH.search(d.line)
    if shell:  # the shell names the native program that died, and its pid
        pid = int(shell["pid"])
        name = name or shell["cmd"].rsplit("/", 1)[-1]
    rank = d.rank
    if rank is None:
        rm = re.match(r"rank(\d+)$", proc.strip())
        rank = int(rm.group(1)) if rm else None
    if pid is None and rank is not None and log_lines:
        pid = _rank_pid(rank, log_lines)
    if pid is None and log_lines:
        pid = _launcher_pid(log_lines)
    text = "\n".join([d.message or d.line, *d.traceback[-20:]])
    ordinal = None
    m = _DEVICE.search(text)
    if m:
        ordinal = int(next(g for g in m.groups() if g is not None))
    elif d.rank is not None:
        ordinal = d.rank
    else:  # a vLLM worker's tag: Worker_TP1, Worker_DP1_TP0 (its local device is dp × tp_size + tp)
        tp = re.search(r"TP(\d+)", proc)
        dp = re.search(r"DP(\d+)", proc)
        if tp:
            ordinal = int(tp.group(1))
            size = (facts.get("parallel") or {}).get("tp")
            if dp and isinstance(size, int):
                ordinal += int(dp.group(1)) * size
    uuid = _UUID.search(text)
    pci = _PCI.search(text)
    return AppError(
        line=d.line,
        time=when,
        pid=pid,
        process=name,
        gpu=_host_gpu(ordinal, facts),
        uuid=uuid.group(0) if uuid else None,
        bus=pci.group(0) if pci else None,
        names=_log_names([*(log_lines or []), d.line, *d.traceback]),
    )


_STAMP_AT_START = re.compile(
    r"^\[?(?:\S+\s+)?(?:\(\S+ pid=\d+\)\s+)?(?:[A-Z]+\s+)?"
    r"(?P<t>\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?|[A-Za-z]{3}\s+\d{1,2} \d\d:\d\d:\d\d)"
)
_GLOG_AT_START = re.compile(r"^[IWEF](?P<t>\d{4} \d\d:\d\d:\d\d(?:\.\d+)?)\b")


def last_stamp(lines: list[str], now: float | None, tz_offset: int = 0) -> float | None:
    """The time of the latest line that starts with a stamp (ISO, vLLM's, syslog/journald, glog), read from the
    end: where a saved copy of a log ends."""
    for text in reversed(lines[-200:]):
        m = _GLOG_AT_START.match(text) or _STAMP_AT_START.match(text)
        if m:
            t = timestamps.epoch(m["t"], tz_offset, now)
            if t is not None:
                return t
    return None


# ------------------------------------------------------------------ the decision, applied


def _kernel_decisive(dec: KernelDecision, app: Decisive | None, linked: bool) -> Decisive:
    ev = dec.event
    message = ev.message if ev is not None else dec.line
    kind = f"Xid {dec.code}" if dec.kind == "xid" and dec.code is not None else dec.kind
    process = None
    if ev is not None and (ev.process or ev.pid):
        process = " ".join(p for p in (ev.process, f"pid={ev.pid}" if ev.pid else None) if p)
    return Decisive(
        line=dec.line,
        message=message,
        process=process,
        time=iso(ev.time) if ev is not None else None,
        exception_type=kind,
        category=dec.category,
        traceback=list(app.traceback) if app else [],
        hint=dec.hint,
        fingerprint=fingerprint(kind, message),
        confidence=0.9 if linked else 0.75,
        reason=dec.why,
        rank=app.rank if app else None,
        source="kernel",
        consequence=app.line if app else None,
    )


def _gpu_decisive(g: GpuHealth, app: Decisive) -> Decisive:
    name = f"GPU {g.index}" if g.index is not None else f"GPU {g.bus_id or '?'}"
    line = f"{name}: {'; '.join(g.degrading)}"
    return Decisive(
        line=line,
        message=line,
        process=None,
        exception_type="gpu-health",
        category="hardware",
        traceback=list(app.traceback),
        hint=GPU_HINT,
        fingerprint=fingerprint("gpu-health", "; ".join(g.degrading)),
        confidence=0.7,
        reason=f"nvidia-smi: the failing process's GPU ({name}) is faulty",
        rank=app.rank,
        source="gpu",
        consequence=app.line,
    )


def _app_gpu(app: AppError, health: list[GpuHealth]) -> GpuHealth | None:
    bus = bus_key(app.bus)
    for g in health:
        if (bus and g.bus == bus) or (app.uuid and g.uuid == app.uuid) or (app.gpu is not None and g.index == app.gpu):
            return g
    return None


def _fact(kc: KernelCollection) -> dict[str, Any] | None:
    fact = kc.fact()
    if fact is not None:
        return fact
    if kc.source:
        return {"kernel_log": "read", "source": kc.source, "lines": sum(1 for ln in kc.lines if ln.strip())}
    return None


def apply(res: HostResult, fr: FunnelResult, table: XidTable | None = None) -> HostResult:
    """Put the kernel/GPU evidence of ``fr`` into ``res`` and let it decide the cause when it is one."""
    if not fr.kernel:
        return res
    return apply_collection(res, fr, parse_sections("\n".join(fr.kernel)), table)


def apply_collection(
    res: HostResult, fr: FunnelResult, kc: KernelCollection, table: XidTable | None = None, live: bool = True
) -> HostResult:
    """``apply`` on a collection already read (the probe's K records, or a ticket's files for ``analyze``).

    ``live``: the log's mtime is when the job last wrote (a probe). A ticket's copy (``live=False``) has only
    the times written in its lines: its end is its last stamp, an error line without a stamp has no time, and
    a log that names no error ended because of a kernel fault when that fault is near its end (or, with no
    stamps, when it never finished starting)."""
    fact = _fact(kc)
    if fact is not None:
        if kc.clock.boot is not None:  # the history tells a reboot by it (store.Recurrence)
            fact["boot"] = round(kc.clock.boot)
        res.facts["kernel_log"] = fact
    events = kc.events()
    if kc.health is not None:
        health = kc.health
    else:
        health = parse_health(kc.smi) if kc.smi_status == "ok" else []
    now = kc.clock.now if kc.clock.now is not None else fr.now
    d = res.decisive
    app: AppError | None = None
    silent = False
    if d is not None and res.verdict in (FAILED, STALLED):
        when = timestamps.epoch(d.time, kc.clock.tz_offset, now) or (fr.mtime if live else None)
        app = app_error(d, res.facts, when, [ln.text for ln in fr.lines()])
    elif (
        live
        and fr.status == "ok"
        and res.verdict in (HEALTHY, STARTING, STALLED)
        and fr.mtime is not None
        and (fr.idle_seconds or 0) >= QUIET_AFTER
    ):
        app = AppError(line="", time=fr.mtime, names=_log_names([ln.text for ln in fr.lines()]))  # what stopped it?
        silent = True
    elif not live and fr.status == "ok" and res.verdict in (HEALTHY, STARTING, STALLED):
        end = last_stamp([ln.text for ln in fr.lines()], now, kc.clock.tz_offset)
        if end is not None or res.verdict in (STARTING, STALLED):
            app = AppError(line="", time=end, names=_log_names([ln.text for ln in fr.lines()]))  # what ended it?
            silent = True
    dec = decide(app, events, health, table) if app is not None else None
    res.evidence = evidence(None if silent else app, events, health)
    if dec is not None:
        res.decisive = _kernel_decisive(dec, d, linked=not dec.why.endswith(("time window", "latest kernel fault")))
        if silent:
            end = app.time if app is not None else None
            res.decisive.reason = (
                f"{dec.why}; the log fell silent at {iso(fr.mtime)}"
                if live
                else f"{dec.why}; the log names no error and ends " + (f"at {iso(end)}" if end else "there")
            )
            if live:
                res.summary = (f"the log stopped {iso(fr.mtime)}: " + (res.summary or "")).rstrip(": ")
        if (
            dec.event is not None
            and kc.smi_status == "ok"
            and unrecovered(dec.event, [], set(), table_or_default(table))
        ):
            res.decisive.reason += "; " + _smi_says(dec, kc, health)[0]  # what nvidia-smi says of that GPU now
        res.verdict = FAILED
        return res
    if app is not None and not silent and d is not None:
        g = _app_gpu(app, health)
        if g is not None and g.degrading:
            res.decisive = _gpu_decisive(g, d)
            res.verdict = FAILED
            return res
    reasons = degraded(health)
    fault = standalone(current(events), health, table)
    if fault is not None:
        return _standing_fault(res, fault, kc, health, reasons)
    if reasons and res.verdict in (HEALTHY, STARTING, NO_LOG):
        res.verdict = DEGRADED
        res.summary = "; ".join(reasons) + (f" (log: {res.summary})" if res.summary else "")
    return res


def _standing_fault(
    res: HostResult, fault: KernelDecision, kc: KernelCollection, health: list[GpuHealth], reasons: list[str]
) -> HostResult:
    """An unrecovered GPU fault of the current boot that no application error was tied to: the host is
    ``degraded`` (``failed`` when its job failed of something the fault explains) with the kernel line as its
    cause, nvidia-smi refining what it says and its absence clearing nothing."""
    d = res.decisive
    note, confidence = _smi_says(fault, kc, health)
    if res.verdict == FAILED and d is not None and d.category in UNRELATED:
        res.markers.append(f"the kernel log also shows an unrecovered GPU fault: {fault.line}")
        return res
    if res.verdict == STALLED:
        res.markers.append(f"the kernel log shows an unrecovered GPU fault: {fault.line}")
        return res
    job_failed = res.verdict == FAILED and d is not None
    new = _kernel_decisive(fault, d if job_failed else None, linked=False)
    new.reason = f"{fault.why}; {note}"
    new.confidence = confidence
    if job_failed:
        new.consequence = d.line
        res.decisive = new
        return res
    log_summary = res.summary if res.verdict != NO_LOG else (res.error or "")
    res.decisive = new
    res.verdict = DEGRADED
    res.summary = "; ".join([f"kernel: {fault.event.message if fault.event else fault.line}", *reasons]) + (
        f" (log: {log_summary})" if log_summary else ""
    )
    return res


def _smi_says(fault: KernelDecision, kc: KernelCollection, health: list[GpuHealth]) -> tuple[str, float]:
    """What nvidia-smi adds to a kernel fault, and the confidence that results."""
    bus = fault.event.bus if fault.event is not None else None
    if kc.smi_status == "not-given":
        return "no nvidia-smi output given: the kernel line stands alone", 0.8
    if kc.smi_status in (None, "absent"):
        return "nvidia-smi is not installed: the kernel line stands alone", 0.8
    if not health:
        return "nvidia-smi answers but reaches no GPU", 0.9
    g = next((g for g in health if bus and g.bus == bus), None)
    if g is not None and g.degrading:
        name = f"GPU {g.index}" if g.index is not None else f"GPU {g.bus_id}"
        return f"nvidia-smi confirms: {name}: {'; '.join(g.degrading)}", 0.95
    if g is None and bus:
        return f"nvidia-smi does not list the GPU at {bus}", 0.9
    if g is not None:
        pend = [f for f in g.faults if "pending" in f]
        name = f"GPU {g.index}" if g.index is not None else f"GPU {g.bus_id}"
        if pend:
            return f"nvidia-smi: {name}: {'; '.join(pend)}", 0.9
        return (
            f"nvidia-smi reaches {name} now with no fault: a reset may have cleared it; "
            "check it before it takes jobs again",
            0.6,
        )
    return "nvidia-smi answers; the kernel line names no GPU it lists", 0.75
