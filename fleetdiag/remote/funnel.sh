# shellcheck shell=sh disable=SC2016,SC2034,SC2086,SC3013
# SC2016: awk programs are single-quoted on purpose
# SC2034: read by the part that runs after this one, or a placeholder
# SC2086: $TO/$FTO and stat fields are split on purpose
# SC3013: test -nt works in dash, bash, zsh and busybox ash
# The funnel: see fleetdiag/remote/funnel.py. Values arrive as exported FD_* variables.

TO=; TOC=
if command -v timeout >/dev/null 2>&1; then
  if timeout -k 1 1 true >/dev/null 2>&1; then TO="timeout -k 2 $FD_TMO"; TOC="timeout -k 2 $FD_CTMO"
  else TO="timeout $FD_TMO"; TOC="timeout $FD_CTMO"; fi
fi
T=$(printf '\t')
NL='
'
# Each write the host makes reaches the controller as an SSH packet of its own, and every packet costs it
# CPU: the funnel holds a section's lines in $fd_o (while $fd_hold is set, m and x append there) and
# writes the section at once (fd_w). Nothing that can hang in the kernel (ps, nvidia-smi, a kernel read)
# runs while lines are held: those parts come after the funnel's last write.
fd_o=; fd_hold=
m() { if [ -n "$fd_hold" ]; then fd_o=$fd_o"M$T$1$T$2$NL"; else printf 'M\t%s\t%s\n' "$1" "$2"; fi; }
x() { if [ -n "$fd_hold" ]; then fd_o=$fd_o"X$T$1$NL"; else printf 'X\t%s\n' "$1"; fi; }
fd_w() { [ -z "$fd_o" ] || printf '%s' "$fd_o"; fd_o=; }
# -v: od would print a repeated 16-byte line as '*'
hex() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }
secs() { date +%s; }
# A pass that ran into the remote time limit says so (timeout cut it short).
late() { [ -n "$TO" ] && [ $(( $(secs) - $1 )) -ge "$FD_TMO" ] && x "$2: stopped by the ${FD_TMO}s remote time limit, so it may be incomplete"; }
# The pinned log from byte $1 on. busybox tail takes no offset past 2 GiB: dd seeks there.
fd_nl() { if [ -n "$fd_cr" ]; then tr '\r' '\n'; else cat; fi; }
# The same, with NUL bytes read as spaces (awk implementations differ on NUL): one tr either way.
fd_nz() { if [ -n "$fd_cr" ]; then tr '\r\000' '\n '; else tr '\000' ' '; fi; }
# A stream source (journal, docker, command) was read once into $fd_buf (bounded): the passes read that.
fd_all() { if [ -n "$fd_s" ]; then printf '%s\n' "$fd_buf"; else $TO cat "$r"; fi; }
fd_last() { if [ -n "$fd_s" ]; then fd_all | tail -c "$1"; else $TO tail -c "$1" "$r"; fi; }
fd_upto() { if [ -n "$fd_s" ]; then fd_all | head -c "$1"; else $TO head -c "$1" "$r"; fi; }
fd_from() {
  if [ -n "$fd_s" ]; then fd_all | tail -c "+$(( $1 + 1 ))"
  elif [ "$1" -lt 2147483647 ]; then $TO tail -c "+$(( $1 + 1 ))" "$r"
  else $TO dd if="$r" bs=65536 skip=$(( $1 / 65536 )) 2>/dev/null | tail -c "+$(( $1 % 65536 + 1 ))"; fi
}
# The begin marker and the first facts in one write, before anything reads the log (a hung mount shows
# as a begun, cut answer, not as no answer).
printf '%s begin %s\nM\tnow\t%s\nM\tpid\t%s\nM\ttools\t%s\nM\tnice\t%s\nM\tioclass\t%s\n' "$FD_MARK" "$FD_VERSION" \
  "$(secs)" $$ "$(command -v timeout >/dev/null 2>&1 && echo timeout) $(command -v ionice >/dev/null 2>&1 && echo ionice)" \
  "$(nice 2>/dev/null)" "$(ionice -p $$ 2>/dev/null)"
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
# The log's facts are held and leave with the keyword pass's write (fd_scan), or at the end when no pass runs.
fd_log() { fd_hold=1; fd_log_held; fd_hold=; fd_w; }
fd_log_held() {
  f=
  oifs=$IFS; IFS=''
  if [ -n "$FD_LOGLIT" ]; then set -- "$FD_LOG"; else set -- $FD_LOG; fi
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
  fd_scan
}
# The passes over the pinned file ($r) or the stream buffer ($fd_s set, $size known), in two writes: the
# log's facts with the keyword pass, then the tail, head and context passes together (each pass reads the
# log under the remote time limit, so the second write waits at most for those limits).
fd_scan() { fd_hold=1; fd_scan_held; fd_hold=; fd_w; }
fd_scan_held() {
  m size "$size"
  if [ "$size" -eq 0 ]; then m status empty; fd_close; return; fi
  # Binary (a .gz a glob caught, a core file): control bytes beyond tab, newline, CR and ESC
  # in the last 8 KB. NUL padding after a crash is not held against a text log.
  # Counts in one pass over the last 8 KB (od: awk implementations differ on NUL bytes): bytes other
  # than NUL, control bytes, LF, CR.
  # shellcheck disable=SC2046
  set -- $(fd_last 8192 | od -An -v -tu1 | awk '{ for (i = 1; i <= NF; i++) { b = $i + 0; if (b == 0) continue; n++
      if (b == 10) lf++; else if (b == 13) cr++
      else if (b != 9 && b != 27 && (b < 32 || b == 127)) ctl++ } }
    END { printf "%d %d %d %d\n", n, ctl, lf, cr }')
  samp=${1:-0}; ctl=${2:-0}
  if [ "$samp" -eq 0 ]; then m status binary; m reason "its last 8 KB are all NUL bytes"; fd_close; return; fi
  if [ $((ctl * 20)) -gt "$samp" ]; then m status binary; m reason "$ctl control bytes in the last $samp"; fd_close; return; fi
  m status ok
  # CR-only line ends (old Mac style, some progress writers): read CR as the line end, byte for byte.
  fd_cr=
  if [ "${3:-0}" -eq 0 ] && [ "${4:-0}" -gt 0 ]; then
    fd_cr=1; m note "the log ends its lines with CR only: CR read as the line end"
  fi
  # The cap: the last FD_SCAN bytes (start 0 when the whole log fits).
  cap=0
  if [ "$size" -gt "$FD_SCAN" ]; then cap=$((size - FD_SCAN)); fi
  # One grep checks the keyword pattern and the GNU options (-a -b -n); only when it fails, each alone.
  gnu=
  printf 'x\n' | grep -a -b -n -E -e "$FD_KW" >/dev/null 2>&1
  if [ $? -le 1 ]; then gnu=1
  else
    if printf 'x\n' | grep -E -e "$FD_KW" >/dev/null 2>&1; [ $? -gt 1 ]; then
      x "the remote grep rejected the keyword pattern: error lines may be missing"
    fi
    printf 'x\n' | grep -a -b -n -E x >/dev/null 2>&1 && gnu=1
  fi
  if [ -n "$FD_RS" ] && { printf 'x\n' | grep -E -e "$FD_RS" >/dev/null 2>&1; [ $? -gt 1 ]; }; then
    x "the remote grep rejected the run_start pattern: the latest run may not be found"
  fi
  if [ -n "$gnu" ]; then
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
  # Backwards in growing windows (1, 8, 64 MiB, ... up to the cap): the latest run is usually the
  # last few KB, so once a window holds a run-start banner (past its possibly cut first line) the
  # hits, tags and run start are exactly those of a scan of the whole cap, at a fraction of its cost.
  # Without a run_start pattern there is nothing to stop at: the cap is scanned at once.
  w=$FD_W0; [ -n "$FD_RS" ] && [ "$w" -gt 0 ] || w=$FD_SCAN
  t0=$(secs)
  while :; do
    start=0; [ "$size" -gt "$w" ] && start=$((size - w))
    [ "$start" -lt "$cap" ] && start=$cap
    # Line numbers as a whole-file scan gives them: the newlines before a window within the cap.
    lnb=0
    if [ "$start" -gt 0 ] && [ "$cap" -eq 0 ]; then
      if [ -n "$fd_cr" ]; then lnb=$(fd_upto "$start" | tr -cd '\r' | wc -c | tr -d ' ')
      else lnb=$(fd_upto "$start" | wc -l | tr -d ' '); fi
    fi
    fd_pass
    [ "$start" -le "$cap" ] && break
    case "$NL$p1" in *"${NL}M${T}run_start${T}"*) break ;; esac
    w=$((w * 8))
  done
  # A line that starts before the window and runs on past FD_MAXLINE bytes into it: its start,
  # where an error message would be, was not searched. Say so rather than pass as healthy.
  wx=
  if [ "$start" -gt 0 ] && [ "$start" -eq "$cap" ] && [ "$(fd_from "$start" | head -c "$FD_MAXLINE" | fd_nl | tr -cd '\n' | wc -c | tr -d ' ')" -eq 0 ]; then
    wx="X${T}the scan window (last $FD_SCAN bytes) starts inside a line longer than $FD_MAXLINE bytes: the part of it before the window was not searched$NL"
  fi
  fd_o="${fd_o}M${T}window$T$start$NL$wx$p1$NL"
  late "$t0" "keyword pass"
  fd_w
  rp=0
  case "$NL$p1" in *"${NL}M${T}run_start${T}"*) rp=${p1#*M"$T"run_start"$T"}; rp=${rp%%"$NL"*} ;; esac
  tb=$FD_TB; [ "$size" -lt "$tb" ] && tb=$size
  # Captured whole (it always ends with one newline: the tail pass prints its section line at least).
  fd_rest=$(
    fd_hold=
    t0=$(secs)
    fd_tailpass
    late "$t0" "tail pass"
    if [ -n "$FD_EP" ]; then
      t0=$(secs)
      fd_headpass
      late "$t0" "head pass"
    fi
    fd_ctxpasses
    fd_changed
  )
  [ -z "$fd_rest" ] || fd_o=$fd_o$fd_rest$NL
  fd_w
  fd_close
}
fd_win() { if [ "$start" -gt 0 ]; then fd_from "$start"; else fd_all; fi; }
# The keyword pass over the window from $start (cut at the latest run start): sets $p1.
fd_pass() {
  p1=$( { if [ -n "$fd_cr" ]; then fd_win | tr '\r' '\n'; else fd_win; fi; } | fd_grep | tr '\000' ' ' | awk -v start="$start" -v cap="$cap" -v lnb="$lnb" "$FD_AWKLIB"'
    function reset() { nh = 0; nr = 0; hb = 0; dropped = 0; nt = 0; split("", first); split("", firstln); split("", order); split("", ring) }
    BEGIN { kw = ENVIRON["FD_KW"]; rs = ENVIRON["FD_RS"]; tg = ENVIRON["FD_TAGS"]; bh = ENVIRON["FD_BH"]; ML = ENVIRON["FD_MAXLINE"] + 0
      H1 = ENVIRON["FD_H1"] + 0; H2 = ENVIRON["FD_H2"] + 0; HB = ENVIRON["FD_HB"] + 0; runpos = -1; reset() }
    {
      i = index($0, ":"); ln = substr($0, 1, i - 1); r = substr($0, i + 1)
      j = index(r, ":"); off = substr(r, 1, j - 1); t = substr(r, j + 1)
      if (start > 0 && ln == 1) { if (t ~ kw) cutkw = 1; next }
      pos = start + off; sub(/\r$/, "", t)
      if (rs != "" && t ~ rs) { reset(); runpos = pos; runln = ln }
      lno = (start == 0) ? ln : (cap == 0) ? lnb + ln : "-"
      rec = fd_int(pos) "\t" lno "\t" fd_clip(t)
      if (nh < H1 && hb + length(rec) <= HB) { head[nh++] = rec; hb += length(rec) }
      else { if (nr >= H2) dropped++; ring[nr % H2] = rec; nr++ }
      if (tg != "" && t ~ kw && match(t, tg)) { g = substr(t, RSTART, RLENGTH)
        if (!(g in first)) { first[g] = pos; firstln[g] = lno; order[nt++] = g } }
      else if (t ~ bh && !("" in first)) { first[""] = pos; firstln[""] = lno; order[nt++] = "" }
    }
    END {
      if (cutkw && start <= cap) print "X\tthe scan window starts inside an error-shaped line: its start was not searched"
      if (runpos >= 0) printf "M\trun_start\t%s\n", fd_int(runpos)
      print "S\thits"
      for (k = 0; k < nh; k++) print "L\t" head[k]
      if (dropped > 0) printf "X\tkeyword hits: %d lines between the first %d and the last %d not shown\n", dropped, nh, H2
      s = (nr > H2) ? nr - H2 : 0
      for (k = s; k < nr; k++) print "L\t" ring[k % H2]
      for (k = 0; k < nt; k++) printf "T\t%s\t%s\t%s\n", fd_int(first[order[k]]), firstln[order[k]], order[k]
    }')
}
# The last lines from the latest run start ($rp) on. A window that holds no line break (one line longer than
# the window ends the log) shows the end of that line, marked as cut: dropping it would read as a log with no lines.
fd_tailpass() {
  fd_last "$tb" | fd_nz | awk -v base=$((size - tb)) -v rp="$rp" "$FD_AWKLIB"'
    BEGIN { print "S\ttail"; N = ENVIRON["FD_TL"] + 0; ML = ENVIRON["FD_MAXLINE"] + 0; pos = base; k = 0 }
    { p = pos; pos += length($0) + 1
      if (base > 0 && NR == 1) { cut = $0; next }
      if (p < rp) next
      t = $0; sub(/\r$/, "", t); t = fd_clip(t)
      lno = (base == 0) ? NR : "-"
      buf[k % N] = fd_int(p) "\t" lno "\t" t; k++ }
    END { s = (k > N) ? k - N : 0
      if (s > 0) printf "X\ttail: last %d lines shown\n", N
      if (NR == 1 && base > 0 && base >= rp) {
        printf "X\ttail: the last %d bytes hold no line break: the end of one longer line is shown\n", pos - base - 1
        t = cut; sub(/\r$/, "", t); print "L\t" fd_int(base) "\t-\t" fd_clip(t) }
      for (i = s; i < k; i++) print "L\t" buf[i % N] }'
}
# The rendezvous endpoint (torchrun, vLLM and Ray print it near the start, which the passes
# above, reading the end, seldom reach): at most FD_HEADN lines matching FD_EP in the first FD_HEADB
# bytes of the latest run (of the cap when no run start was found). A line the byte cap cuts is dropped.
fd_headpass() {
  if printf 'x\n' | grep -E -e "$FD_EP" >/dev/null 2>&1; [ $? -gt 1 ]; then
    x "the remote grep rejected the endpoint pattern: the job rendezvous is not read"; return
  fi
  hs=$rp; [ "$hs" -lt "$cap" ] && hs=$cap
  fd_from "$hs" | head -c "$FD_HEADB" | fd_nl | tr '\000' ' ' | awk -v base="$hs" -v cut=$(( hs != rp )) "$FD_AWKLIB"'
    BEGIN { B = ENVIRON["FD_HEADB"] + 0; pos = base }
    { p = pos; pos += length($0) + 1
      if (cut && NR == 1) next
      if (pos - base > B) exit
      t = $0; sub(/\r$/, "", t); print fd_int(p) "\t" t }' |
    $TO grep -E -e "$FD_EP" | head -n "$FD_HEADN" | awk -v T="$T" "$FD_AWKLIB"'
    BEGIN { print "S\thead"; ML = ENVIRON["FD_MAXLINE"] + 0 }
    { i = index($0, T); print "L\t" substr($0, 1, i - 1) "\t-\t" fd_clip(substr($0, i + 1)) }'
}
# Every line of the earliest failing tags from their first error on.
fd_ctxpasses() {
  printf '%s\n' "$p1" | awk -F "$T" '$1 == "T"' | head -n "$FD_NTAGS" | while IFS="$T" read -r kind apos aln atag; do
    t0=$(secs)
    fd_from "$apos" | head -c "$FD_WIN" | fd_nz | FD_TAG="$atag" awk -v apos="$apos" -v aln="$aln" "$FD_AWKLIB"'
      BEGIN { tag = ENVIRON["FD_TAG"]; printf "S\tctx\t%s\n", tag; tg = ENVIRON["FD_TAGS"]; ML = ENVIRON["FD_MAXLINE"] + 0
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
        t = fd_clip(t)
        lno = (aln == "-") ? "-" : aln + NR - 1
        print "L\t" fd_int(p) "\t" lno "\t" t; k++ }'
    late "$t0" "context pass for ${atag:-untagged lines}"
  done
}
# The log changed under us? Compare the name's inode and the opened file's size with the start.
fd_changed() {
  [ -z "$fd_s" ] || return 0
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
fd_s=; fd_buf=; pinned=
