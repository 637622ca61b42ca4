"""Kernel log lines of interest, in every time format a host prints them.

The remote side (fleetdiag/remote/kernel.sh) sends marked sections; ``parse_sections``
splits them, ``parse_kernel_lines`` turns each kernel line into a ``KernelEvent``.
Benign driver lines (module load, GPU announcements, FBHUB notices, persistence-mode
notices) become events of kind ``benign`` that the decision never chooses; they still
carry the GPU's bus id and UUID so an application's GPU UUID can be mapped to a bus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .. import timestamps

# ---------------------------------------------------------------- time prefixes
_ISO = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_RE_ISO = re.compile(rf"^(?P<t>{_ISO})\s+(?:(?P<host>\S+)\s+)?kernel:\s?(?:\[\s*\d+\.\d+\]\s*)?")
_RE_ISO_BARE = re.compile(rf"^(?P<t>{_ISO})\s+")  # dmesg --time-format iso
# Talos: 'kern: warning: [<ISO>]: ', with the node's name or address before it when talosctl asked many nodes
_RE_TALOS = re.compile(rf"^(?:[\w.:-]+:\s+)?kern:\s*\w+:\s*\[(?P<t>{_ISO})\]:\s*")
# a month or a weekday as a locale abbreviates it ("Apr", "kwi", "févr.", "2月", "Do", "Чт"); see timestamps
_MON = timestamps.MONTH_WORD
_DAY = r"[^\W\d_]{2,5}\.?"
_RE_SYSLOG = re.compile(  # syslog, journalctl -o short and short-precise (fractional seconds)
    rf"^(?P<mon>{_MON})\s+(?P<day>\d{{1,2}})\s+(?P<hms>\d\d:\d\d:\d\d)(?P<frac>\.\d+)?\s+"
    r"(?:(?P<host>\S+)\s+)?kernel:\s?(?:\[\s*(?P<boot>\d+\.\d+)\]\s*)?"
)
_RE_FULL = re.compile(  # journalctl -o short-full: 'Tue 2024-08-30 11:43:09 UTC host kernel: '
    r"^[A-Za-z]{3} (?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?: (?P<zone>[A-Z]{2,5}|[+-]\d{4}))?\s+"
    r"(?:(?P<host>\S+)\s+)?kernel:\s?"
)
_RE_MONO_HOST = re.compile(r"^\S+ kernel:\s?")  # journalctl -o short-monotonic: '[ 5.1] host kernel: '
_RE_BOOT_MARK = re.compile(r"^Linux version \d|^-- (?:Boot [0-9a-f]+|Reboot) --")
_RE_DRIVER_LOAD = re.compile(r"NVRM: loading NVIDIA UNIX")
_RE_CTIME = re.compile(  # dmesg -T
    rf"^\[(?:{_DAY}\s+)?(?P<mon>{_MON})\s+(?P<day>\d{{1,2}})\s+(?P<hms>\d\d:\d\d:\d\d)\s+"
    r"(?P<year>\d{4})\]\s?"
)
_RE_HUMAN_ABS = re.compile(rf"^\[(?P<mon>{_MON})(?P<day>\d{{1,2}})\s+(?P<hm>\d\d:\d\d)\]\s?")  # dmesg -H header
_RE_HUMAN_REL = re.compile(r"^\[\s*\+(?P<rel>\d+\.\d+)\]\s?")
_RE_BOOT = re.compile(r"^\[\s*(?P<boot>\d+\.\d+)\]\s?")
_RE_KERNEL = re.compile(r"^kernel:\s?")

# ---------------------------------------------------------------- message shapes
_RE_XID = re.compile(r"\bXid \(PCI:(?P<bus>[^)]*)\):\s*(?P<code>\d+)(?P<rest>.*)")
_RE_PID = re.compile(r"\bpid=(?:'?<unknown>'?|(?P<pid>\d+))")
_RE_NAME = re.compile(r"\bname=(?P<name>[^,\s]+)")
_RE_CAUSED = re.compile(r"caused by previous Xid (?P<code>\d+)")
_RE_SXID = re.compile(r"\bSXid \(PCI:(?P<bus>[^)]*)\):\s*(?P<code>\d+),\s*(?P<rest>.*)")
_RE_PCI = re.compile(r"\b(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)\b")
_RE_FALLEN = re.compile(r"fallen off the bus")
_RE_LOST = re.compile(r"NV_ERR_GPU_IS_LOST|GPU is lost")
_RE_INIT = re.compile(r"RmInitAdapter failed|NV_ERR_RESET_REQUIRED|GPU Reset Required")
_RE_GSP = re.compile(  # the GSP firmware stopped answering: its heartbeat, an RPC, a crash
    r"GSP.*(?:[Tt]imeout|timed out|heartbeat|crashed|halt)|[Hh]eartbeat.*GSP|_kgspIsHeartbeatTimedOut|_kgspLogRpcTimeout"
)
_RE_EDAC_UE = re.compile(r"EDAC .*\b(?:UE|[Uu]ncorrected|[Uu]ncorrectable)\b")
_RE_GPU_AT = re.compile(r"NVRM: GPU at PCI:(?P<bus>[0-9a-fA-F:.]+):\s*(?P<uuid>GPU-[0-9a-fA-F-]+)")
_RE_OOM_KILL = re.compile(
    r"(?i:out of memory)(?: \(oom_kill_allocating_task\))?: Kill(?:ed)? process (?P<pid>\d+) \((?P<name>[^)]+)\)"
)
_RE_KILLED = re.compile(r"^Killed process (?P<pid>\d+) \((?P<name>[^)]+)\)")
_RE_OOM_SUM = re.compile(r"oom-kill:.*?\btask=(?P<name>[^,]+),pid=(?P<pid>\d+)")
_RE_REAPED = re.compile(r"oom_reaper: reaped process (?P<pid>\d+) \((?P<name>[^)]+)\)")
_RE_INVOKED = re.compile(r"^(?P<name>\S.*?) invoked oom-killer:")
_RE_SEGV = re.compile(r"^(?P<name>\S+?)\[(?P<pid>\d+)\]: segfault at")
_RE_GPF = re.compile(r"^(?:traps: )?(?P<name>\S+?)\[(?P<pid>\d+)\].*general protection")
_RE_HUNG = re.compile(r"INFO: task (?P<name>.+?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds")
_RE_AER = re.compile(
    r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d).*PCIe Bus Error: (?:severity=)?(?P<sev>[^,]+)"
)
_RE_AER_RECV = re.compile(r"AER: (?:Correct|Uncorrect|Multiple)\w*.*error.*received")
# the kernel gave up on a device after an AER: the error is not recovered
_RE_AER_NORECOVER = re.compile(r"AER: can't recover|AER: device recovery failed|has no AER-aware driver")
_RE_DEV_PREFIX = re.compile(r"^(?P<drv>[\w-]+) (?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d):")
_RE_MCE = re.compile(r"mce: \[Hardware Error\]|[Mm]achine [Cc]heck")
_RE_MCE_FATAL = re.compile(r"[Uu]ncorrected|[Ff]atal|[Pp]anic|Machine Check Exception")
_RE_WATCHDOG = re.compile(r"RC watchdog: GPU is probably locked")

# Lines every healthy GPU host prints; never a cause.
BENIGN = re.compile(
    "|".join(
        [  # noqa: FLY002  (one pattern a line reads better)
            r"NVRM: loading NVIDIA UNIX",
            r"nvidia: loading out-of-tree module",
            r"module license .* taints kernel",
            r"nvidia-nvlink: Nvlink Core is being initialized",
            r"NVRM: GPU at PCI:",
            r"NVRM: GPU Board Serial Number",
            r"NVRM: .*FBHUB Interrupt detected\. Clearing it",
            r"Persistence mode is deprecated",
            r"NVRM: A GPU crash dump has been created",
            r"NVRM: nvidia-bug-report\.sh as root",
            r"NVRM: the NVIDIA kernel module is unloaded",
            r"kbifCacheVFInfo_\w+: Unable to read",
            r"nvidia-peermem .*detected invalid context",
            r"GPU serial number is",
            r"nvidia-uvm: Loaded the UVM driver",
            r"nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
            r"NVRM: Open Kernel Module",
            r"entered promiscuous mode",
            r"workqueue: .* hogged CPU",
        ]
    )
)

# What the remote side greps for (POSIX ERE); kept here so both sides agree.
INTEREST_ERE = (
    "NVRM|Xid|SXid|NVLink|nvlink|ECC|EDAC|GSP|[Oo]ut of memory|oom-kill|oom_reaper|Killed process|"
    "invoked oom-killer|segfault at|general protection|hung_task|blocked for more than|"
    "PCIe Bus Error|AER|[Mm]achine [Cc]heck|mce:|Hardware Error|fallen off the bus|GPU is lost|"
    "NV_ERR_|RmInitAdapter|Linux version"
)


@dataclass
class KernelEvent:
    """One kernel line of interest."""

    line: str  # the raw line, as the host printed it
    message: str  # the line without its time prefix
    kind: str  # xid | sxid | gpu-lost | gpu-init | gsp | ecc | nvlink | oom-kill | oom-invoke | segfault | gpf | hung-task | pcie-aer | mce | watchdog | benign | other
    time: float | None = None  # epoch seconds, None when the line has no absolute time
    code: int | None = None  # Xid / SXid number
    cause_code: int | None = None  # "caused by previous Xid N"
    bus: str | None = None  # PCI bus key "bb:dd" (see bus_key)
    pid: int | None = None
    process: str | None = None
    uuid: str | None = None
    severity: str | None = None  # AER severity, SXid Fatal/Non-fatal
    pos: int = 0  # order in the source
    benign: bool = False
    driver: str | None = None  # the kernel driver that printed a device line ('nvidia', 'pcieport')
    mono: float | None = None  # seconds since boot as printed ('[ 123.456]'): order and gaps without a wall clock
    marker: str | None = None  # 'boot' (a new kernel) or 'driver-load' (the NVIDIA module loaded): history ends


def aer_fatal(severity: str | None) -> bool:
    """An AER severity that the link did not survive: 'Uncorrected (Fatal)', 'Uncorrectable (Fatal)'."""
    s = (severity or "").lower()
    return "fatal" in s and "non-fatal" not in s and "nonfatal" not in s


def bus_key(bus: str | None) -> str | None:
    """A PCI address reduced to 'bus:device' in lower case: 'PCI:0000:91:00' and '00000000:91:00.0' meet."""
    if not bus:
        return None
    s = bus.strip().lower()
    s = s.removeprefix("pci:")
    s = s.split(".")[0]
    parts = [p for p in s.split(":") if p]
    if len(parts) < 2 or not all(re.fullmatch(r"[0-9a-f]+", p) for p in parts[-2:]):
        return None
    return f"{int(parts[-2], 16):02x}:{int(parts[-1], 16):02x}"


@dataclass
class Clock:
    """What converts a kernel line's time to epoch seconds."""

    now: float | None = None  # the remote clock when collected
    uptime: float | None = None  # /proc/uptime at the same moment
    tz_offset: int = 0  # seconds east of UTC, for stamps without a zone
    year: int | None = None  # for stamps without a year

    @property
    def boot(self) -> float | None:
        return self.now - self.uptime if self.now is not None and self.uptime is not None else None


def _iso(s: str, tz: int) -> float | None:
    return timestamps.epoch(s, tz)


def _zone(z: str) -> int:
    """'+0200' -> 7200."""
    return (1 if z[0] == "+" else -1) * (int(z[1:3]) * 3600 + int(z[3:5]) * 60)


def _wall(clock: Clock, mon: str, day: str, hms: str, year: int | None = None) -> float | None:
    mo = timestamps.month_number(mon)
    if not mo:
        return None
    return timestamps.wall(mo, int(day), hms, clock.tz_offset, clock.now, year or clock.year)


def split_time(line: str, clock: Clock, state: dict[str, float | None]) -> tuple[float | None, str]:
    """(epoch or None, message) for one raw line; ``state`` carries dmesg -H's last absolute time."""
    s = line.rstrip("\n")
    m = _RE_TALOS.match(s)
    if m:
        return _iso(m["t"], clock.tz_offset), s[m.end() :]
    m = _RE_ISO.match(s)
    if m:
        return _iso(m["t"], clock.tz_offset), s[m.end() :]
    m = _RE_SYSLOG.match(s)
    if m:
        t = _wall(clock, m["mon"], m["day"], m["hms"])
        return (t + float(m["frac"] or 0) if t is not None else None), s[m.end() :]
    m = _RE_FULL.match(s)
    if m:
        z = m["zone"]
        tz = 0 if z in ("UTC", "GMT") else (_zone(z) if z and z[0] in "+-" else clock.tz_offset)
        return _iso(m["t"], tz), s[m.end() :]
    m = _RE_CTIME.match(s)
    if m:
        return _wall(clock, m["mon"], m["day"], m["hms"], int(m["year"])), s[m.end() :]
    m = _RE_HUMAN_ABS.match(s)
    if m:
        t = _wall(clock, m["mon"], m["day"], m["hm"])
        state["human"] = t
        return t, s[m.end() :]
    m = _RE_HUMAN_REL.match(s)
    if m:
        base = state.get("human")
        if base is not None:
            base += float(m["rel"])
            state["human"] = base
        return base, s[m.end() :]
    m = _RE_BOOT.match(s)
    if m:
        boot = clock.boot
        rest = s[m.end() :]
        h = _RE_MONO_HOST.match(rest)
        return (boot + float(m["boot"]) if boot is not None else None), rest[h.end() :] if h else rest
    m = _RE_ISO_BARE.match(s)
    if m:
        return _iso(m["t"], clock.tz_offset), s[m.end() :]
    m = _RE_KERNEL.match(s)
    if m:
        return None, s[m.end() :]
    return None, s


def classify(message: str) -> KernelEvent:
    """The event a message states (time and raw line are filled in by the caller)."""
    msg = message.strip()
    ev = KernelEvent(line=message, message=msg, kind="other")
    if _RE_BOOT_MARK.search(msg):
        ev.kind, ev.benign, ev.marker = "benign", True, "boot"
        return ev
    if _RE_DRIVER_LOAD.search(msg):
        ev.kind, ev.benign, ev.marker = "benign", True, "driver-load"
        return ev
    m = _RE_GPU_AT.search(msg)
    if m:
        ev.kind, ev.bus, ev.uuid, ev.benign = "benign", bus_key(m["bus"]), m["uuid"], True
        return ev
    if BENIGN.search(msg):
        ev.kind, ev.benign = "benign", True
        return ev
    m = _RE_SXID.search(msg)
    if m:
        ev.kind, ev.code, ev.bus = "sxid", int(m["code"]), bus_key(m["bus"])
        ev.severity = "fatal" if re.match(r"Fatal\b", m["rest"]) else "non-fatal"
        return ev
    m = _RE_XID.search(msg)
    if m:
        ev.kind, ev.code, ev.bus = "xid", int(m["code"]), bus_key(m["bus"])
        rest = m["rest"]
        p = _RE_PID.search(rest)
        if p and p["pid"]:
            ev.pid = int(p["pid"])
        n = _RE_NAME.search(rest)
        if n and "<unknown>" not in n["name"]:
            ev.process = n["name"]
        c = _RE_CAUSED.search(rest)
        if c:
            ev.cause_code = int(c["code"])
        return ev
    for rx, kind in ((_RE_FALLEN, "gpu-lost"), (_RE_LOST, "gpu-lost"), (_RE_INIT, "gpu-init"), (_RE_GSP, "gsp")):
        if rx.search(msg):
            p = _RE_PCI.search(msg)
            ev.kind, ev.bus = kind, bus_key(p["bus"]) if p else None
            return ev
    for rx, kind in (
        (_RE_OOM_KILL, "oom-kill"),
        (_RE_OOM_SUM, "oom-kill"),
        (_RE_KILLED, "oom-killed"),
        (_RE_REAPED, "oom-reaped"),
        (_RE_SEGV, "segfault"),
        (_RE_GPF, "gpf"),
        (_RE_HUNG, "hung-task"),
    ):
        m = rx.search(msg)
        if m:
            ev.kind, ev.pid, ev.process = kind, int(m["pid"]), m["name"].strip()
            return ev
    m = _RE_INVOKED.search(msg)
    if m:
        ev.kind, ev.process = "oom-invoke", m["name"]
        return ev
    dev = _RE_DEV_PREFIX.match(msg)
    m = _RE_AER.search(msg)
    if m:
        ev.kind, ev.bus, ev.severity = "pcie-aer", bus_key(m["bus"]), m["sev"].strip().lower()
        ev.driver = dev["drv"] if dev else None
        return ev
    if _RE_AER_RECV.search(msg):
        ev.kind = "pcie-aer-detail"
        ev.severity = (
            "uncorrected (fatal)"
            if aer_fatal(msg)
            else ("uncorrected" if re.search(r"Uncorrect", msg) else "corrected")
        )
        src = re.search(r"received(?: from)?:? (?:id=)?(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)", msg)
        p = src or _RE_PCI.search(msg)
        ev.bus = bus_key(p["bus"]) if p else None
        ev.driver = dev["drv"] if dev else None
        return ev
    if _RE_AER_NORECOVER.search(msg):
        ev.kind, ev.severity = "pcie-recovery", "unrecovered"
        ev.bus = bus_key(dev["bus"]) if dev else None
        ev.driver = dev["drv"] if dev else None
        return ev
    if _RE_MCE.search(msg):
        ev.kind, ev.severity = "mce", "fatal" if _RE_MCE_FATAL.search(msg) else "corrected"
        return ev
    if _RE_EDAC_UE.search(msg):
        ev.kind, ev.severity = "mce", "fatal"
        return ev
    if _RE_WATCHDOG.search(msg):
        ev.kind = "watchdog"
        return ev
    if re.search(r"\bECC\b", msg) and re.search(r"uncorrect|double bit|DBE", msg, re.IGNORECASE):
        ev.kind = "ecc"
        return ev
    if re.search(r"NVLink|nvlink", msg) and re.search(r"error|fatal|fault", msg, re.IGNORECASE):
        ev.kind = "nvlink"
        return ev
    return ev


def parse_kernel_lines(lines: list[str] | str, clock: Clock | None = None) -> list[KernelEvent]:
    """Every line of interest as an event, in source order; lines of no interest are dropped."""
    clock = clock or Clock()
    if isinstance(lines, str):
        lines = lines.splitlines()
    state: dict[str, float | None] = {}
    out: list[KernelEvent] = []
    for i, raw in enumerate(_joined(lines)):
        if not raw.strip():
            continue
        t, msg = split_time(raw, clock, state)
        ev = classify(msg)
        if ev.kind == "other":
            continue
        ev.line, ev.time, ev.pos = raw.rstrip("\n"), t, i
        mono = _RE_MONO.search(raw)
        ev.mono = float(mono.group(1)) if mono else None
        out.append(ev)
    return out


_RE_MONO = re.compile(r"^(?:[^\[]{0,80}kernel:\s?)?\[\s*(\d+\.\d+)\]")


_RE_CONT = re.compile(r"^\s+NVRM: ")  # dmesg's continuation of a multi-line NVRM message: indented, no stamp
_RE_OPEN = re.compile(r"NVRM: The NVIDIA GPU \S+$|installed in this system has$|please run$|collect this data before$")


def _joined(lines: list[str]) -> list[str]:
    """Lines with each multi-line NVRM message made one line ('The NVIDIA GPU 0000:b3:00.0 / (PCI ID: …)
    installed in this system has / fallen off the bus …'), so its bus and its statement stay together.
    A continuation is indented with no stamp (dmesg), or repeats the opening line's stamp (syslog, journal)."""
    out: list[str] = []
    for raw in lines:
        raw = raw.rstrip("\n")
        if out and _RE_CONT.match(raw):
            out[-1] += " " + raw.strip()
            continue
        if out and _RE_OPEN.search(out[-1].rstrip()):
            head, _, _ = out[-1].partition("NVRM:")
            nvrm = raw.find("NVRM:")
            if nvrm > 0 and raw[:nvrm].rstrip() == head.rstrip() and head:
                out[-1] += " " + raw[nvrm:]
                continue
        out.append(raw)
    return out


# ---------------------------------------------------------------- the remote output
@dataclass
class KernelCollection:
    """What kernel.sh brought back: the source, the clock, kernel lines, the health CSV, and why not."""

    source: str | None = None  # journalctl | dmesg | kern.log | None when unreadable
    clock: Clock = field(default_factory=Clock)
    lines: list[str] = field(default_factory=list)
    unreadable: dict[str, str] | None = None  # {"dmesg_restrict": "1", "groups": "...", "user": "..."}
    truncated: bool = False
    smi_fields: str | None = None
    smi: list[str] = field(default_factory=list)
    smi_status: str | None = None  # ok | absent | error | not-given (offline: no nvidia-smi file)
    health: list[Any] | None = None  # GpuHealth already parsed (offline files); None: parse ``smi`` as CSV

    def events(self) -> list[KernelEvent]:
        return parse_kernel_lines(self.lines, self.clock)

    def fact(self) -> dict[str, str] | None:
        """A fact for the card when the kernel log could not be read, with the fix."""
        if not self.unreadable:
            return None
        u = self.unreadable
        why = []
        if u.get("dmesg_restrict") == "1":
            why.append("kernel.dmesg_restrict=1")
        why.append(f"user {u.get('user') or '?'} is in neither the adm nor the systemd-journal group")
        user = u.get("user") or "$USER"
        return {
            "kernel_log": "unreadable",
            "why": "; ".join(why),
            "fix": f"sudo usermod -aG adm,systemd-journal {user} (journalctl -k and /var/log/kern.log), "
            "or sysctl kernel.dmesg_restrict=0 (dmesg)",
        }


def _kv(s: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in s.split() if "=" in p)


def parse_sections(text: str) -> KernelCollection:
    """Split kernel.sh's marked output (lines starting '@@fd_') into a KernelCollection."""
    kc = KernelCollection()
    section = None
    for raw in text.splitlines():
        if raw.startswith("@@fd_"):
            head, _, rest = raw.partition(" ")
            kv = _kv(rest)
            if head == "@@fd_kernel_clock":
                kc.clock.now = _num(kv.get("now"))
                kc.clock.uptime = _num(kv.get("uptime"))
                z = kv.get("tz", "")
                if re.fullmatch(r"[+-]\d{4}", z):
                    kc.clock.tz_offset = (1 if z[0] == "+" else -1) * (int(z[1:3]) * 3600 + int(z[3:5]) * 60)
            elif head == "@@fd_kernel_source":
                kc.source, section = kv.get("source"), "kernel"
            elif head == "@@fd_kernel_unreadable":
                kc.unreadable, section = kv, None
            elif head == "@@fd_kernel_truncated":
                kc.truncated = True
            elif head == "@@fd_gpu_health":
                kc.smi_status = kv.get("status", "ok")
                kc.smi_fields = kv.get("fields")
                section = "smi"
            elif head.endswith("_end"):
                section = None
            continue
        if section == "kernel":
            kc.lines.append(raw)
        elif section == "smi":
            kc.smi.append(raw)
    return kc


def _num(s: str | None) -> float | None:
    try:
        return float(s) if s not in (None, "") else None
    except ValueError:
        return None
