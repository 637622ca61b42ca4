"""Processes found by their command line (keepers, spread workers), for the tests and benchmarks."""

from __future__ import annotations

import os
from pathlib import Path


def pids_with(*words: str) -> list[int]:
    """Live (not zombie) processes whose argv holds every one of ``words`` as a whole argument."""
    want = [w.encode() for w in words]
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and all(w in argv for w in want):
            pids.append(int(entry.name))
    return pids
