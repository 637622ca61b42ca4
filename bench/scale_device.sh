#!/bin/bash
# fleet.py on a bare many-core machine with no network: install OpenSSH and
# fleetdiag's dependencies from a carried bundle, then run the fleet bench.
#
#   bash bench/scale_device.sh --sizes 50 --fanout 64 [other bench/fleet.py options]
#
# The bundle (default .devwork/scale, or $FLEETDIAG_BUNDLE) holds:
#   debs/    openssh-server, openssh-client and the libraries sshd may lack
#            (libwrap0, libnsl2, libtirpc3, libsystemd0, libcrypt1), made with
#            `apt-get download`; unpacked with dpkg -x into $SSH_ROOT, never /,
#            and only the sonames the system lacks are added to the loader path
#   wheels/  pip, setuptools, and fleetdiag's dependencies for the target
#            Python (pip download --only-binary=:all: --python-version ...)
# The table goes to stdout and $OUT/fleet.txt, the numbers to $OUT/fleet.json
# ($OUT defaults to bench/out). Default tools: fleetdiag,clush (--tools overrides).
# Needs root (symlinks /usr/sbin/sshd, adds the sshd privilege-separation user).
set -eu

# shellcheck source=bench/_device_setup.sh
. "$(dirname "$0")/_device_setup.sh"

# ---------------------------------------------------------------- the bench
# 600+ hosts: one proxy port and up to two sockets per host in one process
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
say "$(nproc) cores, ulimit -n $(ulimit -n), load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r)"
set -o pipefail
PYTHONUNBUFFERED=1 "$VENV/bin/python" bench/fleet.py --tools fleetdiag,clush --no-install \
    --json-out "$OUTDIR/fleet.json" "$@" 2>&1 | tee "$OUTDIR/fleet.txt"
