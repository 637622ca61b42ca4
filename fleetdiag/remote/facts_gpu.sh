# shellcheck shell=sh disable=SC2209
# SC2209: a plain word, not a command
# GPUs and their compute processes (probe and preflight), after facts_base.sh: see fleetdiag/facts/collect.py.
# nvidia-smi's output, at most FD_SMICAP bytes (never buffered whole), in $o; its exit status
# in $rc, or rc=cut when the output ran past the cap (the status line did not arrive).
fd_smi() {
  o=$( { $FTO nvidia-smi "$@" </dev/null 2>&1; printf '\n@rc %s\n' "$?"; } | head -c "$FD_SMICAP")
  rc=$(printf '%s\n' "$o" | tail -n 1)
  case $rc in
    '@rc '*) rc=${rc#@rc }; o=$(printf '%s\n' "$o" | sed '$d') ;;
    *) rc=cut ;;
  esac
}
fd_gpus() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then fd_f nvidia_smi missing; return; fi
  fd_f nvidia_smi "$(command -v nvidia-smi)"
  fd_smi --query-gpu="$FD_GPUQ" --format=csv,noheader,nounits
  if [ "$rc" = cut ]; then
    fd_f nvidia_smi_error "output over $FD_SMICAP bytes: not read"
    return
  fi
  if [ "$rc" -ne 0 ]; then
    fd_f nvidia_smi_error "exit $rc: $(printf '%s\n' "$o" | head -n 1 | cut -c1-300)"
    return
  fi
  printf '%s\n' "$o" | head -n 64 | cut -c1-1000 | while IFS= read -r l; do
    [ -n "$l" ] && fd_f gpu "$l"
  done
  fd_smi --query-compute-apps="$FD_APPQ" --format=csv,noheader,nounits
  [ "$rc" = 0 ] || return
  printf '%s\n' "$o" | head -n 128 | cut -c1-1000 | while IFS= read -r l; do
    case $l in ''|*'No running'*) continue ;; esac
    fd_f app "$l"
    p=${l%%,*}
    case $p in ''|*[!0-9]*) continue ;; esac
    if [ -r "/proc/$p/cmdline" ]; then
      c=$($FTO tr '\000' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-512)
      [ -n "$c" ] && printf 'F\tapp_cmd\t%s\t%s\n' "$p" "$c"
    fi
  done
}
fd_gpus
