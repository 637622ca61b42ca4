# shellcheck shell=sh
# Run by the shell that runs everything else, before anything forks: every part of the
# script (the funnel, and the parts beside it) inherits the C locale and the lowest CPU
# and I/O priority. ($$ is this shell, also inside a subshell: so it is set here.)
# FD_NICE is empty for `fleetdiag analyze` on the user's own machine: the user is waiting for it.
LC_ALL=C; export LC_ALL
if [ -n "${FD_NICE:-}" ]; then
  renice -n 19 -p $$ >/dev/null 2>&1
  ionice -c3 -p $$ >/dev/null 2>&1
fi
