"""The remote side: how a script reaches a host's ``/bin/sh`` through any login shell.

sshd hands the exec request to the user's login shell, and login shells
disagree about quoting: tcsh splits single-quoted text at newlines, fish
treats backslashes inside single quotes as escapes. So the exec request is
one fixed line, the same for every script, that every login shell (bash,
dash, zsh, ksh, csh/tcsh, fish) reads the same way: ``exec sh -c '<decoder>'
fleetdiag-remote <base64>``. The decoder contains no backslash, no newline, no
``!`` and no single quote; the payload contains only ``[A-Za-z0-9+/=]``. Only
``sh`` decodes the payload (with ``base64 -d`` where the host has it, else with
``awk``, present wherever the funnel runs) and ``eval``s it, with stdin still the channel.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from functools import cache
from importlib import resources

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# The name the decoded script runs under ($0): remote processes that carry a
# fleetdiag script are recognised by it (the follower's liveness check skips them).
ARG0 = "fleetdiag-remote"
# awk base64 decoder. Reads in 512-character slices: busybox awk's substr and
# length are O(n), so one pass over a 40 KB line would be quadratic.
_DECODER = (
    "BEGIN { for (i = 0; i < 64; i++) v[substr(a, i + 1, 1)] = i; b = 0; k = 0;"
    " while ((getline l) > 0) while (length(l) > 0) { s = substr(l, 1, 512); l = substr(l, 513); n = length(s);"
    " for (i = 1; i <= n; i++) { c = substr(s, i, 1);"
    " if (c in v) { b = b * 64 + v[c]; k++; if (k == 4) { printf f, int(b / 65536); printf f, int(b / 256) % 256;"
    " printf f, b % 256; b = 0; k = 0 } } } }"
    " if (k == 3) { printf f, int(b / 1024); printf f, int(b / 4) % 256 } else if (k == 2) printf f, int(b / 16) }"
)
# ``base64 -d`` where the host has it (coreutils, busybox): the awk decoder takes 40-140 ms of a warm
# probe's remote work for its ~50 KB payload, base64 a few. Decoded into a variable first, so a base64 that
# fails (or prints nothing) leaves the awk decoder to do it: the script is never run half-decoded.
_AWK = 'printf %s "$1" | LC_ALL=C awk -v a=' + B64 + ' -v f=%c "' + _DECODER + '"'
WRAPPER = (
    'exec sh -c \'if command -v base64 >/dev/null 2>&1 && fd_b64=$(printf %s "$1" | base64 -d 2>/dev/null)'
    ' && [ -n "$fd_b64" ]; then eval "$fd_b64"; else eval "$(' + _AWK + ")\"; fi' " + ARG0
)
# Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN); stay well below.
MAX_PAYLOAD = 120 * 1024


def encode(script: str) -> str:
    """The script as the payload word: base64, nothing a shell could read as syntax."""
    return base64.b64encode(script.encode("utf-8", "surrogateescape")).decode("ascii")


def remote_command(script: str) -> str:
    """The exec request: the fixed wrapper and the script as base64 data (one round trip)."""
    payload = encode(script)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"remote script too long ({len(payload)} bytes encoded, limit {MAX_PAYLOAD})")
    return f"{WRAPPER} {payload}"


def encoded_prefix(line: str) -> str:
    """Base64 of a first script line padded to a multiple of 3 bytes: a fixed start of the payload
    that remote code can look for in ``/proc/PID/cmdline``."""
    raw = line.encode("utf-8")
    raw += b" " * (-len(raw) % 3)
    return base64.b64encode(raw).decode("ascii")


def pad_line(line: str) -> str:
    """``line`` padded with spaces to a multiple of 3 bytes (so ``encoded_prefix`` matches it)."""
    n = len(line.encode("utf-8"))
    return line + " " * (-n % 3)


# ------------------------------------------------------------------ the script builder
#
# Every remote script is: quoted, exported assignments of its values, then
# fixed texts from the .sh files of this package. No value is spliced into
# code; awk reads patterns through ENVIRON; awk programs share lib.awk
# (exported as FD_AWKLIB) for line clipping and integer printing.


@cache
def load(name: str) -> str:
    """A shipped script text (``funnel.sh``, ``lib.awk``, ...) from this package, without its
    comment lines: they are for the reader here, and every host would receive them base64-encoded
    and decode them in awk (a fifth of a probe's request)."""
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    return "".join(ln for ln in text.splitlines(keepends=True) if not _COMMENT_LINE.match(ln))


# A whole-line comment of sh or awk (the remote scripts have no here-documents and no multi-line
# strings whose lines start with "#": tests/test_remote_scripts.py checks the shipped files).
_COMMENT_LINE = re.compile(r"[ \t]*#")


def quote(value: object) -> str:
    """One value as a single-quoted sh word (the only quoting function for remote scripts)."""
    return shlex.quote(str(value))


def assignments(env: Mapping[str, object]) -> str:
    """``K='v'`` lines and one ``export`` of them all: values reach sh and awk only as variables."""
    lines = [f"{k}={quote(v)}" for k, v in env.items()]
    lines.append("export " + " ".join(env))
    return "\n".join(lines) + "\n"


def awk_lib() -> str:
    """awk functions every remote awk program gets: ``fd_clip(s)`` (keep both ends of a line over
    ML bytes, with a marker) and ``fd_int(v)`` (an integer without exponent, past 2^31 too)."""
    return load("lib.awk")


def script(env: Mapping[str, object], *parts: str) -> str:
    """The whole script: assignments (with FD_AWKLIB) then the fixed parts, in order."""
    return assignments({**env, "FD_AWKLIB": awk_lib()}) + "".join(parts)


for _c in "\\\n!":
    assert _c not in WRAPPER
