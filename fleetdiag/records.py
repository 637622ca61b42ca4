"""The records that flow through fleetdiag: funnel output, diagnosis, host result.

They are plain dataclasses so the core stays free of any UI library, and
``to_json`` gives the documented, versioned schema (README, "JSON schema").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1


class StrEnum(str, Enum):
    """A closed vocabulary whose members are the very strings of the JSON schema.

    ``Verdict.FAILED == "failed"``, ``f"{Verdict.FAILED}"`` is ``failed`` and
    ``json.dumps`` writes ``"failed"``: records read back from JSON (plain
    strings) compare equal to the members, and the schema does not change.
    """

    __str__ = str.__str__
    __format__ = str.__format__


class Verdict(StrEnum):
    """A host's verdict, in the order a fleet view lists them (worst first)."""

    FAILED = "failed"
    STALLED = "stalled"
    DEGRADED = "degraded"  # no failing job, but a GPU is faulty (lost, uncorrectable ECC, remap failure, narrow link)
    UNREACHABLE = "unreachable"
    NO_LOG = "no-log"
    STARTING = "starting"
    HEALTHY = "healthy"


class WatchState(StrEnum):
    """A watched host's state: the verdicts plus the two only a live watch has, in table order."""

    FAILED = "failed"
    STALLED = "stalled"
    UNREACHABLE = "unreachable"
    NO_LOG = "no-log"
    CONNECTING = "connecting"
    STARTING = "starting"
    RECOVERED = "recovered"
    HEALTHY = "healthy"


class LogStatus(StrEnum):
    """What the funnel found at the log path (``FunnelResult.status``)."""

    OK = "ok"
    MISSING = "missing"
    UNREADABLE = "unreadable"
    EMPTY = "empty"
    BINARY = "binary"
    NO_MATCH = "no-match"


class ErrorKind(StrEnum):
    """Why a host has no diagnosis (``HostResult.error_kind``, ``facts["error_kind"]`` in the JSON): how it could not be reached, or what cut it short."""

    REFUSED = "refused"
    DNS = "dns"
    TIMEOUT = "timeout"
    AUTH = "auth"
    HOSTKEY_UNKNOWN = "hostkey-unknown"
    HOSTKEY_CHANGED = "hostkey-changed"
    CLOSED = "closed"
    JUMP = "jump"
    NETWORK = "network"
    KEY = "client-key"
    LOCAL = "local"  # a limit of this machine (file descriptors), never the host's status by choice
    OVERSIZE = "output-cap"  # the host sent more than reach.MAX_OUTPUT: reading stopped
    DEADLINE = "deadline"
    INTERRUPTED = "interrupted"
    INTERNAL = "internal"


class CheckStatus(StrEnum):
    """A preflight check's outcome, and a host's (``unreachable``: nothing could be checked)."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    UNREACHABLE = "unreachable"


FAILED = Verdict.FAILED
STALLED = Verdict.STALLED
DEGRADED = Verdict.DEGRADED
UNREACHABLE = Verdict.UNREACHABLE
NO_LOG = Verdict.NO_LOG
STARTING = Verdict.STARTING
HEALTHY = Verdict.HEALTHY
VERDICTS = tuple(Verdict)


@dataclass
class Line:
    """One log line the funnel brought back.

    ``pos`` is the byte offset of the line's start in the log file: unique and
    ordered, so lines from different stages merge without duplicates.
    ``lineno`` is the 1-based line number when it is known (it is not when
    the funnel read only the end of a large file).
    """

    pos: int
    text: str
    lineno: int | None = None


@dataclass
class FunnelResult:
    """What one run of the funnel script reported about one log."""

    path: str | None = None
    status: str = "ok"  # ok | missing | unreadable | empty | binary | no-match | no-source
    size: int | None = None
    mtime: float | None = None
    inode: int | None = None
    now: float | None = None  # the remote clock, so idle time needs no clock sync
    window_start: int = 0  # byte offset where the scanned window starts
    run_start: int | None = None  # byte offset of the latest run's start banner
    tail: list[Line] = field(default_factory=list)
    hits: list[Line] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)  # failing process tags, earliest first
    context: list[Line] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)  # visible notes of anything cut
    facts: dict[str, Any] = field(default_factory=dict)
    payload_bytes: int = 0
    remote_ms: float | None = None
    kernel: list[str] = field(default_factory=list)  # kernel.sh's output (its marked sections), as sent

    def lines(self) -> list[Line]:
        """All lines from every stage, merged by position, each once."""
        by_pos: dict[int, Line] = {}
        for group in (self.tail, self.hits, self.context):
            for ln in group:
                old = by_pos.get(ln.pos)
                if old is None or (old.lineno is None and ln.lineno is not None):
                    by_pos[ln.pos] = ln
        return [by_pos[p] for p in sorted(by_pos)]

    @property
    def idle_seconds(self) -> float | None:
        if self.now is None or self.mtime is None:
            return None
        return max(0.0, self.now - self.mtime)


@dataclass
class Decisive:
    """The one line that states the root cause, with what explains it."""

    line: str  # the raw log line, as written
    message: str  # the line with prefixes, level, time and source peeled off
    process: str | None = None  # the process tag, e.g. "Worker pid=7506"
    time: str | None = None
    lineno: int | None = None
    pos: int | None = None
    exception_type: str | None = None
    category: str = "other"
    traceback: list[str] = field(default_factory=list)
    hint: str | None = None
    fingerprint: str = ""
    confidence: float = 0.0
    reason: str = ""
    rank: int | None = None
    rule: str | None = None
    source: str = "log"  # where the line came from: log | kernel | gpu
    consequence: str | None = None  # source kernel/gpu: the application's error this caused (its log line)
    time_iso: str | None = None  # ``time`` as ISO 8601 (year from the log's mtime; offset when the zone is known)
    # what the line is to the failure: cause | wrapper | launcher | peer-caused | consequence (DESIGN §14);
    # a peer-caused line is this host's own error, caused by another process (the job analysis uses it)
    role: str = "cause"


@dataclass
class Diagnosis:
    """The analyzer's answer for one log."""

    verdict: str  # failed | starting | healthy (stalled is decided with the log's age)
    decisive: Decisive | None = None
    secondary: dict[str, int] = field(default_factory=dict)
    primary_count: int = 0
    summary: str = ""  # one plain line for healthy/starting logs


@dataclass
class Timing:
    connect_ms: float | None = None
    rtt_ms: float | None = None
    exec_ms: float | None = None
    total_ms: float | None = None
    round_trips: int = 0
    bytes: int = 0


@dataclass
class JobRole:
    """A host's part in a multi-host job's failure, as the job analysis (fleetdiag.job) found it.

    Typed here, written by ``job.mark`` only; the JSON keeps it where the schema always had it,
    merged into ``facts["job"]`` (``role: root`` with ``rank``, ``affected``, ``why``, ``time``, or
    ``role: consequence`` with ``root``), which the history reads back.
    """

    role: str  # root | consequence
    root: str | None = None  # a consequence's root host
    rank: int | None = None
    affected: list[str] = field(default_factory=list)
    why: str | None = None
    time: str | None = None

    KEYS = ("role", "root", "rank", "affected", "why", "time")

    def to_json(self) -> dict[str, Any]:
        if self.role == "root":
            return {
                "role": "root",
                "rank": self.rank,
                "affected": list(self.affected),
                "why": self.why,
                "time": self.time,
            }
        return {"role": self.role, "root": self.root}

    @classmethod
    def from_json(cls, data: Any) -> JobRole | None:
        if not isinstance(data, dict) or data.get("role") not in ("root", "consequence"):
            return None
        return cls(
            role=str(data["role"]),
            root=data.get("root"),
            rank=data.get("rank"),
            affected=[str(h) for h in data.get("affected") or []],
            why=data.get("why"),
            time=data.get("time"),
        )


@dataclass
class Clock:
    """A host's clock against ours, read last in the funnel (``job.clock_sample`` makes it).

    ``offset`` is what the job analysis adds to the host's log times; ``zone`` is its ``date +%z``.
    The JSON keeps it as ``facts["clock"]`` (and the zone again as ``facts["zone"]``).
    """

    local_receive: float | None = None
    remote_now: float | None = None
    rtt: float | None = None
    measured: float | None = None
    offset: float | None = None
    zone: str | None = None

    def to_json(self) -> dict[str, Any] | None:
        if self.remote_now is None:  # no reading, only what a record carried (an offset)
            return None if self.offset is None else {"offset": self.offset}
        out: dict[str, Any] = {
            "local_receive": self.local_receive,
            "remote_now": self.remote_now,
            "rtt": self.rtt,
            "measured": self.measured,
            "offset": self.offset,
        }
        if self.zone:
            out["zone"] = self.zone
        return out

    @classmethod
    def from_json(cls, data: Any, zone: Any = None) -> Clock | None:
        """From ``facts["clock"]`` (and ``facts["zone"]``); None when neither says anything."""
        d = data if isinstance(data, dict) else {}

        def num(key: str) -> float | None:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        z = d.get("zone") or zone
        c = cls(num("local_receive"), num("remote_now"), num("rtt"), num("measured"), num("offset"), z or None)
        return None if c == cls() else c


@dataclass
class LogSilence:
    """The numbers behind a verdict on a quiet log (``evidence.hang``'s judgement): ``facts["silence"]``."""

    phase: str | None = None
    stalled: bool = False
    cadence_s: float | None = None
    median_s: float | None = None
    silent_s: float | None = None
    threshold_s: float | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> LogSilence | None:
        if not isinstance(data, dict):
            return None
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class JobFacts:
    """What a probe keeps for the job analysis (``job.job_facts``): the host's error's peer-caused
    ``kind`` ("" when local-origin) and the few log lines with ranks, times and endpoints; ``line``
    and ``chosen`` when another line than the decisive one speaks for the host, ``signal`` when it
    was killed. The JSON keeps it as ``facts["job"]``, with the host's ``JobRole`` merged in."""

    kind: str = ""
    lines: list[str] = field(default_factory=list)
    line: str | None = None
    chosen: str = ""
    signal: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "lines": list(self.lines)}
        if self.chosen:
            out["line"], out["chosen"] = self.line, self.chosen
        if self.signal:
            out["signal"] = self.signal
        return out

    @classmethod
    def from_json(cls, data: Any) -> JobFacts | None:
        if not isinstance(data, dict) or not (set(data) - set(JobRole.KEYS)):
            return None
        return cls(
            kind=str(data.get("kind") or ""),
            lines=[str(x) for x in data.get("lines") or []],
            line=data.get("line"),
            chosen=str(data.get("chosen") or ""),
            signal=data.get("signal"),
        )


# The facts that are typed fields of HostResult, in the order the JSON's ``facts`` has always listed them
# among the descriptive ones (``_LATE``: those that come after ``silence``).
TYPED_FACTS = ("silence", "clock", "zone", "log_mtime", "job", "error_kind")
_LATE = ("kernel_log", "clock", "zone", "log_mtime", "node", "job", "stacks", "error_kind")


@dataclass
class HostResult:
    """Everything fleetdiag knows about one host after a probe.

    ``facts`` holds what the host told about itself, descriptive and read by the analyzer and the
    cards, a documented dict because its shapes are the remote scripts': ``nvidia_smi``, ``gpus``,
    ``serving``, ``cuda_visible_devices`` (``_source``), ``parallel`` (``_source``) (``fleetdiag.facts``),
    ``kernel_log`` (``evidence.host``), ``node`` (``facts.node``), ``stacks`` (``evidence.hang``). What
    other modules decide on is typed: ``clock`` (zone included), ``log_mtime``, ``silence``, ``job``
    and ``job_role``, ``error_kind``. ``to_json`` puts them back into ``facts``, where the schema has them;
    a ``facts`` given with those keys (a record read back, a test's) has them lifted into the fields.
    """

    host: str
    verdict: str
    address: str | None = None
    log: str | None = None
    decisive: Decisive | None = None
    secondary: dict[str, int] = field(default_factory=dict)
    timing: Timing = field(default_factory=Timing)
    error: str | None = None  # plain-words reason for unreachable / no-log
    summary: str = ""
    idle_seconds: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    markers: list[str] = field(default_factory=list)
    # what the decision saw: {source: log|kernel|gpu, time, line, pid, gpu, kind, code}
    evidence: list[dict[str, Any]] = field(default_factory=list)
    # Where the log was read: {kind: file|journal|docker|cri|slurm|command, detail, found_by}.
    log_source: dict[str, str] | None = None
    job_role: JobRole | None = None  # set by job.mark, never while serialising
    error_kind: str | None = None  # why there is no diagnosis (ErrorKind, ssh.reach's kinds): set with the verdict
    clock: Clock | None = None  # the host's clock against ours (probe.add_job_facts, watch's heartbeats)
    log_mtime: float | None = None  # the log's modification time on the host's clock
    silence: LogSilence | None = None  # probe's judgement of a quiet log
    job: JobFacts | None = None  # what the job analysis reads later (job.job_facts)

    def __post_init__(self) -> None:
        if any(k in self.facts for k in TYPED_FACTS):
            self.facts = dict(self.facts)
            self._lift(self.facts)

    def _lift(self, facts: dict[str, Any]) -> None:
        clock, zone = facts.pop("clock", None), facts.pop("zone", None)
        self.clock = self.clock or Clock.from_json(clock, zone)
        mtime = facts.pop("log_mtime", None)
        if self.log_mtime is None and isinstance(mtime, (int, float)) and not isinstance(mtime, bool):
            self.log_mtime = float(mtime)
        self.silence = self.silence or LogSilence.from_json(facts.pop("silence", None))
        job = facts.pop("job", None)
        self.job = self.job or JobFacts.from_json(job)
        self.job_role = self.job_role or JobRole.from_json(job)
        kind = facts.pop("error_kind", None)
        self.error_kind = self.error_kind or kind

    def facts_json(self) -> dict[str, Any]:
        """``facts`` as the JSON has it: the descriptive ones, then the typed ones in their places."""
        out = {k: v for k, v in self.facts.items() if k not in _LATE}
        if self.silence is not None:
            out["silence"] = self.silence.to_json()
        clock = self.clock.to_json() if self.clock is not None else None
        typed: dict[str, Any] = {
            "clock": clock,
            "zone": self.clock.zone if self.clock is not None else None,
            "log_mtime": self.log_mtime,
            "job": self._job_json(),
            "error_kind": self.error_kind,
        }
        for key in _LATE:
            value = typed[key] if key in typed else self.facts.get(key)
            if key in typed and value is not None or key not in typed and key in self.facts:
                out[key] = value
        return out

    def _job_json(self) -> dict[str, Any] | None:
        if self.job is None and self.job_role is None:
            return None
        return {**(self.job.to_json() if self.job else {}), **(self.job_role.to_json() if self.job_role else {})}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("job_role", *TYPED_FACTS):
            out.pop(key, None)
        out["facts"] = self.facts_json()
        return out


def report_json(
    results: list[HostResult], root_causes: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    """The one shape of a JSON report (probe --json, sweep report, watch's summary).

    ``{"version", **extra (e.g. "sweep": {...}), "hosts": [HOST...], "root_causes": [...]}``.
    Pure: ``root_causes`` (fleetdiag.job's, as JSON) and the hosts' roles (``job.assign_roles``)
    are worked out before; ``[]`` when there is no job-level cause.
    """
    return {
        "version": SCHEMA_VERSION,
        **extra,
        "hosts": [r.to_json() for r in results],
        "root_causes": root_causes or [],
    }


def host_result_from_json(data: dict[str, Any]) -> HostResult:
    """Inverse of ``HostResult.to_json`` (the history store and sweep reports use it)."""
    data = dict(data)
    dec = data.pop("decisive", None)
    timing = data.pop("timing", None) or {}
    known = set(HostResult.__dataclass_fields__) - {"job_role", *TYPED_FACTS}
    facts = data.get("facts")
    data["facts"] = dict(facts) if isinstance(facts, dict) else {}
    res = HostResult(**{k: v for k, v in data.items() if k in known})
    res.timing = Timing(**{k: v for k, v in timing.items() if k in Timing.__dataclass_fields__})
    if dec:
        res.decisive = Decisive(**{k: v for k, v in dec.items() if k in Decisive.__dataclass_fields__})
    return res
