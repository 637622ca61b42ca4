# shellcheck shell=sh disable=SC2034
# SC2034: fd_o is written by remote/end.sh, with the end marker
# The remote clock and zone, read last so the answer leaves right after it: fleetdiag/job/ puts a host's
# log times on the local clock with it (offset = local receive time - RTT/2 - this). %N is GNU date's;
# busybox prints it literally and the reader keeps the whole seconds. Held: it leaves with the end marker.
fd_o="${fd_o:-}M${T}clock$T$(date '+%s.%N %z' 2>/dev/null)$NL"
