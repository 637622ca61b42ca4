"""The probe's remote script run on this machine, without SSH: its parts beside each other vs in a row.

    .venv/bin/python bench/remote_parts.py [--repeat 5] [--log-mb 5]

``probe_command`` builds one exec: the funnel, the facts after it (two
nvidia-smi calls), the kernel part (journalctl/dmesg, two nvidia-smi calls),
the remote clock. The kernel part is self-contained, so it runs beside the
funnel from the start (``FunnelSpec.side``); on a GPU host its nvidia-smi
calls cost as much as the funnel. This prints the script's wall time both
ways, on this machine's own log, kernel and GPUs (none here: run it on a GPU
host), median of ``--repeat``.
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

from _common import MB, write_log  # noqa: E402


def scripts(log: str) -> dict[str, str]:
    from fleetdiag.analysis import load_rules
    from fleetdiag.evidence import host as evidence
    from fleetdiag.facts import SNIPPET, snippet_vars
    from fleetdiag.probe import CLOCK_SNIPPET, spec_for
    from fleetdiag.remote import funnel

    out = {}
    for name in ("beside", "in a row"):
        spec = spec_for(log, load_rules(user_default=False))
        spec.extra += SNIPPET
        spec.extra_vars.update(snippet_vars(None))
        spec.extra_vars.update(evidence.script_vars(None))
        if name == "beside":
            spec.side += evidence.SCRIPT
        else:
            spec.extra += evidence.SCRIPT
        spec.last += CLOCK_SNIPPET
        out[name] = funnel.build_script(spec, funnel.new_mark())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--log-mb", type=float, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetdiag-parts-"))
    try:
        log = write_log(tmp / "vllm.log", int(args.log_mb * MB))
        smi = shutil.which("nvidia-smi")
        print(f"log {args.log_mb:g} MB; nvidia-smi: {smi or 'none'}")
        for name, script in scripts(str(log)).items():
            subprocess.run(["sh", "-c", script], capture_output=True)  # warm caches
            walls = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run(["sh", "-c", script], capture_output=True)
                walls.append(time.perf_counter() - t0)
            print(f"  parts {name:8}: {statistics.median(walls) * 1000:7.0f} ms (median of {args.repeat})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
