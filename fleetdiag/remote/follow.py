"""The remote follower: one long-running POSIX sh script per watched host.

``fleetdiag watch`` must learn about a failure within a second without the
controller polling over a 240 ms round trip. So one exec request runs this
script on the host; it stays running and *pushes*:

1. the probe funnel's snapshot, exactly as ``probe`` gets it (same script, so
   the first verdict is the probe's verdict), between the funnel's markers;
2. then, until the connection closes: on every wake-up it stats the log
   (size, inode) and, when it grew, reads only the new bytes
   (``tail -c +OFFSET | head -c N``) into one persistent awk filter that
   keeps error-shaped lines, the tagged context after them (so a whole
   traceback arrives), run-start banners and the last lines of each burst, as
   the funnel's ``L\tpos\tlineno\ttext`` records (``l`` for routine tail
   lines); a heartbeat every ``heartbeat`` seconds carries the remote clock,
   size, mtime, inode and whether the serving process is alive.

A stream source (``journalctl -u UNIT -f``, ``docker logs -f``, a command's
stdout), named in the inventory or found by the snapshot's discovery, is
piped into the same awk filter: the records are the same, but heartbeats
carry no size, mtime or inode, so idle time is the time since the last line
arrived.

Wake-ups come from a ``tail -F`` *doorbell* where GNU tail exists (inotify,
so an idle log starts no processes at all; offsets never come from tail),
else from a stat every ``poll`` seconds. Truncation (size < offset) and
rotation (inode change) restart at offset 0 with a reset record; a glob
re-resolves to its newest match on every heartbeat. Partial last lines are
held back until their newline arrives (and shown at heartbeats, so an
unterminated dying line is not lost).

Same rules as the funnel: read-only, no temp files, ``renice``/``ionice -c3``
on itself, every value a single-quoted assignment (the fixed shell and awk
texts too), awk regexes via ENVIRON. Measured cost and latency:
bench/watch_latency.py.

Control lines travel from the shell loop to awk *inside* the byte stream,
prefixed with a random mark; awk splits them off even when they land after a
partial line, so positions stay exact byte offsets of the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import remote
from ..records import Line
from . import funnel as funnel_mod

# The follower's fixed texts (remote/): functions both shells share (the main
# sh's pre-stat and the follow loop's shell, handed over as FW_FUNCS and eval'd),
# the follow loop (FW_LOOP, run by bash or sh), the pre-stat before the funnel,
# the awk filter (FW_AWK) and the main part after the funnel's end marker.
#
# The loop's *reader* does one step per wake-up: stat the log; handle truncation
# (size < offset), rotation (inode), a newer glob match; read only the new bytes
# into the awk pipe, then a sync mark. Wake mode (GNU tail): a ``tail -F -n0``
# doorbell (inotify) rings a pipe the reader blocks on, plus a ticker every
# heartbeat; offsets never come from tail. Poll mode: a stat every ``poll`` s.
# Under bash, naps are ``read -t`` on the channel's stdin (fd 9) while it is open: no fork. Its EOF
# never ends the follower (asyncssh's stdin=DEVNULL sends one a round trip after the exec, which a fast
# host's loop sees after it started: every follower ended there, #25): naps become sleeps, and a
# hang-up ends the follower at its next write (SIGPIPE). The log's size and inode are
# taken *before* the funnel reads it, so following from that offset can only
# repeat lines (merged by pos), never miss one.
_FUNCS = remote.load("follow_funcs.sh")
_LOOP = remote.load("follow_loop.sh")
_PRE = remote.load("follow_pre.sh")

_AWK = remote.load("follow.awk")

_FOLLOW = remote.load("follow_main.sh")


@dataclass
class FollowSpec:
    """What the follower watches for and how often it looks (defaults: ~0.2 s latency, <1 % CPU)."""

    funnel: funnel_mod.FunnelSpec  # the snapshot, and the keyword/run-start/tag EREs
    waiting: str = ""  # ERE: a wait/health-check loop line
    ready: str = ""  # ERE: the service is up
    process: str | None = None  # pgrep -f pattern of the serving process; None: not checked
    session: str = ""  # identifies this watch's followers on the host (to end stale ones)
    kill: list[int] = field(default_factory=list)  # pids of this session's earlier followers
    mode: str = "auto"  # auto: wake on inotify (GNU tail) where possible; poll: stat every `poll` s
    shell: str = "auto"  # auto: bash when present (fork-free naps); sh: plain POSIX sh + sleep
    poll: float = 0.2  # seconds between stats in poll mode; minimum gap between steps in wake mode
    # wake mode under bash 5: the gap is a budget of this many reads, refilled one per `poll` (a failure
    # right after a routine line is read at once; a log writing faster is read once a poll, as before)
    burst_reads: int = 2
    heartbeat: float = 2.0  # seconds between heartbeat records
    context_lines: int = 400  # lines of a process kept after its error line
    batch_lines: int = 2000  # error-shaped lines per burst before a marker says "more"
    tail_lines: int = 20  # last lines of every burst, so the analyzer sees where the log is
    chunk_bytes: int = 1024 * 1024  # bytes read per step (a burst is read in steps)
    skip_bytes: int = 64 * 1024 * 1024  # a bigger jump is skipped with a marker, as the funnel caps its scan
    # A journal or docker stream is followed with ``journalctl -f -n N`` / ``docker logs -f --tail N``: the
    # N lines overlap the snapshot's end, and the awk drops that overlap, so the lines written between the
    # snapshot and the follow's start (up to N) are not lost. Positions go on from the snapshot's size.
    stream_lines: int = 100
    # A ``command`` source is read once (its output is the log) unless it streams under FLEETDIAG_FOLLOW
    # (``streams``): the follower then does not run it again, it only keeps the heartbeat.
    once: bool = False


def streams(command: str) -> bool:
    """Whether a ``command`` source opts into being followed: it reads ``$FLEETDIAG_FOLLOW`` (set for
    the follower's run), so it can print its log once for the snapshot and stream it for watch. Any other
    command's output is the log, read once: running ``cat train.log`` again would read the log twice."""
    return "FLEETDIAG_FOLLOW" in command


def build_script(spec: FollowSpec, mark: str) -> str:
    """The whole exec: follower settings, pre-stat, the probe funnel, the follow loop."""
    fs = spec.funnel
    env = {
        "FW_MARK": mark,
        "FW_ID": spec.session,
        # the payload's first characters: a follower of this session carries them in its cmdline
        "FW_IDTAG": remote.encoded_prefix(_id_line(spec.session)),
        "FW_LOG": fs.log,
        "FW_PROC": spec.process or "",
        "FW_WAIT": spec.waiting,
        "FW_READY": spec.ready,
        "FW_KILL": " ".join(str(int(p)) for p in spec.kill),
        "FW_POLL": _fmt_seconds(spec.poll),
        "FW_POLLUS": max(1, round(spec.poll * 1_000_000)),
        "FW_BURST": max(1, int(spec.burst_reads)),
        "FW_HBN": max(1, round(spec.heartbeat / max(spec.poll, 0.01))),
        "FW_HB": _fmt_seconds(spec.heartbeat),
        "FW_MODE": spec.mode,
        "FW_SHELL": spec.shell,
        "FW_CTX": spec.context_lines,
        "FW_BATCH": spec.batch_lines,
        "FW_TAILN": max(1, spec.tail_lines),
        "FW_CHUNK": spec.chunk_bytes,
        "FW_SKIP": spec.skip_bytes,
        "FW_LNMAX": fs.scan_bytes,
        "FW_SLINES": max(0, int(spec.stream_lines)),
        "FW_ONCE": "1" if spec.once else "",
    }
    # the constants go in as quoted assignments too: nothing is ever spliced into code
    env.update(FW_FUNCS=_FUNCS, FW_LOOP=_LOOP, FW_AWK=remote.awk_lib() + _AWK)
    funnel_script = funnel_mod.build_script(fs, mark)
    head = remote.pad_line(_id_line(spec.session))
    body = remote.script(env, _PRE, "{\n", funnel_script, "} </dev/null\n", _FOLLOW)
    return f"{head}\n{body}"


def _id_line(session: str) -> str:
    return "# fleetdiag follower " + "".join(c for c in session if c.isalnum())


def _fmt_seconds(s: float) -> str:
    return f"{s:.3f}".rstrip("0").rstrip(".") or "1"


# ------------------------------------------------------------------ records


@dataclass
class Tail:
    """One of the last lines of a burst (or a held-back partial line): where the log is now.

    Kept apart from error-shaped lines so a busy healthy log does not fill
    the controller's buffer with routine lines.
    """

    line: Line


@dataclass
class Started:
    """Following began at byte ``pos`` (``lineno``: lines before it, when known)."""

    pos: int
    lineno: int | None


@dataclass
class Sync:
    """End of a burst: everything before byte ``pos`` has been read."""

    pos: int


@dataclass
class Heartbeat:
    now: float  # remote clock
    size: int | None
    mtime: float | None
    inode: int | None
    alive: bool | None  # the serving process; None: not checked or no pgrep
    pos: int


@dataclass
class Reset:
    """The file was truncated, rotated, switched (newest glob match) or appeared: back to 0."""

    reason: str
    inode: int | None
    path: str | None = None


@dataclass
class Gone:
    what: str  # missing | unreadable


@dataclass
class Note:
    text: str


Record = Line | Tail | Started | Sync | Heartbeat | Reset | Gone | Note


def _int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def _float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def parse_record(raw: str) -> Record | None:
    """One output line of the follow loop; None for anything unrecognised."""
    kind, _, rest = raw.partition("\t")
    if kind in ("L", "l"):
        pos, _, rest = rest.partition("\t")
        lno, _, text = rest.partition("\t")
        p = _int(pos)
        if p is None:
            return None
        line = Line(p, text, int(lno) if lno.isdigit() else None)
        return line if kind == "L" else Tail(line)
    if kind == "S":
        p = _int(rest)
        return Sync(p) if p is not None else None
    if kind == "H":
        parts = rest.split("\t")
        if len(parts) < 6:
            return None
        alive = {"1": True, "0": False}.get(parts[4])
        return Heartbeat(
            _float(parts[0]) or 0.0, _int(parts[1]), _float(parts[2]), _int(parts[3]), alive, _int(parts[5]) or 0
        )
    if kind == "A":
        pos, _, lno = rest.partition("\t")
        p = _int(pos)
        return Started(p, _int(lno)) if p is not None else None
    if kind == "R":
        parts = rest.split("\t", 2)
        return Reset(
            parts[0], _int(parts[1]) if len(parts) > 1 else None, parts[2] if len(parts) > 2 and parts[2] else None
        )
    if kind == "G":
        return Gone(rest)
    if kind == "X":
        return Note(rest)
    return None
