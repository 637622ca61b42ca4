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

import shlex
from dataclasses import dataclass, field
from typing import Union

from . import funnel as funnel_mod
from . import remote
from .records import Line

# Shell functions both shells share: the main ``sh`` (pre-stat) and the
# follow loop's shell. Handed over as one quoted constant and ``eval``'d.
_FUNCS = r"""
fw_resolve() {
  fw_f=
  oifs=$IFS; IFS=''
  set -- $FW_LOG
  IFS=$oifs
  for c in "$@"; do
    [ -e "$c" ] || continue
    if [ -z "$fw_f" ] || [ "$c" -nt "$fw_f" ]; then fw_f=$c; fi
  done
  case $fw_f in -*) fw_f=./$fw_f ;; esac
}
fw_stat() {
  fw_size=; fw_mtime=; fw_ino=
  [ -n "$fw_f" ] || return 1
  if [ -n "$fw_nostat" ]; then
    [ -f "$fw_f" ] || return 1
    fw_size=$(wc -c <"$fw_f" 2>/dev/null | tr -d ' ')
    fw_mtime=$(date -r "$fw_f" +%s 2>/dev/null)
    set -- $(ls -di "$fw_f" 2>/dev/null)
    fw_ino=$1
  else
    set -- $(stat -L -c '%s %Y %i' "$fw_f" 2>/dev/null)
    [ $# -eq 3 ] || return 1
    fw_size=$1; fw_mtime=$2; fw_ino=$3
  fi
  [ -n "$fw_size" ]
}
"""

# The follow loop. The *reader* does one step per wake-up: stat the log;
# handle truncation (size < offset), rotation (inode), a newer glob match;
# read only the new bytes into the awk pipe, then a sync mark. What wakes it:
#
# * wake mode (GNU tail present): a *doorbell* ``tail -F -n0`` on the log
#   (inotify; its own in-process polling on NFS) writes into a pipe the reader
#   blocks on, so an idle log costs no process starts at all. Offsets never
#   come from tail: it only rings. A ticker in the same pipe rings every
#   heartbeat, so a missed inotify event costs at most one heartbeat.
# * poll mode (no GNU tail, or forced): a stat every ``poll`` seconds.
#
# Under bash, naps are ``read -t`` on the channel's stdin (fd 9): no fork,
# and an immediate exit when the controller hangs up.
_LOOP = r"""
eval "$FW_FUNCS"
sl=$FW_POLL
if [ -n "$BASH_VERSION" ] && read -r -t 0.01 -u 9 _ 2>/dev/null; [ $? -gt 128 ]; then
  fw_nap() { read -r -t "$1" -u 9 _; [ $? -ne 1 ]; }
  fw_now() { printf -v fw_t '%(%s)T' -1 2>/dev/null || fw_t=$(date +%s); }
else
  sleep "$sl" 2>/dev/null || sl=1
  fw_nap() { sleep "$1"; }
  fw_now() { fw_t=$(date +%s); }
fi
fw_pid=; fw_mypg=
if [ -r "/proc/$FW_SELF/stat" ] && read -r st <"/proc/$FW_SELF/stat"; then set -- $st; fw_mypg=$5; fi
fw_alive() {
  fw_a=-
  [ -n "$FW_PROC" ] || return 0
  fw_a=1
  if [ -n "$fw_pid" ]; then
    if [ -d /proc/1 ]; then [ -d "/proc/$fw_pid" ] && return 0; else kill -0 "$fw_pid" 2>/dev/null && return 0; fi
  fi
  fw_pid=; fw_a='?'
  command -v pgrep >/dev/null 2>&1 || return 0
  fw_a=0
  for p in $(pgrep -f -- "$FW_PROC" 2>/dev/null); do
    [ "$p" = "$FW_SELF" ] && continue
    if [ -n "$fw_mypg" ] && [ -r "/proc/$p/stat" ]; then  # our own doorbell tail names the log path
      read -r st <"/proc/$p/stat" 2>/dev/null && set -- $st && [ "$5" = "$fw_mypg" ] && continue
    fi
    if [ -r "/proc/$p/cmdline" ] && tr '\000' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -e 'FW_PROC=' -e 'FD_MARK=' -e fleetdiag-remote; then continue; fi
    fw_a=1; fw_pid=$p; return 0
  done
}
fw_glob=
case $FW_LOG in *'*'*|*'?'*|*'['*) fw_glob=1 ;; esac
fw_beat() {
  if [ -n "$fw_glob" ] && [ -z "$gone" ]; then
    fw_resolve
    [ -n "$fw_f" ] && [ "$fw_f" != "$f" ] && sw=1
  fi
  fw_alive
  fw_now
  echo "$FW_MARK h $fw_t ${fw_size:--} ${fw_mtime:--} ${fw_ino:--} $fw_a"
}
fw_step() {
  more=
  if [ -n "$gone" ] || [ -n "$sw" ]; then fw_resolve; else fw_f=$f; fi
  if fw_stat; then
    why=
    if [ -z "$f" ]; then why=appeared
    elif [ "$fw_f" != "$f" ]; then why=switched
    elif [ "$fw_ino" != "$ino" ]; then why=rotated
    fi
    gone=; sw=
    if [ -n "$why" ]; then
      printf '%s r %s %s %s\n' "$FW_MARK" "$why" "$fw_ino" "$(printf '%s' "$fw_f" | tr '\n\t' '??')"
      off=0; ino=$fw_ino; f=$fw_f
    elif [ "$fw_size" -lt "$off" ]; then
      echo "$FW_MARK r truncated $fw_ino"
      off=0
    fi
    if [ "$fw_size" -gt "$off" ]; then
      if [ ! -r "$f" ]; then
        [ -n "$unr" ] || echo "$FW_MARK g unreadable"
        unr=1
      else
        unr=
        d=$((fw_size - off))
        if [ "$d" -gt "$FW_SKIP" ]; then
          off=$((fw_size - FW_SKIP)); d=$FW_SKIP
          echo "$FW_MARK k $off"
        fi
        [ "$d" -gt "$FW_CHUNK" ] && d=$FW_CHUNK
        tail -c "+$((off + 1))" "$f" 2>/dev/null | head -c "$d" | tr '\000' ' '
        off=$((off + d))
        echo "$FW_MARK s"
        [ "$off" -lt "$fw_size" ] && more=1
      fi
    fi
  elif [ -z "$gone" ]; then
    echo "$FW_MARK g missing"; gone=1
  fi
  return 0
}
fw_ring() {
  t=
  fw_bell() {
    [ -n "$t" ] && kill "$t" 2>/dev/null
    t=
    tail -F -n 0 -s "$sl" --pid="$FW_SELF" -- "$1" 2>/dev/null &
    t=$!
  }
  trap '[ -n "$t" ] && kill "$t" 2>/dev/null; exit 0' PIPE TERM HUP INT
  cur=$fw_f
  if [ -z "$cur" ] && [ -z "$fw_glob" ]; then cur=$FW_LOG; fi
  [ -n "$cur" ] && fw_bell "$cur"
  while :; do
    echo "$FW_MARK h"
    fw_nap "$FW_HB" || break
    if [ -n "$fw_glob" ]; then
      fw_resolve
      if [ -n "$fw_f" ] && [ "$fw_f" != "$cur" ]; then cur=$fw_f; fw_bell "$cur"; echo "$FW_MARK w"; fi
    fi
  done
  [ -n "$t" ] && kill "$t" 2>/dev/null
}
fw_read() {
  f=$fw_f; off=$fw_off0; ino=$fw_ino0; gone=; sw=; unr=
  ln=-
  if [ -n "$f" ] && [ "$off" -le "$FW_LNMAX" ]; then
    ln=$(head -c "$off" "$f" 2>/dev/null | wc -l | tr -d ' ')
  fi
  echo "$FW_MARK a $off $ln"
  [ -n "$f" ] || { echo "$FW_MARK g missing"; gone=1; }
  if [ "$1" = wake ]; then
    while w=$(dd bs=65536 count=1 2>/dev/null; echo .); [ "$w" != . ]; do
      case $w in *"$FW_MARK w"*) sw=1 ;; esac
      fw_step
      while [ -n "$more" ]; do fw_step; done
      case $w in *"$FW_MARK h"*) fw_beat ;; esac
      fw_nap "$sl" || exit 0
    done
  else
    n=$FW_HBN
    while :; do
      fw_step
      [ -n "$more" ] && continue
      n=$((n + 1))
      if [ "$n" -ge "$FW_HBN" ]; then n=0; fw_beat; fi
      fw_nap "$sl" || exit 0
    done
  fi
}
fw_mode=poll
if [ "$FW_MODE" != poll ] && tail --version 2>/dev/null | grep -q GNU; then fw_mode=wake; fi
if [ "$fw_mode" = wake ]; then
  fw_ring | fw_read wake
else
  fw_read poll
fi
"""

# The main script around the funnel. The log's size and inode are taken
# *before* the funnel reads it, so following from that offset can only repeat
# lines (merged by pos), never miss one. The funnel (and its facts) read
# /dev/null, not the channel: only the follow loop waits on stdin.
_PRE = r"""
LC_ALL=C; export LC_ALL
eval "$FW_FUNCS"
fw_nostat=
stat -L -c '%s' / >/dev/null 2>&1 || fw_nostat=1
fw_resolve
fw_off0=0; fw_ino0=
if fw_stat; then fw_off0=$fw_size; fw_ino0=$fw_ino; fi
FW_SELF=$$
export fw_nostat fw_f fw_off0 fw_ino0 FW_SELF
"""

_AWK = r"""
  function clip(s,  h) { if (length(s) <= ML) return s
    h = int(ML / 2); return substr(s, 1, h) "...[fleetdiag: " (length(s) - 2 * h) " bytes cut]..." substr(s, length(s) - h + 1) }
  function num(v) { return sprintf("%.0f", v) }
  function emit(p, n, t) { buf = buf "L\t" num(p) "\t" n "\t" t "\n" }
  function emit_tail(p, n, t) { buf = buf "l\t" num(p) "\t" n "\t" t "\n" }
  function batch_end(force,   k, s, j) {
    if (!force && nr == 0 && buf == "" && dropped == 0) return
    s = (nr > TN) ? nr - TN : 0
    for (k = s; k < nr; k++) { j = k % TN; if (!rk[j]) emit_tail(rp[j], rn[j], rt[j]) }
    if (dropped > 0) buf = buf "X\tfollow: " dropped " more error-shaped lines in one burst not shown\n"
    printf "%sS\t%.0f\n", buf, pos; fflush()
    buf = ""; nb = 0; nr = 0; dropped = 0; seenw = 0; seenr = 0; split("", rk)
  }
  function show_partial(   t) { if (pend != "") { t = pend; sub(/\r$/, "", t); emit_tail(pos, (ln >= 0) ? ln + 1 : "-", clip(t)) } }
  function line(t,   p, n, tagged, g, keep, j) {
    p = pos; pos += length(t) + 1
    if (ln >= 0) { ln++; n = ln } else n = "-"
    sub(/\r$/, "", t); t = clip(t)
    keep = 0
    if (rs != "" && t ~ rs) { split("", ctx); prevk = 0; keep = 1 }
    tagged = (tg != "" && match(t, tg)); g = tagged ? substr(t, RSTART, RLENGTH) : ""
    if (kw != "" && t ~ kw) { keep = 1; if (ctx[g] + 0 <= 0) ctx[g] = C }
    else if (ctx[g] + 0 > 0) keep = 1
    else if (!tagged && prevk) keep = 1
    if (keep && ctx[g] + 0 > 0) ctx[g]--
    prevk = keep
    if (!keep && wt != "" && !seenw && t ~ wt) { keep = 1; seenw = 1 }
    if (!keep && rd != "" && !seenr && t ~ rd) { keep = 1; seenr = 1 }
    if (keep) { if (nb < B) { emit(p, n, t); nb++ } else { dropped++; keep = 0 } }
    j = nr % TN; rp[j] = p; rn[j] = n; rt[j] = t; rk[j] = keep; nr++
  }
  function control(c,   a) {
    split(c, a, " ")
    if (a[1] == "s") { batch_end(1); return }
    if (a[1] == "h") { show_partial(); batch_end(0); printf "H\t%s\t%s\t%s\t%s\t%s\t%.0f\n", a[2], a[3], a[4], a[5], a[6], pos; fflush(); return }
    if (a[1] == "a") { pos = a[2] + 0; ln = (a[3] == "-") ? -1 : a[3] + 0; pend = ""; printf "A\t%s\t%s\n", a[2], a[3]; fflush(); return }
    if (a[1] == "r") { show_partial(); batch_end(0); pend = ""; split("", ctx); prevk = 0; pos = 0; ln = 0
      printf "R\t%s\t%s\t%s\n", a[2], a[3], substr(c, length(a[1] a[2] a[3]) + 4); fflush(); return }
    if (a[1] == "k") { batch_end(0); pend = ""; pos = a[2] + 0; ln = -1
      printf "X\tfollow: the log grew by more than %s bytes at once: skipped to byte %.0f\n", SK, pos; fflush(); return }
    if (a[1] == "g") { batch_end(0); printf "G\t%s\n", a[2]; fflush(); return }
  }
  BEGIN { MK = ENVIRON["FW_MARK"] " "; kw = ENVIRON["FD_KW"]; rs = ENVIRON["FD_RS"]; tg = ENVIRON["FD_TAGS"]
    wt = ENVIRON["FW_WAIT"]; rd = ENVIRON["FW_READY"]; ML = ENVIRON["FD_MAXLINE"] + 0; C = ENVIRON["FW_CTX"] + 0
    B = ENVIRON["FW_BATCH"] + 0; TN = ENVIRON["FW_TAILN"] + 0; SK = ENVIRON["FW_SKIP"]; pos = 0; ln = -1; pend = ""; buf = "" }
  {
    i = index($0, MK)
    if (i > 0) { pend = pend substr($0, 1, i - 1); control(substr($0, i + length(MK))); next }
    t = pend $0; pend = ""
    line(t)
  }
"""

# After the funnel's end marker: end this session's stale followers, then
# the loop piped into one awk (interactive where mawk needs it to not buffer).
_FOLLOW = r"""
renice -n 19 -p $$ >/dev/null 2>&1
ionice -c3 -p $$ >/dev/null 2>&1
for p in $FW_KILL; do
  if [ -r "/proc/$p/cmdline" ] && tr '\000' ' ' <"/proc/$p/cmdline" | grep -q -e "$FW_IDTAG"; then
    kill -s TERM -- "-$p" 2>/dev/null || kill -s TERM "$p" 2>/dev/null
  fi
done
fw_sh=sh
[ "$FW_SHELL" != sh ] && command -v bash >/dev/null 2>&1 && fw_sh=bash
fw_ai=
awk -W interactive 'BEGIN { }' </dev/null >/dev/null 2>&1 && fw_ai='-W interactive'
exec 9<&0
"$fw_sh" -c "$FW_LOOP" 2>/dev/null | awk $fw_ai "$FW_AWK"
"""


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
    heartbeat: float = 2.0  # seconds between heartbeat records
    context_lines: int = 400  # lines of a process kept after its error line
    batch_lines: int = 2000  # error-shaped lines per burst before a marker says "more"
    tail_lines: int = 20  # last lines of every burst, so the analyzer sees where the log is
    chunk_bytes: int = 1024 * 1024  # bytes read per step (a burst is read in steps)
    skip_bytes: int = 64 * 1024 * 1024  # a bigger jump is skipped with a marker, as the funnel caps its scan


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
    }
    # the constants go in as quoted assignments too: nothing is ever spliced into code
    env.update(FW_FUNCS=_FUNCS, FW_LOOP=_LOOP, FW_AWK=_AWK)
    assigns = "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
    exports = "export " + " ".join(env)
    funnel_script = funnel_mod.build_script(fs, mark)
    head = remote.pad_line(_id_line(spec.session))
    return f"{head}\n{assigns}\n{exports}\n{_PRE}\n{{\n{funnel_script}\n}} </dev/null\n{_FOLLOW}"


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


Record = Union[Line, Tail, Started, Sync, Heartbeat, Reset, Gone, Note]


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
        return Heartbeat(_float(parts[0]) or 0.0, _int(parts[1]), _float(parts[2]), _int(parts[3]), alive,
                         _int(parts[5]) or 0)
    if kind == "A":
        pos, _, lno = rest.partition("\t")
        p = _int(pos)
        return Started(p, _int(lno)) if p is not None else None
    if kind == "R":
        parts = rest.split("\t", 2)
        return Reset(parts[0], _int(parts[1]) if len(parts) > 1 else None,
                     parts[2] if len(parts) > 2 and parts[2] else None)
    if kind == "G":
        return Gone(rest)
    if kind == "X":
        return Note(rest)
    return None
