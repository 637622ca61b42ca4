#!/bin/bash
# #27, fourth pass, on the lent GPU host: this tree ("after") beside $BEFORE (another source tree,
# "before"), each measured with this tree's bench scripts, in one call. Parts (COST4_PARTS, words):
#   remote  bench/remote_split.py: the warm probe's remote work taken apart on the real GPU
#   decode  bench/decode_ab.py: the exec under base64 -d vs the awk decoder (this tree only)
#   warm    bench/warm_probe.py --gap 2: warm probe at 240 ms, back to back and after a gap
#   cpu     bench/cpu_floor.py --only warm at COST4_CPU_HOSTS (600) hosts: controller CPU beside clush
#   profile bench/warm_profile.py --plain: a warm sweep's CLI and keeper CPU apart
# Each table is printed as its bench ends and kept in $OUT. Setup as scale_device.sh (the carried bundle).
#
#   FLEETDIAG_BUNDLE=/abs/bundle BEFORE=/abs/tree COST4_PARTS="remote warm" bash bench/cost4_device.sh
set -eu
# shellcheck source=bench/_device_setup.sh
. "$(dirname "$0")/_device_setup.sh"
set +e
cost_bench_env
parts=${COST4_PARTS:-remote warm}
before_after_trees warm_probe.py remote_split.py warm_profile.py cpu_floor.py

case " $parts " in *" remote "*)
    for t in $trees; do
        s "remote work apart, $t"
        in_tree "$t" timeout "${COST4_REMOTE_S:-60}" "$PY" bench/remote_split.py --repeat 7 \
            --json-out "$OUTDIR/remote_$t.json" 2>&1 | tee "$OUTDIR/remote_$t.txt"
    done
    ;;
esac

case " $parts " in *" decode "*)
    s "the payload's decoders"
    timeout 60 "$PY" bench/decode_ab.py --repeat 15 2>&1 | tee "$OUTDIR/decode.txt"
    ;;
esac

case " $parts " in *" warm "*)
    for t in $trees; do
        s "warm probe, 240 ms, $t"
        in_tree "$t" timeout "${COST4_WARM_S:-150}" "$PY" bench/warm_probe.py --repeat 3 --gap 2 >"$OUTDIR/warm_$t.txt" 2>&1
        echo "rc=$?"
        tail -34 "$OUTDIR/warm_$t.txt"
    done
    ;;
esac

simhost_nvidia_smi || true # the simulated hosts share one driver: a stand-in answers for it

case " $parts " in *" profile "*)
    for t in $trees; do
        s "warm sweep CPU apart (CLI, keeper), ${COST4_PROFILE_HOSTS:-200} hosts, $t"
        in_tree "$t" env PATH="$VENV/bin:$PATH" timeout "${COST4_PROFILE_S:-120}" "$PY" bench/warm_profile.py --plain \
            --hosts "${COST4_PROFILE_HOSTS:-200}" --fanout 64 --json-out "$OUTDIR/profile_$t.json" 2>&1 |
            tee "$OUTDIR/profile_$t.txt"
    done
    ;;
esac

case " $parts " in *" cpu "*)
    for t in $trees; do
        s "controller CPU per host, warm, ${COST4_CPU_HOSTS:-600} hosts, $t"
        in_tree "$t" env PATH="$VENV/bin:$PATH" timeout "${COST4_CPU_S:-200}" "$PY" bench/cpu_floor.py \
            --hosts "${COST4_CPU_HOSTS:-600}" --fanout 64 --repeat 1 --only warm --json-out "$OUTDIR/cpu_$t.json" 2>&1 |
            tee "$OUTDIR/cpu_$t.txt"
    done
    ;;
esac
s end
