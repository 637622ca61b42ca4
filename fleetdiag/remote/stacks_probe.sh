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

fd_ras() { # fd_ras PID...: NCCL RAS's STATUS, when a job process has NCCL loaded and RAS is not turned off
  fd_ras_pid=
  for fd_ras_p in "$@"; do
    if grep -q -m 1 'libnccl' "/proc/$fd_ras_p/maps" 2>/dev/null; then fd_ras_pid=$fd_ras_p; break; fi
  done
  if [ -z "$fd_ras_pid" ]; then
    echo '@@fd_ras_start available=no reason=no job process has NCCL loaded'; return 0
  fi
  fd_ras_env=$({ tr '\000' '\n' < "/proc/$fd_ras_pid/environ"; } 2>/dev/null | grep -E '^NCCL_RAS_(ENABLE|ADDR)=[A-Za-z0-9.:_-]{0,80}$')
  case $fd_ras_env in *NCCL_RAS_ENABLE=0*)
    echo '@@fd_ras_start available=no reason=the job turned RAS off (NCCL_RAS_ENABLE=0)'; return 0 ;;
  esac
  fd_ras_addr=$(printf '%s\n' "$fd_ras_env" | sed -n 's/^NCCL_RAS_ADDR=//p')
  [ -n "$fd_ras_addr" ] || fd_ras_addr=localhost:28028
  fd_ras_h=${fd_ras_addr%:*}; fd_ras_port=${fd_ras_addr##*:}
  case $fd_ras_port in ''|*[!0-9]*) fd_ras_port=28028 ;; esac
  [ -n "$fd_ras_h" ] && [ "$fd_ras_h" != "$fd_ras_addr" ] || fd_ras_h=localhost
  fd_ras_t=${FD_RAS_TIMEOUT:-8}
  if command -v ncclras >/dev/null 2>&1; then
    fd_ras_fmt=text
    # JSON where the client offers it (NCCL 2.28.7 and later)
    if fd_stacks_to 3 ncclras --help 2>&1 | grep -q 'json'; then fd_ras_fmt=json; fi
    echo "@@fd_ras_start available=yes via=ncclras format=$fd_ras_fmt addr=$fd_ras_h:$fd_ras_port"
    # -f only where the client has it (ncclras 2.28.9 refuses the option: "invalid option -- 'f'")
    if [ "$fd_ras_fmt" = json ]; then set -- -f json; else set --; fi
    fd_stacks_to "$fd_ras_t" ncclras -h "$fd_ras_h" -p "$fd_ras_port" -t "$((fd_ras_t - 2))" "$@" 2>&1 |
      head -c "${FD_RAS_BYTES:-262144}"
  elif command -v nc >/dev/null 2>&1; then
    echo "@@fd_ras_start available=yes via=nc format=text addr=$fd_ras_h:$fd_ras_port"
    printf 'STATUS\n' | fd_stacks_to "$fd_ras_t" nc -w "$fd_ras_t" "$fd_ras_h" "$fd_ras_port" 2>/dev/null |
      head -c "${FD_RAS_BYTES:-262144}"
  else
    echo '@@fd_ras_start available=no reason=neither ncclras nor nc on the host to ask it'; return 0
  fi
  echo
  echo '@@fd_ras_end'

}

# shellcheck disable=SC2046 # PIDs are digits only: word splitting is the point
set -- $(fd_stacks_job_pids)
fd_stacks_main "$@"
fd_ras "$@"
