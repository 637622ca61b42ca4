# shellcheck shell=bash
# Sourced by the device benches (scale_device.sh, watch_device.sh) after `set -eu`: OpenSSH and
# fleetdiag's dependencies from the carried bundle onto a bare machine, then one login through the test
# sshd. Sets BUNDLE, OUTDIR, SSH_ROOT, VENV and say(); see scale_device.sh for the bundle's layout.
cd "$(dirname "$0")/.." || exit 1
BUNDLE=${FLEETDIAG_BUNDLE:-.devwork/scale}
OUTDIR=${OUT:-bench/out}
SSH_ROOT=${FLEETDIAG_SSH_ROOT:-/opt/fleetdiag-ssh}
VENV=${FLEETDIAG_VENV:-/opt/fleetdiag-venv}
mkdir -p "$OUTDIR"
say() { printf '== %s\n' "$*"; }

# ---------------------------------------------------------------- OpenSSH
missing_libs() { # the sonames one binary cannot resolve
    ldd "$1" 2>/dev/null | awk '/not found/ {print $1}'
}

if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null; then
    say "OpenSSH already here: $(ssh -V 2>&1)"
else
    say "unpacking OpenSSH into $SSH_ROOT"
    mkdir -p "$SSH_ROOT/libsrc" "$SSH_ROOT/lib"
    for deb in "$BUNDLE"/debs/openssh-*.deb; do dpkg -x "$deb" "$SSH_ROOT"; done
    for deb in "$BUNDLE"/debs/lib*.deb; do dpkg -x "$deb" "$SSH_ROOT/libsrc"; done
    bins="$SSH_ROOT/usr/sbin/sshd $SSH_ROOT/usr/bin/ssh $SSH_ROOT/usr/bin/ssh-keygen"
    echo "$SSH_ROOT/lib" >/etc/ld.so.conf.d/zz-fleetdiag-ssh.conf
    for _ in 1 2 3 4 5; do # a carried library may itself need another one
        need=$(for b in $bins "$SSH_ROOT"/lib/*.so*; do if [ -e "$b" ]; then missing_libs "$b"; fi; done | sort -u)
        [ -z "$need" ] && break
        for so in $need; do
            src=$(find "$SSH_ROOT/libsrc" -name "$so" | head -n 1)
            if [ -z "$src" ]; then
                echo "no carried library provides $so" >&2
                exit 1
            fi
            echo "   adding $so (from the bundle)"
            cp -L "$src" "$SSH_ROOT/lib/$so"
        done
        ldconfig
    done
    for b in $bins; do
        if [ -n "$(missing_libs "$b")" ]; then
            echo "$b still lacks: $(missing_libs "$b")" >&2
            exit 1
        fi
    done
    ln -sf "$SSH_ROOT/usr/sbin/sshd" /usr/sbin/sshd
    ln -sf "$SSH_ROOT/usr/bin/ssh" /usr/bin/ssh
    ln -sf "$SSH_ROOT/usr/bin/ssh-keygen" /usr/bin/ssh-keygen
    say "$(ssh -V 2>&1)"
fi
mkdir -p /run/sshd
chmod 0755 /run/sshd
if ! getent passwd sshd >/dev/null; then # sshd's privilege separation runs as this user
    useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd 2>/dev/null ||
        echo 'sshd:x:115:65534::/run/sshd:/usr/sbin/nologin' >>/etc/passwd
fi
# tests/sshd.py gives the test sshd "MaxStartups 200:30:400": past 200 unauthenticated
# connections sshd drops new ones at random. For fanouts above that, set
# FLEETDIAG_SSHD_MAXSTARTUPS (e.g. 2000:30:4000), which tests/sshd.py reads.
# sshd without PAM refuses an account whose password field starts with "!"
if [ "$(id -u)" = 0 ] && [ -r /etc/shadow ] && grep -q '^root:!' /etc/shadow; then
    usermod -p '*' root
fi

# ---------------------------------------------------------------- Python
if [ ! -x "$VENV/bin/fleetdiag" ]; then
    base=/usr/bin/python3.12
    [ -x "$base" ] || base=$(command -v python3)
    say "venv $VENV from $base ($($base -V 2>&1))"
    "$base" -m venv --without-pip "$VENV"
    for pipwhl in "$BUNDLE"/wheels/pip-*.whl; do break; done
    log=$OUTDIR/install.log
    {
        "$VENV/bin/python" "$pipwhl/pip" install -q --no-index --find-links "$BUNDLE/wheels" pip setuptools &&
            "$VENV/bin/python" -m pip install -q --no-index --find-links "$BUNDLE/wheels" \
                asyncssh bcrypt click rich pyyaml clustershell platformdirs &&
            "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e .
    } >"$log" 2>&1 || {
        cat "$log"
        exit 1
    }
fi
"$VENV/bin/python" -m pip list --format=freeze 2>/dev/null |
    grep -iE '^(asyncssh|bcrypt|cryptography|click|rich|pyyaml|clustershell|platformdirs|fleetdiag)==' | tr '\n' ' '
echo

# ---------------------------------------------------------------- check: a login through the test sshd
"$VENV/bin/python" - <<'EOF'
import subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, ".")
from tests.sshd import start_sshd, ssh_argv

d = Path(tempfile.mkdtemp(prefix="fleetdiag-check-"))
s = start_sshd(d / "sshd")
try:
    p = subprocess.run(ssh_argv(s) + ['echo "login ok: $(id -un), shell $0"'], capture_output=True, text=True, timeout=30)
    print(f"== ssh {s.user}@127.0.0.1: rc={p.returncode} {p.stdout.strip()} {p.stderr.strip()}")
    if p.returncode:
        print((d / "sshd" / "sshd.log").read_text(), file=sys.stderr)
        sys.exit(1)
finally:
    s.stop()
EOF


# what the cost benches run under after the setup: many sockets and ports for the simulated hosts,
# unbuffered output (partial tables reach $OUT as each bench ends), and a stamped step line
cost_bench_env() {
    ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    sysctl -qw net.ipv4.ip_local_port_range="10000 65000" net.ipv4.tcp_tw_reuse=1 2>/dev/null || true
    export PYTHONUNBUFFERED=1
    # shellcheck disable=SC2034  # PY: the sourcing bench runs its Python with it
    PY=$VENV/bin/python
}
s() { echo "== $(date -u +%T) $* (load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores)"; }

# "after" is this tree; "before" is $BEFORE when it names another source tree, given this tree's copies of
# the benches named (so both trees are measured by the same scripts). Sets AFTER and trees, prints where
# each tree's fleetdiag comes from and the driver's version
before_after_trees() {
    AFTER=$PWD
    trees="after"
    if [ -n "${BEFORE:-}" ] && [ -d "$BEFORE" ]; then
        trees="before after"
        [ "${COST_ORDER:-}" = reversed ] && trees="after before" # the second tree runs on the first one's load
        for f in "$@"; do cp "bench/$f" "$BEFORE/bench/$f"; done
    fi
    for t in $trees; do
        in_tree "$t" "$PY" -c "import fleetdiag, sys; print('== $t: fleetdiag from', fleetdiag.__file__)"
    done
    nvidia-smi -q 2>/dev/null | grep -iE 'Driver Version|Persistence Mode|Product Name' | head -4
}
# in $1's tree, with its fleetdiag first on the path (the CLI, its workers and the keeper it starts)
in_tree() {
    t=$1
    shift
    if [ "$t" = before ]; then (cd "$BEFORE" && PYTHONPATH=$BEFORE "$@"); else (cd "$AFTER" && "$@"); fi
}

# the simulated hosts share the device's one driver: a stand-in nvidia-smi answers for each of them from
# a cache of the real one's answers (bench/_simhost_nvidia_smi.sh). Returns 1 where there is no nvidia-smi.
simhost_nvidia_smi() {
    real=$(command -v nvidia-smi) || return 1
    sim=/opt/fleetdiag-simhost
    mkdir -p "$sim/cache"
    cp bench/_simhost_nvidia_smi.sh "$sim/nvidia-smi"
    chmod 0755 "$sim/nvidia-smi"
    echo "$real" >"$sim/real"
    export FLEETDIAG_BENCH_HOST_PATH=$sim FLEETDIAG_BENCH_HOST_NICE=10
}
