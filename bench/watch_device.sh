#!/bin/bash
# watch_cli.py on a bare many-core machine (the device): the same bundle as scale_device.sh, then
# detection through the CLI for 1, 3 and 50 hosts, the bare `ssh tail -F` floor beside it, and (when
# $BEFORE names a second source tree) the same hosts on that tree, for a before/after on one machine;
# first the follower by hand (watch_follower.py), and each detection traced (watch_cli.py --trace).
#
#   OUT=... FLEETDIAG_BUNDLE=... bash bench/watch_device.sh
#
# Each result is one JSON line on stdout and in $OUT/watch.jsonl, written as it comes (a run cut by
# its time limit keeps what it had). Needs root, as scale_device.sh.
set -eu

# shellcheck source=bench/_device_setup.sh
. "$(dirname "$0")/_device_setup.sh"

ulimit -n 65536 2>/dev/null || true
say "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r), $(tail --version | head -n 1)"
res=$OUTDIR/watch.jsonl
: >"$res"
bench() { # one watch_cli.py run; its lines go to stdout and the results file
    PYTHONUNBUFFERED=1 nice -n 0 "$VENV/bin/python" "$@" 2>&1 | tee -a "$res"
}
bench bench/watch_follower.py --block --seconds 6 # the follower by hand: stdin sent EOF, or kept open
bench bench/watch_cli.py --hosts "${HOSTS_AFTER:-1,3,50}" --rounds "${ROUNDS:-3}" --settle 10 --trace "$OUTDIR/trace"
bench bench/watch_cli.py --floor --hosts "${HOSTS_FLOOR:-1,50}" --rounds "${ROUNDS_FLOOR:-2}"
if [ -n "${BEFORE:-}" ] && [ -d "$BEFORE" ]; then # the older tree, run from its own directory
    echo "== before: $BEFORE"
    (cd "$BEFORE" && PYTHONPATH=$PWD bench "$OLDPWD/bench/watch_cli.py" --hosts "${HOSTS_BEFORE:-3,50}" --rounds "${ROUNDS_BEFORE:-2}" --settle 5)
fi
