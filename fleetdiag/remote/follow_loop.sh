# shellcheck shell=sh disable=SC2086,SC2153,SC2154,SC3045
# SC2086: $TO/$FTO and stat fields are split on purpose
# SC2153: FW_* values are exported by the builder
# SC2154: set by the part that runs before this one
# SC3045: read -t/printf -v run only under $BASH_VERSION
# The follow loop, run by bash or sh from FW_LOOP: see fleetdiag/remote/follow.py.

eval "$FW_FUNCS"
sl=$FW_POLL
# Naps: under bash, while fd 9 (the channel's stdin) is open, `read -t` on it (no fork). Its EOF is no
# reason to stop: a client sends one when it likes (asyncssh's stdin=DEVNULL, one round trip after the
# exec: after this check whenever the snapshot took less than a round trip), so from then on a nap is
# a sleep, and a hang-up ends the follower at its next write (SIGPIPE), a heartbeat at the latest.
if [ -n "$BASH_VERSION" ] && read -r -t 0.01 -u 9 _ 2>/dev/null; [ $? -gt 128 ]; then
  fw_nap() {
    read -r -t "$1" -u 9 _
    [ $? -ne 1 ] && return 0
    fw_nap() { sleep "$1" 2>/dev/null || sleep 1; }
    fw_nap "$1"
  }
  fw_now() { printf -v fw_t '%(%s)T' -1 2>/dev/null || fw_t=$(date +%s); }
else
  sleep "$sl" 2>/dev/null || sl=1
  fw_nap() { sleep "$1"; }
  fw_now() { fw_t=$(date +%s); }
fi
# The minimum gap between reads of a busy log (wake mode). With a clock that needs no fork (bash 5's
# EPOCHREALTIME, in microseconds) it is a budget: FW_BURST reads, refilled one per poll. A log writing a
# line every poll or less often is read at once every time, so a failure written right after a routine
# line is not held for the nap that line's read began (up to poll: the p90 of #25); a log writing faster
# is still read at most once a poll in the long run. Without such a clock: a nap of poll after each read.
fw_clock=
if [ -n "$BASH_VERSION" ] && [ -n "$EPOCHREALTIME" ] && [ "$FW_POLLUS" -gt 0 ] 2>/dev/null; then fw_clock=1; fi
fw_us() { fw_u=${EPOCHREALTIME%[.,]*}${EPOCHREALTIME#*[.,]}; }
fw_cap=$((FW_POLLUS * FW_BURST)); fw_b=$fw_cap; fw_u=0; fw_last=0
[ -n "$fw_clock" ] && fw_us && fw_last=$fw_u
fw_pace() {
  if [ -z "$fw_clock" ]; then fw_nap "$sl"; return; fi
  fw_us
  fw_d=$((fw_u - fw_last)); fw_last=$fw_u
  [ "$fw_d" -lt 0 ] && fw_d=0  # the clock stepped back: the nap stays at most a poll
  fw_b=$((fw_b + fw_d - FW_POLLUS))
  [ "$fw_b" -gt $((fw_cap - FW_POLLUS)) ] && fw_b=$((fw_cap - FW_POLLUS))
  [ "$fw_b" -ge 0 ] && return 0
  printf -v fw_ns '%d.%06d' $((-fw_b / 1000000)) $((-fw_b % 1000000))
  fw_nap "$fw_ns" || return 1
  fw_b=0; fw_us; fw_last=$fw_u
}
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
        off=$((off + d)); got=1
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
    # A read is paced (fw_pace: the minimum gap between reads of a busy log); a wake that read nothing
    # (the heartbeat's tick) is not, so a failure written just after a heartbeat is read at once.
    while w=$(dd bs=65536 count=1 2>/dev/null; echo .); [ "$w" != . ]; do
      case $w in *"$FW_MARK w"*) sw=1 ;; esac
      got=
      fw_step
      while [ -n "$more" ]; do fw_step; done
      case $w in *"$FW_MARK h"*) fw_beat ;; esac
      if [ -n "$got" ]; then fw_pace || exit 0; fi
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
# A stream (journalctl -f, docker logs -f, a command's stdout): no size or mtime, so a sync mark
# every nap (the awk counts the bytes) and a heartbeat with '-' for them; the controller's idle time
# is the time since the last line arrived. The stream writes into the same pipe as the marks.
# A command read once (FW_ONCE: it does not stream under FLEETDIAG_FOLLOW) is not run again: only
# the heartbeat goes on.
fw_stream() {
  echo "$FW_MARK a $fw_off0 -"
  if [ -n "$FW_ONCE" ]; then
    sp=; ended=1
    echo "$FW_MARK n follow: the command's output is the log, read once (it ended; nothing more to follow)"
  else
    (
      case $fw_sk in
        journal) exec journalctl $fd_ju "$fw_sv" -f -n "$FW_SLINES" -o cat --no-pager ;;
        docker) exec docker logs -f --tail "$FW_SLINES" "$fw_sv" 2>&1 ;;
        *) FLEETDIAG_FOLLOW=1; export FLEETDIAG_FOLLOW; exec sh -c "$fw_sv" ;;
      esac
    ) </dev/null 2>/dev/null &
    sp=$!; ended=
  fi
  n=$FW_HBN
  trap '[ -n "$sp" ] && kill "$sp" 2>/dev/null; exit 0' PIPE TERM HUP INT
  while :; do
    n=$((n + 1))
    if [ "$n" -ge "$FW_HBN" ]; then
      n=0
      if [ -z "$ended" ] && ! kill -0 "$sp" 2>/dev/null; then
        ended=1; echo "$FW_MARK n follow: the stream ($fw_sk) ended: idle from its last line"
      fi
      fw_alive; fw_now
      echo "$FW_MARK h $fw_t - - - $fw_a"
    else
      echo "$FW_MARK s"
    fi
    fw_nap "$sl" || break
  done
  [ -n "$sp" ] && kill "$sp" 2>/dev/null
  exit 0
}
[ -n "$fw_sk" ] && fw_stream
fw_mode=poll
if [ "$FW_MODE" != poll ] && tail --version 2>/dev/null | grep -q GNU; then fw_mode=wake; fi
if [ "$fw_mode" = wake ]; then
  fw_ring | fw_read wake
else
  fw_read poll
fi
