# shellcheck shell=sh
# The probe's second round trip (fleetdiag/evidence/hang.py), after stacks.sh: where a stalled job's processes wait.
# The job: the PIDs the first trip's facts named (FD_STACKS_PIDS) and the processes that hold the log
# (FD_STACKS_LOG) open, each kept only when it lives and is a Python/ML process; none of them: fd_stacks_find.
# FD_SPATH: a directory put first on PATH (py-spy or nvidia-smi in an odd place, as --path-prepend).

if [ -n "${FD_SPATH:-}" ]; then PATH="$FD_SPATH:$PATH"; export PATH; fi

fd_stacks_writers() { # fd_stacks_writers FILE: PIDs holding FILE open, from one ls over every fd table
  fd_stacks_lp=$(readlink -f "$1" 2>/dev/null) || return 0
  [ -n "$fd_stacks_lp" ] || return 0
  # shellcheck disable=SC2012 # ls -l prints each fd's link target: the one place the open file shows
  ls -l /proc/[0-9]*/fd 2>/dev/null | FD_STACKS_LP=$fd_stacks_lp LC_ALL=C awk '
    BEGIN { t = " -> " ENVIRON["FD_STACKS_LP"]; n = length(t) }
    /^\/proc\/[0-9]+\/fd:$/ { split($0, a, "/"); p = a[3]; next }
    p != "" && length($0) >= n && substr($0, length($0) - n + 1) == t && !(p in s) { s[p] = 1; print p }'
}

fd_stacks_job_pids() { # the job's PIDs, each once, in order: the facts' first, then the log's writers
  fd_stacks_l=' '
  for fd_stacks_x in ${FD_STACKS_PIDS:-} $(fd_stacks_writers "${FD_STACKS_LOG:-}"); do
    case $fd_stacks_x in ''|*[!0-9]*) continue ;; esac
    case $fd_stacks_l in *" $fd_stacks_x "*) continue ;; esac
    [ "$fd_stacks_x" = "$$" ] && continue
    [ -r "/proc/$fd_stacks_x/stat" ] || continue
    fd_stacks_is_job "$fd_stacks_x" || continue
    fd_stacks_l="$fd_stacks_l$fd_stacks_x "
  done
  printf '%s\n' "$fd_stacks_l"
}

# shellcheck disable=SC2046 # PIDs are digits only: word splitting is the point
set -- $(fd_stacks_job_pids)
fd_stacks_main "$@"
