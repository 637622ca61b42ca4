"""The decision: is a kernel event the decisive cause of this host's failure?

Pure functions over the application's decisive error, the kernel events and the GPU health.
A kernel event is the cause when it names the failing process (pid or name) or the failing GPU
(bus id <-> index <-> UUID), or, lacking a link, when it is a hardware/driver/host-memory event of the
host's latest burst that is not far from the application's error in time. The first cause-capable event
of a burst wins (later lines of the same burst are its consequences: Xid 109 after Xid 13, SXid after Xid 79);
a "caused by previous Xid N" line stands for Xid N. Benign lines are never chosen.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from .gpu_health import GpuHealth
from .kernel import KernelEvent, aer_fatal, bus_key
from .xid import XidTable, default_xid_table

BURST_GAP = 120.0  # seconds of silence that separate two bursts of kernel lines
WINDOW_BEFORE = 900.0  # a kernel event this long before the app error can still be its cause
WINDOW_AFTER = 120.0  # kernel clocks (dmesg -T) drift: allow the kernel line to look later
RELOAD_GRACE = 30.0  # a fault this close before a driver load belongs to that load (a probe that failed)
_ASKED = re.compile(r"recovery action changed from .*? to \S+ \(([^)]+)\)")

HINTS = {
    "host-oom": "host memory ran out and the kernel killed the process: lower host memory use "
    "(fewer data-loader workers, smaller batches or prefetch) or add RAM",
    "oom-cgroup": "the container's memory limit was reached and the kernel killed the process: raise the limit "
    "or lower the job's host memory use",
    "gpu-init": "the driver could not initialise or needs to reset the GPU: reset the GPU or reboot the node; "
    "drain and RMA if it persists",
    "segfault": "the process crashed in native code: fix the code or the library version it names",
    "hung-task": "tasks stuck in uninterruptible sleep (a driver or I/O hang): drain the node and reboot it",
    "gpu-lost": "the GPU has left the bus: drain the node, power-cycle it, RMA the GPU if it recurs",
    "pcie": "PCIe link errors on the GPU's path: drain the node, reseat or replace the riser/GPU",
    "mce": "CPU/memory machine check: drain the node and have the hardware checked",
    "sxid": "NVSwitch fatal error: drain the node, reset the fabric, RMA if it recurs",
}


@dataclass
class AppError:
    """The application's decisive error, as far as it is known."""

    line: str
    time: float | None = None
    pid: int | None = None
    process: str | None = None
    gpu: int | None = None  # GPU index (the rank's device, after CUDA_VISIBLE_DEVICES)
    bus: str | None = None
    uuid: str | None = None
    names: Collection[str] = frozenset()  # program names the log itself names (its binary, its source file)


@dataclass
class KernelDecision:
    source: str  # "kernel"
    category: str  # hardware | driver | host-oom | application
    line: str
    hint: str
    kind: str
    code: int | None
    why: str
    consequence: str | None = None  # the application's error line, shown under the cause
    event: KernelEvent | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "category": self.category,
            "line": self.line,
            "hint": self.hint,
            "kind": self.kind,
            "code": self.code,
            "why": self.why,
            "consequence": self.consequence,
        }


@dataclass
class Outcome:
    decisive: KernelDecision | None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)


def _class(ev: KernelEvent, table: XidTable) -> tuple[str | None, str, str]:
    """(category or None when it can never be a cause, strength, hint). strength: strong | weak | app."""
    if ev.benign:
        return None, "", ""
    if ev.kind == "xid":
        code = ev.cause_code if ev.cause_code is not None and ev.code == 45 else ev.code
        info = table.get(code)
        if code == 154:
            return _recovery_class(ev, table)
        if info.action == "informational":
            return info.category, "weak", info.hint
        return info.category, ("app" if info.action == "application" else "strong"), info.hint
    if ev.kind == "gpu-lost":
        return "hardware", "strong", HINTS["gpu-lost"]
    if ev.kind == "gpu-init":
        return "driver", "strong", HINTS["gpu-init"]
    if ev.kind == "gsp":
        return "driver", "weak", table.hints.get("driver", "")
    if ev.kind in ("oom-kill", "oom-killed", "oom-reaped", "oom-invoke"):
        return "host-oom", "strong", HINTS["oom-cgroup" if "cgroup" in ev.message else "host-oom"]
    if ev.kind in ("segfault", "gpf"):
        return "application", "app", HINTS["segfault"]
    if ev.kind == "hung-task":
        return "driver", "strong", HINTS["hung-task"]
    if ev.kind == "pcie-aer":
        return "hardware", ("weak" if ev.severity == "corrected" else "strong"), HINTS["pcie"]
    if ev.kind == "pcie-aer-detail" and ev.severity == "uncorrected":
        return "hardware", "weak", HINTS["pcie"]
    if ev.kind == "mce" and ev.severity == "fatal":
        return "hardware", "strong", HINTS["mce"]
    if ev.kind == "sxid" and ev.severity == "fatal":
        return "hardware", "strong", HINTS["sxid"]
    if ev.kind in ("ecc", "nvlink"):
        return "hardware", "weak", table.hints.get("hardware", "")
    return None, "", ""  # details: watchdog, AER 'received', SXid non-fatal/data


def asked_recovery(ev: KernelEvent) -> str | None:
    """The recovery an Xid 154 line asks for ('GPU Reset Required', 'Node Reboot Required', 'Drain and Reset'),
    or None when it asks for none."""
    m = _ASKED.search(ev.message)
    if not m or m.group(1).strip().lower() == "none":
        return None
    return m.group(1).strip()


def _recovery_class(ev: KernelEvent, table: XidTable) -> tuple[str | None, str, str]:
    """Xid 154 states the recovery the GPU now needs, so its class follows that action (NVIDIA's Xid catalog):
    a reset or a reboot is the driver's remedy (the fault before it, a GSP or driver failure, is the cause);
    a drain ('Drain P2P', 'Drain and Reset') takes the GPU out of service: hardware. Asking for none is a record."""
    asked = asked_recovery(ev)
    if asked is None:
        return "driver", "weak", table.hints.get("informational", "")
    if "drain" in asked.lower():
        return "hardware", "strong", table.hints.get("hardware", "")
    return "driver", "strong", table.hints.get("driver", "")


def _bursts(events: list[KernelEvent]) -> list[list[KernelEvent]]:
    """Events in time order (source order for equal or unknown times), cut where the log fell silent."""
    if all(e.time is not None for e in events):
        clock = {id(e): e.time for e in events}
    elif all(e.mono is not None for e in events):  # seconds since boot with no wall clock (a saved dmesg)
        clock = {id(e): e.mono for e in events}
    else:
        clock = {id(e): e.time for e in events}
    evs = (
        sorted(events, key=lambda e: (clock[id(e)], e.pos))
        if all(clock[id(e)] is not None for e in events)
        else sorted(events, key=lambda e: e.pos)
    )
    out: list[list[KernelEvent]] = []
    last: float | None = None
    for e in evs:
        t = clock[id(e)]
        if out and not (t is not None and last is not None and t - last > BURST_GAP):
            out[-1].append(e)
        else:
            out.append([e])
        if t is not None:
            last = t
    return out


def _oom_episode_line(burst: list[KernelEvent], victim: KernelEvent) -> KernelEvent:
    """The line that states an OOM kill: 'Out of memory: Kill(ed) process', else 'Killed process',
    else the 'invoked oom-killer' header of the episode the reaper line belongs to."""
    i = burst.index(victim)
    for stated in (
        lambda e: e.kind == "oom-kill" and "Kill" in e.message and "process" in e.message,  # 'Out of memory: Kill…'
        lambda e: e.kind == "oom-killed",  # 'Killed process N (name)'
        lambda e: e.kind == "oom-kill",  # the 'oom-kill:constraint=…,task=…,pid=N' summary
    ):
        for e in burst:
            if stated(e) and e.pid == victim.pid:
                return e
    for e in reversed(burst[:i]):
        if e.kind == "oom-invoke":
            return e
    return victim


def _gpu_maps(events: list[KernelEvent], health: list[GpuHealth]) -> tuple[dict[int, str], dict[str, str]]:
    by_index = {g.index: g.bus for g in health if g.index is not None and g.bus}
    by_uuid = {g.uuid: g.bus for g in health if g.uuid and g.bus}
    for e in events:
        if e.uuid and e.bus:
            by_uuid.setdefault(e.uuid, e.bus)
    return by_index, by_uuid


def _linked(ev: KernelEvent, app: AppError | None, app_bus: str | None) -> str | None:
    if app is None:
        return None
    if app.pid is not None and ev.pid == app.pid:
        return f"pid {ev.pid}"
    if app.process and ev.process and _same_name(app.process, ev.process):
        return f"process {ev.process}"
    if app_bus and ev.bus == app_bus:
        return f"GPU {ev.bus}"
    if ev.process and _specific(ev.process) and any(_same_name(n, ev.process) for n in app.names):
        return f"process {ev.process} (named in the log)"
    return None


# comms every GPU host runs many of: a match by one of these says nothing
_GENERIC = re.compile(r"^(?:python[\d.]*|pt_main_thread|pt_autograd_\d+|bash|sh|java|node|ray::\w*|<unknown>)$", re.I)


def _specific(name: str) -> bool:
    return len(name) >= 6 and not _GENERIC.match(name)


def _same_name(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a == b or a[:15] == b[:15] or (len(min(a, b, key=len)) >= 6 and (a.startswith(b) or b.startswith(a)))


def _in_window(ev: KernelEvent, app: AppError | None) -> bool | None:
    if app is None or app.time is None or ev.time is None:
        return None
    return app.time - WINDOW_BEFORE <= ev.time <= app.time + WINDOW_AFTER


def decide(
    app: AppError | None,
    events: list[KernelEvent],
    health: list[GpuHealth] | None = None,
    table: XidTable | None = None,
) -> KernelDecision | None:
    """The kernel event that decides this host's failure, or None when the application's error stays decisive."""
    table = table or default_xid_table()
    health = health or []
    by_index, by_uuid = _gpu_maps(events, health)
    app_bus = None
    if app is not None:
        app_bus = (
            bus_key(app.bus)
            or (by_uuid.get(app.uuid) if app.uuid else None)
            or (by_index.get(app.gpu) if app.gpu is not None else None)
        )
    cands = [e for e in events if _class(e, table)[0] is not None]
    if not cands:
        return None
    bursts = _bursts(cands)
    scored: list[tuple[tuple[int, ...], KernelEvent, str]] = []  # (link, burst, strength, hardware, -order)
    for bi, burst in enumerate(bursts):
        for ei, ev in enumerate(burst):
            cat, strength, _ = _class(ev, table)
            link = _linked(ev, app, app_bus)
            win = _in_window(ev, app)
            if win is False and not (link and link.startswith("pid")):
                continue  # far from the failure in time
            if ev.kind in ("oom-reaped", "oom-killed", "oom-kill"):
                ev = _oom_episode_line(burst, ev)
                cat, strength, _ = _class(ev, table)
            elif ev.kind == "oom-invoke":
                continue  # names the allocator, not the victim; chosen only through its episode's kill line
            if app is not None and not link and strength in ("weak", "app") and not win:
                continue  # an unlinked weak or application-level event does not beat the app's own error
            why = link or ("in the failure's time window" if win else "the host's latest kernel fault")
            # in a burst: a hardware fault (drain, RMA) before a driver one, then the first line (a later line of
            # the same GPU is the first one's consequence)
            hw = 1 if cat == "hardware" and strength == "strong" else 0
            rank = (1 if link else 0, bi, 0 if strength == "weak" else 1, hw, -ei)
            scored.append((rank, ev, why))
    if not scored:
        return None
    # the latest burst decides; in it, strong before weak, a hardware fault before others, then the first line
    scored.sort(key=lambda s: s[0])
    rank, ev, why = scored[-1]
    return _decision(ev, why, app, table)


def _decision(ev: KernelEvent, why: str, app: AppError | None, table: XidTable) -> KernelDecision:
    cat, _, hint = _class(ev, table)
    code = ev.cause_code if ev.kind == "xid" and ev.code == 45 and ev.cause_code else ev.code
    if ev.kind == "xid":
        info = table.get(code)
        why = f"Xid {code} ({info.name}); {why}"
        asked = _ASKED.search(ev.message)
        if asked:
            hint = f"the driver asks for: {asked.group(1)}; {hint}"
    return KernelDecision(
        source="kernel",
        category=cat or "hardware",
        line=ev.line,
        hint=hint,
        kind=ev.kind,
        code=code,
        why=why,
        consequence=app.line if app else None,
        event=ev,
    )


# ------------------------------------------------------------------ a fault that stands on its own


def current(events: list[KernelEvent]) -> list[KernelEvent]:
    """The events of the running kernel and NVIDIA driver: history ends at the last boot ('Linux version',
    a journal's '-- Boot --') and at the last driver load, except a fault within RELOAD_GRACE seconds before
    that load (the load's own probe failing: 'fallen off the bus' then 'loading NVIDIA UNIX … Module')."""
    evs = sorted(events, key=lambda e: e.pos)
    boots = [i for i, e in enumerate(evs) if e.marker == "boot"]
    if boots:
        evs = evs[boots[-1] + 1 :]
    loads = [i for i, e in enumerate(evs) if e.marker == "driver-load"]
    if not loads:
        return evs
    load = evs[loads[-1]]
    keep = []
    for e in evs[: loads[-1]]:
        a, b = (e.time, load.time) if e.time is not None and load.time is not None else (e.mono, load.mono)
        if a is not None and b is not None and 0 <= b - a <= RELOAD_GRACE:
            keep.append(e)
    return keep + evs[loads[-1] + 1 :]


def _effective_code(ev: KernelEvent) -> int | None:
    return ev.cause_code if ev.code == 45 and ev.cause_code is not None else ev.code


def _on_gpu_path(ev: KernelEvent, window: list[KernelEvent], gpu_buses: set[str]) -> bool:
    """A PCIe error on a GPU's path: printed by the nvidia driver, on a GPU's bus, or on the port above a GPU
    that the same burst shows failing (the nvidia driver unable to recover, an Xid, a GPU off the bus)."""
    if ev.driver == "nvidia" or (ev.bus and ev.bus in gpu_buses):
        return True
    for e in window:
        if e.kind == "pcie-recovery" and (e.driver == "nvidia" or (e.bus and e.bus in gpu_buses)):
            return True
        if e.kind in ("xid", "gpu-lost", "gpu-init"):
            return True
    return False


def unrecovered(ev: KernelEvent, window: list[KernelEvent], gpu_buses: set[str], table: XidTable) -> bool:
    """Is this event a hardware or driver fault the GPU does not come back from without a reset, a reboot or
    an RMA? The Xids NVIDIA's catalog sends there (by their action class: hardware, driver), Xid 45 caused by
    one of them, Xid 154 asking for any recovery, a GPU off the bus or lost, an adapter that failed to
    initialise or needs a reset, a GSP failure, a fatal AER on a GPU's path, a fatal NVSwitch SXid."""
    if ev.benign:
        return False
    if ev.kind == "xid":
        code = _effective_code(ev)
        if code == 45:
            return False  # cleanup after a killed process
        if code == 154:
            return asked_recovery(ev) is not None
        return table.get(code).action in ("hardware", "driver")
    if ev.kind in ("gpu-lost", "gpu-init", "gsp"):
        return True
    if ev.kind == "pcie-aer":
        return aer_fatal(ev.severity) and _on_gpu_path(ev, window, gpu_buses)
    if ev.kind == "sxid":
        return ev.severity == "fatal"
    return False


def standalone(
    events: list[KernelEvent], health: list[GpuHealth] | None = None, table: XidTable | None = None
) -> KernelDecision | None:
    """The unrecovered GPU fault of the current boot that makes a host ``degraded`` on its own, whatever its
    log says and whether or not nvidia-smi answers; None when there is none.

    The latest burst that holds one decides. In it, each GPU's first such line is that GPU's fault (later lines
    on the same GPU are its consequences); of several GPUs' faults a hardware one (drain, RMA) is named before a
    driver one (a reset), then the earliest. A channel's event that follows an application fault on the same
    GPU in its burst (Xid 109 after Xid 13: the catalog's ``aftermath``) is that fault's consequence, not a
    fault of its own; a micro-controller halt or a GSP failure after one (Xid 62 after Xid 31) is the GPU's. Corrected
    errors, benign lines, OOM kills and segfaults never qualify."""
    table = table or default_xid_table()
    evs = current(events)
    gpu_buses = {e.bus for e in evs if e.bus and e.kind in ("xid", "gpu-lost", "gpu-init", "gsp")}
    gpu_buses |= {e.bus for e in evs if e.bus and e.uuid}  # 'NVRM: GPU at PCI:…: GPU-uuid'
    gpu_buses |= {g.bus for g in health or [] if g.bus}
    cands = [e for e in evs if _class(e, table)[0] is not None]
    if not cands:
        return None
    for burst in reversed(_bursts(cands)):
        window = _window(evs, burst)
        app_fault: set[str | None] = set()
        first: dict[str | None, tuple[int, KernelEvent]] = {}  # bus -> (order in the burst, its first fault)
        for i, ev in enumerate(burst):
            if ev.kind == "xid" and table.get(_effective_code(ev)).action == "application":
                app_fault.add(ev.bus)
                continue
            if not unrecovered(ev, window, gpu_buses, table):
                continue
            if ev.kind == "xid" and ev.bus in app_fault and table.get(_effective_code(ev)).aftermath:
                continue  # the application fault's aftermath on its own GPU
            first.setdefault(ev.bus, (i, ev))
        if first:
            # a strong statement before a weak one (Xid 154's request over the GSP heartbeat lines it follows),
            # a hardware fault before a driver one, then the earliest
            _, ev = min(
                first.values(),
                key=lambda f: (_class(f[1], table)[1] == "weak", _class(f[1], table)[0] != "hardware", f[0]),
            )
            why = "an unrecovered GPU fault of the current boot"
            cause = _cause_before(ev, burst, table) if ev.kind == "xid" and ev.code == 154 else None
            if cause is not None:
                why += f", after: {cause.message[:160]}"
            got = _decision(ev, why, None, table)
            asked = next(
                (
                    asked_recovery(e)
                    for e in burst
                    if e.kind == "xid" and e.code == 154 and e.bus == ev.bus and e is not ev
                ),
                None,
            )
            if asked and ev.kind == "xid" and ev.code != 154:  # the driver's request for the fault it follows
                got.hint = f"the driver asks for: {asked}; {got.hint}"
            return got
    return None


def _cause_before(ev: KernelEvent, burst: list[KernelEvent], table: XidTable) -> KernelEvent | None:
    """The fault an Xid 154 request follows in its burst: the first earlier GSP, driver or hardware line on its GPU
    or on no named GPU (the GSP heartbeat lines name none)."""
    for e in burst:
        if e is ev:
            return None
        if e.bus not in (None, ev.bus):
            continue
        cat, strength, _ = _class(e, table)
        if e.kind == "gsp" or (cat in ("driver", "hardware") and strength == "strong"):
            return e
    return None


def _window(evs: list[KernelEvent], burst: list[KernelEvent]) -> list[KernelEvent]:
    """Every event (details too) from the burst's first line to its last, by source order."""
    lo, hi = min(e.pos for e in burst), max(e.pos for e in burst)
    return [e for e in evs if lo - 20 <= e.pos <= hi + 20]


def evidence(
    app: AppError | None, events: list[KernelEvent], health: list[GpuHealth] | None = None, limit: int = 40
) -> list[dict[str, Any]]:
    """The HOST record's ``evidence`` list: the app error, kernel events of interest, GPU faults."""
    out: list[dict[str, Any]] = []
    if app is not None:
        out.append(
            {
                "source": "log",
                "time": app.time,
                "line": app.line,
                "pid": app.pid,
                "gpu": app.gpu,
                "kind": "error",
                "code": None,
            }
        )
    idx = {g.bus: g.index for g in (health or []) if g.bus}
    for e in [e for e in events if not e.benign][:limit]:
        out.append(
            {
                "source": "kernel",
                "time": e.time,
                "line": e.line,
                "pid": e.pid,
                "gpu": idx.get(e.bus, e.bus) if e.bus else None,
                "kind": e.kind,
                "code": e.code,
            }
        )
    for g in health or []:
        for f in g.faults:
            out.append(
                {
                    "source": "gpu",
                    "time": None,
                    "line": f,
                    "pid": None,
                    "gpu": g.index if g.index is not None else g.bus_id,
                    "kind": "lost" if g.lost else "health",
                    "code": None,
                }
            )
    return out


def correlate(
    app: AppError | None,
    events: list[KernelEvent],
    health: list[GpuHealth] | None = None,
    table: XidTable | None = None,
) -> Outcome:
    """Decision, evidence and degraded reasons in one call."""
    from .gpu_health import degraded

    return Outcome(decide(app, events, health, table), evidence(app, events, health), degraded(health or []))
