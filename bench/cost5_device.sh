#!/bin/bash
# #27, fifth and sixth passes, on the lent GPU host: this tree ("after") beside $BEFORE (another source tree, "before"),
# each measured with this tree's bench scripts, in one call. Parts (COST5_PARTS, words, in this order):
#   cpu     bench/cpu_floor.py at COST5_CPU_HOSTS (600) hosts: the warm CLI row per tree beside clush, and
#           (after only) asyncssh's kept-connection exec as the probe's answer comes and written at once
#   profile bench/warm_profile.py --plain at COST5_PROFILE_HOSTS (200): a warm sweep's CLI and keeper CPU apart
#   warm    bench/warm_probe.py --gap 2: warm probe at 240 ms, back to back and after a gap
# COST_ORDER=reversed runs "after" first; COST5_AFTER_ONLY (warm,kept) the after tree's rows.
# Each table is printed as its bench ends and kept in $OUT. Setup as scale_device.sh (the carried bundle).
#
#   FLEETDIAG_BUNDLE=/abs/bundle BEFORE=/abs/tree COST5_PARTS="cpu profile" bash bench/cost5_device.sh
set -eu
# shellcheck source=bench/_device_setup.sh
. "$(dirname "$0")/_device_setup.sh"
set +e
cost_bench_env
parts=${COST5_PARTS:-cpu profile}
before_after_trees warm_probe.py warm_profile.py cpu_floor.py _common.py

# before each tree's row: the simulated hosts of the row before wind down first (the 1-minute load under
# COST5_SETTLE_LOAD, 4, or COST5_SETTLE_S seconds, 60, at most), so the second tree does not run on the
# first one's load
settle() {
    n=0
    while [ "$n" -lt "${COST5_SETTLE_S:-60}" ] &&
        awk -v m="${COST5_SETTLE_LOAD:-4}" '{ exit !($1 >= m) }' /proc/loadavg; do
        sleep 5
        n=$((n + 5))
    done
}

for part in $parts; do
    case $part in
    warm)
        for t in $trees; do
            s "warm probe, 240 ms, $t"
            in_tree "$t" timeout "${COST5_WARM_S:-150}" "$PY" bench/warm_probe.py --repeat 3 --gap 2 >"$OUTDIR/warm_$t.txt" 2>&1
            echo "rc=$?"
            tail -34 "$OUTDIR/warm_$t.txt"
        done
        ;;
    cpu)
        simhost_nvidia_smi || true # the simulated hosts share one driver: a stand-in answers for it
        for t in $trees; do
            settle
            only=warm
            [ "$t" = after ] && only=${COST5_AFTER_ONLY:-warm,kept}
            s "controller CPU per host, warm, ${COST5_CPU_HOSTS:-600} hosts, $t"
            in_tree "$t" env PATH="$VENV/bin:$PATH" timeout "${COST5_CPU_S:-200}" "$PY" bench/cpu_floor.py \
                --hosts "${COST5_CPU_HOSTS:-600}" --fanout 64 --repeat 1 --only "$only" \
                --json-out "$OUTDIR/cpu_$t.json" 2>&1 | tee "$OUTDIR/cpu_$t.txt"
        done
        ;;
    profile)
        simhost_nvidia_smi || true
        for t in $trees; do
            settle
            s "warm sweep CPU apart (CLI, keeper), ${COST5_PROFILE_HOSTS:-200} hosts, $t"
            in_tree "$t" env PATH="$VENV/bin:$PATH" timeout "${COST5_PROFILE_S:-120}" "$PY" bench/warm_profile.py \
                --plain --hosts "${COST5_PROFILE_HOSTS:-200}" --fanout 64 --json-out "$OUTDIR/profile_$t.json" 2>&1 |
                tee "$OUTDIR/profile_$t.txt"
        done
        ;;
    esac
done
s end
