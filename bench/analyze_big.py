"""`fleetdiag analyze` on a 1 GB log next to one `LC_ALL=C grep -c ERROR` pass; memory at 100 MB vs 1 GB.

    .venv/bin/python bench/analyze_big.py [--sizes-mb 100,1024] [--repeat 3]

The log (in /tmp, deleted afterwards) is a healthy run's INFO chatter with
the seeds' failing launch at its end. The page cache is warmed for every
tool. Rows per size (median of --repeat, interleaved):

  grep -c ERROR        LC_ALL=C grep -c ERROR FILE: one plain pass over the file
                       (stdout goes to a file: GNU grep stops at the first
                       match when its stdout is /dev/null)
  fleetdiag analyze    the installed CLI, default settings, run once before (so its funnel starts at
                       the entry point, before the imports; the FLEETDIAG_AHEAD=0 row: after): the funnel reads
                       the last 64 MiB (scan_bytes), so its cost is bounded
                       whatever the size (docs/funnel.md "Why the end of the file")
  funnel, whole file   the same funnel with scan_bytes >= the file size, through
                       the local sh (a Python process: start-up included): what
                       a full keyword pass costs next to grep -c
  start-up alone       `fleetdiag --version`: the interpreter and the CLI's imports,
                       the part of analyze's time that does not depend on the log

The floor, same minute, same file (what one pass costs in the funnel's own tools):

  awk one pass         LC_ALL=C awk '/ERROR/ {n++} END {print n + 0}' FILE
  funnel alone         the script analyze runs, through `sh -c` with no Python: its grep/awk/tail
                       processes over the file's last window
  python -c pass       the interpreter alone (site included, as the console script starts)

Peak memory is the largest single process of the tree (wait4's ru_maxrss:
Python, sh, grep or awk) and the sampled sum over the tree.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DECISIVE,
    MB,
    child_env,
    dump_summary,
    fleetdiag_bin,
    load_average,
    median,
    ratio,
    run_measured,
    table,
    verdict,
    warm,
    write_log,
)

FULL_SCAN = r"""
import sys, time
from fleetdiag.analysis import load_rules
from fleetdiag.remote.funnel import run_local
from fleetdiag.probe import finish, spec_for
path = sys.argv[1]
rules = load_rules()
spec = spec_for(path, rules)
spec.scan_bytes = int(sys.argv[2])
res = finish(path, run_local(spec), rules)
print(res.verdict, (res.decisive.line if res.decisive else ""))
"""


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", default="100,1024", help="log sizes in MiB (the last one is the big one)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the logs (deleted after)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    fd = fleetdiag_bin()
    sizes = [int(x) for x in args.sizes_mb.split(",")]
    work = Path(tempfile.mkdtemp(prefix="fleetdiag-bench-big-", dir=args.dir))
    try:
        return run(fd, sizes, work, args)
    finally:
        for f in work.glob("*"):
            f.unlink()
        work.rmdir()


def funnel_script(log: Path) -> str:
    """The script ``fleetdiag analyze`` runs for ``log`` (``funnel.run_local``'s), for the floor row."""
    import dataclasses

    from fleetdiag.analysis import load_rules
    from fleetdiag.probe import spec_for
    from fleetdiag.remote.funnel import build_script, new_mark

    return build_script(dataclasses.replace(spec_for(str(log), load_rules()), nice=False), new_mark())


def run(fd: str, sizes: list[int], work: Path, args) -> dict:
    env = child_env(LC_ALL="C")
    rows = []
    summary: dict = {"sizes": {}}
    print(f"analyze bench: sizes {sizes} MiB, median of {args.repeat}; load {load_average()}", flush=True)
    for size in sizes:
        log = write_log(work / f"vllm-{size}M.log", size * MB)
        warm(log)
        tools = {
            "LC_ALL=C grep -c ERROR": [["grep", "-c", "ERROR", str(log)], {}],
            "fleetdiag analyze --json": [[fd, "analyze", str(log), "--json"], {}],
            "fleetdiag analyze --json, FLEETDIAG_AHEAD=0 (funnel after the imports)": [
                [fd, "analyze", str(log), "--json"],
                {"FLEETDIAG_AHEAD": "0"},
            ],
            "funnel over the whole file": [
                [sys.executable, "-c", FULL_SCAN, str(log), str(log.stat().st_size + 1)],
                {},
            ],
            "(start-up alone: fleetdiag --version)": [[fd, "--version"], {}],
            "floor: LC_ALL=C awk one pass (/ERROR/)": [
                ["awk", "/ERROR/ {n++} END {print n + 0}", str(log)],
                {},
            ],
            "floor: funnel alone (sh, no Python)": [["sh", "-c", funnel_script(log)], {}],
            "floor: python -c pass": [[sys.executable, "-c", "pass"], {}],
        }
        runs: dict[str, list] = {k: [] for k in tools}
        run_measured([fd, "analyze", str(log), "--json"], env=env, timeout=900)  # remembered: the next start early
        for _ in range(args.repeat):
            for name, (argv, extra) in tools.items():
                m = run_measured(argv, env={**env, **extra}, sample_tree=True, timeout=900)
                check(name, m)
                runs[name].append(m)
        base = median(m.wall for m in runs["LC_ALL=C grep -c ERROR"])
        entry = {}
        for name, ms in runs.items():
            w = median(m.wall for m in ms)
            rss = max(m.maxrss_mb for m in ms)
            tree = max(m.tree_mb or 0 for m in ms)
            rows.append([f"{size} MiB", name, f"{w:.2f}", ratio(w, base), f"{rss:.0f}", f"{tree:.0f}"])
            entry[name] = {"wall_s": w, "maxrss_mb": rss, "tree_mb": tree, "vs_grep": w / base}
        summary["sizes"][str(size)] = entry
        log.unlink()
        print(f"  {size} MiB done", flush=True)
    print(f"\nload average after: {load_average()}")
    print(table(["log", "tool", "wall s", "x grep -c", "peak RSS MB", "tree RSS MB"], rows))
    big, small = str(sizes[-1]), str(sizes[0])
    a = summary["sizes"][big]["fleetdiag analyze --json"]
    b = summary["sizes"][small]["fleetdiag analyze --json"]
    summary["targets"] = {"analyze_vs_grep": a["vs_grep"], "rss_big_over_small": a["maxrss_mb"] / b["maxrss_mb"]}
    print(f"\ntargets ({big} MiB):")
    print(f"  fleetdiag analyze <= 1.2x grep -c ERROR : {a['vs_grep']:.2f}x  {verdict(a['vs_grep'] <= 1.2)}")
    print(
        f"  peak memory {big} MiB vs {small} MiB      : {a['maxrss_mb']:.0f} MB vs {b['maxrss_mb']:.0f} MB "
        f"({a['maxrss_mb'] / b['maxrss_mb']:.2f}x)  "
        f"{verdict(a['maxrss_mb'] <= 1.1 * b['maxrss_mb'])} (independent of size)"
    )
    full = summary["sizes"][big]["funnel over the whole file"]
    print(f"  (whole-file funnel pass, for reference: {full['vs_grep']:.2f}x grep -c, {full['maxrss_mb']:.0f} MB)")
    dump_summary(args.json_out, summary)
    return summary


def check(name: str, m) -> None:
    out = m.out.decode("utf-8", "replace")
    if name.startswith("fleetdiag"):
        try:
            rec = json.loads(out)
        except ValueError:
            raise SystemExit(f"fleetdiag analyze gave no JSON (rc {m.rc}): {m.err.decode()[-1500:]}") from None
        line = (rec.get("decisive") or {}).get("line") or ""
        if rec.get("verdict") != "failed" or DECISIVE not in line:
            raise SystemExit(f"fleetdiag analyze missed the decisive error: {out[:1500]}")
    elif name.startswith("funnel"):
        if not out.startswith("failed") or DECISIVE not in out:
            raise SystemExit(f"whole-file funnel missed the decisive error: {out[:500]} {m.err.decode()[-1500:]}")
    elif name.startswith(("(start-up", "floor: python", "floor: funnel")):
        pass
    elif not out.strip().isdigit():
        raise SystemExit(f"grep -c gave {out[:200]!r}")


if __name__ == "__main__":
    main()
