# shellcheck shell=sh
# What the node already knows about the job whose log the funnel read (fleetdiag/facts/node.py): read-only,
# bounded, after the funnel (which leaves $f, the log, and $rp, the latest run's start offset, behind).
#   N<TAB>proc<TAB>pid=P ppid=Q state=S env=K=V,K=V cmd=ARGV  the job's processes: those whose stdout or
#       stderr is the log, and their children (FD_NODE_PROCS at most); only the rank/rendezvous variables
#       of their environment (the names below, values of [A-Za-z0-9,._:/-] only), never the rest
#   N<TAB>file<TAB>ID<TAB>KIND<TAB>SIZE<TAB>MTIME<TAB>PATH      one file the node wrote about the job:
#       errfile (torchelastic's error file: the summary's error_file:, TORCHELASTIC_ERROR_FILE) or
#       fr (a Flight Recorder dump: TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE of the job,
#       FD_NODE_FR, else the default prefix /tmp/nccl_trace_rank_)
#   N<TAB>b64<TAB>ID<TAB>CHUNK                                  its bytes, base64 (a pickle is binary)
#   N<TAB>note<TAB>TEXT                                         what was skipped, and why
# Bounds: FD_NODE_PROCS processes (16), FD_NODE_FILES files of each kind (8), FD_NODE_ERRB bytes per error
# file (65536), FD_NODE_FRB bytes per dump (2 MiB), FD_NODE_TOTAL bytes of files in all (3 MiB: base64 keeps the
# answer under the transport's output cap); a larger file is named, not read. Only regular files.

fd_n() { printf 'N\t%s\t%s\n' "$1" "$2"; }

fd_node_pids() { # the processes whose fd 1 or 2 is the log, then their children
  fd_node_lp=$(readlink -f "$1" 2>/dev/null) || return 0
  [ -n "$fd_node_lp" ] || return 0
  # shellcheck disable=SC2012 # ls -l shows each descriptor's target: the one place the open file shows
  ls -l /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2 2>/dev/null | FD_NODE_LP=$fd_node_lp LC_ALL=C awk '
    BEGIN { t = " -> " ENVIRON["FD_NODE_LP"]; n = length(t) }
    length($0) >= n && substr($0, length($0) - n + 1) == t {
      for (i = 1; i <= NF; i++) if ($i ~ /^\/proc\/[0-9]+\/fd\/[12]$/) { split($i, a, "/"); if (!(a[3] in s)) { s[a[3]] = 1; print a[3] } }
    }' | head -n "${FD_NODE_PROCS:-16}"
}

fd_node_children() { # PIDs whose parent is one of "$@"
  for fd_node_s in /proc/[0-9]*/stat; do
    fd_node_st=
    { IFS= read -r fd_node_st < "$fd_node_s"; } 2>/dev/null || continue
    fd_node_r=${fd_node_st##*) }
    # shellcheck disable=SC2086 # the stat fields: split on purpose
    set -- $fd_node_r
    printf '%s %s\n' "${fd_node_s#/proc/}" "${2:-}"
  done | sed 's|/stat||'
}

fd_node_env() { # the rank/rendezvous variables of one process, one K=V list
  { tr '\000' '\n' < "/proc/$1/environ"; } 2>/dev/null |
    grep -E '^(RANK|LOCAL_RANK|GROUP_RANK|NODE_RANK|ROLE_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_RUN_ID|TORCHELASTIC_ERROR_FILE|TORCH_FR_DUMP_TEMP_FILE|TORCH_NCCL_DEBUG_INFO_TEMP_FILE|NCCL_RAS_ENABLE|NCCL_RAS_ADDR|NCCL_RAS_TIMEOUT_FACTOR|CUDA_VISIBLE_DEVICES|SLURM_PROCID|SLURM_NODEID|SLURM_JOB_ID|OMPI_COMM_WORLD_RANK|OMPI_COMM_WORLD_SIZE)=[A-Za-z0-9,._:/-]{0,256}$' |
    head -n 40 | tr '\n' ',' | sed 's/,$//'
}

fd_node_file() { # fd_node_file KIND MAXBYTES PATH: name it, and send its bytes when it is small enough
  fd_node_id=$((fd_node_id + 1))
  if [ ! -f "$3" ] || [ -L "$3" ]; then fd_n note "$1 $3: not a regular file"; return 0; fi
  [ -r "$3" ] || { fd_n note "$1 $3: not readable"; return 0; }
  fd_node_sz=$(wc -c < "$3" 2>/dev/null | tr -d ' ')
  fd_node_mt=$(date -r "$3" +%s 2>/dev/null || stat -c %Y "$3" 2>/dev/null)
  printf 'N\tfile\t%s\t%s\t%s\t%s\t%s\n' "$fd_node_id" "$1" "${fd_node_sz:-0}" "${fd_node_mt:-}" "$3"
  if [ "${fd_node_sz:-0}" -gt "$2" ]; then fd_n note "$1 $3: $fd_node_sz bytes, over the $2 read"; return 0; fi
  if [ $((fd_node_sent + ${fd_node_sz:-0})) -gt "${FD_NODE_TOTAL:-3145728}" ]; then
    fd_n note "$1 $3: not sent, the ${FD_NODE_TOTAL:-3145728} bytes of files one probe sends are spent"; return 0
  fi
  fd_node_sent=$((fd_node_sent + ${fd_node_sz:-0}))
  if command -v base64 >/dev/null 2>&1; then
    head -c "$2" "$3" 2>/dev/null | base64 2>/dev/null | while IFS= read -r fd_node_l; do
      printf 'N\tb64\t%s\t%s\n' "$fd_node_id" "$fd_node_l"
    done
  elif [ "${fd_node_sz:-0}" -le 262144 ]; then # no base64: hex, for the small ones
    head -c "$2" "$3" 2>/dev/null | od -An -v -tx1 | tr -d ' \n' | fold -w 4096 | while IFS= read -r fd_node_l; do
      printf 'N\thex\t%s\t%s\n' "$fd_node_id" "$fd_node_l"
    done
  else
    fd_n note "$1 $3: no base64 on the host to send it"
  fi
}

fd_node_main() {
  fd_node_id=0
  fd_node_list=
  if [ -n "${f:-}" ]; then
    fd_node_list=$(fd_node_pids "$f")
  fi
  if [ -n "$fd_node_list" ]; then
    fd_node_all=" $(echo "$fd_node_list" | tr '\n' ' ') "
    fd_node_kids=$(fd_node_children | awk -v want="$fd_node_all" 'index(want, " " $2 " ") { print $1 }' | head -n "${FD_NODE_PROCS:-16}")
    for fd_node_p in $fd_node_kids; do
      case $fd_node_all in *" $fd_node_p "*) ;; *) fd_node_all="$fd_node_all$fd_node_p " ;; esac
    done
    fd_node_k=0
    for fd_node_p in $fd_node_all; do
      fd_node_k=$((fd_node_k + 1))
      [ "$fd_node_k" -gt "${FD_NODE_PROCS:-16}" ] && break
      fd_node_st=
      { IFS= read -r fd_node_st < "/proc/$fd_node_p/stat"; } 2>/dev/null || continue
      fd_node_r=${fd_node_st##*) }
      # shellcheck disable=SC2086 # the stat fields: split on purpose
      set -- $fd_node_r
      fd_node_cmd=$({ tr '\000\n\t' '   ' < "/proc/$fd_node_p/cmdline"; } 2>/dev/null | head -c 512)
      fd_node_e=$(fd_node_env "$fd_node_p")
      fd_n proc "pid=$fd_node_p ppid=${2:-?} state=${1:-?} env=$fd_node_e cmd=$fd_node_cmd"
      fd_node_envs="$fd_node_envs,$fd_node_e"
    done
  fi
  # torchelastic error files: the latest run's error_file: lines, and the job's TORCHELASTIC_ERROR_FILE
  fd_node_errs=
  if [ -n "${f:-}" ] && [ -f "$f" ] && [ -r "$f" ]; then  # a regular file only: a FIFO would block
    # the latest run's part, its last 4 MiB at most: a seek, not a second pass over a large log
    fd_node_at=$(( ${size:-0} - 4194304 ))
    [ "$fd_node_at" -gt "${rp:-0}" ] || fd_node_at=${rp:-0}
    fd_node_errs=$(tail -c "+$(( fd_node_at + 1 ))" "$f" 2>/dev/null | tail -c 4194304 | tr -d '\000\r' |
      grep -a -o -E 'error_file: */[A-Za-z0-9._/-]+\.json' | sed 's/^error_file: *//' | sort -u | head -n "${FD_NODE_FILES:-8}")
  fi
  fd_node_ev=$(printf '%s\n' "${fd_node_envs:-}" | tr ',' '\n' | sed -n 's/^TORCHELASTIC_ERROR_FILE=//p' | grep -E '\.json$')
  for fd_node_x in $(printf '%s\n%s\n' "$fd_node_errs" "$fd_node_ev" | grep . | sort -u | head -n "${FD_NODE_FILES:-8}"); do
    fd_node_file errfile "${FD_NODE_ERRB:-65536}" "$fd_node_x"
  done
  # Flight Recorder dumps: the job's prefix, the inventory's, else the default one
  fd_node_pre=$(printf '%s\n' "${fd_node_envs:-}" | tr ',' '\n' | sed -n 's/^TORCH_FR_DUMP_TEMP_FILE=//p; s/^TORCH_NCCL_DEBUG_INFO_TEMP_FILE=//p' | sort -u)
  [ -n "$fd_node_pre" ] || fd_node_pre=${FD_NODE_FR:-/tmp/nccl_trace_rank_}
  fd_node_n=0
  for fd_node_x in $fd_node_pre; do
    case $fd_node_x in /*) ;; *) continue ;; esac
    for fd_node_d in "$fd_node_x"[0-9]*; do
      [ -e "$fd_node_d" ] || continue
      fd_node_n=$((fd_node_n + 1))
      [ "$fd_node_n" -gt "${FD_NODE_FILES:-8}" ] && { fd_n note "more Flight Recorder dumps than ${FD_NODE_FILES:-8}: the rest not read"; break 2; }
      fd_node_file fr "${FD_NODE_FRB:-2097152}" "$fd_node_d"
    done
  done
}
fd_node_envs=
fd_node_sent=0
fd_node_main
