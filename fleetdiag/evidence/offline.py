"""A ticket's attachments as evidence: a kernel log file and an nvidia-smi output, read the way the probe's
round trip reads them on a live host, for ``fleetdiag analyze LOG --kernel FILE [--smi FILE]``.

The kernel file may be any form a user saves: ``dmesg`` (seconds since boot), ``dmesg -T`` / ``-H`` /
``--time-format iso``, ``journalctl -k`` in any short format (short, short-precise, short-iso,
short-iso-precise, short-full, short-monotonic), ``/var/log/kern.log`` (syslog), or grep output with no stamps.
Each line's stamp is read on its own (``kernel.split_time``), so a file of mixed forms reads too; the form
named in the result is the one most lines have. Only the lines of interest are kept, the newest
``KEEP_LINES`` of them (and each at most ``MAX_LINE`` characters), so a 1 GB journal costs one pass, not memory.
Seconds since boot have no wall time offline (the host's boot time is unknown): such lines keep their order,
and correlate by process, GPU and order instead of by time.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from pathlib import Path
from typing import TextIO

from .gpu_health import parse_smi_text
from .kernel import INTEREST_ERE, Clock, KernelCollection

KEEP_LINES = 4000
MAX_LINE = 4096

_INTEREST = re.compile(INTEREST_ERE)
_CONT = re.compile(r"^\s+NVRM: ")
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
_FORMS = [  # (label, pattern): the first that matches a line names its form
    ("journalctl -k -o short-iso-precise", re.compile(rf"^{_ISO}[.,]\d+(?:Z|[+-]\d\d:?\d\d)\s+\S+\s+kernel:")),
    ("journalctl -k -o short-iso", re.compile(rf"^{_ISO}(?:Z|[+-]\d\d:?\d\d)\s+\S+\s+kernel:")),
    ("dmesg --time-format iso", re.compile(rf"^{_ISO}[.,]\d+(?:Z|[+-]\d\d:?\d\d)\s")),
    ("journalctl -k -o short-full", re.compile(r"^[A-Za-z]{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d")),
    ("journalctl -k -o short-precise", re.compile(r"^[A-Za-z]{3}\s+\d{1,2} \d\d:\d\d:\d\d\.\d+\s")),
    ("journalctl -k / kern.log (syslog)", re.compile(r"^[A-Za-z]{3}\s+\d{1,2} \d\d:\d\d:\d\d\s")),
    ("journalctl -k -o short-monotonic", re.compile(r"^\[\s*\d+\.\d+\]\s+\S+\s+kernel:")),
    ("dmesg -T", re.compile(r"^\[(?:[A-Za-z]{3}\s+)?[A-Za-z]{3}\s+\d{1,2} \d\d:\d\d:\d\d \d{4}\]")),
    ("dmesg -H", re.compile(r"^\[(?:[A-Za-z]{3}\d{1,2} \d\d:\d\d|\s*\+\d+\.\d+)\]")),
    ("dmesg", re.compile(r"^\[\s*\d+\.\d+\]")),
    ("Talos kernel log", re.compile(r"^kern:\s*\w+:\s*\[")),
]


def detect_form(lines: list[str]) -> str:
    """The form most of these kernel lines are in, as the command that prints it; 'no timestamps' when none."""
    seen: Counter[str] = Counter()
    for ln in lines:
        for label, rx in _FORMS:
            if rx.match(ln):
                seen[label] += 1
                break
    return seen.most_common(1)[0][0] if seen else "no timestamps"


def read_kernel_file(path: str | Path | TextIO, tz_offset: int = 0) -> KernelCollection:
    """The lines of interest of a saved kernel log (a path, or an open text stream such as stdin), as a
    KernelCollection like the probe's (no GPU health)."""
    if isinstance(path, (str, Path)):
        with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
            return read_kernel_file(fh, tz_offset)
    kept: deque[str] = deque(maxlen=KEEP_LINES)
    truncated = False
    for raw in path:
        line = raw.rstrip("\r\n")
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE]
        if _INTEREST.search(line) or (_CONT.match(line) and kept):
            if len(kept) == kept.maxlen:
                truncated = True
            kept.append(line)
    lines = list(kept)
    kc = KernelCollection(source=detect_form(lines), clock=Clock(tz_offset=tz_offset), lines=lines)
    kc.truncated = truncated
    kc.smi_status = "not-given"
    return kc


def add_smi_file(kc: KernelCollection, path: str | Path) -> KernelCollection:
    """An nvidia-smi output (``-q`` text, ``--query-gpu`` CSV, the plain table, its errors) as the GPU health."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    kc.smi = text.splitlines()[:20000]
    kc.smi_status = "ok"
    kc.health = parse_smi_text("\n".join(kc.smi))
    return kc
