#!/bin/sh
# nvidia-smi for simulated hosts: every simulated host of a many-host bench is the same machine,
# so the real nvidia-smi would serve them all through one GPU driver (64 at once took seconds
# of system CPU each), a queue no real fleet has: each real host asks its own driver. This
# stand-in answers what the real one answered for the same arguments, asked once and kept
# (cache/ beside this file); the path of the real one is in the file `real` beside it.
# Installed by bench/scale_device.sh (FLEETDIAG_BENCH_SIM_GPU=1) and put first on the simulated
# hosts' PATH through the probe's own --path-prepend (FLEETDIAG_BENCH_HOST_PATH).
here=$(dirname "$0")
key=$(printf '%s\n' "$@" | cksum | tr ' ' _)
f=$here/cache/$key
if [ ! -f "$f.rc" ]; then
  "$(cat "$here/real")" "$@" >"$f.out.$$" 2>&1
  echo "$?" >"$f.rc.$$"
  mv "$f.out.$$" "$f.out"
  mv "$f.rc.$$" "$f.rc"
fi
cat "$f.out"
exit "$(cat "$f.rc")"
