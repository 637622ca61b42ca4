# fleetdiag kernel evidence (POSIX sh, read-only): kernel lines of interest and GPU health, in marked sections.
# Self-contained: functions prefixed fd_kernel_, no global options set. Bounds: FD_KERNEL_LINES, FD_KERNEL_BYTES.

fd_kernel_ere='NVRM|Xid|SXid|NVLink|nvlink|ECC|EDAC|GSP|[Oo]ut of memory|oom-kill|oom_reaper|Killed process|invoked oom-killer|segfault at|general protection|hung_task|blocked for more than|PCIe Bus Error|AER|[Mm]achine [Cc]heck|mce:|Hardware Error|fallen off the bus|GPU is lost|NV_ERR_|RmInitAdapter|Linux version'

fd_kernel_to() { # fd_kernel_to SECONDS CMD...: run under timeout -k where timeout exists
  fd_kernel_s=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout -k 2 "$fd_kernel_s" "$@"; else "$@"; fi
}

fd_kernel_thin() { # a flood of corrected PCIe errors (thousands a minute on a bad riser) must not push the
  # fault it precedes out of the newest lines: the first 20 are kept, then one in 50 (all, without awk)
  if command -v awk >/dev/null 2>&1; then
    awk '/[Cc]orrect(ed|able)/ && !/[Uu]ncorrect/ { n++; if (n > 20 && n % 50 != 0) next } { print }'
  else
    cat
  fi
}

fd_kernel_filter() { # keep lines of interest, the newest ones, bounded in lines and bytes
  grep -E "$fd_kernel_ere" | fd_kernel_thin | tail -n "${FD_KERNEL_LINES:-400}" | head -c "${FD_KERNEL_BYTES:-65536}"
  echo
}

fd_kernel_log() {
  printf '@@fd_kernel_clock now=%s uptime=%s tz=%s\n' "$(date +%s)" \
    "$(cut -d' ' -f1 /proc/uptime 2>/dev/null)" "$(date +%z 2>/dev/null)"
  if command -v journalctl >/dev/null 2>&1 &&
     fd_kernel_to 10 journalctl -k -q --no-pager -n 1 -o short-iso-precise 2>/dev/null | grep -q .; then
    echo '@@fd_kernel_source source=journalctl'
    fd_kernel_to 20 journalctl -k -b -q --no-pager -o short-iso-precise -n "${FD_KERNEL_SCAN:-200000}" 2>/dev/null |
      fd_kernel_filter
    echo '@@fd_kernel_end'
    return 0
  fi
  if command -v dmesg >/dev/null 2>&1 && fd_kernel_to 10 dmesg 2>/dev/null | head -n 1 | grep -q .; then
    echo '@@fd_kernel_source source=dmesg'
    # plain dmesg prints seconds since boot; the clock line above converts them
    fd_kernel_to 20 dmesg 2>/dev/null | fd_kernel_filter
    echo '@@fd_kernel_end'
    return 0
  fi
  for fd_kernel_f in "${FD_KERNEL_KERNLOG:-/var/log/kern.log}" /var/log/messages; do
    if [ -r "$fd_kernel_f" ] && [ -s "$fd_kernel_f" ]; then
      echo '@@fd_kernel_source source=kern.log'
      tail -n "${FD_KERNEL_SCAN:-200000}" "$fd_kernel_f" 2>/dev/null | fd_kernel_filter
      echo '@@fd_kernel_end'
      return 0
    fi
  done
  printf '@@fd_kernel_unreadable dmesg_restrict=%s user=%s groups=%s\n' \
    "$(cat /proc/sys/kernel/dmesg_restrict 2>/dev/null)" "$(id -un 2>/dev/null)" \
    "$(id -Gn 2>/dev/null | tr ' ' ',')"
}

fd_kernel_gpu_health() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo '@@fd_gpu_health status=absent'
    return 0
  fi
  # The fields of today's drivers first (one call; asking --help-query-gpu which name the slowdown
  # reasons have cost a second one), then the older name of the reasons, then the fields every driver knows.
  for fd_kernel_r in clocks_event_reasons clocks_throttle_reasons -; do
    if [ "$fd_kernel_r" = - ]; then
      fd_kernel_q='index,pci.bus_id,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending,pcie.link.width.current,pcie.link.width.max'
    else
      fd_kernel_q="index,pci.bus_id,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,$fd_kernel_r.hw_slowdown,$fd_kernel_r.hw_thermal_slowdown,$fd_kernel_r.hw_power_brake_slowdown,$fd_kernel_r.sw_thermal_slowdown"
    fi
    fd_kernel_out=$(fd_kernel_to 15 nvidia-smi --query-gpu="$fd_kernel_q" --format=csv 2>&1 | head -c 32768)
    case $fd_kernel_out in
      *'is not a valid field'*|*'Invalid combination'*) ;;
      *) break ;;
    esac
  done
  printf '@@fd_gpu_health status=ok fields=%s\n%s\n@@fd_gpu_health_end\n' "$fd_kernel_q" "$fd_kernel_out"
}

fd_kernel_main() {
  fd_kernel_log
  fd_kernel_gpu_health
}
