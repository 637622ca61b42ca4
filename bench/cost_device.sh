#!/bin/bash
# #27 on the lent GPU host in one call: the warm probe at 240 ms beside `ssh host true`, `analyze` on
# 1 GiB beside `grep -c`, then controller CPU per host beside clush while the time lasts. Each table is
# printed as its bench ends (and kept in $OUT). Setup as scale_device.sh (the carried bundle).
#
#   FLEETDIAG_BUNDLE=/abs/bundle bash bench/cost_device.sh
#
# COST_CPU_HOSTS (200), COST_CPU_S (seconds for the CPU rows; 0 skips them), COST_WARM_S, COST_ANALYZE_S.
set -eu
# shellcheck source=bench/_device_setup.sh
. "$(dirname "$0")/_device_setup.sh"
set +e
cost_bench_env

s "warm probe, 240 ms"
timeout "${COST_WARM_S:-110}" "$PY" bench/warm_probe.py --repeat 3 >"$OUTDIR/warm.txt" 2>&1
echo "rc=$?"
tail -32 "$OUTDIR/warm.txt"

s "analyze 1 GiB"
timeout "${COST_ANALYZE_S:-120}" "$PY" bench/analyze_big.py --sizes-mb 100,1024 --repeat 3 --json-out "$OUTDIR/analyze.json" \
    >"$OUTDIR/analyze.txt" 2>&1
echo "rc=$?"
tail -30 "$OUTDIR/analyze.txt"

if [ "${COST_CPU_S:-120}" -gt 0 ]; then
    simhost_nvidia_smi || true
    s "controller CPU per host, ${COST_CPU_HOSTS:-200} hosts"
    PATH="$VENV/bin:$PATH" timeout "${COST_CPU_S:-120}" "$PY" bench/cpu_floor.py --hosts "${COST_CPU_HOSTS:-200}" \
        --fanout 64 --repeat 1 --only "kept,probe_many,warm" --json-out "$OUTDIR/cpu.json" 2>&1 | tee "$OUTDIR/cpu.txt"
    echo "rc=$?"
fi
s end
