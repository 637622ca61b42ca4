# fleetdiag stacks (POSIX sh, read-only, low priority): where each of the job's Python processes waits.
# The second round trip, asked for when a host's log is stalled. Self-contained: functions prefixed fd_stacks_,
# no global options set. Entry: fd_stacks_main [PID...]; without PIDs, the job's processes (fd_stacks_find).
# Per process: py-spy dump (native frames when it can) where py-spy is installed, always the /proc view
# (state, wchan, every thread's state and wchan), RANK/LOCAL_RANK-like variables from its environment (only those);
# then, where nvidia-smi exists, each GPU's utilisation and which pid uses which GPU.
# Bounds: FD_STACKS_MAX processes (16), FD_STACKS_THREADS thread lines per process (128), FD_STACKS_BYTES per
# dump (65536), FD_STACKS_TIMEOUT seconds per dump (20). FD_STACKS_PYSPY: a py-spy not on PATH (none: do not use one).

fd_stacks_to() { # fd_stacks_to SECONDS CMD...: run under timeout -k where timeout exists, at low priority
  fd_stacks_s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout -k 2 "$fd_stacks_s" nice -n 19 "$@"; else nice -n 19 "$@"; fi
}

fd_stacks_pyspy_path() { # the py-spy to use, or nothing
  if [ -n "${FD_STACKS_PYSPY:-}" ]; then # an explicit choice; one that is not executable (none) turns py-spy off
    [ -x "$FD_STACKS_PYSPY" ] || return 1
    echo "$FD_STACKS_PYSPY"; return 0
  fi
  if command -v py-spy >/dev/null 2>&1; then command -v py-spy; return 0; fi
  for fd_stacks_c in "${HOME:-/nonexistent}/.local/bin/py-spy" /usr/local/bin/py-spy; do
    if [ -x "$fd_stacks_c" ]; then echo "$fd_stacks_c"; return 0; fi
  done
  return 1
}

fd_stacks_is_job() { # fd_stacks_is_job PID: argv[0] names a Python interpreter or an ML launcher/worker
  # argv[0] only: a shell whose script mentions python is not a Python process
  fd_stacks_a0=$({ tr '\000' '\n' < "/proc/$1/cmdline"; } 2>/dev/null | head -n 1)
  case ${fd_stacks_a0##*/} in
    python|python[0-9]*|pypy*|torchrun|vllm|vllm::*|VLLM::*|sglang*|deepspeed|accelerate|ray::*|pt_main_thread*)
      return 0 ;;
  esac
  case $fd_stacks_a0 in ray::*|VLLM::*|sglang::*) return 0 ;; esac
  return 1
}

fd_stacks_gpu_fds() { # fd_stacks_gpu_fds PID: how many /dev/nvidia* files it holds open (a rank holds its GPU)
  # one ls, not a readlink per descriptor (a rank holds thousands); only the link targets are read
  # shellcheck disable=SC2010
  ls -l "/proc/$1/fd" 2>/dev/null | grep -c ' -> /dev/nvidia'
}

fd_stacks_tool() { # fd_stacks_tool PID: a Python process that is nobody's job (fleetdiag, its keeper, pytest, pip)
  fd_stacks_cl=$({ tr '\000' ' ' < "/proc/$1/cmdline"; } 2>/dev/null | head -c 4096)
  case $fd_stacks_cl in
    # the program or module by name, never a path that merely contains the word (a checkout called fleetdiag/)
    *bin/fleetdiag|*bin/fleetdiag\ *|*"from fleetdiag"*|*"-m fleetdiag"*|*"import fleetdiag"*) return 0 ;;
    *bin/pytest|*bin/pytest\ *|*"-m pytest"*|*bin/py.test*|*bin/pip\ *|*"-m pip "*|*ipykernel*|*bin/jupyter*) return 0 ;;
  esac
  return 1
}

fd_stacks_find() { # PIDs of the job's Python processes, at most FD_STACKS_MAX: those holding a GPU first
  fd_stacks_me=$$
  grep -aliE 'python|torchrun|vllm|sglang|ray::|deepspeed|accelerate|pt_main_thread' /proc/[0-9]*/cmdline 2>/dev/null |
    sed -n 's|^/proc/\([0-9][0-9]*\)/cmdline$|\1|p' | sort -n | while read -r fd_stacks_p; do
      [ "$fd_stacks_p" = "$fd_stacks_me" ] && continue
      fd_stacks_is_job "$fd_stacks_p" || continue
      fd_stacks_tool "$fd_stacks_p" && continue
      if [ "$(fd_stacks_gpu_fds "$fd_stacks_p")" -gt 0 ]; then echo "0 $fd_stacks_p"; else echo "1 $fd_stacks_p"; fi
    done | sort -k1,1n -k2,2n | head -n "${FD_STACKS_MAX:-16}" | cut -d' ' -f2
}

fd_stacks_threads() { # fd_stacks_threads PID: "tid state wchan comm" per thread, bounded
  fd_stacks_n=0
  for fd_stacks_t in /proc/"$1"/task/[0-9]*; do
    [ -d "$fd_stacks_t" ] || continue
    fd_stacks_n=$((fd_stacks_n + 1))
    [ "$fd_stacks_n" -gt "${FD_STACKS_THREADS:-128}" ] && continue
    fd_stacks_st='' fd_stacks_w=''
    { IFS= read -r fd_stacks_st < "$fd_stacks_t/stat"; } 2>/dev/null || :
    { IFS= read -r fd_stacks_w < "$fd_stacks_t/wchan"; } 2>/dev/null || :
    fd_stacks_comm=${fd_stacks_st#*(}; fd_stacks_comm=${fd_stacks_comm%)*}
    fd_stacks_rest=${fd_stacks_st##*) }
    printf '%s %s %s %s\n' "${fd_stacks_t##*/}" "${fd_stacks_rest%% *}" "${fd_stacks_w:--}" "$fd_stacks_comm"
  done
  echo "@@fd_stacks_threads_end count=$fd_stacks_n"
}

fd_stacks_pyspy() { # fd_stacks_pyspy PYSPY PID: native frames first, plain frames when native unwinding fails
  fd_stacks_mode=native
  fd_stacks_out=$(fd_stacks_to "${FD_STACKS_TIMEOUT:-20}" "$1" dump --native --pid "$2" 2>&1)
  fd_stacks_rc=$?
  case $fd_stacks_out in
    *[Pp]ermission*|*'not permitted'*|*EPERM*) ;;
    *)
      if [ "$fd_stacks_rc" -ne 0 ]; then
        fd_stacks_mode=plain
        fd_stacks_out=$(fd_stacks_to "${FD_STACKS_TIMEOUT:-20}" "$1" dump --pid "$2" 2>&1)
        fd_stacks_rc=$?
      fi ;;
  esac
  fd_stacks_status=ok
  case $fd_stacks_rc in
    0) ;;
    124|137) fd_stacks_status=timeout ;;
    *) case $fd_stacks_out in
         *[Pp]ermission*|*'not permitted'*|*EPERM*) fd_stacks_status=denied ;;
         *) fd_stacks_status=failed ;;
       esac ;;
  esac
  printf '@@fd_stacks_pyspy pid=%s mode=%s\n' "$2" "$fd_stacks_mode"
  printf '%s\n' "$fd_stacks_out" | head -c "${FD_STACKS_BYTES:-65536}"
  printf '\n@@fd_stacks_pyspy_end pid=%s rc=%s status=%s\n' "$2" "$fd_stacks_rc" "$fd_stacks_status"
}

fd_stacks_proc() { # fd_stacks_proc PYSPY PID: one process, every view of it
  fd_stacks_p=$2
  case $fd_stacks_p in
    ''|*[!0-9]*) echo '@@fd_stacks_badpid'; return 0 ;;
  esac
  if [ ! -r "/proc/$fd_stacks_p/stat" ]; then
    echo "@@fd_stacks_gone pid=$fd_stacks_p"
    return 0
  fi
  fd_stacks_st='' fd_stacks_w=''
  { IFS= read -r fd_stacks_st < "/proc/$fd_stacks_p/stat"; } 2>/dev/null || :
  { IFS= read -r fd_stacks_w < "/proc/$fd_stacks_p/wchan"; } 2>/dev/null || :
  fd_stacks_rest=${fd_stacks_st##*) }
  # shellcheck disable=SC2086 # the stat fields after "(comm) ": split on purpose
  set -- "$1" $fd_stacks_rest
  fd_stacks_sc=
  { read -r fd_stacks_sc _ < "/proc/$fd_stacks_p/syscall"; } 2>/dev/null || :
  case $fd_stacks_sc in ''|*[!0-9]*) fd_stacks_sc=- ;; esac
  printf '@@fd_stacks_proc pid=%s state=%s ppid=%s wchan=%s gpu_fds=%s syscall=%s\n' "$fd_stacks_p" "${2:-?}" "${3:-?}" \
    "${fd_stacks_w:--}" "$(fd_stacks_gpu_fds "$fd_stacks_p")" "$fd_stacks_sc"
  printf '@@fd_stacks_cmdline %s\n' "$({ tr '\000\n' '  ' < "/proc/$fd_stacks_p/cmdline"; } 2>/dev/null | head -c 512)"
  # only the rank/device variables leave the host, never the rest of the environment
  printf '@@fd_stacks_environ %s\n' "$({ tr '\000' '\n' < "/proc/$fd_stacks_p/environ"; } 2>/dev/null |
    grep -E '^(RANK|LOCAL_RANK|GROUP_RANK|NODE_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|CUDA_VISIBLE_DEVICES|OMPI_COMM_WORLD_RANK|OMPI_COMM_WORLD_LOCAL_RANK|SLURM_PROCID|SLURM_LOCALID|PMI_RANK|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_RUN_ID|NCCL_RAS_ENABLE|NCCL_RAS_ADDR)=[A-Za-z0-9,._:-]{0,128}$' |
    tr '\n' ' ' | head -c 512)"
  if [ -n "$1" ]; then
    fd_stacks_pyspy "$1" "$fd_stacks_p"
  fi
  echo "@@fd_stacks_threads pid=$fd_stacks_p"
  fd_stacks_threads "$fd_stacks_p"
  echo "@@fd_stacks_end pid=$fd_stacks_p"
}

fd_stacks_gpus() { # per GPU: index, bus id, utilisation; per compute process: pid, bus id (pid -> GPU)
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  echo '@@fd_stacks_gpus'
  fd_stacks_to 15 nvidia-smi --query-gpu=index,pci.bus_id,utilization.gpu --format=csv,noheader,nounits 2>&1 |
    head -n 64 | head -c 8192
  echo '@@fd_stacks_apps'
  fd_stacks_to 15 nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader 2>&1 | head -n 512 |
    head -c 16384
  echo '@@fd_stacks_gpus_end'
}

fd_stacks_main() { # fd_stacks_main [PID...]
  renice -n 19 -p $$ >/dev/null 2>&1
  ionice -c3 -p $$ >/dev/null 2>&1
  fd_stacks_py=$(fd_stacks_pyspy_path) || fd_stacks_py=
  fd_stacks_scope=
  { IFS= read -r fd_stacks_scope < /proc/sys/kernel/yama/ptrace_scope; } 2>/dev/null || :
  printf '@@fd_stacks_start now=%s uid=%s user=%s pyspy=%s ptrace_scope=%s arch=%s\n' "$(date +%s)" "$(id -u 2>/dev/null)" \
    "$(id -un 2>/dev/null)" "${fd_stacks_py:-absent}" "${fd_stacks_scope:--}" "$(uname -m 2>/dev/null)"
  if [ "$#" -eq 0 ]; then
    # shellcheck disable=SC2046 # PIDs are digits only: word splitting is the point
    set -- $(fd_stacks_find)
    printf '@@fd_stacks_found count=%s\n' "$#"
  fi
  fd_stacks_k=0
  for fd_stacks_pid in "$@"; do
    fd_stacks_k=$((fd_stacks_k + 1))
    [ "$fd_stacks_k" -gt "${FD_STACKS_MAX:-16}" ] && break
    fd_stacks_proc "$fd_stacks_py" "$fd_stacks_pid"
  done
  fd_stacks_gpus
  echo '@@fd_stacks_done'
}
