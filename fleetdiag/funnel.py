"""The staged narrowing funnel, as one POSIX sh script that runs where the log is.

The seeds' manual funnel is four ssh calls: ``tail -40``, a keyword grep, a
worker grep, a PID-targeted grep. Here the four stages run in one script, so
a host costs one exec round trip, and each stage computes what the next one
needs on the remote side:

1. tail: the last lines of the log, with its size, mtime and inode.
2. keyword grep: error-shaped lines of the latest run (one ``grep -E`` pass
   over the last ``scan_bytes`` of the file, cut at the last run-start banner).
3. worker grep: the process tags that own those lines, earliest first.
4. tag-targeted grep: for the earliest failing tags, every line of theirs
   (and their unprefixed continuation lines) from their first error on, so
   the whole traceback and its final exception line arrive.

The script only reads: no temp files, ``renice``/``ionice -c3`` on itself,
``timeout`` around each pass where available. Every value from the inventory
reaches it as a single-quoted shell assignment. Nothing is cut silently:
caps are in bytes and leave a marker line, and over-long lines keep both ends.
"""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
from dataclasses import dataclass, field

from . import remote
from .records import FunnelResult, Line

VERSION = 1


@dataclass
class FunnelSpec:
    """What to look for and how much to bring back (all caps are visible)."""

    log: str  # path or glob; the newest match wins
    keywords: str  # one ERE: error-shaped lines
    run_start: str  # one ERE: a new run's start banner
    tags: str  # one ERE: a leading process tag
    tail_lines: int = 80
    tail_bytes: int = 32 * 1024
    scan_bytes: int = 64 * 1024 * 1024
    max_line: int = 4096
    hits_head: int = 400
    hits_tail: int = 200
    hit_bytes: int = 192 * 1024
    ntags: int = 6
    window_bytes: int = 1024 * 1024
    context_lines: int = 400
    timeout: int = 30  # seconds, per pass, on the remote side
    extra: str = ""  # more script (facts), appended before the end marker
    extra_vars: dict[str, str] = field(default_factory=dict)


# The script body. Values arrive as shell variables set above it; awk reads
# regexes through ENVIRON so no escape processing touches them.
_BODY = r"""
LC_ALL=C; export LC_ALL
renice -n 19 -p $$ >/dev/null 2>&1
ionice -c3 -p $$ >/dev/null 2>&1
TO=
if command -v timeout >/dev/null 2>&1; then
  if timeout -k 1 1 true >/dev/null 2>&1; then TO="timeout -k 2 $FD_TMO"; else TO="timeout $FD_TMO"; fi
fi
T=$(printf '\t')
echo "$FD_MARK begin $FD_VERSION"
m() { printf 'M\t%s\t%s\n' "$1" "$2"; }
x() { printf 'X\t%s\n' "$1"; }
hex() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; }
secs() { date +%s; }
# A pass that ran into the remote time limit says so (timeout cut it short).
late() { [ -n "$TO" ] && [ $(( $(secs) - $1 )) -ge "$FD_TMO" ] && x "$2: stopped by the ${FD_TMO}s remote time limit, so it may be incomplete"; }
# The pinned log from byte $1 on. busybox tail takes no offset past 2 GiB: dd seeks there.
fd_nl() { if [ -n "$fd_cr" ]; then tr '\r' '\n'; else cat; fi; }
fd_from() {
  if [ "$1" -lt 2147483647 ]; then $TO tail -c "+$(( $1 + 1 ))" "$r"
  else $TO dd if="$r" bs=65536 skip=$(( $1 / 65536 )) 2>/dev/null | tail -c "+$(( $1 % 65536 + 1 ))"; fi
}
m now "$(secs)"
m pid $$
m tools "$(command -v timeout >/dev/null 2>&1 && echo timeout) $(command -v ionice >/dev/null 2>&1 && echo ionice)"
m nice "$(nice 2>/dev/null)"
m ioclass "$(ionice -p $$ 2>/dev/null)"
# Why a path cannot be seen: the first existing parent that is not searchable.
fd_why() {
  d=$1
  while :; do
    case $d in */*) d=${d%/*} ;; *) return 1 ;; esac
    [ -n "$d" ] || return 1
    if [ -e "$d" ]; then
      if [ -d "$d" ] && ! [ -x "$d" ]; then m deniedhex "$(hex "$d")"; return 0; fi
      return 1
    fi
  done
}
fd_log() {
  f=
  oifs=$IFS; IFS=''
  set -- $FD_LOG
  IFS=$oifs
  for c in "$@"; do
    [ -e "$c" ] || continue
    if [ -z "$f" ] || [ "$c" -nt "$f" ]; then f=$c; fi
  done
  if [ -z "$f" ]; then
    m pathhex "$(hex "$FD_LOG")"
    if fd_why "$FD_LOG"; then m status unreadable; return; fi
    case $FD_LOG in
      *'*'*|*'?'*|*'['*) m status no-match ;;
      *) m status missing ;;
    esac
    return
  fi
  m pathhex "$(hex "$f")"
  case $f in -*) f=./$f ;; esac
  if [ -d "$f" ]; then m status unreadable; m reason "is a directory"; return; fi
  if ! [ -f "$f" ]; then m status unreadable; m reason "not a regular file (FIFO, socket or device): not read, it could block"; return; fi
  if ! [ -r "$f" ]; then m status unreadable; m reason "permission denied"; return; fi
  if ! $TO head -c 1 "$f" >/dev/null 2>&1; then m status unreadable; m reason "read error"; return; fi
  # Pin the file: every pass reads the inode opened here, so a rotation
  # (rename + new file) between passes cannot mix two files.
  r=$f; pinned=
  if { command exec 3<"$f"; } 2>/dev/null; then
    pinned=1
    [ -d /proc/self/fd ] && [ -r /dev/fd/3 ] && r=/dev/fd/3
  fi
  st=$(stat -L -c '%s %Y %i' "$r" 2>/dev/null)
  ino=
  if [ -n "$st" ]; then
    set -- $st; size=$1; ino=$3; m mtime "$2"; m inode "$3"
  else
    size=$(wc -c <"$r" | tr -d ' ')
    mt=$(date -r "$f" +%s 2>/dev/null) && m mtime "$mt"
  fi
  m size "$size"
  if [ "$size" -eq 0 ]; then m status empty; fd_close; return; fi
  # Binary (a .gz a glob caught, a core file): control bytes beyond tab, newline, CR and ESC
  # in the last 8 KB. NUL padding after a crash is not held against a text log.
  samp=$($TO tail -c 8192 "$r" | tr -d '\000' | wc -c | tr -d ' ')
  ctl=$($TO tail -c 8192 "$r" | tr -d '\000\011\012\015\033\040-\176\200-\377' | wc -c | tr -d ' ')
  if [ "$samp" -eq 0 ]; then m status binary; m reason "its last 8 KB are all NUL bytes"; fd_close; return; fi
  if [ $((ctl * 20)) -gt "$samp" ]; then m status binary; m reason "$ctl control bytes in the last $samp"; fd_close; return; fi
  m status ok
  # CR-only line ends (old Mac style, some progress writers): read CR as the line end, byte for byte.
  fd_cr=
  if [ "$($TO tail -c 8192 "$r" | tr -cd '\n' | wc -c | tr -d ' ')" -eq 0 ] &&
     [ "$($TO tail -c 8192 "$r" | tr -cd '\r' | wc -c | tr -d ' ')" -gt 0 ]; then
    fd_cr=1; m note "the log ends its lines with CR only: CR read as the line end"
  fi
  start=0
  if [ "$size" -gt "$FD_SCAN" ]; then start=$((size - FD_SCAN)); fi
  m window "$start"
  # A line that starts before the window and runs on past FD_MAXLINE bytes into it: its start,
  # where an error message would be, was not searched. Say so rather than pass as healthy.
  if [ "$start" -gt 0 ] && [ "$(fd_from "$start" | head -c "$FD_MAXLINE" | fd_nl | tr -cd '\n' | wc -c | tr -d ' ')" -eq 0 ]; then
    x "the scan window (last $FD_SCAN bytes) starts inside a line longer than $FD_MAXLINE bytes: the part of it before the window was not searched"
  fi
  if printf 'x\n' | grep -E -e "$FD_KW" >/dev/null 2>&1; [ $? -gt 1 ]; then
    x "the remote grep rejected the keyword pattern: error lines may be missing"
  fi
  if [ -n "$FD_RS" ] && { printf 'x\n' | grep -E -e "$FD_RS" >/dev/null 2>&1; [ $? -gt 1 ]; }; then
    x "the remote grep rejected the run_start pattern: the latest run may not be found"
  fi
  if printf 'x\n' | grep -a -b -n -E x >/dev/null 2>&1; then
    if [ -n "$FD_RS" ]; then
      fd_grep() { $TO grep -a -n -b -E -e "$FD_KW" -e "$FD_RS"; }
    else
      fd_grep() { $TO grep -a -n -b -E -e "$FD_KW"; }
    fi
  else
    m note "no GNU grep: awk scan"
    fd_grep() { tr '\000' ' ' | $TO awk 'BEGIN{kw=ENVIRON["FD_KW"]; rs=ENVIRON["FD_RS"]; o=0}
      { if ($0 ~ kw || (rs != "" && $0 ~ rs)) print NR ":" sprintf("%.0f", o) ":" $0; o += length($0) + 1 }'; }
  fi
  t0=$(secs)
  p1=$( { if [ "$start" -gt 0 ]; then fd_from "$start"; else $TO cat "$r"; fi; } | fd_nl | fd_grep | tr '\000' ' ' | awk -v start="$start" '
    function n(v) { return sprintf("%.0f", v) }
    function clip(s,  h) { if (length(s) <= ML) return s
      h = int(ML / 2); return substr(s, 1, h) "...[fleetdiag: " (length(s) - 2 * h) " bytes cut]..." substr(s, length(s) - h + 1) }
    function reset() { nh = 0; nr = 0; hb = 0; dropped = 0; nt = 0; split("", first); split("", firstln); split("", order); split("", ring) }
    BEGIN { kw = ENVIRON["FD_KW"]; rs = ENVIRON["FD_RS"]; tg = ENVIRON["FD_TAGS"]; ML = ENVIRON["FD_MAXLINE"] + 0
      H1 = ENVIRON["FD_H1"] + 0; H2 = ENVIRON["FD_H2"] + 0; HB = ENVIRON["FD_HB"] + 0; runpos = -1; reset() }
    {
      i = index($0, ":"); ln = substr($0, 1, i - 1); r = substr($0, i + 1)
      j = index(r, ":"); off = substr(r, 1, j - 1); t = substr(r, j + 1)
      if (start > 0 && ln == 1) { if (t ~ kw) cutkw = 1; next }
      pos = start + off; sub(/\r$/, "", t)
      if (rs != "" && t ~ rs) { reset(); runpos = pos; runln = ln }
      lno = (start > 0) ? "-" : ln
      rec = n(pos) "\t" lno "\t" clip(t)
      if (nh < H1 && hb + length(rec) <= HB) { head[nh++] = rec; hb += length(rec) }
      else { if (nr >= H2) dropped++; ring[nr % H2] = rec; nr++ }
      if (tg != "" && t ~ kw && match(t, tg)) { g = substr(t, RSTART, RLENGTH)
        if (!(g in first)) { first[g] = pos; firstln[g] = lno; order[nt++] = g } }
      else if (t ~ /Traceback \(most recent call last\)/ && !("" in first)) { first[""] = pos; firstln[""] = lno; order[nt++] = "" }
    }
    END {
      if (cutkw) print "X\tthe scan window starts inside an error-shaped line: its start was not searched"
      if (runpos >= 0) printf "M\trun_start\t%s\n", n(runpos)
      print "S\thits"
      for (k = 0; k < nh; k++) print "L\t" head[k]
      if (dropped > 0) printf "X\tkeyword hits: %d lines between the first %d and the last %d not shown\n", dropped, nh, H2
      s = (nr > H2) ? nr - H2 : 0
      for (k = s; k < nr; k++) print "L\t" ring[k % H2]
      for (k = 0; k < nt; k++) printf "T\t%s\t%s\t%s\n", n(first[order[k]]), firstln[order[k]], order[k]
    }')
  printf '%s\n' "$p1"
  late "$t0" "keyword pass"
  rp=$(printf '%s\n' "$p1" | awk -F "$T" '$1 == "M" && $2 == "run_start" { print $3 }')
  [ -n "$rp" ] || rp=0
  echo "S${T}tail"
  tb=$FD_TB; [ "$size" -lt "$tb" ] && tb=$size
  t0=$(secs)
  $TO tail -c "$tb" "$r" | fd_nl | tr '\000' ' ' | awk -v base=$((size - tb)) -v rp="$rp" '
    function n(v) { return sprintf("%.0f", v) }
    BEGIN { N = ENVIRON["FD_TL"] + 0; ML = ENVIRON["FD_MAXLINE"] + 0; pos = base; k = 0 }
    { p = pos; pos += length($0) + 1
      if (base > 0 && NR == 1) next
      if (p < rp) next
      t = $0; sub(/\r$/, "", t)
      if (length(t) > ML) { h = int(ML / 2); t = substr(t, 1, h) "...[fleetdiag: " (length(t) - 2 * h) " bytes cut]..." substr(t, length(t) - h + 1) }
      lno = (base == 0) ? NR : "-"
      buf[k % N] = n(p) "\t" lno "\t" t; k++ }
    END { s = (k > N) ? k - N : 0
      if (s > 0) printf "X\ttail: last %d lines shown\n", N
      for (i = s; i < k; i++) print "L\t" buf[i % N] }'
  late "$t0" "tail pass"
  printf '%s\n' "$p1" | awk -F "$T" '$1 == "T"' | head -n "$FD_NTAGS" | while IFS="$T" read -r kind apos aln atag; do
    echo "S${T}ctx${T}$atag"
    t0=$(secs)
    fd_from "$apos" | head -c "$FD_WIN" | fd_nl | tr '\000' ' ' | FD_TAG="$atag" awk -v apos="$apos" -v aln="$aln" '
      function n(v) { return sprintf("%.0f", v) }
      BEGIN { tag = ENVIRON["FD_TAG"]; tg = ENVIRON["FD_TAGS"]; ML = ENVIRON["FD_MAXLINE"] + 0
        W = ENVIRON["FD_WIN"] + 0; C = ENVIRON["FD_CTX"] + 0; pos = apos; k = 0; prev = 0 }
      { p = pos; pos += length($0) + 1
        if (pos - apos > W) { if (k < C) printf "X\tcontext for %s: stopped at the %d-byte window\n", (tag == "" ? "untagged lines" : tag), W; exit }
        t = $0; sub(/\r$/, "", t)
        tagged = (tg != "" && match(t, tg))
        if (tag == "") keep = !tagged
        else keep = (tagged && substr(t, RSTART, RLENGTH) == tag) || (!tagged && prev)
        prev = keep
        if (!keep) next
        if (k >= C) { printf "X\tcontext for %s: first %d lines shown\n", (tag == "" ? "untagged lines" : tag), C; exit }
        if (length(t) > ML) { h = int(ML / 2); t = substr(t, 1, h) "...[fleetdiag: " (length(t) - 2 * h) " bytes cut]..." substr(t, length(t) - h + 1) }
        lno = (aln == "-") ? "-" : aln + NR - 1
        print "L\t" n(p) "\t" lno "\t" t; k++ }'
    late "$t0" "context pass for ${atag:-untagged lines}"
  done
  fd_changed
  fd_close
}
# The log changed under us? Compare the name's inode and the opened file's size with the start.
fd_changed() {
  now=$(stat -L -c '%s %i' "$f" 2>/dev/null)
  if [ -z "$now" ]; then
    [ -e "$f" ] || x "the log was removed or renamed while it was read: shown as it was when opened"
    return
  fi
  set -- $now
  if [ -n "$ino" ] && [ "$2" != "$ino" ]; then
    if [ "$r" = /dev/fd/3 ]; then x "the log was rotated while it was read: shown as it was when opened (the new file has $1 bytes)"
    else x "the log was rotated while it was read: later passes read the new file, lines may mix both"; fi
    return
  fi
  cur=$(stat -L -c '%s' "$r" 2>/dev/null)
  if [ -n "$cur" ] && [ "$cur" -lt "$size" ]; then x "the log was truncated while it was read ($size -> $cur bytes): later passes saw less of it"; fi
}
fd_close() { if [ -n "$pinned" ]; then exec 3<&-; pinned=; fi; r=$f; }
fd_log
"""

_END = r"""
echo "$FD_MARK end"
"""


def _q(value: object) -> str:
    return shlex.quote(str(value))


def build_script(spec: FunnelSpec, mark: str) -> str:
    """The complete script: quoted assignments, then the fixed body."""
    env = {
        "FD_MARK": mark,
        "FD_VERSION": VERSION,
        "FD_LOG": spec.log,
        "FD_KW": spec.keywords,
        "FD_RS": spec.run_start,
        "FD_TAGS": spec.tags,
        "FD_TL": spec.tail_lines,
        "FD_TB": spec.tail_bytes,
        "FD_SCAN": spec.scan_bytes,
        "FD_MAXLINE": spec.max_line,
        "FD_H1": spec.hits_head,
        "FD_H2": spec.hits_tail,
        "FD_HB": spec.hit_bytes,
        "FD_NTAGS": spec.ntags,
        "FD_WIN": spec.window_bytes,
        "FD_CTX": spec.context_lines,
        "FD_TMO": spec.timeout,
        **spec.extra_vars,
    }
    assigns = "\n".join(f"{k}={_q(v)}" for k, v in env.items())
    exports = "export " + " ".join(env)
    return f"{assigns}\n{exports}\n{_BODY}{spec.extra}{_END}"


def new_mark() -> str:
    return "@@FD:" + secrets.token_hex(6)


def remote_command(script: str) -> str:
    """The exec request: a fixed, value-free wrapper safe under every login shell (csh and fish
    too), with the script as base64 data that only ``sh`` decodes. See ``fleetdiag.remote``."""
    return remote.remote_command(script)


_LINE_SPLIT = re.compile("\t")
CUT = "funnel output ended early (timeout or connection cut): what arrived is shown"


def parse_output(out: str, mark: str) -> FunnelResult:
    """Turn the script's tagged lines into a FunnelResult.

    Anything before the begin marker (a login banner, a chatty ``.bashrc``)
    is ignored. A missing end marker means the output was cut short, and says so.
    """
    res = FunnelResult(payload_bytes=len(out.encode("utf-8", "surrogateescape")))
    begin = out.find(mark + " begin")
    if begin < 0:
        res.status = "error"
        if not out.strip():
            res.markers.append("the remote command printed nothing")
        else:
            res.markers.append("the remote shell did not run the funnel (is sh and awk on the login PATH?)")
            res.facts["reason"] = "it printed: " + _first_words(out)
        return res
    body = out[begin:].split("\n")
    if not out.endswith("\n") and len(body) > 1 and not body[-1].startswith(mark):
        body.pop()  # cut mid-line (timeout, dropped connection): never analyse half a record
        res.markers.append("the last line arrived cut and was dropped")
    section = ""
    target: list[Line] = res.hits
    ended = False
    for raw in body[1:]:
        if raw.startswith(mark):
            if raw == mark + " end":
                ended = True
                break  # anything after the end (a logout script's chatter) is not ours
            continue
        kind, _, rest = raw.partition("\t")
        if kind == "L":
            pos, _, rest = rest.partition("\t")
            lno, _, text = rest.partition("\t")
            try:
                ln = Line(int(pos), text, int(lno) if lno.isdigit() else None)
            except ValueError:
                continue
            target.append(ln)
        elif kind == "S":
            section = rest
            if section == "tail":
                target = res.tail
            elif section == "hits":
                target = res.hits
            else:
                target = res.context
        elif kind == "M":
            key, _, value = rest.partition("\t")
            _meta(res, key, value)
        elif kind == "T":
            parts = rest.split("\t", 2)
            if len(parts) == 3:
                res.tags.append(parts[2])
        elif kind == "X":
            res.markers.append(rest)
        elif kind == "F":
            key, _, value = rest.partition("\t")
            res.facts.setdefault("raw", {}).setdefault(key, []).append(value)
    if not ended:
        res.markers.append(CUT)
    return res


def _meta(res: FunnelResult, key: str, value: str) -> None:
    ints = {"size": "size", "inode": "inode", "window": "window_start", "run_start": "run_start"}
    if key in ints:
        try:
            setattr(res, ints[key], int(value))
        except ValueError:
            pass
    elif key in ("mtime", "now"):
        try:
            setattr(res, key, float(value))
        except ValueError:
            pass
    elif key == "status":
        res.status = value
    elif key == "pathhex":
        try:
            res.path = bytes.fromhex(value).decode("utf-8", "backslashreplace")
        except ValueError:
            res.path = None
    elif key == "reason":
        res.facts["reason"] = value
    elif key == "deniedhex":
        try:
            where = bytes.fromhex(value).decode("utf-8", "backslashreplace")
        except ValueError:
            where = "a parent directory"
        res.facts["reason"] = f"permission denied: cannot enter {where}"
    elif key == "note":
        res.markers.append(value)
    else:
        res.facts.setdefault("remote", {})[key] = value


def shell_failure(stderr: bytes, status: int | None) -> str:
    """Why the remote shell did not run the funnel, from its exit status and stderr."""
    said = _first_words(stderr.decode("utf-8", "replace"))
    hint = {127: "sh not found", 126: "sh not executable"}.get(status or 0, "")
    bits = [b for b in (f"exit status {status}" if status is not None else "", hint, said) if b]
    return ": ".join(bits) if bits else "no output and no error message"


def _first_words(out: str) -> str:
    text = " ".join(out.split())
    return text[:200]


def run_local(spec: FunnelSpec, timeout: float | None = None) -> FunnelResult:
    """Run the same script through the local ``sh``: ``fleetdiag analyze`` uses grep speed too."""
    mark = new_mark()
    script = build_script(spec, mark)
    proc = subprocess.run(
        ["sh", "-c", script],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )
    out = proc.stdout.decode("utf-8", "replace")
    return parse_output(out, mark)
