"""The probe's exec under its two decoders, interleaved: ``base64 -d`` (where the host has it) vs awk.

    .venv/bin/python bench/decode_ab.py [--repeat 15] [--log-mb 5]

The same payload (the probe's exact script for a 5 MB log, ``funnel_command``) through ``sh -c``: the
decode alone with each tool, then the whole exec with each wrapper (the awk-only one is the wrapper
before ``base64 -d`` was tried first). Wall ms, median and minimum, rounds interleaved.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MB, funnel_command, warm, write_log  # noqa: E402


def main() -> None:
    from fleetdiag.remote import _AWK, ARG0

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--log-mb", type=float, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetdiag-decode-"))
    try:
        log = write_log(tmp / "vllm.log", int(args.log_mb * MB))
        warm(log)
        command, _mark = funnel_command(str(log))
        wrapper, payload = command.rsplit(" ", 1)
        awk_only = "exec sh -c 'eval \"$(" + _AWK + ")\"' " + ARG0 + " " + payload
        rows = {
            "decode alone: awk": ["sh", "-c", _AWK + " >/dev/null", ARG0, payload],
            "decode alone: base64 -d": ["sh", "-c", 'printf %s "$1" | base64 -d >/dev/null', ARG0, payload],
            "whole exec, awk-only wrapper": ["sh", "-c", awk_only],
            "whole exec, this wrapper (base64 -d, awk if it fails)": ["sh", "-c", command],
        }
        print(
            f"payload {len(payload)} B; awk: {shutil.which('awk')}; base64: {shutil.which('base64')}; "
            f"wrapper {len(wrapper)} B",
            flush=True,
        )
        outs = {k: subprocess.run(v, capture_output=True).stdout for k, v in rows.items()}
        kinds = [[ln.split(b"\t")[0] for ln in out.split(b"\n")] for out in list(outs.values())[2:]]
        same = kinds[0] == kinds[1]  # the same records in the same order (their values hold times and pids)
        walls: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(args.repeat):
            for k, v in rows.items():
                t0 = time.perf_counter()
                subprocess.run(v, capture_output=True)
                walls[k].append((time.perf_counter() - t0) * 1000)
        for k, w in walls.items():
            print(f"  {statistics.median(w):7.1f} ms (min {min(w):6.1f})  {k}", flush=True)
        print(f"  the two wrappers' outputs: the same records in the same order: {same}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
