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

import calendar
import re
import time as _time
from datetime import datetime, timedelta, timezone
from typing import Any

from .. import facts as facts_mod
from .. import remote
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
from .correlate import AppError, KernelDecision, decide, evidence
from .gpu_health import GpuHealth, degraded, parse_health
from .kernel import KernelCollection, bus_key, parse_sections
from .xid import XidTable

# The remote part: kernel.sh's functions, then the call that prints its sections as K records.
SCRIPT = remote.load("kernel.sh") + remote.load("kernel_probe.sh")
QUIET_AFTER = 60.0  # a log silent this long (and naming no error) may have been stopped by a kernel event
GPU_HINT = (
    "the failing rank's GPU is faulty now: drain the node and reset the GPU; RMA it if the fault persists after a reset"
)


def script_vars(path_prepend: str | None = None) -> dict[str, str]:
    """The shell variables the kernel part reads (the funnel quotes and exports each)."""
    return {"FD_KPATH": path_prepend or ""}


# ------------------------------------------------------------------ the application's side


_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_T_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T _-](\d\d):(\d\d):(\d\d)([.,]\d+)?\s*(Z|[+-]\d\d:?\d\d)?")
_T_MD = re.compile(r"^(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?$")  # vLLM: 05-15 08:57:36
_T_GLOG = re.compile(r"^(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?$")  # glog: 0810 15:36:05.94
_T_SYSLOG = re.compile(r"^([A-Za-z]{3})\s+(\d{1,2}) (\d\d):(\d\d):(\d\d)$")


def app_time(text: str | None, now: float | None, tz_offset: int = 0) -> float | None:
    """A log timestamp as epoch seconds on the host's clock; stamps without a year take the latest year
    that does not put them in the future, stamps without a zone the host's zone."""
    if not text:
        return None
    s = text.strip()
    tz = timezone(timedelta(seconds=tz_offset))
    m = _T_ISO.search(s)
    if m:
        y, mo, d, hh, mi, ss, frac, z = m.groups()
        if z:
            zz = z.replace(":", "")
            tz = (
                timezone.utc
                if z == "Z"
                else timezone(
                    timedelta(seconds=(1 if zz[0] == "+" else -1) * (int(zz[1:3]) * 3600 + int(zz[3:5]) * 60))
                )
            )
        try:
            dt = datetime(int(y), int(mo), int(d), int(hh), int(mi), int(ss), tzinfo=tz)
        except ValueError:
            return None
        return dt.timestamp() + float((frac or "0").replace(",", ".") or 0)
    parts: tuple[int, int, int, int, int, float] | None = None
    for rx in (_T_MD, _T_GLOG):
        m = rx.match(s)
        if m:
            parts = (int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), float(m[6] or 0))
            break
    m = _T_SYSLOG.match(s)
    if m and m[1].lower() in _MONTHS:
        parts = (_MONTHS[m[1].lower()], int(m[2]), int(m[3]), int(m[4]), int(m[5]), 0.0)
    if parts is None:
        return None
    ref = now if now is not None else _time.time()
    year = _time.gmtime(ref + tz_offset).tm_year
    for y in (year, year - 1):
        try:
            t = datetime(y, parts[0], parts[1], parts[2], parts[3], parts[4], tzinfo=tz).timestamp() + parts[5]
        except ValueError:
            continue
        if t <= ref + 86400:  # a day of slack for clocks and zones
            return t
    return None


_PID = re.compile(r"\bpid[= ](\d+)|\[(\d+)\]")
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


def app_error(d: Decisive, facts: dict[str, Any], when: float | None) -> AppError:
    """What correlate needs of the log's decisive error: its line, time, pid, process name and GPU."""
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
    )


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
    kc = parse_sections("\n".join(fr.kernel))
    fact = _fact(kc)
    if fact is not None:
        if kc.clock.boot is not None:  # the history tells a reboot by it (store.Recurrence)
            fact["boot"] = round(kc.clock.boot)
        res.facts["kernel_log"] = fact
    events = kc.events()
    health = parse_health(kc.smi) if kc.smi_status == "ok" else []
    now = kc.clock.now if kc.clock.now is not None else fr.now
    d = res.decisive
    app: AppError | None = None
    silent = False
    if d is not None and res.verdict in (FAILED, STALLED):
        when = app_time(d.time, now, kc.clock.tz_offset) or fr.mtime
        app = app_error(d, res.facts, when)
    elif (
        fr.status == "ok"
        and res.verdict in (HEALTHY, STARTING, STALLED)
        and fr.mtime is not None
        and (fr.idle_seconds or 0) >= QUIET_AFTER
    ):
        app = AppError(line="", time=fr.mtime)  # the log's last write: what stopped it?
        silent = True
    dec = decide(app, events, health, table) if app is not None else None
    res.evidence = evidence(None if silent else app, events, health)
    if dec is not None:
        res.decisive = _kernel_decisive(dec, d, linked=not dec.why.endswith(("time window", "latest kernel fault")))
        if silent:
            res.decisive.reason = f"{dec.why}; the log fell silent at {iso(fr.mtime)}"
            res.summary = (f"the log stopped {iso(fr.mtime)}: " + (res.summary or "")).rstrip(": ")
        res.verdict = FAILED
        return res
    if app is not None and not silent and d is not None:
        g = _app_gpu(app, health)
        if g is not None and g.degrading:
            res.decisive = _gpu_decisive(g, d)
            res.verdict = FAILED
            return res
    reasons = degraded(health)
    if reasons and res.verdict in (HEALTHY, STARTING, NO_LOG):
        res.verdict = DEGRADED
        res.summary = "; ".join(reasons) + (f" (log: {res.summary})" if res.summary else "")
    return res
