"""One host end to end: connect, run the funnel in one exec, analyse, report.

``finish`` is shared with ``fleetdiag analyze`` (local files) and ``watch``, so
a log gets the same verdict whichever way it was read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import facts as facts_mod
from . import job as job_mod
from . import remote, timestamps
from .analysis import Rules, analyze, load_rules
from .evidence import hang as hang_mod
from .evidence import host as evidence_mod
from .evidence import stacks as stacks_mod
from .facts import node as node_mod
from .facts import ras as ras_mod
from .inventory.model import DISCOVER, LogSource
from .records import (
    FAILED,
    HEALTHY,
    NO_LOG,
    STALLED,
    STARTING,
    UNREACHABLE,
    FunnelResult,
    HostResult,
    JobFacts,
    LogSilence,
    Timing,
)
from .remote import funnel as funnel_mod
from .ssh.keeper import ahead

if TYPE_CHECKING:
    import concurrent.futures

from .ssh.reach import JUMP, NETWORK, HostError, JumpHop, PartialOutput, Runner, TransportOptions, parse_jump_chain

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
    stacks: bool = True  # a stalled host: a second exec asks where the job's processes wait (evidence/hang.py)
    pyspy: str | None = None  # py-spy's path on the hosts when not on PATH ("none": do not use py-spy)
    # Held around every SSH handshake (the scheduler's per-address MaxStartups limit).
    connect_gate: Callable[[Any], AsyncContextManager[Any]] | None = None
    # Kept connections (fleetdiag/ssh/keeper/): seconds a host's connection stays open after use; 0: direct.
    persist: float = 0.0
    keeper_dir: Path | None = None  # None: the user's runtime directory

    # Rules still loading in a thread (the CLI starts it before the first handshake, so the
    # ~6-round-trip login overlaps it); the funnel needs them only once the connection is up.
    rules_pending: concurrent.futures.Future[Rules] | None = None

    def get_rules(self) -> Rules:
        if self.rules is None and self.rules_pending is not None:
            self.rules = self.rules_pending.result()
        if self.rules is None:
            self.rules = load_rules()
        return self.rules

    async def rules_ready(self) -> Rules:
        """The rules, waiting for a pending load without blocking the event loop."""
        if self.rules is None and self.rules_pending is not None:
            import asyncio  # here: ``analyze`` imports this module and never awaits

            self.rules = await asyncio.wrap_future(self.rules_pending)
        return self.get_rules()


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
        block_heads=rules.block_head_ere(),
        endpoints=job_mod.endpoint_ere(),
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
        diag.decisive.time_iso = timestamps.iso(diag.decisive.time, fr.mtime)  # zone-less as the host wrote it
        diag.decisive.hint = facts_mod.refine_hint(diag.decisive, res.facts) or diag.decisive.hint
    res.secondary = diag.secondary
    res.summary = diag.summary
    res.verdict = diag.verdict
    if res.verdict not in (FAILED, STARTING, HEALTHY, STALLED):
        res.verdict = HEALTHY
    if res.verdict not in (FAILED, STALLED) and fr.mtime is not None and fr.now is not None:
        # silence against the log's own rhythm: a stall only while starting or training, never an idle server
        sil = hang_mod.judge_silence(
            hang_mod.run_lines(lines, fr.run_start),
            fr.mtime,
            fr.now,
            rules,
            stall_after,
            alive=hang_mod.alive_from_facts(res.facts),
        )
        res.silence = LogSilence.from_json(hang_mod.silence_fact(sil))
        if sil.stalled:
            res.verdict = STALLED
            res.summary = hang_mod.stall_summary(sil, diag.summary if diag.verdict == STARTING else None)
    return res


def _log_problem(fr: FunnelResult) -> str:
    reason = fr.facts.get("reason")
    text = {
        "missing": f"log not found: {fr.path or ''}",
        "no-match": f"no file matches the log pattern {fr.path}" if fr.path else "no file matches the log pattern",
        "unreadable": f"log unreadable: {fr.path}" + (f" ({reason})" if reason else ""),
        "empty": f"log is empty: {fr.path}" + (f" ({reason})" if reason else ""),
        "no-source": f"no log found on the host: {reason or 'discovery found nothing'}",
        "binary": f"log looks binary: {fr.path}" + (f" ({reason})" if reason else ""),
    }.get(fr.status)
    if text:
        return text
    return f"funnel failed: {'; '.join(fr.markers) or fr.status}" + (f" ({reason})" if reason else "")


async def open_host(host: HostLike, settings: ProbeSettings) -> Runner:
    """The host's connection: through the keeper when connections are kept.

    The handshake holds the host's ``connect_gate`` slot; through the keeper that is while its first
    command's request may dial (``KeptConnection``), since that request is the open too."""
    jump = None
    if host.jump:
        resolve = settings.jump_resolver or parse_jump
        try:
            hops = parse_jump_chain(host.jump)
        except ValueError as exc:
            raise HostError(JUMP, str(exc)) from None
        # each hop may name an inventory host; a chain is connected through in order
        jump = [resolve(_hop_text(h)) for h in hops]
    opts = host_transport(host, settings.transport)
    if settings.persist > 0:
        kept = await _kept(host, settings, opts, jump)
        if kept is not None:
            return kept
    from .ssh.transport import connect  # asyncssh loads only when a host is really reached directly

    if settings.connect_gate is None:
        return await connect(host.target, host.port, host.user, opts, jump=jump)
    async with settings.connect_gate(host):
        return await connect(host.target, host.port, host.user, opts, jump=jump)


async def _kept(host: HostLike, settings: ProbeSettings, opts: TransportOptions, jump: Any) -> Any:
    """The host's kept connection, when the keeper can be used for it; None: connect directly, silently."""
    from .ssh.keeper import KeeperUnavailable, open_kept

    gate = settings.connect_gate
    try:
        return await open_kept(
            host.target,
            host.port,
            host.user,
            opts,
            jump,
            host.name,
            settings.persist,
            settings.keeper_dir,
            gate=None if gate is None else lambda: gate(host),
        )
    except KeeperUnavailable:
        return None


def host_transport(host: Any, opts: TransportOptions) -> TransportOptions:
    """A host's own key (``identity_file``, Ansible's ``ansible_ssh_private_key_file``) first."""
    key = getattr(host, "identity_file", None)
    if not key:
        return opts
    import dataclasses
    import os

    return dataclasses.replace(opts, client_keys=[os.path.expanduser(key), *(opts.client_keys or [])])


def _hop_text(h: JumpHop) -> str:
    addr = f"[{h.host}]" if ":" in h.host else h.host
    return f"{h.user + '@' if h.user else ''}{addr}{':' + str(h.port) if h.port else ''}"


def parse_jump(text: str) -> tuple[str, int | None, str | None]:
    """The first hop of a ProxyJump value as (host, port, user): the address whose sshd gates the handshake."""
    try:
        h = parse_jump_chain(text)[0]
    except ValueError:
        return text, None, None
    return h.host, h.port, h.user


def remote_spec(
    host: HostLike,
    source: LogSource,
    log_path: str | None,
    rules: Rules,
    *,
    facts: bool = True,
    kernel: bool = True,
    path_prepend: str | None = None,
    command_timeout: float | None = None,
) -> funnel_mod.FunnelSpec:
    """What runs on a host in one exec: the funnel on its log source; beside it, from the start, the kernel
    part and the GPU facts (each beside the other); after it the serving facts and the node part; the
    remote clock last. The one builder: probe, sweep and the demo send it as it
    is, watch's follower sends it as its snapshot, so a host's first watch verdict is probe's.
    ``command_timeout``: the exec's own limit; a ``command`` source gets half of it to end."""
    path_prepend = path_prepend or getattr(host, "path_prepend", None)  # --path-prepend, else the host's own
    spec = spec_for(log_path or "", rules, host.funnel)
    if command_timeout:
        spec.command_timeout = max(1, int(command_timeout / 2))
    apply_source(spec, source, host, path_prepend)
    gpus = ""
    if facts:  # same exec: the GPU facts beside the funnel, the serving process after it (it reads the log's path)
        gpus = facts_mod.GPU_SNIPPET
        spec.extra += facts_mod.BASE_SNIPPET + facts_mod.SERVE_SNIPPET
        spec.extra_vars.update(facts_mod.snippet_vars(path_prepend))
    # same exec, after the funnel: what the node knows (the job's rank variables, error files, Flight Recorder)
    spec.extra += node_mod.SCRIPT
    spec.extra_vars.update(node_mod.script_vars((host.funnel or {}).get("flight_recorder")))
    if kernel:  # same exec, beside the funnel: kernel log and GPU health, and beside both the GPU facts
        spec.side += ("{\n" + gpus + "} | {\n" + evidence_mod.SCRIPT + "cat\n}\n") if gpus else evidence_mod.SCRIPT
        spec.extra_vars.update(evidence_mod.script_vars(path_prepend))
    else:
        spec.side += gpus
    spec.last += CLOCK_SNIPPET  # last: read right before the answer leaves
    return spec


def probe_command(
    host: HostLike,
    source: LogSource,
    log_path: str | None,
    settings: ProbeSettings,
    rules: Rules,
    mark: str | None = None,
) -> tuple[str, str]:
    """The one exec a probe sends, and its output marker (``mark``, else a new one; the benchmarks send
    this very command)."""
    spec = remote_spec(
        host,
        source,
        log_path,
        rules,
        facts=settings.facts,
        kernel=settings.kernel,
        path_prepend=settings.path_prepend,
        command_timeout=settings.transport.command_timeout,
    )
    mark = mark or funnel_mod.new_mark()
    return funnel_mod.remote_command(funnel_mod.build_script(spec, mark)), mark


def kernel_command(path_prepend: str | None = None) -> tuple[str, str]:
    """The kernel part alone as one exec, and its output marker: watch reads it again on the same
    connection when a failure appears after its snapshot (the fault is as new as the error)."""
    mark = funnel_mod.new_mark()
    script = remote.script(
        {"FD_MARK": mark, **evidence_mod.script_vars(path_prepend)},
        remote.load("prelude.sh"),
        remote.load("begin.sh"),
        evidence_mod.SCRIPT,
        remote.load("end.sh"),
    )
    return funnel_mod.remote_command(script), mark


def host_result(
    name: str,
    fr: FunnelResult,
    rules: Rules,
    stall_after: float,
    timing: Timing | None,
    facts: dict[str, Any] | None,
    log_source: dict[str, str] | None,
    received: float | None = None,
) -> HostResult:
    """The one step from a host's parsed output to its HostResult, for probe and for watch (its
    snapshot and every re-analysis): the log's verdict, the kernel and GPU evidence (``finish``),
    where the log came from, and what the job-level analysis needs (``add_job_facts``).
    ``facts``: ``host_facts`` of the output (None: facts off); ``log_source``: ``source_name``'s."""
    res = finish(name, fr, rules, stall_after, timing, facts)
    res.log_source = log_source
    add_job_facts(res, fr, received)
    return res


def host_facts(fr: FunnelResult, enabled: bool = True) -> dict[str, Any] | None:
    """The host facts (GPUs, processes) the output carried; None when facts were not asked for."""
    return facts_mod.build(fr.facts.get("raw")) if enabled else None


def source_name(fr: FunnelResult, log_name: str, source: LogSource, log: str | None) -> dict[str, str] | None:
    """``log_source`` of a result: what discovery found on the host, else the source the user named."""
    return fr.facts.get("log_source") or given_source(log_name, source, log)


async def probe_host(host: HostLike, settings: ProbeSettings, conn: Runner | None = None) -> HostResult:
    """Probe one host; never raises for a host-side problem: it becomes the verdict."""
    t0 = time.perf_counter()
    timing = Timing()
    try:
        log_name, source = source_of(host, settings.log)
    except Exception as exc:  # an inventory problem for this host only
        return HostResult(host=host.name, verdict=NO_LOG, error=str(exc), timing=timing)
    log_path = source.value if source.kind == "file" else (None if source.kind == DISCOVER else str(source))
    own = conn is None
    try:
        if conn is None:
            conn = await open_host(host, settings)
        timing.connect_ms = round(conn.connect_ms, 1)
        rules = await settings.rules_ready()
        # built with the marker of a request sent ahead for this command line, if any (ssh.keeper.ahead)
        command, mark = ahead.command(lambda m: probe_command(host, source, log_path, settings, rules, mark=m))
        # a kept connection's first command is its open too: the keeper found (or started), the host
        # dialled when it held none, and the command on a direct connection when the keeper cannot be used
        run = await conn.execute(command, settings.transport.command_timeout)
        timing.connect_ms = round(conn.connect_ms, 1)
        if run.error is not None and not isinstance(run.error, PartialOutput):
            raise run.error
        out, status, exec_ms = run.stdout, run.status, run.total_ms
        partial = str(run.error) if run.error is not None else None
        partial_kind = run.error.kind if run.error is not None else None
        received = time.time()
        timing.round_trips = 1
        if settings.save_dir is not None:
            save_evidence(settings.save_dir, host.name, out)
        if run.error is None and run.rtt_ms is not None:
            timing.rtt_ms = round(run.rtt_ms, 1)
            timing.exec_ms = round(exec_ms or 0, 1)
        fr = funnel_mod.parse_output(out.decode("utf-8", "replace"), mark)
        if fr.status == "error" and partial is None:  # the remote shell never ran it: say why
            fr.facts["reason"] = funnel_mod.shell_failure(run.stderr, status)
        if partial and fr.status != "error" and funnel_mod.CUT not in fr.markers:
            partial = None  # the end marker arrived: all of the funnel's output is here
        if partial:
            fr.markers.append(partial)
        res = host_result(
            host.name,
            fr,
            rules,
            _stall_after(host, settings),
            timing,
            host_facts(fr, settings.facts),
            source_name(fr, log_name, source, settings.log),
            received,
        )
        if partial and fr.status == "error":  # cut before the funnel said anything
            res.verdict = UNREACHABLE
            res.error = partial
            res.markers = []
            res.error_kind = partial_kind
        elif fr.status != "error" and funnel_mod.CUT in fr.markers:
            _never_a_verdict(res, partial, partial_kind)
        if settings.stacks and res.verdict == STALLED and not partial:  # the analysis asks: where does it wait?
            await _stacks(conn, host.name, settings, res, exec_ms)
    except HostError as exc:
        res = HostResult(host=host.name, verdict=UNREACHABLE, error=str(exc), timing=timing)
        res.error_kind = exc.kind
    finally:
        if own and conn is not None:
            conn.close()
    res.address = host.target
    if res.log is None:
        res.log = log_path
    t0 = min(t0, ahead.sent_at() or t0)  # its request left before this call: counted from there
    res.timing.total_ms = round((time.perf_counter() - t0) * 1000, 1)
    return res


def _never_a_verdict(res: HostResult, partial: str | None, kind: str | None) -> None:
    """Output that ended before the funnel's end marker is that host's error, never a verdict: a log
    read half-way can look healthy while its CUDA error sat in the part that never arrived."""
    seen = res.decisive.line if res.decisive is not None else None
    res.verdict = UNREACHABLE
    res.error = partial or "the funnel's output ended before its end marker: the log was not read to its end"
    res.error_kind = kind or NETWORK
    res.decisive, res.secondary, res.summary = None, [], ""
    res.markers = [m for m in res.markers if m != partial]
    if seen:
        res.markers.append(f"before the cut the log showed: {seen}")


async def _stacks(conn: Runner, name: str, settings: ProbeSettings, res: HostResult, first_ms: float | None) -> None:
    """The second round trip, on the same connection: where the stalled job's processes wait.

    Bounded so the host still answers within its deadline: what is left of the command timeout after the
    first exec (at least 3 s, at most ``hang.TRIP_TIMEOUT``), a fraction of it per py-spy dump. A cut
    answer keeps the processes read before the cut; no answer is a note, and the first trip's verdict stands.
    """
    left = settings.transport.command_timeout - (first_ms or 0.0) / 1000
    budget = min(hang_mod.TRIP_TIMEOUT, max(3.0, left))
    command = hang_mod.command(
        hang_mod.job_pids(res.facts, res.log_source),
        res.log,
        settings.path_prepend,
        settings.pyspy,
        dump_timeout=min(hang_mod.DUMP_TIMEOUT, max(1.0, budget / 4)),
    )
    cut = None
    t0 = time.perf_counter()
    try:
        out = (await conn.run(command, budget))[0]
    except PartialOutput as exc:
        out, cut = exc.data, str(exc)
    except HostError as exc:
        res.markers.append(f"where the processes wait was not read: {exc}")
        return
    res.timing.round_trips += 1
    res.timing.bytes += len(out)
    if settings.save_dir is not None:
        save_evidence(settings.save_dir, name, out, "stacks")
    text = out.decode("utf-8", "replace")
    hang_mod.apply(res, stacks_mod.parse_stacks(text), cut, ras_mod.parse(text))
    res.facts["stacks"]["exec_ms"] = round((time.perf_counter() - t0) * 1000, 1)


def source_of(host: HostLike, log: str | None) -> tuple[str, LogSource]:
    """The host's log source for ``--log`` (None: the inventory's first log, else discovery)."""
    if hasattr(host, "log_source"):
        return host.log_source(log)  # type: ignore[attr-defined]
    name, path = host.log_path(log)
    return name, LogSource("file", path)


def apply_source(spec: funnel_mod.FunnelSpec, source: LogSource, host: Any, path_prepend: str | None) -> None:
    """Point the funnel at the source: a file (discovery as the fallback when it is missing),
    a stream, or discovery on the host."""
    spec.source = source.kind
    spec.path_prepend = path_prepend or ""
    if source.kind == "file":
        spec.fallback = True
    elif source.kind == DISCOVER:
        spec.globs = list(host.file_globs()) if hasattr(host, "file_globs") else []
    else:
        spec.source_value = source.value


def given_source(name: str, source: LogSource, log: str | None) -> dict[str, str] | None:
    """``log_source`` for a source the user named (discovery reports its own)."""
    if source.kind == DISCOVER:
        return None
    by = "--log" if log and log == source.value else f"the inventory (logs.{name})"
    return {"kind": source.kind, "detail": source.value, "found_by": by}


CLOCK_SNIPPET = remote.load("clock.sh")


def add_job_facts(res: HostResult, fr: FunnelResult, received: float | None = None) -> None:
    """What the job-level analysis (fleetdiag.job) needs from this probe, kept on the result so a
    sweep report or the history can name a job's root cause later: ``clock`` (the remote clock
    against ours, its zone), ``log_mtime`` and, for a host with a decisive error, ``job`` (its
    peer-caused kind and the few log lines with ranks, times, watchdog SeqNums and endpoints)."""
    rtt = res.timing.rtt_ms / 1000.0 if res.timing.rtt_ms is not None else None
    raw = (fr.facts.get("remote") or {}).get("clock")
    clock = job_mod.clock_sample(raw, received, rtt) if raw and received is not None else None
    if clock is not None:
        res.clock = clock
    if fr.mtime is not None:
        res.log_mtime = fr.mtime
    node = node_mod.parse_node(fr.facts.get("node_raw"))
    if node is not None and (node["procs"] or node["error_files"] or node["flight_recorder"] or node["notes"]):
        res.facts["node"] = node
    if res.decisive is not None:
        kept = job_mod.job_facts(res, [ln.text for ln in fr.lines()])
        if kept is not None:
            res.job = kept
    elif res.verdict == STALLED:  # a straggler candidate: its last lines say the step it is stuck in
        res.job = JobFacts(lines=[job_mod.clip(ln.text) for ln in fr.lines()[-job_mod.QUIET_LINES :]])


def save_evidence(directory: Path, name: str, raw: bytes, stage: str = "funnel") -> Path:
    """Write the raw stage output for one host (local only; the remote is never written)."""
    from .store import write_private  # 0600 in a 0700 directory: the output may quote secrets from logs

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "host"
    return write_private(Path(directory) / f"{safe}.{stage}.txt", raw)


def _stall_after(host: HostLike, settings: ProbeSettings) -> float:
    value = host.funnel.get("stall_after") if host.funnel else None
    return float(value) if value else settings.stall_after
