# shellcheck shell=sh
# The remote clock and zone, read last so the answer leaves right after it: fleetdiag/job/ puts a host's
# log times on the local clock with it (offset = local receive time - RTT/2 - this). %N is GNU date's;
# busybox prints it literally and the reader keeps the whole seconds.
m clock "$(date '+%s.%N %z' 2>/dev/null)"
