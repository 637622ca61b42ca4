"""From events to a diagnosis: each error line's role, the decisive error, the verdict.

Every error line gets a role (rules.py ROLES): a *cause* raised where it
happened, a *wrapper* quoting another error, a *launcher* reporting a child's
exit, a *peer-caused* transport or watchdog error blaming another process, or
a *consequence*. The decisive error is the earliest cause of the latest run;
then a peer-caused line (on a node that failed because of a peer, its own
transport error is what the job analysis reasons with); a wrapper or launcher
only when nothing it wraps is in the log. A parent's report that its child
died (an engine core's or an API server's) is a wrapper by its text, not by
its process: the cause is the earliest line of the best tier, whoever printed it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..records import FAILED, HEALTHY, STALLED, STARTING, Decisive, Diagnosis, Line
from ..units import signal_name
from . import hints
from .fingerprint import fingerprint
from .frames import crosses_packages, frame_lines, frame_paths
from .lines import PROGRESS, SEVERITY, LogLine, clean, parse_all
from .normalise import Normalised, filed_time, normalise
from .processes import rank_of
from .rules import (
    ANOTHER_PACKAGE,
    CAUSE,
    CONSEQUENCE,
    LAUNCHER,
    PEER,
    RAISED_UNDER,
    WRAPPER,
    Rules,
    SecondaryRule,
    Signature,
)
from .tracebacks import JVM_CAUSE, SECTION, Event, build_events

# tiers, best first: a cause; a weak cause (an error line of no known shape) or a peer-caused error,
# whichever came first (an unknown error-level line after a transport error is its follow-up);
# a launcher's report of a child's exit; a wrapper or launcher line that quotes nothing (it names what
# failed: the engine, a worker, a child); a traceback without its last line (frames name no error); a
# consequence
STRONG, WEAK, LAUNCH_TIER, REPORTER, INCOMPLETE, ONLY_SECONDARY = range(6)
PEER_TIER = WEAK
# a signature whose role is wrapper names the step that failed (a build): it loses to any cause (the compiler's
# own line it wraps) and beats the launcher's report of the process that ran the step
_TIER_OF_ROLE = {PEER: PEER_TIER, LAUNCHER: LAUNCH_TIER, WRAPPER: WEAK, CONSEQUENCE: ONLY_SECONDARY}
_TIER_OF_SECONDARY = {PEER: PEER_TIER, LAUNCHER: REPORTER, WRAPPER: REPORTER, CONSEQUENCE: ONLY_SECONDARY}


@dataclass(eq=False)
class Judged:
    """An event with its classification."""

    ev: Event
    role: str  # primary | secondary | repeat | benign
    tier: int = STRONG
    kind: str = ""  # the cascade count's name for secondary/repeat
    sig: Signature | None = None
    fp: str = ""
    rule: SecondaryRule | None = None
    cause: str | None = None  # message quoted by a wrapper
    line_role: str = CAUSE  # cause | wrapper | launcher | peer-caused | consequence (rules.ROLES)
    again: LogLine | None = None  # the later line that restated this error after the process went on (it recurred)


def latest_run(lines: list[LogLine], rules: Rules) -> int:
    """Index of the last run-start banner (0 when none): earlier runs do not count."""
    for i in range(len(lines) - 1, -1, -1):
        if rules.is_run_start(lines[i].raw):
            return i
    return 0


_STAGE_TAG = re.compile(r"^[A-Za-z0-9][\w.-]*$")
_NOT_STAGE = re.compile(r"^(?:rank|default|TP|PP|DP|EP)\d+$|^\d+$")


def _stage(ln: LogLine) -> str | None:
    """The outermost tag when it names a service or host (a docker-compose service, a pdsh host).

    Process tags (a pid, which a restart changes) and rank tags (the same ranks
    come back in the next run) are not stages.
    """
    if not ln.tags:
        return None
    tag = ln.tags[0]
    return tag if _STAGE_TAG.match(tag) and not _NOT_STAGE.match(tag) else None


def current_lines(lines: list[LogLine], rules: Rules) -> list[LogLine]:
    """The latest run's lines, plus the lines of other stages logged before it started.

    A run-start banner resets the analysis for its own stage only: when several
    services or stages share one log (a prefill and a decode instance, engines
    in docker-compose services, hosts under pdsh), a later stage starting up
    healthy does not erase an earlier stage's failure.
    """
    start = latest_run(lines, rules)
    if start == 0:
        return lines
    banner = _stage(lines[start])
    # the stages that printed their own run-start banner after ``start`` too: their earlier lines are an older run
    restarted = {_stage(ln) for ln in lines[start:] if rules.is_run_start(ln.raw)}
    earlier = [ln for ln in lines[:start] if (st := _stage(ln)) is not None and st != banner and st not in restarted]
    return earlier + lines[start:] if earlier else lines[start:]


def _norm(s: str) -> str:
    return " ".join(s.split())


# torchelastic's failure summary lists every failed rank under "Failures:" and then the first one
# under "Root Cause (first observed failure):"; the entries printed before the root cause are the
# other ranks going down after it.
_ROOT_CAUSE = re.compile(r"^\s*Root Cause \(first observed failure\):\s*$")
_SUMMARY_LINE = re.compile(
    r"^\s*(?:\[\d+\]:|(?:time|host|rank|exitcode|error_file|traceback)\s*:|Failures:|<NO_OTHER_FAILURES>|[-=]{8,}\s*$|\S.* FAILED\s*$)"
)
OTHER_RANKS = "other ranks in the launcher's failure summary"


def summary_other_failures(run: list[LogLine]) -> set[int]:
    """Indices of launcher-summary lines that describe failures other than the root cause."""
    out: set[int] = set()
    for k, ln in enumerate(run):
        if "Root Cause" not in ln.msg or not _ROOT_CAUSE.match(ln.msg):
            continue
        j = k - 1
        while j >= 0 and (not run[j].msg.strip() or _SUMMARY_LINE.match(run[j].msg)) and k - j <= 400:
            out.add(run[j].index)
            j -= 1
    return out


def _lifted(ev: Event, rules: Rules) -> list[Event]:
    """Error lines a wrapper exception carries in its message (a launcher's failure summary).

    ``ChildFailedError`` is only the launcher saying a child failed, but its
    message lists the child's exit code and signal: those lines are the
    evidence, so they stand as events of their own.
    """
    out: list[Event] = []
    after = False
    for ln in ev.block:
        if ln is ev.line:
            after = True
            continue
        if not after:
            continue
        text = ln.msg.strip()
        sig = rules.standalone_for(text) if text else None
        if sig is not None and sig.weak:  # an exit code or kill report, not the wrapper's own wording
            out.append(Event("signature", ln, ev.process, block=[ln], message=text, signature=sig, weak=sig.weak))
    return out


RESTATED = "bare exception restated with a message by the next in its chain"


def _restated_by_chain(ev: Event, events: list[Event]) -> bool:
    """A message-less exception (``TimeoutError``) re-raised as one that says what timed out.

    ``raise TimeoutError(f"RPC call to {method} timed out.") from e`` prints the
    bare cause first; the chained exception is the same failure with the words
    an operator needs, so it speaks for both.
    """
    if ev.kind != "exception" or ev.message or not ev.block:
        return False
    for other in events:
        if (
            other is not ev
            and other.kind == "exception"
            and other.block is ev.block
            and other.chain > ev.chain
            and other.message
        ):
            return True
    return False


def _raising_frames(ev: Event, n: int = 4) -> list[str]:
    """The last frame lines above a message-less exception: where it was raised names it."""
    frames: list[str] = []
    for ln in reversed(ev.block):
        if ln is ev.line:
            continue
        if ln.index > ev.line.index:
            continue
        text = ln.msg.strip()
        if text.startswith(SECTION):
            break
        if text:
            frames.append(text)
        if len(frames) >= n:
            break
    return frames


def _frame_test(ev: Event) -> Callable[[Signature], bool] | None:
    """The frames condition of signatures for this event (None when it has no traceback)."""
    if ev.kind != "exception" or len(ev.block) < 2:
        return None
    paths: list[str] | None = None
    lines: list[str] | None = None

    def holds(sig: Signature) -> bool:
        nonlocal paths, lines
        if sig.frames == ANOTHER_PACKAGE:
            if paths is None:
                paths = frame_paths(ev.block, ev.line.index)
            return sig.pat.search(ev.text) is not None and crosses_packages(ev.message, paths)
        if sig.frames == RAISED_UNDER:
            if lines is None:
                lines = frame_lines(ev.block, ev.line.index)
            return any(sig.pat.search(f) is not None for f in lines)
        return False

    return holds


def classify(events: list[Event], rules: Rules, demoted: set[int] | frozenset[int] = frozenset()) -> list[Judged]:
    """Primary vs secondary for every event, repeats folded, quoting wrappers promoted.

    ``demoted`` are line indices that only restate other failures (see
    ``summary_other_failures``): events there count in the cascade.
    """
    out: list[Judged] = []
    seen: dict[str, Judged] = {}
    memo: dict[tuple[str, str | None, str], tuple[Any, ...]] = {}  # cascades repeat one message many times
    queue = list(events)
    q = 0
    while q < len(queue):
        ev = queue[q]
        q += 1
        if ev.line.index in demoted and ev.kind == "signature":
            out.append(Judged(ev, "secondary", ONLY_SECONDARY, OTHER_RANKS, line_role=LAUNCHER))
            continue
        text = ev.text
        key = (text, ev.header, ev.line.msg)
        verdict = memo.get(key)
        if verdict is None:
            if rules.is_benign(text) or rules.is_benign(ev.line.msg) or (ev.header and rules.is_benign(ev.header)):
                verdict = ("benign",)
            else:
                hit = rules.secondary_for(text, ev.header)
                verdict = ("secondary", hit) if hit is not None else ("other",)
            memo[key] = verdict
        if verdict[0] == "benign":
            out.append(Judged(ev, "benign"))
            continue
        if verdict[0] == "secondary":
            rule, m = verdict[1]
            cause = m.groupdict().get("cause") if rule.carries_cause else None
            tier = _TIER_OF_SECONDARY.get(rule.role, ONLY_SECONDARY)
            out.append(Judged(ev, "secondary", tier, rule.kind, rule=rule, cause=cause, line_role=rule.role))
            if ev.kind == "exception" and len(ev.block) > 1:
                queue.extend(_lifted(ev, rules))
            continue
        if ev.kind == "incomplete":
            out.append(Judged(ev, "primary", INCOMPLETE, "traceback without its final line"))
            continue
        if _restated_by_chain(ev, events):
            out.append(Judged(ev, "secondary", ONLY_SECONDARY, RESTATED, line_role=WRAPPER))
            continue
        detail = [d for d in ev.detail[:20] if not rules.is_benign(d)]
        sig = rules.signature_for(text, *detail, frames=_frame_test(ev)) or ev.signature
        while sig is not None and sig.weak and ev.kind == "exception" and detail and not sig.pat.search(text):
            # an exit code after the message (the shell's "exit status 1") is how the process ended, not what
            # this exception is: it keeps its own signature, or a strong one of the lines after that code
            detail = [d for d in detail if not sig.pat.search(d)]
            sig = rules.signature_for(text, *detail)
        if sig is None and ev.kind == "exception" and not ev.message:
            sig = rules.signature_for(text, *_raising_frames(ev))
        weak = ev.weak
        if ev.kind == "error" and sig is not None and not sig.weak:
            weak = False  # an error-level line naming a known error shape is a real error
        if ev.kind == "exception" and ev.line.severity == SEVERITY["WARNING"]:
            weak = True  # logged as a warning: the program went on
        j = Judged(ev, "primary", WEAK if weak else STRONG, sig=sig)
        if ev.kind == "native" and "after throwing" in ev.line.msg:
            j.tier = INCOMPLETE  # the what() naming the exception was not in the lines read
        j.line_role = sig.role if sig is not None else CAUSE
        if j.line_role == CAUSE and _blames_peer(sig) and rules.peer_for(text, ev.line.msg) is not None:
            j.line_role = PEER
        if j.line_role != CAUSE:
            j.tier = max(j.tier, _TIER_OF_ROLE.get(j.line_role, ONLY_SECONDARY))
        if weak and j.line_role == PEER and ev.kind == "signature" and ev.line.severity < SEVERITY["ERROR"]:
            # a weak peer signature on a line of no error level (torch's "what(): ... remote process exited")
            # loses to the rank's specific transport line ("Connection closed by remote peer") or its error
            j.tier = max(j.tier, LAUNCH_TIER)
        j.fp = fingerprint(ev.exception_type or (sig.name if sig else ev.kind), ev.message)
        first = seen.get(j.fp)
        if first is not None:
            j.role, j.kind = "repeat", "same error repeated"
            if j.tier < first.tier:
                first.tier = j.tier
        else:
            seen[j.fp] = j
        out.append(j)
    _chained_wrappers(out)
    _jvm_causes(out)
    _details_below(out)
    # what the log states on its own lines: a wrapper that quotes one of them is not the only line naming
    # the cause (RayTaskError(ActorDiedError) over the ActorDiedError Ray printed with the actor's death)
    known = " \n ".join(
        _norm(j.ev.text + " " + " ".join(j.ev.detail))
        for j in out
        if j.role == "primary" or (j.role == "secondary" and j.cause is None and j.kind != OTHER_RANKS)
    )
    quoting: dict[str, Judged] = {}
    for j in out:
        if j.role == "secondary" and j.cause and _norm(j.cause) not in known:
            # the wrapper is the only line that names the cause: the worker's own traceback is missing
            outer = quoting.get(_norm(j.cause))
            if outer is not None and not _nested(outer.ev, j.ev):
                continue  # the same cause quoted again later, elsewhere: the first quote stands
            if outer is not None:
                outer.role, outer.tier = (
                    "secondary",
                    ONLY_SECONDARY,
                )  # re-raised outward: the inner quote is nearer the cause
            quoting[_norm(j.cause)] = j
            j.role, j.tier = "primary", STRONG
            j.line_role = WRAPPER
            j.sig = rules.signature_for(j.cause, j.ev.text)
            j.fp = fingerprint("quoted", j.cause)
    return out


def _blames_peer(sig: Signature | None) -> bool:
    """A transport or watchdog error blames another process unless it names a local fault.

    "watchdog thread terminated with exception: CUDA error: an illegal memory
    access" is this GPU's own failure, reported by the watchdog.
    """
    return sig is None or sig.category in ("nccl", "network", "other")


def _chained_wrappers(judged: list[Judged]) -> None:
    """Later exceptions of a chain that began with a cause wrap it: they never win over it.

    ``raise RuntimeError("worker failed") from e`` and "During handling of the
    above exception" print the cause first; what follows restates or reacts to it.
    """
    first: dict[int, Judged] = {}
    for j in judged:
        ev = j.ev
        if ev.kind != "exception" or not ev.block:
            continue
        head = first.get(id(ev.block))
        if ev.chain == 0 or head is None:
            if j.role == "primary" and j.line_role == CAUSE and j.tier <= WEAK:
                first[id(ev.block)] = j
            continue
        if j.role in ("primary", "repeat") and j.line_role == CAUSE and ev.chain > head.ev.chain:
            j.line_role = WRAPPER
            j.tier = max(j.tier, REPORTER)


def _jvm_causes(judged: list[Judged]) -> None:
    """A JVM prints its chain outermost first: each ``Caused by: X: msg`` wraps nothing, the line before wraps it.

    The exception whose report (its line, its ``at ...`` frames, a native stack its message quotes) ends right
    where a ``Caused by:`` begins, in the same process, is that cause's wrapper; so the last ``Caused by:`` of a
    chain, the innermost cause, is left.
    """

    def span(ev: Event) -> tuple[int, int]:
        idx = [ln.index for ln in ev.block] or [ev.line.index]
        return min(idx + [ev.line.index]), max(idx + [ev.line.index])

    last: Judged | None = None
    last_end = -1
    for j in sorted(judged, key=lambda j: j.ev.line.index):
        ev = j.ev
        first, end = span(ev)
        near = last is not None and ev.process == last.ev.process and 0 < first - last_end <= 3
        if ev.kind == "exception" and j.role in ("primary", "repeat"):
            if last is not None and near and ev.line.msg.lstrip().startswith(JVM_CAUSE) and last.line_role == CAUSE:
                last.line_role = WRAPPER
                last.tier = max(last.tier, REPORTER)
            last, last_end = j, end
        elif ev.kind == "incomplete" and near:
            last_end = end  # a native stack quoted in the message ("Stack trace:  File ..."), then more frames


DETAIL_GAP = 12  # lines between a runtime's generic error and the detail line under it that says why


def _details_below(judged: list[Judged]) -> None:
    """A generic error whose runtime prints the reason on a detail line under it wraps that line.

    torch_npu's ``RuntimeError: … NPU function error: aclrtSetDevice …`` is followed by CANN's own record
    (``EE1001: … Set visible device failed, invalid device=1``, ``EL0004: … Failed to allocate memory``): a cause a
    signature knows there, in the same process, states what failed (or that a peer did: HCCL's ``EI0002`` notify
    wait timed out); the generic line only says which call did.
    """
    order = sorted(judged, key=lambda j: j.ev.line.index)
    for k, j in enumerate(order):
        if j.role != "primary" or j.sig is None or not j.sig.detailed or j.line_role != CAUSE:
            continue
        at = j.ev.line.index
        for d in order[k + 1 :]:
            if d.ev.line.index - at > DETAIL_GAP:
                break
            known = d.sig is not None and not d.sig.detailed
            if known and d.role == "primary" and d.ev.process == j.ev.process and d.line_role in (CAUSE, PEER):
                j.line_role = WRAPPER
                j.tier = max(j.tier, REPORTER)
                break


def _nested(outer: Event, inner: Event) -> bool:
    """Is ``inner`` printed as part of ``outer`` (Ray prints the remote task's traceback right after its wrapper)?"""
    end = max(ln.index for ln in outer.block) if outer.block else outer.line.index
    start = min(ln.index for ln in inner.block) if inner.block else inner.line.index
    return inner.process == outer.process and 0 <= start - end <= 2


SURVIVED = "handled errors (the process went on normally)"
RESTARTED = "failures after the launcher restarted the workers"
_LAUNCH_CHILD = re.compile(r"local_rank: ?(\d+) \(pid: ?(\d+)\)")
# torchelastic's (and DLRover's) own statement of a restart; INFO, so newer torch prints it only with LOGLEVEL=INFO
_RESTARTING = re.compile(r"attempts left; will restart worker group")
# the agent's pid in a glog-style prefix (torch >= 2.2: "E1201 18:32:10.197000 510 torch/distributed/...py:986]")
_AGENT_PID = re.compile(r"\b[IWEF]\d{4} [\d:.]+ +(\d+) [\w./-]+\.py:\d+\]")


# a supervisor starting its program again after a failure: systemd's "Scheduled restart job, restart counter is at N",
# supervisord's "spawned: 'x' with pid N", ollama's Windows app's "server crash N - exit code N - respawning"
_SUPERVISOR_RESTART = re.compile(
    r"Scheduled restart job, restart counter is at \d+|\bspawned: '[^']+' with pid \d+|- respawning\b"
)


def supervisor_restarts(run: Sequence[LogLine], after: int) -> int:
    """How many times a supervisor started its program again after the line at index ``after``."""
    return sum(1 for ln in run if ln.index > after and _SUPERVISOR_RESTART.search(ln.msg))


def restarted_after(judged: list[Judged], run: Sequence[LogLine] = ()) -> int | None:
    """Line index of a launcher's report of a failed child after which it started the workers again.

    torchelastic's ``--max-restarts`` starts the workers again after a failure;
    when the restart fails too, its errors (a connect refused by peers that are
    gone, a checkpoint the first failure left half written) follow from the
    first failure, which is the answer. The restart shows as the agent's own
    "N/M attempts left; will restart worker group", or as a later report by the
    same agent (its tag and its pid) of a child with another pid: an agent
    reports one failure per attempt.
    """
    restarts = [ln.index for ln in run if "attempts left" in ln.msg and _RESTARTING.search(ln.msg)]
    first: dict[tuple[str | None, str | None], tuple[str, int]] = {}
    for j in judged:
        if j.line_role != LAUNCHER or j.role not in ("primary", "secondary", "repeat"):
            continue  # a repeat: the same report for a new child, its pid aside
        m = _LAUNCH_CHILD.search(j.ev.line.msg)
        if m is None:
            continue
        at = j.ev.line.index
        if any(r > at for r in restarts):
            return at
        agent = _AGENT_PID.search(j.ev.line.raw)
        who = (j.ev.process, agent.group(1) if agent else None)
        pid = m.group(2)
        if who in first and first[who][0] != pid:
            return first[who][1]
        first.setdefault(who, (pid, at))
    return None


SURVIVAL_LINES = 3  # normal lines the same process must log after an error for it to count as survived
_ENDING = re.compile(
    r"(?i)shut(ting)? ?down|exit|terminat|stopp|abort|kill|clean ?up|destroy|teardown|tear down|finished server process"
)
# NCCL's "init.cc:1010 -> 1": the error code returned up the stack; newer releases name the call after it
# ("bootstrap.cc:868 -> 6 ncclSocketConnect()")
_UNWINDING = re.compile(r"-> \d+(?: \[[^]]*\])?\s*$|\.(?:cc|cu|cpp|c|h):\d+ -> \d+\b")
# a runtime's report that the process is dying: Go's fatal signal header ("SIGSEGV: segmentation violation",
# "SIGABRT: abort"), its fatal error and panic, and the goroutine dump under them. Lines of that dump are no sign
# that the process went on after an error
_DYING = re.compile(
    r"^(?:SIG(?:SEGV|ABRT|BUS|ILL|FPE|TRAP|QUIT|SYS): [a-z]|fatal error: |panic: |signal arrived during cgo execution"
    r"|goroutine \d+ (?:gp=\S+ m=\S+ (?:mp=\S+ )?)?\[)"
)


# health, readiness and metrics probes (a load balancer's, an orchestrator's): an HTTP front end answers them
# while its engine is dead, so their answer says the front end is up, not that the engine serves
PROBE_PATHS = r"(?:health\w*|ready\w*|live\w*|ping|metrics|v1/models|models|version|stats|favicon)\b"
_PROBE_PATH = re.compile(r"^/" + PROBE_PATHS)
# the requests a front end answers itself, whatever the method, with no model behind it: ollama's listing and
# model-management endpoints (a client's `ollama run` sends HEAD / and POST /api/show before it asks the runner)
_MANAGEMENT_PATH = re.compile(r"^/api/(?:tags|ps|version|show|pull|push|create|copy|delete|blobs)\b")
# an access log's line: the request's method and path and the status the front end answered with, in uvicorn's
# form ('"GET /health HTTP/1.1" 200', vLLM's and SGLang's front ends) or Gin's (ollama: '| 200 | 1.2ms |
# 127.0.0.1 | HEAD "/"')
_ACCESS = re.compile(
    r'"(?P<method>GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) (?P<path>/[^ "]*) HTTP/[0-9.]+" (?P<code>[1-5][0-9][0-9])\b'
    r"|\| (?P<gcode>[1-5][0-9][0-9]) \|[^|]*\|[^|]*\| +(?P<gmethod>GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) +"
    r'"(?P<gpath>/[^"]*)"'
)


def access(msg: str) -> tuple[str, str, str] | None:
    """(method, path, status) of an access log's line, in either form, or None."""
    if '"' not in msg:
        return None
    m = _ACCESS.search(msg)
    if m is None:
        return None
    if m.group("code") is not None:
        return m.group("method"), m.group("path"), m.group("code")
    return m.group("gmethod"), m.group("gpath"), m.group("gcode")


def is_probe(msg: str, req: tuple[str, str, str] | None = None) -> bool:
    """A request the front end answers without its engine: a probe, a listing, a model's metadata.

    ``req`` is the line's ``access()`` when the caller has it already (one parse a line).
    """
    if req is None:
        req = access(msg)
    if req is None:
        return False
    method, path, _ = req
    if method in ("GET", "HEAD") and (path == "/" or _PROBE_PATH.match(path)):
        return True
    return _MANAGEMENT_PATH.match(path) is not None


def _normal(ln: LogLine, rules: Rules) -> bool:
    """A line that shows a process at work: info-level, not error-shaped, not winding down.

    A ``GET /health 200`` is not work: the API server answers it after the
    engine behind it died.
    """
    m = ln.msg.strip()
    if not m or ln.severity > SEVERITY["INFO"] or m[0] in "|+^~":
        return False
    if is_probe(m):
        return False
    if ln.level is None and (
        ln.msg[:1].isspace() or not rules.is_ready(ln.raw) and (ln.relayed or not ln.tags and not ln.time)
    ):
        return False  # an unlabelled line could be anything (a traceback's tail, a print), relayed or not
    if rules.is_ready(ln.raw):
        return True
    return not (rules.is_keyword(m) or _ENDING.search(m) or _UNWINDING.search(m) or rules.secondary_for(m) is not None)


def survivors(judged: list[Judged], run: list[LogLine], rules: Rules) -> dict[int, bool]:
    """Primary errors after which the same process went on normally (a retry, a fallback, one bad request).

    A process that logs ordinary progress after an error handled it; the
    error that ended the run (or nothing, on a server still serving) decides.
    Returns {index in judged: True when a server answered a request after it}.
    """
    out: dict[int, bool] = {}
    if not run:
        return out
    pos = {ln.index: k for k, ln in enumerate(run)}
    in_block: set[int] = set()
    for j in judged:
        for ln in j.ev.block:
            in_block.add(ln.index)
    for k, j in enumerate(judged):
        if j.role != "primary" or j.tier == INCOMPLETE:
            continue
        ev = j.ev
        end = max([ln.index for ln in ev.block] + [ln.index for ln in ev.repeats] + [ev.line.index])
        seen: set[str] = set()
        own = {ln.index for ln in ev.block}
        # a launcher's or supervisor's report that its child exited is not taken back by its own chatter after it
        # ("Scheduled restart job", "Started …"): only a server answering requests again, whichever process, is
        reported = j.line_role == LAUNCHER
        for ln in run[pos.get(end, len(run)) + 1 :]:
            if reported:
                if rules.is_serving(ln.raw):
                    out[k] = True
                    break
                continue
            if ln.process != ev.process:
                continue
            if _DYING.match(ln.msg.strip()):
                break  # it died of it
            # the server answered a request after it; an error answer counts (it is a line of its own
            # event, a request-scoped benign one: the loop caught the error and went on)
            if ln.index not in own and rules.is_serving(ln.raw):
                out[k] = True
                break
            if ln.index in in_block:
                continue
            if _normal(ln, rules):
                seen.add(ln.msg.strip())  # one note repeated word for word while waiting is not work
                if len(seen) >= SURVIVAL_LINES:
                    j.again = _recurs_last(ev, run[pos[ln.index] + 1 :], rules)
                    if j.again is None:
                        out[k] = False
                    break
    return out


RECURRENCE_MIN = 16  # characters of an error's message that a later line must restate to be the same error


def _recurs_last(ev: Event, after: Sequence[LogLine], rules: Rules) -> LogLine | None:
    """The line where the process hit the same error again after going on, when that was the last it did.

    A server that takes the next job after a failed one and fails it the same way (ComfyUI's next prompt, a
    retried load) did not get past the error: the restated message, with nothing served between and no work
    after it, keeps the first statement decisive.
    """
    msg = ev.message.strip()
    if len(msg) < RECURRENCE_MIN:
        return None
    work: set[str] = set()
    for ln in reversed(after):  # from the end: the last restatement, and what the process did after it
        if rules.is_serving(ln.raw):
            return None  # served since: an error before this answer was one request's
        if msg in ln.msg:
            return ln
        if ln.process == ev.process and _normal(ln, rules):
            work.add(ln.msg.strip())
            if len(work) >= SURVIVAL_LINES:
                return None  # it went on after that too
    return None


def choose(judged: list[Judged], rules: Rules) -> Judged | None:
    """Earliest line of the best tier (a cause, then a peer-caused error, then a launcher or
    wrapper, then a consequence)."""
    prim = [j for j in judged if j.role in ("primary", "secondary")]
    if not prim:
        return None
    tier = min(j.tier for j in prim)
    cands = sorted((j for j in prim if j.tier == tier), key=lambda j: j.ev.line.index)
    if any(j.role == "primary" for j in cands):  # an error line beats a secondary rule's match of its tier
        cands = [j for j in cands if j.role == "primary"]
    return cands[0]


_FALLBACK_HINTS = {
    REPORTER: "Only a wrapper or a launcher's summary was found: the error it reports was printed elsewhere, in "
    "another process's log (the rank's own stderr) or before the lines read.",
    ONLY_SECONDARY: "Only consequences of a failure were found (wrappers, teardown, a launcher's summary): the root cause "
    "was printed elsewhere, earlier in this log or in another process's log.",
    INCOMPLETE: "The traceback's final line was not in the lines read: read the log around it (that process's own "
    "lines) to see the exception.",
}
_FALLBACK_BY_KIND = {
    "exception": "No known error signature: the last frames of the traceback name the failing code; search the "
    "message in the framework's issue tracker.",
    "native": "A C++ exception or abort ended the process: the what() line names it.",
}
_FALLBACK = "An error line with no known signature: the lines around it from the same process say more."


def _fallback_hint(best: Judged) -> str:
    """A hint for an error no signature knows, so the answer always says what to look at next."""
    if best.cause is not None and best.tier == STRONG:
        return (
            f"Only a wrapper names the cause ({best.cause[:120]}): the failing task's own traceback, with the "
            "full message, is in that worker's own log (for Ray, the worker's log file on its node)."
        )
    if best.line_role == PEER:
        return _PEER_HINT
    return _FALLBACK_HINTS.get(best.tier) or _FALLBACK_BY_KIND.get(best.ev.kind, _FALLBACK)


_PEER_HINT = (
    "This process failed because another one did (a peer closed the connection, timed out or exited): "
    "the root cause is in the log of the rank or host that stopped first."
)
_EXIT = re.compile(
    r"exitcode *: *(?P<code>-?\d+)|return code = (?P<rc>-?\d+)|exit code:? (?P<ec>-?\d+)|exit status (?P<st>\d+)"
    r"|Signal (?P<sig>\d+) \(SIG[A-Z]+\)|exited with code (?P<dc>\d+)|terminated with signal (?P<name>SIG[A-Z]+)"
    # a supervisor's report of its child: "exited with status code 1", Go's os/exec "signal: aborted (core
    # dumped)", TGI's "signaled to shutdown with signal 4"
    r"|exited with status code (?P<sc>-?\d+)|\bsignal: (?P<go>killed|aborted|segmentation fault|bus error"
    r"|illegal instruction|terminated|interrupt)\b|with signal (?P<num>\d+)\b"
    # systemd's report on a unit's main process: "code=exited, status=2/INVALIDARGUMENT" is the status it
    # exited with, "code=killed, status=9/KILL" and "code=dumped, status=6/ABRT" the signal that ended it
    r"|code=exited, status=(?P<sd>\d+)|code=(?:killed|dumped), status=(?P<sdsig>\d+)"
    # Python's subprocess: "Command '[...]' died with <Signals.SIGKILL: 9>."
    r"|died with <Signals\.SIG[A-Z]+: (?P<pysig>\d+)>"
)
# an inference server's summary that a model failed to load (rules.yaml): a launcher-tier line that reports no exit
MODEL_LOAD_FAILED = "model-load-failed"
AGENT_DEATH_SIGNAL = "agent-death-signal"
_DEATH_SIGNAL = re.compile(r"Received (\d+) death signal")
_UNIT = re.compile(r"(\S+\.service): [Mm]ain process exited")  # systemd names the unit whose process it was
_SIGNALS = {"SIGKILL": 9, "SIGSEGV": 11, "SIGABRT": 6, "SIGBUS": 7, "SIGTERM": 15, "SIGINT": 2, "SIGFPE": 8}
_GO_SIGNALS = {  # Go's names of the signals (syscall.Signal.String)
    "killed": 9,
    "aborted": 6,
    "segmentation fault": 11,
    "bus error": 7,
    "illegal instruction": 4,
    "terminated": 15,
    "interrupt": 2,
}
# torch.multiprocessing.spawn's parent names the child by its index (its local rank)
_SPAWNED = re.compile(r"\bprocess (\d+) terminated with\b")


def exit_of(text: str) -> tuple[int | None, int | None]:
    """(exit code, signal) a launcher's line reports: ``exitcode: -9`` is SIGKILL, status 137 too."""
    m = _EXIT.search(text)
    if m is None:
        return None, None
    if m.group("sig"):
        return None, int(m.group("sig"))
    if m.group("name"):
        return None, _SIGNALS.get(m.group("name"))
    if m.group("go"):
        return None, _GO_SIGNALS[m.group("go")]
    if m.group("num"):
        return None, int(m.group("num"))
    if m.group("sdsig") or m.group("pysig"):
        return None, int(m.group("sdsig") or m.group("pysig"))
    raw = next(
        g
        for g in (
            m.group("code"),
            m.group("rc"),
            m.group("ec"),
            m.group("st"),
            m.group("dc"),
            m.group("sc"),
            m.group("sd"),
        )
        if g
    )
    n = int(raw)
    if m.group("sc") or m.group("sd"):
        return n, None  # a supervisor's status code is the child's code (Windows' are negative NTSTATUS values)
    if n < 0:
        return None, -n
    if n > 128 and (m.group("st") or m.group("dc")):
        return None, n - 128  # a shell's (or docker's) 128 + signal
    return n, None


def _launcher_says(best: Judged, rank: int | None) -> str:
    """What a launcher-only answer means: "rank 3 died with SIGKILL (-9) and wrote no error: see the kernel log"."""
    local = re.search(r"\blocal_rank: ?(\d+)", best.ev.line.msg) or _SPAWNED.search(best.ev.line.msg)
    unit = _UNIT.search(best.ev.line.msg)
    if local:
        who = f"local rank {local.group(1)}"
    elif unit:
        who = f"{unit.group(1)}'s main process"
    else:
        who = f"rank {rank}" if rank is not None else "a child process"
    code, sig = exit_of(best.ev.line.msg)
    if best.sig is not None and best.sig.name == MODEL_LOAD_FAILED:
        return (
            "the server reports that a model failed to load, and the load error it sums up is not in the lines "
            "read: see its log from the start of the load"
        )
    if best.sig is not None and best.sig.name == AGENT_DEATH_SIGNAL:
        m = _DEATH_SIGNAL.search(best.ev.line.msg)
        sent = f"{signal_name(int(m.group(1)))} ({m.group(1)})" if m else "a signal"
        return (
            f"the launcher's agent was sent {sent} from outside the job and stopped its workers; no rank wrote an "
            "error in the lines read"
        )
    if sig is not None:
        name = signal_name(sig)
        where = {
            9: "the kernel log (the OOM killer) and host memory",
            7: "its stderr and /dev/shm size",
        }.get(sig, "its own stderr and the kernel log")
        return f"{who} died with {name} (-{sig}) and wrote no error: see {where}"
    if code is not None:
        return f"{who} exited with code {code} and wrote no error in the lines read: see its own output"
    return f"{who} died and wrote no error in the lines read: see its own output and the kernel log"


def _category(j: Judged) -> str:
    """The signature's category; an error no signature knows is "other" (not guessed).

    A wrapper quoting a worker's message (``Worker failed with error '…'``)
    carries a Python exception's text: with no signature of its own it is "python".
    """
    if j.sig is not None:
        return j.sig.category
    quoted_message = j.cause is not None and " " in j.cause.strip()  # a message, not a bare type name
    return "python" if quoted_message and j.line_role == WRAPPER and j.tier == STRONG else "other"


def _cascade(judged: list[Judged], best: Judged, run: list[LogLine], rules: Rules) -> Counter[str]:
    """The secondary errors collapsed to counts by kind."""
    counts: Counter[str] = Counter()
    if best.ev.count > 1:
        counts["same error repeated"] += best.ev.count - 1
    in_block: set[int] = set()
    for j in judged:
        for ln in j.ev.block:
            in_block.add(ln.index)
        for ln in j.ev.repeats:
            in_block.add(ln.index)
    mine = {ln.index for ln in best.ev.block}
    for j in judged:
        if j is best or j.role == "benign":
            continue
        if j.role in ("secondary", "repeat"):
            counts[j.kind] += j.ev.count
        elif j.role == "primary" and j.tier > best.tier:
            counts[j.kind or (j.sig.name if j.sig else (j.ev.exception_type or "other later errors"))] += j.ev.count
        hl = j.ev.header_line
        if hl is not None and hl.index not in mine:
            in_block.discard(hl.index)  # a wrapper header ("EngineCore failed to start.") counts on its own
    start = best.ev.block[0].index if best.ev.block else best.ev.line.index
    headers = {j.ev.header_line.index for j in judged if j.ev.header_line is not None}
    pos = {ln.index: k for k, ln in enumerate(run)}
    for ln in run[pos.get(start, 0) :]:
        if ln.index in in_block or ln.index in mine:
            continue
        hit = rules.secondary_for(ln.msg.strip())
        if hit is not None:
            counts[hit[0].kind] += 1
    for idx in sorted(headers):
        if idx < start and idx not in mine:
            if idx not in pos:
                continue
            hit = rules.secondary_for(run[pos[idx]].msg.strip())
            if hit is not None:
                counts[hit[0].kind] += 1
    return counts


def _confidence(best: Judged, judged: list[Judged], cascade: int) -> float:
    ev = best.ev
    if best.tier == ONLY_SECONDARY:
        c = 0.2
    elif best.tier == INCOMPLETE:
        c = 0.25
    elif best.tier == REPORTER:
        c = 0.3
    elif best.tier == LAUNCH_TIER or (best.tier == WEAK and best.line_role in (CAUSE, WRAPPER)):
        c = 0.45
    elif best.cause is not None or best.line_role == PEER:
        c = 0.6
    elif ev.kind == "exception":
        c = 0.85 if len(ev.block) > 1 and not ev.truncated else 0.75
    else:
        c = 0.8
    if best.sig is not None and best.tier <= LAUNCH_TIER:
        c += 0.05
    if cascade and best.tier <= LAUNCH_TIER:
        c += 0.05
    others = sum(1 for j in judged if j.role == "primary" and j is not best and j.tier == STRONG)
    c -= 0.07 * min(others, 3)
    return round(max(0.05, min(0.99, c)), 2)


def _restarts_note(best: Judged, run: Sequence[LogLine], rules: Rules) -> str:
    """A supervisor's report of its child's exit that it restarted since: how often, and whether a request was
    answered after it (a crash loop answers none)."""
    at = best.ev.line.index
    n = supervisor_restarts(run, at) if best.line_role == LAUNCHER else 0
    if not n:
        return ""
    served = any(ln.index > at and rules.is_serving(ln.raw) for ln in run)
    return f"; restarted {n} time{'s' if n != 1 else ''} after it" + ("" if served else ", and nothing served since")


def _again_note(best: Judged) -> str:
    """An error the process went on from and hit again, last: where it recurred."""
    if best.again is None:
        return ""
    at = f" (line {best.again.lineno})" if best.again.lineno else ""
    return f"; the process went on and failed the same way again{at}, the last it did"


def _reason(best: Judged, judged: list[Judged], rules: Rules, cascade: int, rank: int | None) -> str:
    ev = best.ev
    where = f"in {ev.process}" if ev.process else "in an untagged process"
    if rank is not None and not (ev.process or "").endswith(f"rank{rank}"):
        where += f" (rank {rank})"
    if best.line_role == LAUNCHER and best.tier <= LAUNCH_TIER:
        where = f"reported by {ev.process}" if ev.process else "reported by the launcher"
    prim = [j for j in judged if j.role == "primary" and j.tier == best.tier]
    # a launcher's summary says who died of what, also where it ranks only as a consequence
    reported_exit = best.tier in (REPORTER, ONLY_SECONDARY) and exit_of(ev.line.msg) != (None, None)
    if best.line_role == LAUNCHER and (best.tier <= LAUNCH_TIER or reported_exit):
        what = _launcher_says(best, rank)
    elif best.tier in (REPORTER, ONLY_SECONDARY):
        what = f"no cause in the lines read, only consequences (a {best.line_role}); the earliest is shown"
    elif best.line_role == PEER:
        what = "peer-caused: a transport or watchdog error that blames another process, and no cause of its own"
    elif best.cause is not None:
        what = "the failing process's own traceback is missing; this wrapper is the only line quoting its error"
    elif best.tier == INCOMPLETE:
        what = "a traceback without its final line (cut or still being written)"
    elif best.line_role == WRAPPER and best.tier == WEAK:
        what = "only the report of a failed step (a wrapper): the error it wraps is not in the lines read"
    elif best.tier == WEAK:
        what = "no exception found; earliest error line" if len(prim) > 1 else "the only error line"
    else:
        what = "earliest primary error" if len(prim) > 1 or cascade else "the only primary error"
    parts = [f"{what}, {where}"]
    if cascade:
        parts.append(f"{cascade} later line{'s' if cascade != 1 else ''} {'are' if cascade != 1 else 'is'} its cascade")
    others = sum(1 for j in judged if j.role == "primary" and j is not best and j.tier == STRONG)
    if others and best.tier == STRONG:
        parts.append(f"{others} other distinct error{'s' if others != 1 else ''} after it")
    return "; ".join(parts)


# an engine's periodic report (vLLM V0 and V1): throughput, then the requests it holds, running and waiting.
# Three searches, one after the other: one pattern with two lazy gaps backtracked in quadratic time on a line
# of many "Running:" and no "Waiting:"; a number is digits (a stray "." or "1.2.3" is not one to convert)
_NUM = r"\d+(?:\.\d+)?"
_ENGINE_STATS = re.compile(
    rf"Avg prompt throughput: (?P<p>{_NUM}) tokens/s, Avg generation throughput: (?P<g>{_NUM}) tokens/s,"
)
_ENGINE_RUNNING = re.compile(r"Running: (\d+) reqs,")
_ENGINE_WAITING = re.compile(r"(?:Pending|Waiting): (\d+) reqs")


@dataclass
class EngineReport:
    """One periodic report: tokens/s of prompt and generation (as printed), requests running and waiting."""

    prompt: str
    generation: str
    running: int
    waiting: int


def engine_report(msg: str) -> EngineReport | None:
    """The numbers of an engine's periodic report line, or None when the line is not one."""
    m = _ENGINE_STATS.search(msg) if "throughput" in msg else None
    if m is None:
        return None
    r = _ENGINE_RUNNING.search(msg, m.end())
    w = _ENGINE_WAITING.search(msg, r.end()) if r is not None else None
    if r is None or w is None:
        return None
    return EngineReport(m["p"], m["g"], int(r.group(1)), int(w.group(1)))


HUNG_REPORTS = 2  # consecutive engine reports without progress while requests wait: a hung engine


def hung_engine(run: list[LogLine], rules: Rules) -> str | None:
    """Why the engine behind a live front end is hung, or None.

    A server whose engine loop is stuck still answers ``/health`` and
    ``/metrics`` (and keeps its stats timer), so the log grows and reads as
    serving. Its own reports say otherwise: requests are held (running or
    waiting) and nothing is generated, or requests wait and none is running,
    report after report, with no request answered since.
    """
    tail: list[tuple[LogLine, EngineReport]] = []
    for ln in reversed(run):
        if rules.is_serving(ln.raw) and "Avg prompt throughput" not in ln.raw:
            break  # a request was answered after these reports
        rep = engine_report(ln.msg)
        if rep is None:
            continue
        p, g, r, w = float(rep.prompt), float(rep.generation), rep.running, rep.waiting
        stuck = (r + w > 0 and p == 0 and g == 0) or (r == 0 and w > 0)
        if not stuck:
            break
        tail.append((ln, rep))
    if len(tail) < HUNG_REPORTS:
        return None
    last = tail[0][1]
    first = tail[-1][0]
    since = f" since {first.time}" if first.time else ""
    return (
        f"engine hung: {len(tail)} reports in a row{since} with requests held (running {last.running}, waiting "
        f"{last.waiting}) and no progress (prompt {last.prompt}, generation {last.generation} tokens/s); the front "
        "end only answers probes"
    )


FAILING_REQUESTS = 5  # the log's last requests, all answered with a server error: the engine behind does not serve


def failing_front_end(run: list[LogLine]) -> str | None:
    """Why a front end that answers every request with a server error is not healthy, or None.

    A server whose engine died or wedged without a word in this log keeps its HTTP front end up and answers
    each request with ``500 Internal Server Error`` (vLLM's and SGLang's uvicorn access log). One failed request
    among served ones is a request error (healthy); the log's last ``FAILING_REQUESTS`` requests or more all
    answered 5xx, none served since, is a server that does not serve. Probes (``/health``, ``/metrics``) are not
    requests: their ``200 OK`` says only that the front end is up.
    """
    failed = 0
    first: LogLine | None = None
    for ln in reversed(run):
        req = access(ln.msg)
        if req is None:
            continue
        code = req[2]
        if is_probe(ln.msg, req):
            continue
        if code[0] != "5":
            break
        failed += 1
        first = ln
    if failed < FAILING_REQUESTS or first is None:
        return None
    since = f" since {first.time}" if first.time else ""
    return (
        f"front end answers only errors: its last {failed} requests{since} were answered with a server error (5xx) "
        "and none was served; the engine behind it does not serve (its own error is not in the log)"
    )


def _summary(run: list[LogLine], rules: Rules) -> tuple[str, str]:
    hung = hung_engine(run, rules)
    if hung is not None:
        return STALLED, hung
    failing = failing_front_end(run)
    if failing is not None:
        return STALLED, failing
    last_wait = last_ready = None
    for ln in reversed(run):
        # a server answering requests and a training loop's progress are past their start-up too
        if last_ready is None and (rules.is_ready(ln.raw) or rules.is_serving(ln.raw) or PROGRESS.search(ln.msg)):
            last_ready = ln
        if last_wait is None and rules.is_waiting(ln.raw):
            last_wait = ln
        if last_ready is not None and last_wait is not None:
            break
    if last_wait is not None and (last_ready is None or last_wait.index > last_ready.index):
        return STARTING, f"starting, not ready yet: {last_wait.msg.strip()[:160]}"
    if last_ready is not None:
        return HEALTHY, f"no error in the latest run; ready: {last_ready.msg.strip()[:160]}"
    if not run:
        return HEALTHY, "no log lines to analyse"
    return HEALTHY, f"no error in the latest run ({len(run)} lines read)"


def diagnose(lines: Sequence[Line], rules: Rules, facts: dict[str, Any] | None) -> Diagnosis:
    """The whole analysis of one log's lines (sparse, ordered by position)."""
    norm = normalise(list(lines))
    diag = _diagnose(norm.lines, rules, facts, norm)
    if diag.decisive is not None and norm.steps:
        diag.decisive.reason += f"; log normalised first ({', '.join(norm.steps)})"
    return diag


def _time_as_filed(first: LogLine | Line, own: str | None, norm: Normalised | None) -> str | None:
    """A removed service prefix's full stamp wins over a line's own stamp without a year (see filed_time)."""
    if isinstance(first, Line) and norm is not None and "service prefix removed" in norm.steps:
        return filed_time(first.text, own)
    return own


# A wrapper's message that points at the error printed under it: transformers' and diffusers' lazy modules
# ("Failed to import X because of the following error (look up to see its traceback):"), "… see below:".
ANNOUNCES_CAUSE = re.compile(
    r"(?:because of|due to) the following (?:error|exception)|look up to see its traceback|\bsee (?:below|the error below)\b",
    re.IGNORECASE,
)


def _message_line(ev: Event) -> LogLine:
    """The line that states the error: an exception whose message starts on the next line is that line.

    A message that begins with a newline (torch.utils.cpp_extension's CUDA mismatch) prints a bare
    ``RuntimeError:``; the words an operator needs are on the line after it. A wrapper whose message
    only announces the error under it (``… because of the following error …:``) is stated there too.
    """
    if ev.kind != "exception" or not ev.detail or not ev.line.msg.rstrip().endswith(":"):
        return ev.line
    if ev.message.strip() and not ANNOUNCES_CAUSE.search(ev.message):
        return ev.line  # a bare name ("KeyboardInterrupt") has no message: what follows it is not one
    return next((ln for ln in ev.block if ln.index > ev.line.index and ln.msg.strip()), ev.line)


def _diagnose(
    lines: Sequence[Line], rules: Rules, facts: dict[str, Any] | None, norm: Normalised | None = None
) -> Diagnosis:
    parsed = parse_all(lines, rules.tag_peelers)
    run = current_lines(parsed, rules)
    events = build_events(run, rules)
    judged = classify(events, rules, summary_other_failures(run))
    again = restarted_after(judged, run)
    if again is not None:
        for j in judged:
            if j.ev.line.index > again and j.role == "primary":
                j.role, j.kind, j.tier = "secondary", RESTARTED, ONLY_SECONDARY
    handled = survivors(judged, run, rules)
    for k in handled:
        judged[k].role, judged[k].kind, judged[k].tier = "secondary", SURVIVED, ONLY_SECONDARY
    best = choose(judged, rules)
    if best is not None and best.kind == SURVIVED:
        best = None  # every error was handled and nothing ended the run
    if best is None:
        verdict, summary = _summary(run, rules)
        if handled:
            summary = summary.replace("no error", "no fatal error", 1)
            served = sum(1 for v in handled.values() if v)
            if served:
                summary += f"; request errors: {served} (the server answered requests after each)"
            if len(handled) > served:
                summary += f"; handled errors: {len(handled) - served} (the process went on after each)"
        return Diagnosis(verdict=verdict, summary=summary)
    counts = _cascade(judged, best, run, rules)
    cascade = sum(counts.values())
    ev = best.ev
    rank = rank_of(ev.process, run, ev.line.msg)
    sig = best.sig
    if sig is None and best.role == "secondary":
        sig = best.sig = rules.signature_for(best.ev.text)

    def as_filed(ln: LogLine) -> LogLine | Line:
        """The line as the file has it (before normalisation: its prefix, its first physical part)."""
        o = norm.original(ln.pos) if norm is not None and norm.origin else None
        return o if o is not None else ln

    stated = _message_line(ev)
    first = as_filed(stated)
    decisive = Decisive(
        line=clean(first.text) if isinstance(first, Line) else stated.raw,
        message=ev.line.msg.strip() if stated is ev.line else f"{ev.exception_type}: {stated.msg.strip()}",
        process=ev.process or (norm.service if norm is not None else None),
        time=_time_as_filed(first, ev.line.time or next((ln.time for ln in ev.block if ln.time), None), norm),
        lineno=first.lineno,
        pos=first.pos,
        exception_type=ev.exception_type,
        category=_category(best),
        traceback=[clean(o.text) if isinstance(o, Line) else o.raw for o in map(as_filed, ev.block)],
        hint=hints.render(sig, facts) or _fallback_hint(best),
        fingerprint=best.fp or fingerprint(ev.exception_type or best.kind or ev.kind, ev.message),
        confidence=_confidence(best, judged, cascade),
        reason=_reason(best, judged, rules, cascade, rank) + _restarts_note(best, run, rules) + _again_note(best),
        rank=rank,
        rule=sig.name if sig is not None else (best.rule.kind if best.rule is not None else None),
        role=best.line_role,
    )
    primaries = sum(1 for j in judged if j.role == "primary" and j.tier <= WEAK)
    return Diagnosis(
        verdict=FAILED, decisive=decisive, secondary=dict(counts.most_common()), primary_count=max(primaries, 1)
    )
