# shellcheck shell=sh disable=SC2209,SC2034
# SC2209: a plain word, not a command; SC2034: FTO is read by the snippet that follows
# What the facts snippets share (facts_gpu.sh, facts_serve.sh): see fleetdiag/facts/collect.py. The probe runs
# the GPU part beside the funnel and the serving part after it, so each gets its own copy of this.

fd_f() { printf 'F\t%s\t%s\n' "$1" "$2"; }
# timeout -k: a tool that ignores TERM (a wedged driver) is killed, never left running.
FTO=
if command -v timeout >/dev/null 2>&1; then
  if timeout -k 1 1 true >/dev/null 2>&1; then FTO="timeout -k 2 $FD_FTMO"; else FTO="timeout $FD_FTMO"; fi
fi
if [ -n "$FD_FPATH" ]; then PATH=$FD_FPATH:$PATH; export PATH; fi
