"""One host end to end: connect, run the funnel in one exec, analyse, report.

``finish`` is shared with ``fleetdiag analyze`` (local files) and ``watch``, so
a log gets the same verdict whichever way it was read.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncContextManager, Callable, Protocol

from .units import ago
from . import facts as facts_mod
from . import funnel as funnel_mod
from .analysis import Rules, analyze, load_rules
from .evidence import host as evidence_mod
from .records import (
    FAILED,
    HEALTHY,
    NO_LOG,
    STALLED,
    STARTING,
    UNREACHABLE,
    FunnelResult,
    HostResult,
    Timing,
)
from .reach import HostError, PartialOutput, TransportOptions

if TYPE_CHECKING:
    from .transport import Connection

DEFAULT_STALL_AFTER = 600.0


class HostLike(Protocol):
    name: str
    port: int | None
    user: str | None
    jump: str | None
    funnel: dict[str, Any]

    @property
    def target(self) -> str: ...

    def log_path(self, name_or_path: str | None = None) -> tuple[str, str]: ...


@dataclass
class ProbeSettings:
    """Everything a probe needs besides the host itself."""

    log: str | None = None  # --log NAME|PATH
    rules: Rules | None = None
    transport: TransportOptions = field(default_factory=TransportOptions)
    stall_after: float = DEFAULT_STALL_AFTER
    facts: bool = True
    jump_resolver: Callable[[str], tuple[str, int | None, str | None]] | None = None
    save_dir: Path | None = None  # keep each host's raw funnel output (the evidence)
    path_prepend: str | None = None  # a remote dir put before PATH for the facts (nvidia-smi in an odd place)
    kernel: bool = True  # the kernel log and GPU health, in the same exec (fleetdiag/remote/kernel.sh)
    # Held around every SSH handshake (the scheduler's per-address MaxStartups limit).
    connect_gate: Callable[[Any], AsyncContextManager[Any]] | None = None
    # Kept connections (fleetdiag/keeper.py): seconds a host's connection stays open after use; 0: direct.
    persist: float = 0.0
    keeper_dir: Path | None = None  # None: the user's runtime directory

    def get_rules(self) -> Rules:
        if self.rules is None:
            self.rules = load_rules()
        return self.rules


def spec_for(log: str, rules: Rules, overrides: dict[str, Any] | None = None) -> funnel_mod.FunnelSpec:
    """The funnel spec for one log: rule patterns plus the host's overrides."""
    overrides = overrides or {}
    run_start = rules.run_start_ere()
    if overrides.get("run_start"):
        run_start = f"{overrides['run_start']}|{run_start}" if run_start else str(overrides["run_start"])
    spec = funnel_mod.FunnelSpec(
        log=log,
        keywords=rules.keyword_ere(),
        run_start=run_start,
        tags=rules.tag_ere(),
    )
    for key in ("tail_lines", "scan_bytes", "timeout"):
        if overrides.get(key):
            setattr(spec, key, max(1, math.ceil(float(overrides[key]))))
    return spec


def finish(
    host: str,
    fr: FunnelResult,
    rules: Rules,
    stall_after: float = DEFAULT_STALL_AFTER,
    timing: Timing | None = None,
    facts: dict[str, Any] | None = None,
) -> HostResult:
    """Turn one funnel result into a verdict: the step probe, analyze and watch share.

    The log decides first; then the kernel and GPU evidence the same round trip brought (when it did)
    may name the cause below it, or find the host ``degraded`` (``fleetdiag.evidence.host``)."""
    res = _finish_log(host, fr, rules, stall_after, timing, facts)
    return evidence_mod.apply(res, fr)


def _finish_log(
    host: str,
    fr: FunnelResult,
    rules: Rules,
    stall_after: float,
    timing: Timing | None,
    facts: dict[str, Any] | None,
) -> HostResult:
    res = HostResult(host=host, verdict=NO_LOG, log=fr.path, timing=timing or Timing(), markers=list(fr.markers))
    res.timing.bytes = fr.payload_bytes
    res.idle_seconds = fr.idle_seconds
    res.facts = dict(facts or {})
    if fr.status != "ok":
        res.error = _log_problem(fr)
        return res
    lines = fr.lines()
    facts_mod.merge_log_facts(res.facts, (ln.text for ln in lines))
    diag = analyze(lines, rules=rules, facts=res.facts)
    res.decisive = diag.decisive
    if diag.decisive is not None:  # put the host's numbers into the hint
        diag.decisive.hint = facts_mod.refine_hint(diag.decisive, res.facts) or diag.decisive.hint
    res.secondary = diag.secondary
    res.summary = diag.summary
    res.verdict = diag.verdict
    idle = fr.idle_seconds
    if res.verdict == STARTING and idle is not None and idle > stall_after:
        res.verdict = STALLED
        res.summary = f"{diag.summary} — the log has not grown for {ago(idle)}".strip(" —")
    elif res.verdict not in (FAILED, STARTING, HEALTHY):
        res.verdict = HEALTHY
    return res


def _log_problem(fr: FunnelResult) -> str:
    reason = fr.facts.get("reason")
    text = {
        "missing": f"log not found: {fr.path or ''}",
        "no-match": f"no file matches the log pattern {fr.path}" if fr.path else "no file matches the log pattern",
        "unreadable": f"log unreadable: {fr.path}" + (f" ({reason})" if reason else ""),
        "empty": f"log is empty: {fr.path}",
        "binary": f"log looks binary: {fr.path}" + (f" ({reason})" if reason else ""),
    }.get(fr.status)
    if text:
        return text
    return f"funnel failed: {'; '.join(fr.markers) or fr.status}" + (f" ({reason})" if reason else "")




async def open_host(host: HostLike, settings: ProbeSettings) -> Connection:
    jump = None
    if host.jump:
        resolve = settings.jump_resolver or parse_jump
        jump = resolve(host.jump)
    if settings.connect_gate is None:
        return await _connect(host, settings, jump)
    async with settings.connect_gate(host):
        return await _connect(host, settings, jump)


async def _connect(host: HostLike, settings: ProbeSettings, jump: Any) -> Any:
    """Through the keeper when connections are kept and it answers; directly otherwise, silently."""
    if settings.persist > 0:
        from .keeper import KeeperUnavailable, open_kept

        try:
            return await open_kept(host.target, host.port, host.user, settings.transport, jump, host.name,
                                   settings.persist, settings.keeper_dir)
        except KeeperUnavailable:
            pass
    from .transport import connect  # asyncssh loads only when a host is really reached directly

    return await connect(host.target, host.port, host.user, settings.transport, jump=jump)


def parse_jump(text: str) -> tuple[str, int | None, str | None]:
    """``user@host:port`` (user and port optional), as ProxyJump writes it."""
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
    port = None
    if text.startswith("[") and "]" in text:
        addr, _, rest = text[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return addr, port, user
    if text.count(":") == 1:
        addr, _, p = text.partition(":")
        if p.isdigit():
            return addr, int(p), user
    return text, port, user


async def probe_host(host: HostLike, settings: ProbeSettings, conn: Connection | None = None) -> HostResult:
    """Probe one host; never raises for a host-side problem: it becomes the verdict."""
    t0 = time.perf_counter()
    rules = settings.get_rules()
    timing = Timing()
    try:
        log_name, log_path = host.log_path(settings.log)
    except Exception as exc:  # an inventory problem for this host only
        return HostResult(host=host.name, verdict=NO_LOG, error=str(exc), timing=timing)
    own = conn is None
    try:
        if conn is None:
            conn = await open_host(host, settings)
        timing.connect_ms = round(conn.connect_ms, 1)
        spec = spec_for(log_path, rules, host.funnel)
        if settings.facts:  # same exec: the facts snippet runs after the funnel
            spec.extra += facts_mod.SNIPPET
            spec.extra_vars.update(facts_mod.snippet_vars(settings.path_prepend))
        if settings.kernel:  # same exec: kernel log and GPU health after the facts
            spec.extra += evidence_mod.SCRIPT
            spec.extra_vars.update(evidence_mod.script_vars(settings.path_prepend))
        mark = funnel_mod.new_mark()
        command = funnel_mod.remote_command(funnel_mod.build_script(spec, mark))
        partial = None
        status = None
        try:
            out, status, open_ms, exec_ms = await conn.run(command, settings.transport.command_timeout)
        except PartialOutput as exc:
            out, open_ms, exec_ms, partial, partial_kind = exc.data, None, None, str(exc), exc.kind
        timing.round_trips = 1
        if settings.save_dir is not None:
            save_evidence(settings.save_dir, host.name, out)
        if open_ms is not None:
            timing.rtt_ms = round(open_ms / 2, 1)
            timing.exec_ms = round(exec_ms or 0, 1)
        fr = funnel_mod.parse_output(out.decode("utf-8", "replace"), mark)
        if fr.status == "error" and partial is None:  # the remote shell never ran it: say why
            fr.facts["reason"] = funnel_mod.shell_failure(getattr(conn, "last_stderr", b""), status)
        if partial and fr.status != "error" and funnel_mod.CUT not in fr.markers:
            partial = None  # the end marker arrived: all of the funnel's output is here
        if partial:
            fr.markers.append(partial)
        facts = facts_mod.build(fr.facts.get("raw")) if settings.facts else None
        res = finish(host.name, fr, rules, _stall_after(host, settings), timing, facts)
        if partial and fr.status == "error":  # cut before the funnel said anything
            res.verdict = UNREACHABLE
            res.error = partial
            res.markers = []
            res.facts["error_kind"] = partial_kind
    except HostError as exc:
        res = HostResult(host=host.name, verdict=UNREACHABLE, error=str(exc), timing=timing)
        res.facts["error_kind"] = exc.kind
    finally:
        if own and conn is not None:
            conn.close()
    res.address = host.target
    if res.log is None:
        res.log = log_path
    res.timing.total_ms = round((time.perf_counter() - t0) * 1000, 1)
    return res


def save_evidence(directory: Path, name: str, raw: bytes) -> Path:
    """Write the raw stage output for one host (local only; the remote is never written)."""
    from .store import write_private  # 0600 in a 0700 directory: the output may quote secrets from logs

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "host"
    return write_private(Path(directory) / f"{safe}.funnel.txt", raw)


def _stall_after(host: HostLike, settings: ProbeSettings) -> float:
    value = host.funnel.get("stall_after") if host.funnel else None
    return float(value) if value else settings.stall_after
