# shellcheck shell=sh disable=SC2086
# SC2086: $TO/$FTO and stat fields are split on purpose
# Probe only: the serving process and the latest run parallel settings (see fleetdiag/facts/collect.py).

fd_serve() {
  c=$( { $FTO ps -eo pid=,args= </dev/null 2>/dev/null || for d in /proc/[0-9]*; do
           printf '%s %s\n' "${d#/proc/}" "$(tr '\000' ' ' <"$d/cmdline" 2>/dev/null)"; done; } |
       awk 'BEGIN { p = ENVIRON["FD_SERVE"]; mk = ENVIRON["FD_MARK"] }
            index($0, mk) == 0 && index($0, "fleetdiag-remote") == 0 && $0 ~ p { print $1 }' | head -n 16)
  [ -n "$c" ] || return
  lp=
  [ -n "$f" ] && lp=$(readlink -f "$f" 2>/dev/null)
  set -- $c
  n=$#; pick=$1
  for p in $c; do
    if [ -n "$lp" ]; then
      for fd in 1 2; do
        if [ "$(readlink "/proc/$p/fd/$fd" 2>/dev/null)" = "$lp" ]; then pick=$p; fd_f serve_log 1; break 2; fi
      done
    fi
  done
  fd_f serve_candidates "$n"
  fd_f serve_pid "$pick"
  fd_f serve_cmd "$($FTO tr '\000' '\t' <"/proc/$pick/cmdline" 2>/dev/null | cut -c1-4096)"
  if e=$($FTO tr '\000' '\n' <"/proc/$pick/environ" 2>/dev/null); then
    fd_f serve_environ readable
    v=$(printf '%s\n' "$e" | grep -a -m1 '^CUDA_VISIBLE_DEVICES=')
    if [ -n "$v" ]; then fd_f serve_cvd "${v#CUDA_VISIBLE_DEVICES=}"; else fd_f serve_cvd_unset 1; fi
  else
    fd_f serve_environ unreadable
  fi
}
# Held and written at once (each write is a packet for the controller): ps runs first, before any line,
# and each read after it is under the facts' time limit.
fd_serve_o=$(
  fd_serve
  if [ -n "$rp" ] && [ -n "$f" ]; then
    s=$rp; [ "${start:-0}" -gt "$s" ] && s=$start
    $TO tail -c "+$((s + 1))" "$f" 2>/dev/null | head -c "$FD_FSCAN" | tr -d '\000\r' |
      grep -a -E -m 3 -e "$FD_LOGRE" 2>/dev/null | cut -c1-6144 | while IFS= read -r l; do fd_f logline "$l"; done
  fi
)
[ -z "$fd_serve_o" ] || printf '%s\n' "$fd_serve_o"
