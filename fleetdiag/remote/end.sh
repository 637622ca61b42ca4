# shellcheck shell=sh
# The end marker, in one write with what the funnel still holds (the remote clock: remote/clock.sh).
printf '%s%s end\n' "${fd_o:-}" "$FD_MARK"
