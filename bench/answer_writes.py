"""How many writes the probe's answer leaves the host in (#27): every write becomes an SSH packet.

The probe's exec (``probe.probe_command``, funnel + facts + kernel part + clock) on the bench's 1 MiB log,
or the logs named, through the local ``sh`` under ``strace -f``: the writes to its stdout, their sizes and
the section each starts with.

    python bench/answer_writes.py [LOG ...]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MB, funnel_command, write_log  # noqa: E402


def writes(log: str) -> list[tuple[int, str]]:
    cmd, _mark = funnel_command(log)
    with tempfile.TemporaryDirectory() as d:
        out, trace = Path(d) / "out", Path(d) / "trace"
        with out.open("wb") as fo:
            subprocess.run(
                ["strace", "-f", "-y", "-qq", "-s", "24", "-e", "trace=write,writev", "-o", str(trace)]
                + ["sh", "-c", cmd],
                stdout=fo,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        pat = re.compile(r"\bwritev?\(1<" + re.escape(str(out)) + r'>, "(.*?)"\.*, (\d+)')
        return [(int(m.group(2)), m.group(1)) for ln in trace.read_text().splitlines() if (m := pat.search(ln))]


def main(argv: list[str]) -> None:
    logs = argv or [str(write_log(Path(tempfile.mkdtemp()) / "vllm.log", 1 * MB))]
    for log in logs:
        ws = writes(log)
        print(f"{log}: {len(ws)} writes, {sum(n for n, _ in ws)} bytes")
        for n, head in ws:
            print(f"  {n:7d}  {head}")


if __name__ == "__main__":
    main(sys.argv[1:])
