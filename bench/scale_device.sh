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
# FLEETDIAG_BENCH=cpu_floor runs bench/cpu_floor.py with the arguments instead (same setup).
# FLEETDIAG_BENCH_SIM_GPU=1: the simulated hosts find bench/_simhost_nvidia_smi.sh first on their
# PATH (every tool sends it as the probe's path_prepend): the real nvidia-smi's answers, asked once,
# instead of one GPU driver queried by every simulated host at once.
# Needs root (symlinks /usr/sbin/sshd, adds the sshd privilege-separation user).
set -eu

# shellcheck source=bench/_device_setup.sh
. "$(dirname "$0")/_device_setup.sh"

# ---------------------------------------------------------------- the bench
# 600+ hosts: one proxy port and up to two sockets per host in one process
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# thousands of hosts: a listening proxy port per host, and two sockets per connection in TIME_WAIT after it
sysctl -qw net.ipv4.ip_local_port_range="10000 65000" net.ipv4.tcp_tw_reuse=1 2>/dev/null || true
say "$(nproc) cores, ulimit -n $(ulimit -n), ports $(tr '\t' - </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)," \
    "sshd MaxStartups ${FLEETDIAG_SSHD_MAXSTARTUPS:-200:30:400}, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r)"
if [ "${FLEETDIAG_BENCH_SIM_GPU:-0}" = 1 ] && real=$(command -v nvidia-smi); then
    sim=/opt/fleetdiag-simhost
    mkdir -p "$sim/cache"
    cp bench/_simhost_nvidia_smi.sh "$sim/nvidia-smi"
    chmod 0755 "$sim/nvidia-smi"
    echo "$real" >"$sim/real"
    export FLEETDIAG_BENCH_HOST_PATH=$sim
    say "simulated hosts: nvidia-smi is $sim/nvidia-smi (the answers of $real, asked once per argument list)"
fi
set -o pipefail
if [ "${FLEETDIAG_BENCH:-fleet}" = cpu_floor ]; then
    PATH="$VENV/bin:$PATH" PYTHONUNBUFFERED=1 "$VENV/bin/python" bench/cpu_floor.py "$@" 2>&1 | tee "$OUTDIR/cpu_floor.txt"
    exit
fi
PYTHONUNBUFFERED=1 "$VENV/bin/python" bench/fleet.py --tools fleetdiag,clush --no-install \
    --json-out "$OUTDIR/fleet.json" "$@" 2>&1 | tee "$OUTDIR/fleet.txt"
