# shellcheck shell=sh disable=SC2016,SC2034,SC2086,SC3013
# SC2016: awk programs are single-quoted on purpose
# SC2034: read by funnel.sh's functions (fd_scan, fd_log)
# SC2086: $TO and $fd_ju are split on purpose
# SC3013: test -nt works in dash, bash, zsh and busybox ash
# Where the log is (see fleetdiag/discover.py), then the funnel over it. Runs after funnel.sh.
# FD_SRC: file (FD_LOG, a path or glob) | journal | docker | command (FD_SRCV) | discover.
# Discovery may also land on cri: a kubelet container log (its line prefixes are dropped).
# Read-only: it reads /proc, runs journalctl/docker/scontrol read commands, and writes nothing.

[ -n "$FD_DPATH" ] && PATH=$FD_DPATH:$PATH
fd_src() { m src_kind "$1"; m src_detailhex "$(hex "$2")"; m src_byhex "$(hex "$3")"; }

# The job's processes, best first: "score<TAB>pid<TAB>label". Score 2: a known framework
# (vllm, sglang, torchrun, deepspeed, ray, accelerate) as argv[0] or as python's script or -m
# module; 1: any other `python -m MODULE` (tools such as pytest or pip excepted). fleetdiag's
# own processes carry fleetdiag-remote in their command line and are skipped; the patterns
# reach awk through ENVIRON, so no awk of ours matches them in its own command line.
fd_procs() {
  grep -a -H '' /proc/[0-9]*/cmdline 2>/dev/null | tr '\000' '\001' | awk -v min="$1" '
    function base(s) { sub(/.*\//, "", s); return s }
    BEGIN { FS = sprintf("%c", 1); fw = ENVIRON["FD_JOBS"]; fm = ENVIRON["FD_JOBMODS"]; no = ENVIRON["FD_NOTJOBS"] }
    index($0, "/proc/") == 1 && index($0, "fleetdiag-remote") == 0 {
      i = index($0, "/cmdline:"); if (i == 0) next
      pid = substr($0, 7, i - 7); n = split(substr($0, i + 9), a, FS)
      a0 = base(a[1]); score = 0; label = ""
      if (a0 ~ /^python[0-9.]*$/) {
        for (k = 2; k <= n; k++) {
          if (a[k] == "-m") { mod = a[k + 1]
            if (mod ~ fm) score = 2; else if (mod != "" && mod !~ no) score = 1
            label = "python -m " mod; break }
          if (a[k] == "-c" || a[k] == "") break
          if (substr(a[k], 1, 1) == "-") continue
          b = base(a[k]); if (b ~ fw) { score = 2; label = b " " a[k + 1] }
          break
        }
      } else if (a0 ~ fw) { score = 2; label = a0 " " a[2] }
      if (score >= min) { sub(/ +$/, "", label); printf "%d\t%s\t%s\n", score, pid, label }
    }' | sort -t "$T" -k1,1nr -k2,2n
}
# Whether pid $1 descends from FD_UNDER (set: only that process's descendants are the job; a test's
# own view of a shared machine). Walks PPid up, bounded.
fd_under() {
  [ -n "$FD_UNDER" ] || return 0
  q=$1; k=0
  while [ -n "$q" ] && [ "$q" -gt 1 ] && [ "$k" -lt 64 ]; do
    [ "$q" = "$FD_UNDER" ] && return 0
    n=$q; q=
    while IFS= read -r l; do  # builtins only: no fork per step
      case $l in PPid:*) q=${l#PPid:}; q=${q#"${q%%[!"$T" ]*}"}; break ;; esac
    done 2>/dev/null <"/proc/$n/status"
    k=$((k + 1))
  done
  return 1
}
# Start time (clock ticks since boot) of a pid, to prefer the oldest: the launcher, not a worker.
fd_start() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
# (Pipes, not here-documents: bash writes a here-document to a temp file.)
fd_pick() {
  fd_procs "$1" | {
    best=; bst=; bsc=
    while IFS="$T" read -r sc p lab; do
      [ -n "$bsc" ] && [ "$sc" -lt "$bsc" ] && break
      fd_under "$p" || continue
      s=$(fd_start "$p"); [ -n "$s" ] || continue
      if [ -z "$best" ] || [ "$s" -lt "$bst" ]; then best=$p; bst=$s; bsc=$sc; blab=$lab; fi
    done
    [ -n "$best" ] && printf '%s\t%s\n' "$best" "$blab"
  }
}
# The newest existing file among globs, one per line in $1.
fd_newest() {
  printf '%s\n' "$1" | {
    nf=
    while IFS= read -r g; do
      [ -n "$g" ] || continue
      oifs=$IFS; IFS=''
      for c in $g; do [ -f "$c" ] || continue; if [ -z "$nf" ] || [ "$c" -nt "$nf" ]; then nf=$c; fi; done
      IFS=$oifs
    done
    [ -n "$nf" ] && printf '%s\n' "$nf"
  }
}
# The log of pid $1 (label $2): sets fd_k (kind), fd_d (detail), fd_by (why), fd_ju.
fd_find() {
  p=$1; who="pid $p ($2)"; fd_k=
  o=; on=
  for n in 1 2; do
    l=/proc/$p/fd/$n
    if ! [ -f "$l" ] || ! [ -r "$l" ]; then continue; fi
    if [ -z "$o" ] || [ "$l" -nt "$o" ]; then o=$l; on=$n; fi
  done
  if [ -n "$o" ]; then
    t=$(readlink "$o" 2>/dev/null)
    # The path as the process sees it: read through /proc when it is gone or in another mount namespace.
    case $t in /*' (deleted)'|'') t=$o ;; *) [ -f "$t" ] || t=$o ;; esac
    what=stdout; [ "$on" = 2 ] && what=stderr
    l1=$(readlink "/proc/$p/fd/1" 2>/dev/null); l2=$(readlink "/proc/$p/fd/2" 2>/dev/null)
    if [ "$l1" = "$l2" ]; then what="stdout and stderr"
    elif [ -f "/proc/$p/fd/1" ] && [ -f "/proc/$p/fd/2" ]; then
      if [ "$on" = 1 ]; then ol=$l2; ow=stderr; else ol=$l1; ow=stdout; fi
      x "$ow of pid $p goes to another file, $ol: not read (the more recently written one was)"
    fi
    fd_k="file"; fd_d=$t; fd_by="$what of $who"; return 0
  fi
  if [ -d "/proc/$p/fd" ] && ! [ -r "/proc/$p/fd" ]; then x "cannot see the open files of $who (another user): its stdout was not checked"; fi
  cg=$(cat "/proc/$p/cgroup" 2>/dev/null)
  unit=$(printf '%s\n' "$cg" | awk -F/ '{ for (i = NF; i > 1; i--) if ($i ~ /\.service$/ && $i !~ /^user@[0-9]+\.service$/) { print $i; exit } }' | head -n 1)
  if [ -n "$unit" ] && command -v journalctl >/dev/null 2>&1; then
    fd_ju=-u
    case $cg in *"/user@"*"/$unit"*) fd_ju=--user-unit ;; esac
    fd_k=journal; fd_d=$unit; fd_by="$who runs in systemd unit $unit"; return 0
  fi
  cid=$(printf '%s\n' "$cg" | sed -n 's/.*docker[-/]\([0-9a-f]\{64\}\).*/\1/p' | head -n 1)
  if [ -n "$cid" ]; then fd_k=docker; fd_d=$cid; fd_by="$who runs in docker container ${cid%"${cid#????????????}"}"; return 0; fi
  # Kubernetes (containerd, CRI-O): the kubelet's CRI log /var/log/containers/POD_NS_NAME-ID.log.
  kid=$(printf '%s\n' "$cg" | sed -n 's/.*kubepods.*[-/:]\([0-9a-f]\{64\}\).*/\1/p' | head -n 1)
  if [ -n "$kid" ] && kl=$(fd_newest "$FD_K8S_LOGS/*-$kid.log"); then
    fd_k=cri; fd_d=$kl; fd_by="$who runs in Kubernetes container ${kid%"${kid#????????????}"}: its kubelet log"; return 0
  fi
  jid=$(tr '\000' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^SLURM_JOB_ID=//p' | head -n 1)
  if [ -n "$jid" ] && command -v scontrol >/dev/null 2>&1; then
    so=$($TO scontrol show job "$jid" 2>/dev/null | tr ' ' '\n' | sed -n 's/^StdOut=//p' | head -n 1)
    if [ -n "$so" ] && [ -f "$so" ]; then fd_k=slurm; fd_d=$so; fd_by="$who is Slurm job $jid: its StdOut"; return 0; fi
  fi
  cwd=$(readlink "/proc/$p/cwd" 2>/dev/null)
  if [ -n "$cwd" ] && nl=$(fd_newest "$cwd/*.log"); then
    fd_k="file"; fd_d=$nl; fd_by="newest *.log in the working directory of $who"; return 0
  fi
  x "found $who but not its log: stdout is not a file, no systemd unit, container, Slurm job or *.log in its working directory"
  return 1
}
# Discovery: the job's process, then its log; else (with $2) the newest of the configured globs.
fd_discover() {
  pl=$(fd_pick "$1")
  if [ -n "$pl" ]; then
    fd_find "${pl%%"$T"*}" "${pl#*"$T"}" && return 0
  fi
  if [ -n "$2" ] && [ -n "$FD_GLOBS" ] && nl=$(fd_newest "$FD_GLOBS"); then
    fd_k="file"; fd_d=$nl; fd_by="no job process running: the newest of the inventory's logs"; return 0
  fi
  return 1
}
# A stream source read once, bounded to the last FD_SBYTES bytes (FD_SLINES lines asked for).
fd_json() {
  awk 'function u8(c) { if (c < 128) return sprintf("%c", c)
      if (c < 2048) return sprintf("%c%c", 192 + int(c / 64), 128 + c % 64)
      return sprintf("%c%c%c", 224 + int(c / 4096), 128 + int(c / 64) % 64, 128 + c % 64) }
    BEGIN { for (i = 0; i < 16; i++) hv[substr("0123456789abcdef", i + 1, 1)] = i
      for (i = 10; i < 16; i++) hv[substr("ABCDEF", i - 9, 1)] = i }
    { if (!match($0, /"log"[ ]*:[ ]*"/)) next
      s = substr($0, RSTART + RLENGTH); o = ""
      while (match(s, /[\\"]/)) {
        o = o substr(s, 1, RSTART - 1); c = substr(s, RSTART, 1)
        if (c == "\"") { s = ""; break }
        e = substr(s, RSTART + 1, 1); s = substr(s, RSTART + 2)
        if (e == "n") o = o "\n"; else if (e == "t") o = o "\t"; else if (e == "r") o = o "\r"
        else if (e == "u") { v = 0; for (k = 1; k <= 4; k++) v = v * 16 + hv[substr(s, k, 1)]; s = substr(s, 5); o = o u8(v) }
        else if (e == "b" || e == "f") o = o " "; else o = o e
      }
      printf "%s", o }'
}
fd_stream() {
  fd_s=1; f=; r=; fd_buf=
  case $1 in
    journal)
      fd_buf=$($TO journalctl $fd_ju "$2" -o cat --no-pager -n "$FD_SLINES" 2>/dev/null </dev/null | tail -c "$FD_SBYTES" | tr -d '\000')
      [ -n "$fd_buf" ] || m reason "journalctl $fd_ju $2 printed nothing: $($TO journalctl $fd_ju "$2" -n 1 2>&1 </dev/null >/dev/null | head -c 200 | tr '\n' ' ')" ;;
    docker)
      if command -v docker >/dev/null 2>&1 && $TO docker logs --tail 0 "$2" >/dev/null 2>&1 </dev/null; then
        fd_buf=$($TO docker logs --tail "$FD_SLINES" "$2" 2>&1 </dev/null | tail -c "$FD_SBYTES" | tr -d '\000')
      else
        jf=
        for c in "$FD_DOCKER_ROOT/containers/$2"*/*-json.log; do [ -r "$c" ] && jf=$c && break; done
        if [ -n "$jf" ]; then
          m note "docker logs not permitted or no docker CLI: read the container's json-file log $jf"
          mt=$(stat -L -c '%Y' "$jf" 2>/dev/null) && m mtime "$mt"
          fd_buf=$($TO tail -c "$FD_SBYTES" "$jf" | fd_json | tr -d '\000')
        else
          m reason "docker logs $2 not permitted (or no docker CLI) and its json-file log is not readable"; m status unreadable; return
        fi
      fi ;;
    command)
      # Read once: its output is the log. It must end within FD_CTMO seconds (inside the command's own
      # timeout); one cut there is the host's status, never an empty, healthy log.
      fd_buf=$({ $TOC sh -c "$2" 2>/dev/null </dev/null; printf '\n%s rc %s\n' "$FD_MARK" "$?"; } |
        tail -c "$FD_SBYTES" | tr -d '\000')
      fd_rc=${fd_buf##*"$FD_MARK rc "}
      fd_buf=$(printf '%s' "${fd_buf%"$NL$FD_MARK rc "*}")
      if [ -n "$TOC" ] && { [ "$fd_rc" = 124 ] || [ "$fd_rc" = 137 ]; }; then
        m reason "the command did not end within ${FD_CTMO}s; a command source is read once and must end (for watch to stream one, let it print once and stream under \$FLEETDIAG_FOLLOW, e.g. kubectl logs \${FLEETDIAG_FOLLOW:+-f --tail 0} POD)"
        m status unreadable; return
      fi ;;
    cri)
      # "TIME STREAM F|P text": the prefix dropped; P is a partial line, joined to the next one.
      mt=$(stat -L -c '%Y' "$2" 2>/dev/null) && m mtime "$mt"
      fd_buf=$($TO tail -c "$FD_SBYTES" "$2" | awk '{ t = $0; sub(/^[^ ]* [^ ]* [^ ]* ?/, "", t)
        if ($3 == "P") printf "%s", t; else print t }' | tr -d '\000') ;;
  esac
  if [ -z "$fd_buf" ]; then m status empty; return; fi
  size=$(printf '%s\n' "$fd_buf" | wc -c | tr -d ' ')
  fd_scan
}
fd_run() {
  m pathhex "$(hex "$3")"
  case $1 in
    file|slurm) FD_LOG=$2; FD_LOGLIT=1; fd_log ;;
    *) fd_stream "$1" "$2" ;;
  esac
}
fd_label() {
  case $1 in
    journal) printf 'journalctl %s %s' "$fd_ju" "$2" ;;
    docker) printf 'docker logs %s' "$(printf '%s' "$2" | cut -c1-12)" ;;
    cri) printf '%s' "$2" ;;
    command) printf 'command: %s' "$2" ;;
    *) printf '%s' "$2" ;;
  esac
}
fd_ju=-u
case $FD_SRC in
  discover)
    if fd_discover 1 globs; then
      fd_src "$fd_k" "$fd_d" "$fd_by"; fd_run "$fd_k" "$fd_d" "$(fd_label "$fd_k" "$fd_d")"
    else
      m status no-source
      m reason "no job process found (vllm, sglang, torchrun, deepspeed, ray, python -m) and no logs configured"
    fi ;;
  journal|docker|command)
    fd_run "$FD_SRC" "$FD_SRCV" "$(fd_label "$FD_SRC" "$FD_SRCV")" ;;
  *)
    if [ -n "$FD_FALLBACK" ] && ! fd_newest "$FD_LOG" >/dev/null && fd_discover 2; then
      x "the configured log $FD_LOG does not exist: read the log found by discovery instead"
      fd_src "$fd_k" "$fd_d" "$fd_by"; fd_run "$fd_k" "$fd_d" "$(fd_label "$fd_k" "$fd_d")"
    else
      fd_log
    fi ;;
esac
